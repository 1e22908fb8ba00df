"""Shot detectors for a CPU: PySceneDetect's detectors on our decode, and TransNetV2 where
the picture changes gradually.

PySceneDetect's ``AdaptiveDetector``, ``ContentDetector`` and ``HistogramDetector`` run
here on the frames ``ShotFrameDecoder`` decodes once per window, at the width PySceneDetect
itself works at (256 pixels: it downscales wider video to that), so they find what
``scenedetect detect-adaptive`` finds on the same video. Each window's detector is fed the
window's context first (at least ``min_scene_len`` frames and its look-ahead), so a window
decides its own frames as one pass over the whole video would.

They see hard cuts only: a dissolve of a second or more changes each frame little, and
dissolves are most of what TransNetV2 finds that they miss. ``HybridDetector`` takes the
adaptive detector's cuts, finds the stretches where the picture changes more than around
them and no cut explains it (``changing_stretches``: a dissolve, a fade, a flash, a speed
change), and asks TransNetV2 about those stretches only, on frames shrunk from the same
decode. On a CPU that costs a few percent of running TransNetV2 on every frame. It also
gives each frame's variance, in whose sag the splitter finds the dissolves neither sees
(``conveyor.media.dissolves``).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from conveyor.media.dissolves import doubtful_sags, frame_variance
from conveyor.media.transitions import (
    MAX_TRANSITION_S,
    NONE,
    STRONG,
    WEAK,
    gradual_codes,
    merge_transitions,
    runs,
)
from conveyor.resources import Resources
from conveyor.stages.video.base import VideoStage
from conveyor.stages.video.shots import (
    EXTENT_FLOOR,
    TRANSNET_CONTEXT,
    TRANSNET_SIZE,
    TransNetV2Detector,
    transitions_from_mask,
)
from conveyor.tasks.video import FrameWindow, Video

#: PySceneDetect downscales frames wider than this to about this width before detecting
SCENEDETECT_WIDTH = 256


class SceneDetectCuts(VideoStage):
    """Hard cuts from one of PySceneDetect's frame-by-frame detectors, on a decoded window.

    Needs ``context >= min_scene_len`` plus the detector's look-ahead frames around each
    window (``ShotWindows``): the frames before let the detector reach the state a pass
    from the video's start would have, the frames after let it decide the window's last
    frames.
    """

    resources = Resources(cpus=0.5)

    def __init__(self, min_scene_len: int = 15) -> None:
        if min_scene_len < 1:
            raise ValueError(f"min_scene_len must be >= 1 frame, got {min_scene_len}")
        self.min_scene_len = min_scene_len

    def detector(self) -> Any:
        """A fresh PySceneDetect detector (one per window: they keep state)."""
        raise NotImplementedError

    def process_video(self, video: Video) -> None:
        window, meta = video.window, video.metadata
        assert window is not None and meta is not None
        if window.frames is None:
            raise ValueError(f"{video.relative_path}: no decoded window (ShotFrameDecoder first)")
        window.transitions = [(c, c - 1) for c in self.cuts(window, meta.num_frames, meta.fps)]
        self.finish(video)
        window.frames = None
        return None

    def cuts(self, window: FrameWindow, num_frames: int, fps: float) -> list[int]:
        """Frames in ``[window.start, window.end)`` that begin a new shot."""
        import cv2
        from scenedetect import FrameTimecode

        assert window.frames is not None
        detector = self.detector()
        first = window.start - window.context
        found: set[int] = set()
        for offset, frame in enumerate(window.frames):
            index = first + offset
            if index < 0 or index >= num_frames:
                continue  # padding is not content
            bgr = cv2.cvtColor(frame, cv2.COLOR_RGB2BGR)  # PySceneDetect reads OpenCV's order
            for cut in detector.process_frame(FrameTimecode(index, fps), bgr):
                if window.start <= cut.frame_num < window.end and cut.frame_num > 0:
                    found.add(cut.frame_num)
        return sorted(found)

    def finish(self, video: Video) -> None:
        """More work on the window before its frames are dropped (none here)."""


class HistogramDetector(SceneDetectCuts):
    """PySceneDetect's ``HistogramDetector``: luma histograms of consecutive frames."""

    def __init__(self, threshold: float = 0.2, bins: int = 128, min_scene_len: int = 15) -> None:
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        super().__init__(min_scene_len)
        self.threshold = threshold
        self.bins = bins

    def detector(self) -> Any:
        from scenedetect.detectors import HistogramDetector as Detector

        return Detector(self.threshold, self.bins, self.min_scene_len)


