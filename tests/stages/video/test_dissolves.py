"""Dissolves from the sag of the picture's variance (``conveyor.media.dissolves``): found
between two moving pictures of one kind and over the longest length, never in steady
gradual change, flashes or motion, the same however the video is cut into windows, and
never after the splitter has made clips past them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conveyor.media.dissolves import (
    DOUBT_TOLERANCE,
    FIT_TOLERANCE,
    MIN_LEVEL,
    VarianceDissolves,
    _fits,
    doubtful_sags,
    fit_dissolve,
    frame_variance,
)
from conveyor.media.transitions import MAX_TRANSITION_S
from conveyor.samples.video import Segment, render_frames
from conveyor.stages.video.cut_detectors import shrink
from conveyor.stages.video.split import ShotSplitter, SplitRules
from conveyor.tasks.video import FrameWindow, Video, VideoMetadata, VideoTask

FPS = 30.0


def variances(segments: list[Segment], crossfades: dict[int, float] | None = None) -> np.ndarray:
    """Each frame's variance, measured as the hybrid detector measures it."""
    frames = np.stack(list(render_frames(segments, 160, 90, FPS, crossfades)))
    return frame_variance(shrink(frames))


def found(values: np.ndarray, window: int = 600) -> list[tuple[int, int]]:
    fit = VarianceDissolves(FPS)
    out: list[tuple[int, int]] = []
    for start in range(0, len(values), window):
        end = min(len(values), start + window)
        out += fit.feed(start, values[start:end], end)
    return out + fit.finish()


@pytest.mark.parametrize(
    ("first", "second", "seconds"),
    [
        (Segment("plasma", 5, 1), Segment("plasma", 5, 2), 2.0),  # one kind: change hides it
        (Segment("rings", 5, 3), Segment("shapes", 5, 4), MAX_TRANSITION_S),
        (Segment("noise", 5, 5), Segment("checker", 5, 6), 1.0),
    ],
)
def test_a_dissolve_is_found_where_it_blends(
    first: Segment, second: Segment, seconds: float
) -> None:
    values = variances([first, second], {0: seconds})
    start = round((first.duration_s - seconds) * FPS)  # the blend's first frame
    end = start + round(seconds * FPS)
    (dissolve,) = found(values)
    # it covers the blend (to a frame or two), and takes at most 0.3 s of the shots with it
    assert start - 9 <= dissolve[0] <= start + 2 and end - 2 <= dissolve[1] <= end + 9


@pytest.mark.parametrize("kind", ["drift", "slowpan", "zoom", "gradient", "fast", "flash", "pan"])
def test_steady_change_motion_and_flashes_are_no_dissolve(kind: str) -> None:
    assert found(variances([Segment(kind, 14, 7)])) == []


def test_hard_cuts_are_no_dissolve() -> None:
    segments = [Segment("plasma", 3, 1), Segment("rings", 3, 2), Segment("noise", 3, 3)]
    assert found(variances(segments)) == []


#: two plasmas of alike palettes whose variance swings by more than the 1 s dissolve between
#: them sags: the sag's model, which takes each shot's level as steady, cannot decide it
SWINGING = ([Segment("plasma", 4.0041, 872861), Segment("plasma", 4.0, 872882)], {0: 1.0})


def test_a_sag_between_swinging_shots_is_doubtful_not_a_dissolve() -> None:
    values = variances(*SWINGING)
    assert found(values) == []
    ((start, end),) = doubtful_sags(values, FPS)
    assert start <= 105 and end >= 110 and end - start <= 1.5 * FPS  # the blend is 90-120
    assert doubtful_sags(values, FPS, cuts=[100]) == []  # a cut there explains the sag


def test_a_sag_the_model_decides_is_not_doubtful() -> None:
    values = variances([Segment("plasma", 5, 1), Segment("plasma", 5, 2)], {0: 2.0})
    assert len(found(values)) == 1 and doubtful_sags(values, FPS) == []
    # between steady shots a sag that fits a parabola only loosely is no dissolve, and not
    # doubtful: a ramp down and straight back up, 0.67 s
    ramp = np.full(400, 1000.0, np.float32)
    ramp[180:200] = 1000 - 500 * np.arange(1, 21) / 20
    assert FIT_TOLERANCE < _fits(ramp, 180, 199, FPS)[0][0] <= DOUBT_TOLERANCE
    assert found(ramp) == [] and doubtful_sags(ramp, FPS) == []


