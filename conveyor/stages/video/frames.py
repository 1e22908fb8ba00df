"""Decoding each clip's frames once, at every rate the models downstream ask for.

The pipeline builder collects ``frame_rate`` from every ``FrameConsumer`` (embedding, tags,
quality, safety, aesthetics, captions) and gives the set to one ``ClipFrameExtractor``, which
decodes the encoded clip once and keeps, per rate, frames sampled at the middle of each
interval, scaled so the short side is ``short_side`` pixels (each model crops or resizes from
there) and turned upright as a player would show them (phone videos carry a display
rotation). The last consumer drops them.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.video.base import ClipStage, InputError
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
        if short_side < 16:
            raise ValueError(f"short_side must be >= 16 pixels, got {short_side}")
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
                tally = MotionTally(stream, self.motion_patch)
            # as wide as a player shows it: anamorphic pixels are not square
            aspect = stream.sample_aspect_ratio
            shown = round(clip.width * float(aspect)) if aspect else clip.width
            width, height = scaled_size(shown, clip.height, self.short_side)
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