class ContentDetector(SceneDetectCuts):
    """PySceneDetect's ``ContentDetector``: the mean change of hue, saturation and luma
    between consecutive frames above ``threshold`` (0-255), flashes merged."""

    def __init__(self, threshold: float = 27.0, min_scene_len: int = 15) -> None:
        if not 0 < threshold < 255:
            raise ValueError(f"threshold must be in (0, 255), got {threshold}")
        super().__init__(min_scene_len)
        self.threshold = threshold

    def detector(self) -> Any:
        from scenedetect.detectors import ContentDetector as Detector

        return Detector(threshold=self.threshold, min_scene_len=self.min_scene_len)


class AdaptiveDetector(SceneDetectCuts):
    """PySceneDetect's ``AdaptiveDetector`` (the default of ``scenedetect``): a frame's
    content change at least ``threshold`` times the average of its ``window_width``
    neighbours on each side, and at least ``min_content_val``; fast motion raises the
    neighbours too, so it cuts less inside it than ``ContentDetector``."""

    def __init__(
        self,
        threshold: float = 3.0,
        min_scene_len: int = 15,
        window_width: int = 2,
        min_content_val: float = 15.0,
    ) -> None:
        if threshold <= 0 or min_content_val < 0 or window_width < 1:
            raise ValueError(
                "AdaptiveDetector needs threshold > 0, min_content_val >= 0 and window_width "
                f">= 1, got {threshold}, {min_content_val}, {window_width}"
            )
        super().__init__(min_scene_len)
        self.threshold = threshold
        self.window_width = window_width
        self.min_content_val = min_content_val

    def detector(self) -> Any:
        from scenedetect.detectors import AdaptiveDetector as Detector

        return Detector(
            adaptive_threshold=self.threshold,
            min_scene_len=self.min_scene_len,
            window_width=self.window_width,
            min_content_val=self.min_content_val,
        )


#: ``changing_stretches``: frames compared this far apart (s) on each side, the stretch of
#: picture on each side its change is compared with (s), the quantile of that side's change
#: taken as its level (a moving texture's change rises and falls: its median would make its
#: own peaks doubtful), and how much more a frame must change than the calmer side's level
#: (times, plus a floor in 0-255 levels). At 1.2 times (measured 2026-11-27) the corpus of
#: benchmarks/shots.py gave the same dissolves for 1.5x the frames asked of TransNetV2 (2.7x
#: on its 720p timing videos); an older set of 28 dissolves gave 21 found instead of 18
RISE = 1.5
LAG_S = 0.27
SIDE_S = 2.0
CALM_Q = 0.9
RISE_FLOOR = 3.0
#: frames shrunk to this size to measure change (a dissolve is seen whole; motion blurs away)
CHANGE_SIZE = (64, 36)


def shrink(frames: np.ndarray) -> np.ndarray:
    """``frames`` at ``CHANGE_SIZE``, as int16 (differences need the sign)."""
    import cv2

    return np.stack(
        [cv2.resize(f, CHANGE_SIZE, interpolation=cv2.INTER_AREA) for f in frames]
    ).astype(np.int16)


