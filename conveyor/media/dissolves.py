"""Dissolves found from how the picture's variance sags, decided over a whole video.

A dissolve from picture A to picture B shows ``(1 - a) A + a B`` with ``a`` going from 0
to 1. Two different pictures are unrelated pixel by pixel, so the variance of the mix is
``(1 - a)^2 var(A) + a^2 var(B)``: it sags (to half where the two are alike) and comes
back, one parabola in time between the two shots' levels. A moving texture, a pan, a zoom
or a colour drift keeps its variance, or changes it in some other shape.

This finds what the change between frames cannot: a dissolve between two moving textures
of one kind changes the picture no more than the textures' own motion does, and TransNetV2
scores many 2-3 s dissolves low. On the 40 generated dissolves of ``benchmarks/shots.py``
the sag alone finds 28, with nothing spurious on its negatives (pans, zooms, drifts,
flashes, fast motion), and the hybrid detector with it 36 instead of 25
(docs/measurements/2026-11-28-shot-dissolves-variance.md).

The detector gives each frame's variance (``FrameWindow.variance``); ``VarianceDissolves``
takes them window by window in order, as the splitter has them, since a dissolve and the
shot levels around it cross window borders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from conveyor.media.transitions import MAX_TRANSITION_S, Transition, runs

#: a frame sags when its variance is under this share of the lower of the two shots' levels
SAG_RATIO = 0.85
#: each side's level: the median variance over ``LEVEL_SPAN_S``, starting ``LEVEL_GAP_S``
#: from the frame (past half the longest dissolve, so the sag does not lower its own level)
LEVEL_GAP_S = 1.6
LEVEL_SPAN_S = 1.5
#: dissolve lengths tried (s); the longest is ``MAX_TRANSITION_S``
FIT_LENGTHS_S = (0.3, 0.4, 0.5, 0.7, 1.0, 1.3, 1.6, 2.0, 2.5, MAX_TRANSITION_S)
#: the largest misfit of the best parabola, as an RMS in units of its depth: true dissolves
#: fit at 0.03-0.2, colour drifts at 0.24-0.26, flashes, fades through black and cuts above
FIT_TOLERANCE = 0.2
#: a sag whose best parabola misses by at most this, between shots that are not steady, is
#: doubtful (``doubtful_sags``): on the corpus of benchmarks/shots.py all four dissolves the
#: sag missed were such (and 3 of the 9 negatives' sags); TransNetV2, asked, found two of
#: them, and nothing in the negatives
DOUBT_TOLERANCE = 0.3
#: a shot's level is steady when its variance's spread (10th to 90th percentile) is within
#: this share of the sag's depth: a picture whose variance swings by as much (a whip pan's
#: stripes passing) makes sags of any shape
STEADY = 0.8
#: pictures flatter than this (variance summed over R, G and B: about 3 levels of deviation
#: each) have no sag worth measuring
MIN_LEVEL = 25.0
#: sags shorter than this (frames) are noise
MIN_SAG_FRAMES = 3


def frame_variance(small: np.ndarray) -> np.ndarray:
    """Each frame's variance, summed over its colour channels (``small``: N x H x W x C, of
    a type OpenCV takes: uint8, int16, float32...). OpenCV's per-frame statistics cost a
    tenth of NumPy's ``var`` on a converted copy (9 against 116 us a 64 x 36 frame)."""
    import cv2

    out = np.empty(len(small), np.float32)
    for i, frame in enumerate(small):
        _, deviation = cv2.meanStdDev(frame)
        out[i] = float((deviation * deviation).sum())
    return out


def fit_dissolve(values: np.ndarray, first: int, last: int, fps: float) -> Transition | None:
    """The dissolve whose parabola best explains the sag ``[first, last]`` of ``values``, as
    ``(start, end)`` frames (a blend from ``start`` to ``end``), or None if none fits within
    ``FIT_TOLERANCE`` between steady shots (or the shots are too flat).

    Every length of ``FIT_LENGTHS_S`` is tried at starts a tenth of it apart, each placing
    the sag's bottom inside the blend; each length's best start is refined frame by frame,
    and the best fit whose shots are steady is taken."""
    return _accepted(values, _fits(values, first, last, fps), fps)


def _fits(
    values: np.ndarray, first: int, last: int, fps: float
) -> list[tuple[float, float, int, int]]:
    """Each length's best fit of the sag ``[first, last]``, best first (see ``_misfit``)."""
    bottom = first + int(np.argmin(values[first : last + 1]))
    fits = []
    for seconds in FIT_LENGTHS_S:
        length = max(2, round(seconds * fps))
        step = _step(length)
        coarse = [_misfit(values, s, length, fps) for s in range(bottom - length, bottom + 1, step)]
        best = min((f for f in coarse if f is not None), default=None)
        if best is None:
            continue
        near = range(best[2] - step + 1, best[2] + step)
        refined = (_misfit(values, s, length, fps) for s in near)
        fits.append(min([best, *(f for f in refined if f is not None)]))
    return sorted(fits)