@pytest.mark.parametrize("kind", ["drift", "gradient", "slowpan", "zoom", "fast", "flash"])
def test_steady_change_and_motion_leave_no_doubtful_sag(kind: str) -> None:
    assert doubtful_sags(variances([Segment(kind, 8, 5)]), FPS) == []


def test_windows_of_any_size_find_what_one_pass_finds() -> None:
    values = variances(
        [Segment("plasma", 6, 1), Segment("plasma", 6, 2), Segment("rings", 6, 3)],
        {0: 1.0, 1: 2.5},
    )
    whole = found(values, window=len(values))
    assert len(whole) == 2
    for window in (25, 97, 300):
        assert found(values, window) == whole


def test_a_possible_dissolve_holds_the_clips_back_until_it_is_decided() -> None:
    values = variances([Segment("plasma", 5, 1), Segment("plasma", 5, 2)], {0: 2.0})
    start = round(3.0 * FPS)
    fit = VarianceDissolves(FPS)
    middle = start + 30  # inside the blend: the sag has begun
    assert fit.feed(0, values[:middle], middle) == []
    held = fit.holding
    assert held is not None and held <= start
    (dissolve,) = fit.feed(middle, values[middle:], len(values)) + fit.finish()
    assert dissolve[0] >= held  # the clips made up to the hold stay as they are


def test_nothing_held_or_computed_where_no_window_measured_variances() -> None:
    fit = VarianceDissolves(FPS)
    assert fit.feed(0, None, 600) == [] and fit.feed(600, None, 900) == []
    assert fit.holding is None and fit.finish() == []


def test_flat_pictures_and_unmeasured_frames_fit_nothing() -> None:
    flat = np.full(300, MIN_LEVEL / 2, np.float32)
    flat[140:160] = MIN_LEVEL / 4
    assert fit_dissolve(flat, 140, 159, FPS) is None
    values = variances([Segment("plasma", 5, 1), Segment("plasma", 5, 2)], {0: 2.0})
    values[100:110] = np.nan  # a damaged stretch the detector could not measure
    assert found(values) == []


def test_variances_out_of_order_or_of_the_wrong_length_are_refused() -> None:
    fit = VarianceDissolves(FPS)
    with pytest.raises(ValueError, match="from 10, expected 0"):
        fit.feed(10, np.ones(5, np.float32), 15)
    with pytest.raises(ValueError, match="4 variances for frames"):
        fit.feed(0, np.ones(4, np.float32), 5)


def test_the_splitter_makes_no_clip_across_a_dissolve_it_finds_by_the_sag() -> None:
    values = variances([Segment("plasma", 6, 1), Segment("plasma", 6, 2)], {0: 2.0})
    n = len(values)
    meta = VideoMetadata(n / FPS, FPS, n, 160, 90, "h264")
    splitter = ShotSplitter(SplitRules(min_len_s=1.0, max_len_s=3.0, crop_s=0.0))
    clips, transitions = [], []
    edges = [*range(0, n, 150), n]
    for index, (start, end) in enumerate(itertools.pairwise(edges)):
        window = FrameWindow(index, len(edges) - 1, start, end, transitions=[])
        window.variance = values[start:end]
        video = Video("/v.mp4", "v.mp4", meta, window=window)
        for task in splitter.process(VideoTask(data=video)):
            clips += [c.frame_span for c in task.data.clips]
            transitions += task.data.transitions
    blend = (round(4.0 * FPS), round(6.0 * FPS))
    ((first, last),) = transitions  # the frames between the two shots
    assert blend[0] - 9 <= first <= blend[0] + 2 and blend[1] - 2 <= last <= blend[1] + 9
    assert len(clips) == 2 and all(b <= first or a > last for a, b in clips)
