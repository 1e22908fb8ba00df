"""Transitions between shots: gradual ones bounded in length, and detections merged in order.

A detector marks hard cuts itself; for gradual transitions (dissolves, fades) it gives, per
frame, how strongly the frame looks like part of one (``gradual_codes``). Whether a run of
such frames is a transition is decided here, over the whole video, because one run can
cross a detection window's border: a dissolve or a fade through black lasts a bounded time
(``MAX_TRANSITION_S``), and a longer run of gradual change (a scrolling gradient, a slow
pan, a colour drift, a zoom) is content, kept as a shot. TransNetV2's all-frames head took
a 13.8 s scrolling gradient whole as a "dissolve", and that shot gave no clip at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the longest gradual transition: the generated dissolves and fades run 0.3-3 s, and
#: TransNetV2's all-frames head spans at most their length (28 frames for a 1 s dissolve,
#: 55 for 2 s at 30 fps); a run of gradual change that lasts longer is content
MAX_TRANSITION_S = 3.0
#: a frame's gradual evidence: none, weak (part of a run's extent), strong (counts toward
#: the run being a transition)
NONE, WEAK, STRONG = 0, 1, 2
#: strong frames that make a run a transition; around a hard cut TransNetV2's all-frames
#: head marks a frame or two (on 43 generated cuts: 0-2 above 0.3, once 5)
GRADUAL_MIN_FRAMES = 4

Transition = tuple[int, int]


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Runs of true values as inclusive ``(first, last)`` index pairs."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def gradual_codes(scores: np.ndarray, floor: float, strong: float) -> np.ndarray:
    """Per-frame codes from a score of "inside a gradual transition": ``WEAK`` above
    ``floor`` (the run's extent), ``STRONG`` above ``strong``."""
    codes = np.where(scores > floor, WEAK, NONE).astype(np.uint8)
    codes[scores > strong] = STRONG
    return codes


def merge_transitions(transitions: list[Transition]) -> list[Transition]:
    """Sorted, with overlapping or touching transitions joined (a hard cut ``(c, c - 1)``
    inside a dissolve is part of it)."""
    merged: list[Transition] = []
    for first, last in sorted(transitions):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


@dataclass
class GradualRuns:
    """Runs of gradual evidence over one video, fed window by window in order.

    A run with at least ``min_strong`` strong frames and at most ``max_s`` seconds long is a
    transition: its frames after the first belong to neither shot (the first is the ending
    shot's last, as TransNetV2 marks it). A longer run is given up as soon as it is too long;
    the cuts a detector marked inside it stay cuts.
    """

    fps: float
    min_strong: int = GRADUAL_MIN_FRAMES
    max_s: float = MAX_TRANSITION_S
    _first: int | None = None
    _last: int = -1
    _strong: int = 0

    @property
    def max_frames(self) -> int:
        return max(1, round(self.max_s * self.fps))

    @property
    def holding(self) -> int | None:
        """The first frame of the run still open that may become a transition: no clip may
        be made past it yet."""
        if self._first is None or self._last - self._first + 1 > self.max_frames:
            return None
        return self._first

    def feed(self, start: int, codes: np.ndarray | None, end: int) -> list[Transition]:
        """Frames ``[start, end)`` with their codes (None: no evidence); the transitions of
        the runs this closes."""
        out: list[Transition] = []
        if codes is None or not codes.any():
            return self._close(out)
        if len(codes) != end - start:
            raise ValueError(f"{len(codes)} gradual codes for frames [{start}, {end})")
        pieces = runs(codes > NONE)
        if pieces[0][0] != 0 or self._last != start - 1:
            self._close(out)
        for a, b in pieces:
            if self._first is None:
                self._first = start + a
            self._last = start + b
            self._strong += int(np.count_nonzero(codes[a : b + 1] == STRONG))
            if b < len(codes) - 1:
                self._close(out)
        return out

    def finish(self) -> list[Transition]:
        """The video ended: the open run's transition, if it is one."""
        return self._close([])

    def _close(self, out: list[Transition]) -> list[Transition]:
        first, last = self._first, self._last
        if (
            first is not None
            and self._strong >= self.min_strong
            and last - first + 1 <= self.max_frames
        ):
            out.append((first + 1, last) if first < last else (first + 1, first))
        self._first, self._strong = None, 0
        return out