def changing_stretches(
    frames: np.ndarray,
    fps: float,
    cuts: list[int] = (),  # type: ignore[assignment]
    small: np.ndarray | None = None,
) -> list[tuple[int, int]]:
    """Stretches ``(first, last)`` (indices into ``frames``) where the picture changes more
    than on both sides of it and no cut in ``cuts`` (indices) explains it.

    A frame's change is the mean difference between the frames ``LAG_S`` before and after
    it, at ``CHANGE_SIZE``; it is doubtful when it is above ``RISE`` times the level
    (``CALM_Q``) of the calmer of the two ``SIDE_S`` stretches around it (plus
    ``RISE_FLOOR``). A steady
    pan, a scroll or a drift changes as much everywhere and is not doubtful; a dissolve, a
    fade or a speed change is. ``small``: ``shrink(frames)``, where the caller has it.
    """
    n = len(frames)
    lag = max(1, round(LAG_S * fps))
    if n <= 2 * lag + 1:
        return []
    if small is None:
        small = shrink(frames)
    change = np.full(n, np.nan)
    change[lag : n - lag] = np.abs(small[2 * lag :] - small[: -2 * lag]).mean(axis=(1, 2, 3))
    side, gap = max(2, round(SIDE_S * fps)), 2 * lag
    t = np.arange(lag, n - lag)
    # each side's stretch, NaN where it reaches past the video: before t, change[t - side :
    # t - gap], is padded[t : t + width]; after it, change[t + gap + 1 : t + side + 1]
    width = side - gap
    if width < 1:  # at a frame or two a second no side has a frame: nothing stands out
        return []
    padded = np.concatenate([np.full(side, np.nan), change, np.full(side, np.nan)])
    stretch = np.lib.stride_tricks.sliding_window_view(padded, width)
    calm = np.fmin(_level(stretch[t]), _level(stretch[t + gap + 1 + side]))
    doubtful = np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        doubtful[t] = change[t] > RISE * calm + RISE_FLOOR  # NaN: neither side measured
    stretches = merge_transitions(
        [(max(0, a - lag), min(n - 1, b + lag)) for a, b in runs(doubtful)]
    )
    return [(a, b) for a, b in stretches if not any(a - 2 <= c <= b + 2 for c in cuts)]


def _level(rows: np.ndarray) -> np.ndarray:
    """Each row's ``CALM_Q`` quantile over its measured values (NaN: none): the rows without
    a gap at once, the few at the video's ends one by one."""
    out = np.full(len(rows), np.nan)
    whole = ~np.isnan(rows).any(axis=1)
    if whole.any():
        out[whole] = np.quantile(rows[whole], CALM_Q, axis=1)
    for i in np.flatnonzero(~whole):
        values = rows[i][~np.isnan(rows[i])]
        if len(values):
            out[i] = np.quantile(values, CALM_Q)
    return out


#: ``sharp_cuts``: a frame is a cut when it differs from the one before it ``CUT_RATIO``
#: times more than the frames within ``CUT_SIDE_S`` of it differ from theirs (their median,
#: the pair on each side of it left out), and by ``CUT_FLOOR`` levels at least (mean over
#: ``CHANGE_SIZE``). PySceneDetect's adaptive detector also asks its change to reach 15 on
#: its own scale, and so misses cuts between two scenes of one palette (7 of 25 on the
#: corpus of benchmarks/shots.py): there this test scored 12-34 at every such cut and at
#: most 2.0 anywhere else but at flashes, which are dropped (measured 2026-11-28)
CUT_RATIO = 4.0
CUT_FLOOR = 3.0
CUT_SIDE_S = 0.5
#: the same test on the mean of each block of a ``CUT_GRID`` (rows, columns) grid over the
#: ``CHANGE_SIZE`` frames: in a whip pan every pixel changes every frame, so a cut there
#: stands out of its neighbours only once the motion is averaged away (the one hard cut of
#: the corpus the pixels' test missed, found with no spurious cut anywhere; 2026-11-28)
CUT_GRID = (6, 8)