def _accepted(
    values: np.ndarray, fits: list[tuple[float, float, int, int]], fps: float
) -> Transition | None:
    for misfit, depth, start, length in fits:
        if misfit > FIT_TOLERANCE:
            break
        if _steady(values, start, length, fps, depth):
            return start, start + length
    return None


def doubtful_sags(values: np.ndarray, fps: float, cuts: Sequence[int] = ()) -> list[Transition]:
    """The blends ``(start, end)`` that the sags of ``values`` (one stretch of a video's
    variances) fit within ``DOUBT_TOLERANCE`` between shots whose variance swings, away from
    the cuts ``cuts`` (indices into ``values``), where ``fit_dissolve`` found none. A
    dissolve between moving textures looks like this, and so does some content: the sag's
    model, which takes each shot's variance as steady, cannot tell them apart, and the hybrid
    detector asks TransNetV2. Between steady shots the model holds, and a looser fit is no
    dissolve."""
    doubtful = []
    for a, b in runs(_sagging(values, 0, len(values), fps)):
        if b - a + 1 < MIN_SAG_FRAMES or any(a - 3 <= c <= b + 3 for c in cuts):
            continue
        fits = _fits(values, a, b, fps)
        if not fits or fits[0][0] > DOUBT_TOLERANCE or _accepted(values, fits, fps):
            continue
        _, depth, start, length = fits[0]
        if not _steady(values, start, length, fps, depth):
            doubtful.append((start, start + length))
    return doubtful


def _sagging(values: np.ndarray, lo: int, hi: int, fps: float) -> np.ndarray:
    """Whether each frame of ``[lo, hi)`` sags: under ``SAG_RATIO`` of the lower of its two
    sides' levels (False where neither side is measured)."""
    gap, span = max(1, round(LEVEL_GAP_S * fps)), max(2, round(LEVEL_SPAN_S * fps))
    before, after = _side_levels(values, lo, hi, gap, span)
    with np.errstate(invalid="ignore"):
        return values[lo:hi] < SAG_RATIO * np.fmin(before, after)  # NaN compares false


