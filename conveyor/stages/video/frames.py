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

import io
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from conveyor.media.decode import to_rgb
from conveyor.media.errors import InputError
from conveyor.resources import Resources
from conveyor.stages.video.base import ClipStage
from conveyor.stages.video.motion import MotionTally
from conveyor.tasks.video import Clip, Video


def sample_indices(num_frames: int, fps: float, rate: float) -> list[int]:
    """Frame indices at ``rate`` per second: the middle of each 1/rate interval (at least
    one frame, the middle one, for a clip shorter than an interval)."""
    if num_frames <= 0:
        return []
    duration = num_frames / fps
    if duration * rate < 1:
        return [num_frames // 2]
    count = math.floor(duration * rate + 1e-9)
    indices = [min(num_frames - 1, int((k + 0.5) / rate * fps)) for k in range(count)]
    return sorted(set(indices))


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
        wanted = {r: sample_indices(clip.num_frames, fps, r) for r in self.rates}
        needed = sorted({i for indices in wanted.values() for i in indices})
        decoded: dict[int, np.ndarray] = {}
        tally: MotionTally | None = None
        with av.open(io.BytesIO(clip.encoded)) as container:
            stream = container.streams.video[0]
            stream.thread_count = 1
            if self.motion_patch is not None:
                tally = MotionTally.of_stream(stream, self.motion_patch)
            aspect = stream.sample_aspect_ratio
            shape = (aspect.numerator, aspect.denominator) if aspect else (1, 1)
            width, height = model_size(clip.width, clip.height, shape, self.short_side)
            target = iter(needed)
            nxt = next(target, None)
            for position, frame in enumerate(container.decode(stream)):
                if tally is not None:
                    tally.add(frame)  # every frame: the motion is the whole clip's
                elif nxt is None:
                    break
                if position == nxt:
                    image = frame.to_ndarray(width=width, height=height, format="rgb24")
                    decoded[position] = _upright(image, frame.rotation)
                    nxt = next(target, None)
            frame = None
        if tally is not None:
            clip.motion = tally.scores()
        if not decoded:
            raise InputError("the encoded clip has no decodable frame")
        last = decoded[max(decoded)]
        for rate, indices in wanted.items():
            clip.frames[rate] = np.stack([decoded.get(i, last) for i in indices])


class FrameSampler:
    """One clip's frames for the models, taken while its source is decoded to cut it.

    The frames are picked as ``ClipFrameExtractor`` picks them from the encoded clip:
    ``sample_indices`` of the clip's ``expected`` frames at each of ``rates``, ``size``
    pixels, turned upright by ``rotation``. A clip that turns out to hold another number of
    frames (damage, a variable-rate source) takes, for each index its count gives, the
    nearest frame kept.
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
        self.fps = fps
        self.size = size
        self.rotation = rotation
        self.wanted = {i for r in self.rates for i in sample_indices(expected, fps, r)}
        self.kept: dict[int, np.ndarray] = {}

    def wants(self, position: int) -> bool:
        """Whether the clip's frame at ``position`` is one to keep."""
        return position in self.wanted

    def image(self, frame: Any) -> np.ndarray:
        """``frame`` as the models get it (an ``av.VideoFrame`` of the source)."""
        width, height = self.size
        return _upright(to_rgb(frame, (width, height)), self.rotation)

    def keep(self, position: int, image: np.ndarray) -> None:
        self.kept[position] = image

    def frames(self, num_frames: int) -> dict[float, np.ndarray]:
        """The frames at every rate, for a clip of ``num_frames`` frames ({} without any)."""
        if not self.kept:
            return {}
        have = np.array(sorted(self.kept))
        out = {}
        for rate in self.rates:
            indices = sample_indices(num_frames, self.fps, rate) or [int(have[0])]
            nearest = [int(have[np.abs(have - i).argmin()]) for i in indices]
            out[rate] = np.stack([self.kept[i] for i in nearest])
        return out
