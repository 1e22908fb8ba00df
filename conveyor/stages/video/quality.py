"""The quality filter: cheap technical checks on the frames the extractor decoded.

Per clip, from its frames at ``frame_rate`` (OpenCV, no model):

- ``quality_sharpness``: the median over frames of the variance of the Laplacian of the gray
  frame (low = blurry). Smooth patterns and soft footage score low as well (at the
  extractor's 224 pixel short side a plasma pattern scores 1.5 to 3, a panning texture 2.5
  to 15, colour bars 55 to 160), so blur is scored but filters only when ``min_sharpness``
  is set;
- ``quality_brightness``: the mean luma (0-255);
- ``quality_dark_fraction``: the share of frames whose mean luma is below ``dark_luma``;
- ``quality_blank_fraction``: the share of uniform frames (black, grey or any colour): frames
  whose largest per-channel (R, G, B) standard deviation is below ``blank_std``. Colour, not
  luma: two colours of equal luma make a picture, not a blank (some palettes of the
  synthetic patterns have a luma deviation of 1 and an RGB deviation of 26 and more);
- ``quality_frozen_fraction``: the share of consecutive frame pairs in which nothing
  changed: no cell of an 8 x 8 grid over the frame has more than 2% of its pixels changed by
  more than ``frozen_diff`` levels (in any of R, G, B). Changed pixels per region, because a
  mean difference cannot tell a small moving thing from codec noise: a marker walking over
  still colour bars moves the whole-frame mean by as little as 0.03 levels, while the
  keyframes of a frozen source re-quantise it by up to 3.6 levels (a region's mean). Counted
  per pixel and region, the marker changes 8% and more of its cell, the codec 0.3% at most.
  Slow, smooth motion (a gradient drifting, a slow pan) may move no pixel by that much
  between sampled frames yet shift a whole region: a pair whose cell mean difference is
  above ``FROZEN_MEAN`` levels changed too (a slowly turning ring pattern moves its cells
  by 16 levels; re-quantisation noise of a frozen source stays under 7).
  Needs two frames; one frame scores 0.

A clip is filtered as ``"quality"`` when the dark, blank or frozen fraction is above its
maximum or the sharpness is below ``min_sharpness``; ``score_only`` records and keeps all.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.video.base import FrameConsumer, check_numbers, check_rate
from conveyor.tasks.video import Clip, Video

#: a frame pair changed when, in any cell of a GRID x GRID split of the frame, more than
#: CHANGED_SHARE of the pixels changed by more than ``frozen_diff`` levels
GRID = 8
CHANGED_SHARE = 0.02
#: ... or when, in any cell, the mean difference (the largest channel's) is above this
FROZEN_MEAN = 10.0


def quality_scores(
    frames: np.ndarray,
    dark_luma: float = 16.0,
    blank_std: float = 3.0,
    frozen_diff: float = 24.0,
) -> dict[str, float]:
    """The quality scores of ``N x H x W x 3`` uint8 RGB frames (see the module doc)."""
    import cv2

    frames = np.ascontiguousarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
        raise ValueError(f"quality_scores needs N x H x W x 3 uint8 frames, got {frames.shape}")
    sharpness: list[float] = []
    luma: list[float] = []
    blank = 0
    for frame in frames:
        gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
        sharpness.append(float(cv2.Laplacian(gray, cv2.CV_64F).var()))
        luma.append(float(gray.mean()))
        _, std = cv2.meanStdDev(frame)
        blank += float(std.max()) < blank_std
    pairs = len(frames) - 1
    frozen = sum(not _changed(a, b, frozen_diff) for a, b in pairwise(frames))
    return {
        "quality_sharpness": float(np.median(sharpness)),
        "quality_brightness": float(np.mean(luma)),
        "quality_dark_fraction": sum(v < dark_luma for v in luma) / len(frames),
        "quality_blank_fraction": blank / len(frames),
        "quality_frozen_fraction": frozen / pairs if pairs > 0 else 0.0,
    }


def _changed(a: np.ndarray, b: np.ndarray, level: float) -> bool:
    """Whether, in some cell of a grid, more than ``CHANGED_SHARE`` of the pixels differ
    between ``a`` and ``b`` by more than ``level`` in some channel, or the cell's mean
    difference is above ``FROZEN_MEAN``."""
    import cv2

    diff = cv2.absdiff(a, b).max(axis=2).astype(np.float32)
    height, width = diff.shape
    rows = np.arange(min(GRID, height)) * height // min(GRID, height)
    cols = np.arange(min(GRID, width)) * width // min(GRID, width)
    areas = np.outer(np.diff(rows, append=height), np.diff(cols, append=width))

    def cell_means(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(np.add.reduceat(values, rows, axis=0), cols, axis=1) / areas

    return bool(
        cell_means((diff > level).astype(np.float32)).max() > CHANGED_SHARE
        or cell_means(diff).max() > FROZEN_MEAN
    )


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


class QualityFilter(FrameConsumer):
    """Score technical quality (sharpness, brightness, dark, blank and frozen frames) and
    filter clips that are mostly dark, blank or frozen (or too blurry, when asked)."""

    resources = Resources(cpus=1)
    filter_name = "quality"

    def __init__(
        self,
        frame_rate: float = 2.0,
        *,
        dark_luma: float = 16.0,
        max_dark: float = 0.5,
        blank_std: float = 3.0,
        max_blank: float = 0.5,
        frozen_diff: float = 24.0,
        max_frozen: float = 0.9,
        min_sharpness: float = 0.0,
        score_only: bool = False,
    ) -> None:
        check_rate(frame_rate)
        check_numbers(blank_std=blank_std, min_sharpness=min_sharpness)
        if not 0.0 <= dark_luma <= 255.0:
            raise ValueError(f"dark_luma must be in [0, 255], got {dark_luma}")
        if not blank_std >= 0:
            raise ValueError(f"blank_std must be >= 0, got {blank_std}")
        if not 0.0 <= frozen_diff <= 255.0:
            raise ValueError(f"frozen_diff must be in [0, 255], got {frozen_diff}")
        if not min_sharpness >= 0:
            raise ValueError(f"min_sharpness must be >= 0, got {min_sharpness}")
        _check_fraction("max_dark", max_dark)
        _check_fraction("max_blank", max_blank)
        _check_fraction("max_frozen", max_frozen)
        self.frame_rate = frame_rate
        self.dark_luma = dark_luma
        self.max_dark = max_dark
        self.blank_std = blank_std
        self.max_blank = max_blank
        self.frozen_diff = frozen_diff
        self.max_frozen = max_frozen
        self.min_sharpness = min_sharpness
        self.score_only = score_only

    def setup(self, worker: Any) -> None:
        import cv2

        cv2.setNumThreads(max(1, round(self.resources.cpus)))

    def process_clip(self, clip: Clip, video: Video) -> None:
        scores = quality_scores(
            self.frames_of(clip), self.dark_luma, self.blank_std, self.frozen_diff
        )
        clip.scores.update(scores)
        if not self.score_only and self.rejects(scores):
            clip.reject(self.filter_name)

    def rejects(self, scores: dict[str, float]) -> bool:
        """Whether scores from ``quality_scores`` fail this filter's thresholds."""
        return (
            scores["quality_dark_fraction"] > self.max_dark
            or scores["quality_blank_fraction"] > self.max_blank
            or scores["quality_frozen_fraction"] > self.max_frozen
            or scores["quality_sharpness"] < self.min_sharpness
        )