def _step(length: int) -> int:
    """How far apart the starts of a fit of ``length`` frames are first tried."""
    return max(1, length // 10)


def _margin(length: int) -> int:
    """Frames on each side of a blend of ``length`` frames that its fit compares too."""
    return max(3, length // 2)


def _level_frames(length: int, fps: float) -> int:
    """Frames on each side of a blend of ``length`` frames whose median is a shot's level."""
    return _margin(length) + round(0.5 * fps)


def _fit_reach(fps: float) -> int:
    """The most frames past a sag's last frame that fitting it reads: the longest blend
    ends a refining step past the sag's bottom, then its level or its steadiness is read."""
    longest = max(2, round(MAX_TRANSITION_S * fps))
    after = max(_level_frames(longest, fps), round(LEVEL_SPAN_S * fps))
    return longest + _step(longest) + after + 1


def _misfit(
    values: np.ndarray, start: int, length: int, fps: float
) -> tuple[float, float, int, int] | None:
    """How far a blend over ``[start, start + length]`` between the shots' levels is from
    the variances around it, as ``(misfit, depth, start, length)``: the RMS distance in units
    of the sag's depth (None: no such blend here)."""
    n = len(values)
    end = start + length
    if start < 1 or end >= n - 1:
        return None
    margin = _margin(length)
    level = _level_frames(length, fps)
    before = values[max(0, start - level) : start]
    after = values[end + 1 : end + 1 + level]
    if len(before) < 3 or len(after) < 3:
        return None
    va, vb = float(np.median(before)), float(np.median(after))
    if not min(va, vb) >= MIN_LEVEL:  # flat, or not measured (NaN)
        return None
    times = np.arange(max(0, start - margin), min(n, end + margin + 1))
    alpha = np.clip((times - start) / length, 0.0, 1.0)
    model = (1 - alpha) ** 2 * va + alpha**2 * vb
    depth = min(va, vb) - float(model.min())
    seen = values[times]
    if depth <= 0 or not np.isfinite(seen).all():
        return None
    return float(np.sqrt(np.mean((seen - model) ** 2))) / depth, depth, start, length


def _steady(values: np.ndarray, start: int, length: int, fps: float, depth: float) -> bool:
    """Whether the shots on both sides of a blend hold their variance (over
    ``LEVEL_SPAN_S`` at least) within ``STEADY`` of its sag's depth."""
    reach = round(LEVEL_SPAN_S * fps)
    end = start + length
    for side in (values[max(0, start - reach) : start], values[end + 1 : end + 1 + reach]):
        low, high = np.nanquantile(side, (0.1, 0.9))
        if high - low > STEADY * depth:
            return False
    return True


def _side_levels(
    values: np.ndarray, lo: int, hi: int, gap: int, span: int
) -> tuple[np.ndarray, np.ndarray]:
    """For frames ``[lo, hi)``: the level before and the level after each (NaN where that
    side has under a third of its span measured; a side cut short by the video's ends
    counts if it has that much)."""
    from numpy.lib.stride_tricks import sliding_window_view

    pad = gap + span + 1
    padded = np.concatenate([np.full(pad, np.nan), values, np.full(pad, np.nan)])
    windows = sliding_window_view(padded, span)  # windows[i]: padded[i : i + span]
    t = np.arange(lo, hi) + pad
    sides = []
    for rows in (windows[t - gap - span], windows[t + gap + 1]):
        level = np.median(rows, axis=1)  # NaN where any frame is missing: done again below
        ragged = np.flatnonzero(np.isnan(level))
        finite = np.count_nonzero(np.isfinite(rows[ragged]), axis=1)
        for i in ragged[finite >= max(1, span // 3)]:
            level[i] = np.nanmedian(rows[i])
        sides.append(level)
    return sides[0], sides[1]


@dataclass
class VarianceDissolves:
    """The dissolves of one video from its frames' variances, fed window by window in order.

    A frame's sag is decided once the frames its later level needs have arrived; a sag
    ends, and its parabola is fitted, once the frames the longest dissolve's fit needs have.
    ``holding`` says from which frame a dissolve may still be found.
    """

    fps: float
    _values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    _sag: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    _from: int = 0  # sags before this frame were fitted
    _measured: bool = False  # some window had variances (a detector that gives none: no work)

    @property
    def _gap(self) -> int:
        return max(1, round(LEVEL_GAP_S * self.fps))

    @property
    def _span(self) -> int:
        return max(2, round(LEVEL_SPAN_S * self.fps))

    @property
    def _longest(self) -> int:
        return max(2, round(MAX_TRANSITION_S * self.fps))

    def feed(self, start: int, variance: np.ndarray | None, end: int) -> list[Transition]:
        """Frames ``[start, end)`` with their variances (None: not measured); the dissolves
        this makes certain, as transitions ``(first, last)``."""
        if start != len(self._values):
            raise ValueError(f"variances for frames from {start}, expected {len(self._values)}")
        if variance is None:
            variance = np.full(end - start, np.nan, np.float32)
        elif len(variance) != end - start:
            raise ValueError(f"{len(variance)} variances for frames [{start}, {end})")
        else:
            self._measured = True
        self._values = np.concatenate([self._values, variance.astype(np.float32)])
        return self._scan(final=False) if self._measured else []

    def finish(self) -> list[Transition]:
        """The video ended: the dissolves of what is left."""
        return self._scan(final=True) if self._measured else []

    @property
    def holding(self) -> int | None:
        """The first frame a dissolve still to be found may start at (no clip may be made
        past it yet), or None. Where a sag has begun, or the frames not yet decided dip
        under the level before them, a dissolve may have started up to its longest length
        earlier."""
        if not self._measured:
            return None
        n = len(self._values)
        open_at = next((a + self._from for a, _ in runs(self._sag[self._from :])), None)
        lo = len(self._sag)
        if open_at is None and lo < n:
            before, _ = _side_levels(self._values, lo, n, self._gap, self._span)
            with np.errstate(invalid="ignore"):
                dipping = np.flatnonzero(self._values[lo:n] < SAG_RATIO * before)
            open_at = lo + int(dipping[0]) if len(dipping) else None
        return None if open_at is None else max(0, open_at - self._longest)

    def _scan(self, final: bool) -> list[Transition]:
        values = self._values
        n = len(values)
        decided = n if final else max(len(self._sag), n - self._gap - self._span)
        if decided > len(self._sag):
            sag = _sagging(values, len(self._sag), decided, self.fps)
            self._sag = np.concatenate([self._sag, sag])
        found: list[Transition] = []
        base = self._from
        for a, b in runs(self._sag[base:]):
            first, last = a + base, b + base
            if not final and (last >= len(self._sag) - 1 or last + _fit_reach(self.fps) > n):
                break  # it may go on, or its fit needs frames still to come
            self._from = last + 1
            if last - first + 1 < MIN_SAG_FRAMES:
                continue
            dissolve = fit_dissolve(values, first, last, self.fps)
            if dissolve is not None:
                # as the splitter takes gradual runs: the first frame ends the shot before
                found.append((dissolve[0] + 1, dissolve[1]))
        if final:
            self._from = len(self._sag)
        return found
