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
from conveyor.tasks.video import Clip, Video


def motion_scores(encoded: bytes, patch: int = 256) -> tuple[float, float, int]:
    """``(global score, patch minimum, frames with vectors)`` of an encoded clip.

    Both are means over the frames without the busiest tenth (``TRIM``): after each key
    frame an encoder spends a few frames refining even a frozen picture, with vectors that
    a plain mean would let dominate a still clip; a median would call a slow pan still,
    since a texture moving less than a pixel per frame has a vector in only some frames.
    """
    import av

    with av.open(io.BytesIO(encoded)) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        stream.codec_context.flags2 |= av.codec.context.Flags2.export_mvs
        # vectors are read from the bitstream, before deblocking: skipping the loop filter
        # leaves them as they are and saves a third of the decode
        stream.codec_context.options = {"skip_loop_filter": "all"}
        width, height = stream.codec_context.width, stream.codec_context.height
        cols, rows = max(1, -(-width // patch)), max(1, -(-height // patch))
        frame_means: list[float] = []
        patch_means: list[np.ndarray] = []
        for decoded, frame in enumerate(container.decode(stream), start=1):
            if decoded % COLLECT_EVERY == 0:
                gc.collect(1)  # the frames read so far (see COLLECT_EVERY)
            vectors = _vectors(frame)
            if vectors is None:
                continue  # an intra frame: it says nothing about motion
            length = np.hypot(vectors["motion_x"], vectors["motion_y"]) / np.maximum(
                vectors["motion_scale"], 1
            )
            area = vectors["w"].astype(np.float64) * vectors["h"]
            frame_means.append(float((length * area).sum() / max(area.sum(), 1.0)))
            cx = np.clip(vectors["dst_x"] // patch, 0, cols - 1)
            cy = np.clip(vectors["dst_y"] // patch, 0, rows - 1)
            cell = cy * cols + cx
            moved = np.bincount(cell, weights=length * area, minlength=rows * cols)
            covered = np.bincount(cell, weights=area, minlength=rows * cols)
            # a square no vector landed on was coded without motion: still
            patch_means.append(np.where(covered > 0, moved / np.maximum(covered, 1.0), 0.0))
        frame = vectors = None  # the last frame, freed with the rest by the collection below
    gc.collect()  # and those older by now; microseconds in a worker (see runtime.Tidier)
    if not frame_means:
        return 0.0, 0.0, 0
    per_patch = trimmed_mean(np.stack(patch_means))
    return (
        float(trimmed_mean(np.asarray(frame_means))) / width,
        float(per_patch.min()) / width,
        len(frame_means),
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
        if clip.encoded is None:
            raise InputError("no encoded clip to score (ClipTranscoder first)")
        mean, patch_min, frames = motion_scores(clip.encoded, self.patch)
        if frames == 0:
            return  # a clip of intra frames only carries no vectors to judge it by
        clip.scores["motion_global_mean"] = mean
        clip.scores["motion_patch_min"] = patch_min
        if not self.score_only and (
            mean < self.global_threshold or patch_min < self.patch_threshold
        ):
            clip.reject(self.filter_name)
