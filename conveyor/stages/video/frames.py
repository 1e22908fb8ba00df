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
            for position, frame in enumerate(container.decode(stream)):
                if tally is not None:
                    tally.add(frame)  # every frame: the motion is the whole clip's
                if sampler is None:
                    sampler = FrameSampler(self.rates, expected, fps, size, frame.rotation)
                    origin = frame.time if frame.time is not None else 0.0
                elif sampler.done and tally is None:
                    break
                at = frame.time - origin if frame.time is not None else position / (fps or 1)
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

    Per rate the frames shown at the middle of each ``1/rate`` interval of the clip's span
    (``expected`` frames of the nominal ``fps``: ``target_times``), ``size`` pixels, turned
    upright by ``rotation``. A frame is offered with the time it is shown, from the clip's
    first frame, and its picture made only if picked; a frame picked for two times in a row
    (a rate above the clip's) comes once. On a variable-rate source (screen and phone
    recordings) these are the frames really shown then: picked by their position, a
    30-then-10 fps clip gave the models its first second only, its last frame repeated, and
    moving clips were filtered as frozen.
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
        duration = expected / fps if fps > 0 else 0.0
        self.targets = {rate: target_times(duration, rate) for rate in self.rates}
        self._times = sorted({t for times in self.targets.values() for t in times})
        # a stamp the container rounded (to milliseconds) still counts as on time
        self._slack = 0.25 / fps if fps > 0 else 0.0
        self._next = 0
        self._picked: dict[float, np.ndarray] = {}
        self._last: Callable[[], np.ndarray] | None = None
        self._last_image: np.ndarray | None = None

    def image(self, frame: Any) -> np.ndarray:
        """``frame`` as the models get it (an ``av.VideoFrame`` of the source)."""
        width, height = self.size
        return _upright(to_rgb(frame, (width, height)), self.rotation)

    @property
    def done(self) -> bool:
        """Whether every frame to pick has been picked (no later frame matters)."""
        return self._next >= len(self._times)

    def add(self, at: float, picture: Callable[[], np.ndarray]) -> None:
        """The clip's next frame, shown ``at`` seconds after its first; ``picture`` makes
        its image for the models (called only if it is picked)."""
        while self._next < len(self._times) and self._times[self._next] + self._slack < at:
            self._pick(self._times[self._next])  # shown before this frame: the last one
            self._next += 1
        self._last, self._last_image = picture, None

    def _pick(self, time: float) -> None:
        if self._last is None:
            return
        if self._last_image is None:
            self._last_image = self._last()
        self._picked[time] = self._last_image

    def frames(self) -> dict[float, np.ndarray]:
        """The frames at every rate ({} for a clip without a frame); the times past the
        clip's last frame take that frame."""
        for time in self._times[self._next :]:
            self._pick(time)
        self._next = len(self._times)
        self._last = None
        if not self._picked:
            return {}
        out = {}
        for rate, times in self.targets.items():
            # a frame picked for two times in a row (a rate above the clip's) once
            pictures = [self._picked[t] for t in times]
            unique = [p for i, p in enumerate(pictures) if i == 0 or p is not pictures[i - 1]]
            out[rate] = np.stack(unique)
        return out


def target_times(duration: float, rate: float) -> list[float]:
    """Seconds into a clip of ``duration`` of its frames at ``rate`` per second: the middle
    of each ``1/rate`` interval (a partial last one is not sampled), or the middle of the
    clip for a clip shorter than one."""
    if duration <= 0:
        return [0.0]
    if duration * rate < 1:
        return [duration / 2]
    count = math.floor(duration * rate + 1e-9)
    return [(k + 0.5) / rate for k in range(count)]
