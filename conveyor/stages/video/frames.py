"""Each clip's frames for the models, at every rate they ask for.

The pipeline builder collects ``frame_rate`` from every ``FrameConsumer`` (embedding, tags,
quality, safety, aesthetics, captions) and gives the set to the ``ClipTranscoder``, which
samples them from the source's frames in the decode it makes to cut the clip (a
``FrameSampler`` per clip): per rate, frames at the middle of each interval, scaled so the
short side is ``short_side`` pixels (each model crops or resizes from there), as wide as a
player shows them and turned upright (phone videos carry a display rotation). The last
consumer drops them. ``ClipFrameExtractor`` takes the same frames from an encoded clip, for a
pipeline whose clips were not cut by the transcoder.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from conveyor.media.decode import to_rgb
from conveyor.media.errors import InputError
from conveyor.resources import Resources
from conveyor.stages.video.base import ClipStage
from conveyor.stages.video.motion import MotionTally
from conveyor.tasks.video import Clip, Video


def scaled_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """Width and height with the short side at ``short_side`` (never upscaled)."""
    short = min(width, height)
    if short <= short_side:
        return width, height
    factor = short_side / short
    return max(1, round(width * factor)), max(1, round(height * factor))


def model_size(
    width: int, height: int, sample_aspect: tuple[int, int], short_side: int
) -> tuple[int, int]:
    """The size models see a ``width`` x ``height`` clip at: as wide as a player shows it
    (anamorphic pixels are not square), short side at ``short_side``."""
    shown = round(width * sample_aspect[0] / sample_aspect[1]) if all(sample_aspect) else width
    return scaled_size(shown, height, short_side)


def _upright(image: np.ndarray, rotation: int) -> np.ndarray:
    """The frame as a player shows it: turned counter-clockwise by the display rotation."""
    turns = round(rotation / 90) % 4
    return np.ascontiguousarray(np.rot90(image, k=turns)) if turns else image


class ClipFrameExtractor(ClipStage):
    """Decode each active clip once and keep frames at each of ``rates`` (frames/s).

    With ``motion_patch``, the same pass exports the codec's motion vectors and leaves their
    scores (``MotionTally``) on the clip for a ``MotionFilter`` of that patch placed behind
    it, which then decodes nothing: one decode of every clip instead of two (the vectors are
    read from the bitstream, so they are the same with the loop filter on).
    """

    resources = Resources(cpus=1)

    def __init__(
        self,
        rates: Iterable[float] = (1.0,),
        short_side: int = 224,
        motion_patch: int | None = None,
    ) -> None:
        self.rates = tuple(sorted({float(r) for r in rates}))
        if not self.rates or any(r <= 0 for r in self.rates):
            raise ValueError(f"rates must be positive frame rates, got {list(rates)}")
        if isinstance(short_side, bool) or not isinstance(short_side, int) or short_side < 16:
            raise ValueError(f"short_side must be a whole number >= 16 pixels, got {short_side!r}")
        if motion_patch is not None and motion_patch < 16:
            raise ValueError(f"motion_patch must be >= 16 pixels, got {motion_patch}")
        self.short_side = short_side
        self.motion_patch = motion_patch

    def process_clip(self, clip: Clip, video: Video) -> None:
        import av

        if clip.encoded is None:
            raise InputError("no encoded clip to take frames from (ClipTranscoder first)")
        fps = clip.fps or (video.metadata.fps if video.metadata else 0.0)
        # the clip's span on the nominal grid: its duration, whatever its frames' count
        span = clip.frame_span[1] - clip.frame_span[0]
        expected = span if span > 0 else clip.num_frames
        tally: MotionTally | None = None
        with av.open(io.BytesIO(clip.encoded)) as container:
            stream = container.streams.video[0]
            stream.thread_count = 1
            if self.motion_patch is not None:
                tally = MotionTally.of_stream(stream, self.motion_patch)
            aspect = stream.sample_aspect_ratio
            shape = (aspect.numerator, aspect.denominator) if aspect else (1, 1)
            size = model_size(clip.width, clip.height, shape, self.short_side)
            sampler: FrameSampler | None = None
            origin = 0.0
            for frame in container.decode(stream):
                if tally is not None:
                    tally.add(frame)  # every frame: the motion is the whole clip's
                if sampler is None:
                    sampler = FrameSampler(self.rates, expected, fps, size, frame.rotation)
                    origin = frame.time if frame.time is not None else 0.0
                elif sampler.done and tally is None:
                    break
                at = frame.time - origin if frame.time is not None else None
                sampler.add(at, functools.partial(sampler.image, frame))
            frame = None
        if tally is not None:
            clip.motion = tally.scores()
        frames = sampler.frames() if sampler is not None else {}
        if not frames:
            raise InputError("the encoded clip has no decodable frame")
        clip.frames.update(frames)


class FrameSampler:
    """One clip's frames for the models, picked by time as the clip's frames go by.

    Per rate the frames at the middle of each ``1/rate`` interval of the clip's span
    (``expected`` frames of the nominal ``fps``: ``sample_slots``), ``size`` pixels, turned
    upright by ``rotation``. A frame is offered with the time it is shown, from the clip's
    first frame, and its picture made only if picked: the frame picked for a slot is the
    last one whose nearest slot of the nominal grid is at or before it (as frames are given
    to clips), so a constant-rate clip's are its frames at those positions, and a
    variable-rate clip's (screen and phone recordings) the frames really shown then. By
    position, a 30-then-10 fps clip gave the models its first second only, its last frame
    repeated, and moving clips were filtered as frozen. A frame picked for two slots in a
    row (a rate above the clip's) comes once.
    """

    def __init__(
        self,
        rates: Iterable[float],
        expected: int,
        fps: float,
        size: tuple[int, int],
        rotation: int = 0,
    ) -> None:
        self.rates = tuple(rates)
        self.size = size
        self.rotation = rotation
        self.fps = fps
        self.targets = {rate: sample_slots(expected, fps, rate) for rate in self.rates}
        self._slots = sorted({slot for slots in self.targets.values() for slot in slots})
        self._next = 0
        self._offered = 0
        self._picked: dict[int, np.ndarray] = {}
        self._last: Callable[[], np.ndarray] | None = None
        self._last_image: np.ndarray | None = None

    def image(self, frame: Any) -> np.ndarray:
        """``frame`` as the models get it (an ``av.VideoFrame`` of the source)."""
        width, height = self.size
        return _upright(to_rgb(frame, (width, height)), self.rotation)

    @property
    def done(self) -> bool:
        """Whether every frame to pick has been picked (no later frame matters)."""
        return self._next >= len(self._slots)

    def add(self, at: float | None, picture: Callable[[], np.ndarray]) -> None:
        """The clip's next frame, shown ``at`` seconds after its first (``None``: unknown,
        its position then); ``picture`` makes its image (called only if it is picked)."""
        slot = round(at * self.fps) if at is not None and self.fps > 0 else self._offered
        self._offered += 1
        while self._next < len(self._slots) and self._slots[self._next] < slot:
            self._pick(self._slots[self._next])  # shown before this frame: the last one
            self._next += 1
        self._last, self._last_image = picture, None

    def _pick(self, slot: int) -> None:
        if self._last is None:
            return
        if self._last_image is None:
            self._last_image = self._last()
        self._picked[slot] = self._last_image

    def frames(self) -> dict[float, np.ndarray]:
        """The frames at every rate ({} for a clip without a frame); the slots past the
        clip's last frame take that frame."""
        for slot in self._slots[self._next :]:
            self._pick(slot)
        self._next = len(self._slots)
        self._last = None
        if not self._picked:
            return {}
        out = {}
        for rate, slots in self.targets.items():
            pictures = [self._picked[slot] for slot in slots]
            unique = [p for i, p in enumerate(pictures) if i == 0 or p is not pictures[i - 1]]
            out[rate] = np.stack(unique)
        return out


def sample_slots(expected: int, fps: float, rate: float) -> list[int]:
    """Frame slots (positions on the nominal ``fps`` grid) at ``rate`` per second of a clip
    of ``expected`` slots: the middle of each ``1/rate`` interval (a partial last one is
    not sampled), or the middle slot of a clip shorter than one interval, or its first."""
    if expected <= 0 or fps <= 0:
        return [0]
    duration = expected / fps
    if duration * rate < 1:
        return [expected // 2]
    count = math.floor(duration * rate + 1e-9)
    return [min(expected - 1, int((k + 0.5) / rate * fps)) for k in range(count)]
