"""The motion filter: codec motion vectors of each encoded clip, exported by the decoder.

Decoding an H.264 clip with ``export_mvs`` gives every inter-coded block's motion vector at
no extra decoding cost. Two scores come out, both in fractions of the frame width per frame
(so they do not depend on the resolution):

- ``motion_global_mean``: each frame's block-area-weighted mean vector length, averaged
  over the frames (the busiest tenth left out, see ``motion_scores``);
- ``motion_patch_min``: the frame cut into ``patch`` x ``patch`` pixel squares, each square's
  average over the frames (likewise), and the least of them (low when some region never
  moves).

A clip below either threshold is filtered as ``"motion"``. The defaults filter still footage
(a frozen frame scores 0) and keep slow content (a few shapes moving over a still background
score around 3e-4 at 720p); ``patch_threshold`` is off by default,
since a still region (a logo, a letterbox, a fixed background) is common in good footage.
"""

from __future__ import annotations

import gc
import io
from typing import Any

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.video.base import ClipStage, InputError
from conveyor.tasks.video import Clip, MotionScores, Video


def motion_scores(encoded: bytes, patch: int = 256) -> MotionScores:
    """The motion scores of an encoded clip, from a decoding pass of its own.

    Both are means over the frames without the busiest tenth (``TRIM``): after each key
    frame an encoder spends a few frames refining even a frozen picture, with vectors that
    a plain mean would let dominate a still clip; a median would call a slow pan still,
    since a texture moving less than a pixel per frame has a vector in only some frames.
    """
    import av

    with av.open(io.BytesIO(encoded)) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        # vectors are read from the bitstream, before deblocking: skipping the loop filter
        # leaves them as they are and saves a third of the decode
        stream.codec_context.options = {"skip_loop_filter": "all"}
        tally = MotionTally(stream, patch)
        for frame in container.decode(stream):
            tally.add(frame)
        frame = None  # the last frame, freed with the rest by the collection below
    return tally.scores()


class MotionTally:
    """Motion scores gathered frame by frame from a decoding pass that exports the codec's
    vectors: ``motion_scores``' own, or the ``ClipFrameExtractor``'s, which decodes every
    frame anyway (one pass instead of two)."""

    def __init__(self, stream: Any, patch: int) -> None:
        """Turns on the vectors' export on ``stream``, before its first packet."""
        import av

        stream.codec_context.flags2 |= av.codec.context.Flags2.export_mvs
        self.patch = patch
        self.width = stream.codec_context.width
        height = stream.codec_context.height
        self.cols, self.rows = max(1, -(-self.width // patch)), max(1, -(-height // patch))
        self.frame_means: list[float] = []
        self.patch_means: list[np.ndarray] = []
        self.decoded = 0

    def add(self, frame: Any) -> None:
        """Count one decoded frame (an intra frame has no vectors and says nothing)."""
        self.decoded += 1
        if self.decoded % COLLECT_EVERY == 0:
            gc.collect(1)  # the frames read so far (see COLLECT_EVERY)
        vectors = _vectors(frame)
        if vectors is None:
            return
        length = np.hypot(vectors["motion_x"], vectors["motion_y"]) / np.maximum(
            vectors["motion_scale"], 1
        )
        area = vectors["w"].astype(np.float64) * vectors["h"]
        self.frame_means.append(float((length * area).sum() / max(area.sum(), 1.0)))
        cx = np.clip(vectors["dst_x"] // self.patch, 0, self.cols - 1)
        cy = np.clip(vectors["dst_y"] // self.patch, 0, self.rows - 1)
        cell = cy * self.cols + cx
        cells = self.rows * self.cols
        moved = np.bincount(cell, weights=length * area, minlength=cells)
        covered = np.bincount(cell, weights=area, minlength=cells)
        # a square no vector landed on was coded without motion: still
        self.patch_means.append(np.where(covered > 0, moved / np.maximum(covered, 1.0), 0.0))

    def scores(self) -> MotionScores:
        """The clip's scores, in fractions of the frame width per frame."""
        gc.collect()  # the frames read last; microseconds in a worker (see runtime.Tidier)
        if not self.frame_means:
            return MotionScores(self.patch, 0.0, 0.0, 0)
        per_patch = trimmed_mean(np.stack(self.patch_means))
        return MotionScores(
            self.patch,
            float(trimmed_mean(np.asarray(self.frame_means))) / self.width,
            float(per_patch.min()) / self.width,
            len(self.frame_means),
        )


#: frames between collections of the young generations: reading a frame's side data ties
#: the frame and its side data in a reference cycle, which only the cycle collector frees,
#: and Python would run it only every couple of hundred frames (1.4 MB each at 720p)
COLLECT_EVERY = 16

#: share of the frames with the most motion left out of the scores (see ``motion_scores``)
TRIM = 0.1


def trimmed_mean(values: np.ndarray, share: float = TRIM) -> np.ndarray | float:
    """Mean over the first axis without its largest ``share`` (at least one value is kept,
    and one is dropped once there are ten)."""
    n = len(values)
    drop = min(n - 1, int(n * share))
    if drop <= 0:
        return values.mean(axis=0)
    return np.sort(values, axis=0)[: n - drop].mean(axis=0)


def _vectors(frame: Any) -> np.ndarray | None:
    for data in frame.side_data:
        if data.type.name == "MOTION_VECTORS":
            vectors = data.to_ndarray()
            return vectors if len(vectors) else None
    return None


class MotionFilter(ClipStage):
    """Score motion from codec motion vectors and filter clips that barely move.

    Right behind a ``ClipFrameExtractor`` that exported the vectors for this ``patch``, it
    judges from the scores left on the clip; anywhere else it decodes the clip itself.
    ``score_only`` records the scores and filters nothing.
    """

    resources = Resources(cpus=1)
    filter_name = "motion"

    def __init__(
        self,
        global_threshold: float = 1e-5,
        patch_threshold: float = 0.0,
        patch: int = 256,
        score_only: bool = False,
    ) -> None:
        if global_threshold < 0 or patch_threshold < 0:
            raise ValueError("motion thresholds must be >= 0")
        if patch < 16:
            raise ValueError(f"patch must be >= 16 pixels, got {patch}")
        self.global_threshold = global_threshold
        self.patch_threshold = patch_threshold
        self.patch = patch
        self.score_only = score_only

    def process_clip(self, clip: Clip, video: Video) -> None:
        motion = clip.motion
        if motion is None or motion.patch != self.patch:
            if clip.encoded is None:
                raise InputError("no encoded clip to score (ClipTranscoder first)")
            motion = motion_scores(clip.encoded, self.patch)
        if motion.frames == 0:
            return  # a clip of intra frames only carries no vectors to judge it by
        clip.scores["motion_global_mean"] = motion.global_mean
        clip.scores["motion_patch_min"] = motion.patch_min
        if not self.score_only and (
            motion.global_mean < self.global_threshold or motion.patch_min < self.patch_threshold
        ):
            clip.reject(self.filter_name)