def sharp_cuts(small: np.ndarray, fps: float) -> list[int]:
    """Indices ``c`` into ``small`` (``shrink``'s frames) with a hard cut between frames
    ``c - 1`` and ``c`` (see ``CUT_RATIO``), in the pixels or in the grid of ``CUT_GRID``;
    only the larger of two neighbouring jumps."""
    if len(small) < 3:
        return []
    found = _sharp_jumps(small, fps)
    found += [
        j for j in _sharp_jumps(_block_means(small), fps) if not any(abs(j - k) <= 2 for k in found)
    ]
    return sorted(found)


def _block_means(small: np.ndarray) -> np.ndarray:
    """Each frame's mean over each cell of a ``CUT_GRID`` grid (edge pixels past whole cells
    left out); summed one axis at a time, a sixth of the time of one reduction over both."""
    n, h, w, c = small.shape
    rows, cols = CUT_GRID
    tall, wide = h // rows, w // cols
    cells = small[:, : rows * tall, : cols * wide].reshape(n * rows, tall, cols * wide * c)
    sums = cells.sum(axis=1, dtype=np.int64).reshape(n * rows, cols, wide, c).sum(axis=2)
    return sums.reshape(n, rows, cols, c) / (tall * wide)


def _sharp_jumps(frames: np.ndarray, fps: float) -> list[int]:
    from numpy.lib.stride_tricks import sliding_window_view

    diff = np.abs(frames[1:] - frames[:-1]).mean(axis=tuple(range(1, frames.ndim)))
    side = max(2, round(CUT_SIDE_S * fps))
    padded = np.concatenate([np.full(side, np.nan), diff, np.full(side, np.nan)])
    around = sliding_window_view(padded, 2 * side + 1)  # row i: diff[i - side : i + side + 1]
    others = np.concatenate([around[:, : side - 1], around[:, side + 2 :]], axis=1)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows of NaN only: no neighbours
        level = np.nan_to_num(np.nanmedian(others, axis=1), nan=0.0)
    before = np.concatenate([[-np.inf], diff[:-1]])
    after = np.concatenate([diff[1:], [-np.inf]])
    sharp = (
        (diff >= CUT_FLOOR)
        & (diff >= CUT_RATIO * np.maximum(level, 0.5))
        & (diff >= before)
        & (diff > after)
    )
    return [int(i) + 1 for i in np.flatnonzero(sharp)]


#: a flash lasts at most this long (s) and the picture after it is this close to the one
#: before it (a fraction of the jump into the flash), where a cut goes on to another picture
FLASH_S = 0.2
FLASH_RETURN = 0.5


def flashes(
    frames: np.ndarray, fps: float, cuts: list[int], small: np.ndarray | None = None
) -> list[int]:
    """The cuts (indices into ``frames``) that are flashes: the picture jumps mostly by
    getting brighter, and within ``FLASH_S`` comes back to what it was before the jump (a
    photographer's flash, a muzzle flash, a lightning strike: PySceneDetect's detectors cut
    at each); or it is that coming back: it darkens to what it was within ``FLASH_S``
    before (``sharp_cuts`` marks both ends of a flash). A cut into black and back out of it
    (a dip) darkens and stays dark, then lightens into another picture: it stays a cut.
    ``small``: ``shrink(frames)``, where the caller has it (else the frames looked at are
    shrunk here)."""
    span = max(1, round(FLASH_S * fps))

    def at(i: int) -> np.ndarray:
        return small[i] if small is not None else shrink(frames[i : i + 1])[0]

    def close(i: int, to: np.ndarray, jump: float) -> bool:
        return float(np.abs(at(i) - to).mean()) < FLASH_RETURN * jump

    found = []
    for c in cuts:
        if c < 1 or c + 1 >= len(frames):
            continue
        before, now = at(c - 1), at(c)
        jump = float(np.abs(now - before).mean())
        lighter = float(now.mean() - before.mean())  # a flash lights; a fade darkens
        if jump <= 0:
            continue
        after = range(c + 1, min(len(frames), c + span + 1))
        earlier = range(max(0, c - span - 1), c - 1)
        if (lighter > FLASH_RETURN * jump and any(close(i, before, jump) for i in after)) or (
            -lighter > FLASH_RETURN * jump and any(close(i, now, jump) for i in earlier)
        ):
            found.append(c)
    return found


