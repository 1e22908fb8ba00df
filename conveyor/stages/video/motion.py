"""The motion filter: codec motion vectors, exported by the decoder.

Decoding H.264 (or MPEG-2, MPEG-4 Part 2) with ``export_mvs`` gives every inter-coded
block's motion vector at no extra decoding cost. Two scores come out, both in fractions of
the frame width per frame (so they do not depend on the resolution):

- ``motion_global_mean``: each frame's block-area-weighted mean vector length, averaged
  over the frames (the busiest tenth left out, see ``motion_scores``);
- ``motion_patch_min``: the frame cut into ``patch`` x ``patch`` pixel squares, each square's
  average over the frames (likewise), and the least of them (low when some region never
  moves).

Whose vectors (``MotionFilter.source``): by default the *source's*, which the transcoder
reads in the one decode it makes to cut the clip, as a plain script would; ``"clip"`` takes
those of the re-encoded clip, decoding it again. A source whose decoder exports none
(VP8/VP9, AV1, HEVC, and intra-only codecs such as MJPEG and ProRes) is scored from the
clip's, so a still clip is never kept for want of vectors; each clip's meta says which
scored it (``motion_source``).

A clip below either threshold is filtered as ``"motion"``. The defaults filter still footage
(a frozen frame scores 0) and keep slow content (a few shapes moving over a still background
score around 3e-4 at 720p); ``patch_threshold`` is off by default,
since a still region (a logo, a letterbox, a fixed background) is common in good footage.
"""

from __future__ import annotations

import gc
import io
from typing import Any, Literal

import numpy as np

from conveyor.media.errors import InputError
from conveyor.resources import Resources
from conveyor.stages.video.base import ClipStage, check_numbers
from conveyor.tasks.video import Clip, MotionScores, Video

#: whose motion vectors score a clip: the source's (read while it is cut) or the clip's
MotionSource = Literal["source", "clip"]
MOTION_SOURCES = ("source", "clip")


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
        tally = MotionTally.of_stream(stream, patch)
        for frame in container.decode(stream):
            tally.add(frame)
        frame = None  # the last frame, freed with the rest by the collection below
    return tally.scores()


def export_vectors(stream: Any) -> None:
    """Have ``stream``'s decoder attach motion vectors to the frames (before its first
    packet)."""
    import av

    stream.codec_context.flags2 |= av.codec.context.Flags2.export_mvs


#: one frame's motion: its mean vector length and each patch's (pixels of the frame)
FrameMotion = tuple[float, np.ndarray]


class MotionGrid:
    """How a ``width`` x ``height`` picture's vectors are measured, frame by frame.

    ``patch``: the squares' side in pixels of the clip; ``scale`` (source pixels per clip
    pixel, for a source cut into smaller clips) makes them cover the same part of the picture
    when the source's own vectors are measured.
    """

    def __init__(self, width: int, height: int, patch: int, scale: float = 1.0) -> None:
        self.patch = patch
        self.width = width
        self.cell = max(1, round(patch * scale))
        self.cols = max(1, -(-width // self.cell))
        self.rows = max(1, -(-height // self.cell))
        self.measured = 0

    def measure(self, frame: Any) -> FrameMotion | None:
        """One decoded frame's motion (``None``: an intra frame, which has no vectors and
        says nothing)."""
        self.measured += 1
        if self.measured % COLLECT_EVERY == 0:
            gc.collect(1)  # the frames read so far (see COLLECT_EVERY)
        vectors = _vectors(frame)
        if vectors is None:
            return None
        # a few NumPy calls per frame, each costing microseconds whatever the frame's size:
        # on a 2 s 160x90 video they were a fifth of all the work done on it
        length = np.hypot(vectors["motion_x"], vectors["motion_y"])
        scale = vectors["motion_scale"]
        if scale.max() > 1:
            length /= np.maximum(scale, 1)
        area = vectors["w"] * vectors["h"].astype(np.float64)
        moved = length * area
        total, covered = float(moved.sum()), float(area.sum())
        mean = total / max(covered, 1.0)
        if self.cols == self.rows == 1:  # one square: the frame's own mean
            return mean, np.array([mean if covered > 0 else 0.0])
        cx = np.minimum(np.maximum(vectors["dst_x"] // self.cell, 0), self.cols - 1)
        cy = np.minimum(np.maximum(vectors["dst_y"] // self.cell, 0), self.rows - 1)
        cell = cy * self.cols + cx
        cells = self.rows * self.cols
        moved_in = np.bincount(cell, weights=moved, minlength=cells)
        covered_in = np.bincount(cell, weights=area, minlength=cells)
        # a square no vector landed on was coded without motion: still
        return mean, np.where(covered_in > 0, moved_in / np.maximum(covered_in, 1.0), 0.0)


class MotionTally:
    """A clip's motion scores gathered frame by frame from a decoding pass that exports the
    codec's vectors: ``motion_scores``' own, a ``ClipFrameExtractor``'s, or the transcoder's
    over the source (one ``MotionGrid.measure`` per frame, shared by every clip that holds
    it)."""

    def __init__(self, grid: MotionGrid, source: MotionSource = "clip") -> None:
        self.grid = grid
        self.source = source
        self.frame_means: list[float] = []
        self.patch_means: list[np.ndarray] = []

    @classmethod
    def of_stream(cls, stream: Any, patch: int) -> MotionTally:
        """A tally of the clip ``stream`` decodes; turns on the vectors' export on it."""
        export_vectors(stream)
        context = stream.codec_context
        return cls(MotionGrid(context.width, context.height, patch))

    def add(self, frame: Any) -> None:
        """Count one decoded frame."""
        self.add_measured(self.grid.measure(frame))

    def add_measured(self, motion: FrameMotion | None) -> None:
        """Count one frame measured already (``MotionGrid.measure``)."""
        if motion is not None:
            self.frame_means.append(motion[0])
            self.patch_means.append(motion[1])

    def scores(self) -> MotionScores:
        """The clip's scores, in fractions of the frame width per frame."""
        gc.collect()  # the frames read last; microseconds in a worker (see runtime.Tidier)
        patch, width = self.grid.patch, self.grid.width
        if not self.frame_means:
            return MotionScores(patch, 0.0, 0.0, 0, self.source)
        per_patch = trimmed_mean(np.stack(self.patch_means))
        return MotionScores(
            patch,
            float(trimmed_mean(np.asarray(self.frame_means))) / width,
            float(per_patch.min()) / width,
            len(self.frame_means),
            self.source,
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
    # looked up by type: iterating gives the entries in PyAV 18, their types in PyAV 19
    data = frame.side_data.get("MOTION_VECTORS")
    if data is None:
        return None
    vectors = data.to_ndarray()
    return vectors if len(vectors) else None


class MotionFilter(ClipStage):
    """Score motion from codec motion vectors and filter clips that barely move.

    ``source="source"`` (the default) judges from the source's vectors the transcoder read
    while it cut the clip (``ClipTranscoder(motion_patch=patch)``), and decodes the clip
    itself only where there are none (a source whose decoder exports no vectors, or no
    transcoder that read them). ``source="clip"`` always judges from the encoded clip's own
    vectors (or a ``ClipFrameExtractor``'s reading of them), the definition of earlier
    versions. ``score_only`` records the scores and filters nothing.
    """

    resources = Resources(cpus=1)
    filter_name = "motion"

    def __init__(
        self,
        global_threshold: float = 1e-5,
        patch_threshold: float = 0.0,
        patch: int = 256,
        score_only: bool = False,
        source: MotionSource = "source",
    ) -> None:
        check_numbers(global_threshold=global_threshold, patch_threshold=patch_threshold)
        for name, value in (
            ("global_threshold", global_threshold),
            ("patch_threshold", patch_threshold),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if isinstance(patch, bool) or not isinstance(patch, int) or patch < 16:
            raise ValueError(f"patch must be >= 16 pixels, got {patch}")
        if source not in MOTION_SOURCES:
            raise ValueError(f"source must be 'source' or 'clip', got {source!r}")
        self.global_threshold = global_threshold
        self.patch_threshold = patch_threshold
        self.patch = patch
        self.score_only = score_only
        self.source = source

    def process_clip(self, clip: Clip, video: Video) -> None:
        motion = clip.motion
        if not self._usable(motion):
            if clip.encoded is None:
                raise InputError("no encoded clip to score (ClipTranscoder first)")
            motion = clip.motion = motion_scores(clip.encoded, self.patch)
        assert motion is not None
        if motion.frames == 0:
            return  # a clip of intra frames only carries no vectors to judge it by
        clip.scores["motion_global_mean"] = motion.global_mean
        clip.scores["motion_patch_min"] = motion.patch_min
        if not self.score_only and (
            motion.global_mean < self.global_threshold or motion.patch_min < self.patch_threshold
        ):
            clip.reject(self.filter_name)

    def _usable(self, motion: MotionScores | None) -> bool:
        """Whether scores found on the clip answer this filter: its patch, vectors in some
        frame, and the clip's own where those are asked for (the source's otherwise, or the
        clip's as the fallback)."""
        if motion is None or motion.patch != self.patch or motion.frames == 0:
            return False
        return self.source == "source" or motion.source == "clip"