#: a doubtful sag's blend where TransNetV2's all-frames head rises above this is a dissolve:
#: the two agree. On the corpus of benchmarks/shots.py the head reached 0.12-0.55 inside the
#: four dissolves' doubtful sags and at most 0.032 inside the negatives' (2026-11-28), where
#: alone it needs 0.3
SAG_AGREES = 0.1


def _agrees(many: np.ndarray, r0: int, r1: int, blends: list[tuple[int, int]]) -> bool:
    """Whether the run ``[r0, r1]`` of gradual evidence rises above ``SAG_AGREES`` inside one
    of the doubtful blends (indices into ``many``)."""
    for a, b in blends:
        lo, hi = max(r0, a), min(r1, b)
        if lo <= hi and float(many[lo : hi + 1].max()) > SAG_AGREES:
            return True
    return False


class HybridDetector(AdaptiveDetector):
    """The adaptive detector's cuts and the sharp jumps it leaves (``sharp_cuts``: cuts
    between scenes of one palette), and TransNetV2's verdict where the picture changes
    gradually (``changing_stretches``) and where the picture's variance sags almost as a
    dissolve's does (``doubtful_sags``): its cuts there, and its evidence of a dissolve for
    the splitter (``FrameWindow.gradual``); and every frame's variance
    (``FrameWindow.variance``), from which the splitter finds dissolves by their sag.

    TransNetV2 sees each doubtful stretch with ``TRANSNET_CONTEXT`` frames on each side
    (within the window's, which must have as many), shrunk to 48 x 27 from the decode the
    adaptive detector used. A gradual run that reaches the edge of what TransNetV2 saw is
    longer than the stretch: it is left weak, never a dissolve.
    """

    resources = Resources(cpus=1)
    preload_modules = TransNetV2Detector.preload_modules
    max_threads = TransNetV2Detector.max_threads

    def __init__(
        self,
        threshold: float = 3.0,
        transnet_threshold: float = 0.4,
        gradual_threshold: float = 0.3,
        min_scene_len: int = 15,
    ) -> None:
        super().__init__(threshold, min_scene_len)
        self.transnet = TransNetV2Detector(transnet_threshold, gradual_threshold)
        self.transnet.resources = self.resources
        self._worker: Any = None

    def setup(self, worker: Any) -> None:
        # TransNetV2 is loaded when a stretch first asks for it: on ordinary footage most
        # workers never do, and the load costs about 2 CPU-s each
        self._worker = worker

    def _transnet(self) -> TransNetV2Detector:
        if self.transnet._model is None:
            self.transnet.setup(self._worker)
        return self.transnet

    def finish(self, video: Video) -> None:
        import cv2

        window, meta = video.window, video.metadata
        assert window is not None and window.frames is not None and meta is not None
        assert window.transitions is not None
        first = window.start - window.context
        # frames repeated past the video's ends are not content (they never change)
        real = slice(max(0, -first), min(len(window.frames), meta.num_frames - first))
        frames, first = window.frames[real], first + real.start
        lo, hi = window.start - first, window.end - first
        small = shrink(frames)
        variance = frame_variance(small)
        window.variance = variance[lo:hi]
        known = [c - first for c, _ in window.transitions]
        window.transitions = sorted(
            window.transitions
            + [
                (first + c, first + c - 1)
                for c in sharp_cuts(small, meta.fps)
                if lo <= c < hi and not any(abs(c - k) <= 2 for k in known)
            ]
        )
        cuts = [c - first for c, _ in window.transitions]
        context = min(TRANSNET_CONTEXT, window.context)
        # the fit may be shorter than the dissolve: TransNetV2 sees the longest one around it
        reach = round(MAX_TRANSITION_S * meta.fps / 2)
        blends = doubtful_sags(variance, meta.fps, cuts)
        sags = [
            (max(0, (a + b) // 2 - reach), min(len(frames) - 1, (a + b) // 2 + reach))
            for a, b in blends
        ]
        asks = [
            (max(0, a - context), min(len(frames), b + 1 + context), a, b)
            for a, b in merge_transitions(changing_stretches(frames, meta.fps, cuts, small) + sags)
            if a < hi and b >= lo
        ]
        if not asks:
            self._drop_flashes(video, frames, first, small)
            return
        shrunk = [
            np.stack(
                [cv2.resize(f, TRANSNET_SIZE, interpolation=cv2.INTER_AREA) for f in frames[s:e]]
            )
            for s, e, _, _ in asks
        ]
        transnet = self._transnet()
        transnet._threads = self._threads  # the threads this batch was given
        heads = transnet.heads(shrunk, [meta.fps] * len(asks))
        codes = np.zeros(hi - lo, dtype=np.uint8)
        found = list(window.transitions)
        for (start, end, a, b), (single, many) in zip(asks, heads, strict=True):
            # frames of the stretch itself, kept within the window's own frames
            inner = slice(a - start, b - start + 1)
            mask = np.zeros(len(single), dtype=bool)
            mask[inner] = single[inner] > self.transnet.threshold
            found += transitions_from_mask(mask, first + start, (lo - start, hi - start))
            extent = gradual_codes(many, EXTENT_FLOOR, self.transnet.gradual_threshold or 1.0)
            for r0, r1 in runs(extent > NONE):
                if _agrees(many, r0, r1, [(p - start, q - start) for p, q in blends]):
                    extent[r0 : r1 + 1] = STRONG
                if (r0 == 0 and start > 0) or (r1 == len(extent) - 1 and end < len(frames)):
                    extent[r0 : r1 + 1] = np.minimum(extent[r0 : r1 + 1], WEAK)
            s0, s1 = max(start, lo), min(end, hi)
            codes[s0 - lo : s1 - lo] = np.maximum(
                codes[s0 - lo : s1 - lo], extent[s0 - start : s1 - start]
            )
        window.transitions = sorted(set(found))
        window.gradual = codes if codes.any() else None
        self._drop_flashes(video, frames, first, small)

    def _drop_flashes(
        self, video: Video, frames: np.ndarray, first: int, small: np.ndarray
    ) -> None:
        """Hard cuts (the adaptive detector's, TransNetV2's) that are flashes are dropped."""
        window, meta = video.window, video.metadata
        assert window is not None and window.transitions is not None and meta is not None
        cuts = [a - first for a, b in window.transitions if a == b + 1]
        flashed = {c + first for c in flashes(frames, meta.fps, cuts, small)}
        window.transitions = [t for t in window.transitions if t[0] not in flashed]


def detector_for(name: str, threshold: float | None = None) -> VideoStage:
    """The CPU cut detector called ``name`` (``adaptive``, ``content``, ``histogram``,
    ``hybrid``), with its own threshold unless given."""
    kinds: dict[str, type[SceneDetectCuts]] = {
        "adaptive": AdaptiveDetector,
        "content": ContentDetector,
        "histogram": HistogramDetector,
        "hybrid": HybridDetector,
    }
    if name not in kinds:
        raise ValueError(f"unknown cut detector {name!r} (known: {', '.join(kinds)})")
    return kinds[name]() if threshold is None else kinds[name](threshold)  # type: ignore[call-arg]


__all__ = [
    "AdaptiveDetector",
    "ContentDetector",
    "HistogramDetector",
    "HybridDetector",
    "SceneDetectCuts",
    "changing_stretches",
    "detector_for",
]
