"""Shot detection in windows: the frames a window decodes (with context at the video's
ends), and the real detectors finding generated cuts and a crossfade."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.media.decode import probe
from conveyor.media.transitions import (
    GradualRuns,
    gradual_codes,
    merge_transitions,
)
from conveyor.samples.video import Segment, SyntheticVideo, write_video
from conveyor.stages.video.shots import (
    EXTENT_FLOOR,
    TRANSNET_CONTEXT,
    ShotFrameDecoder,
    ShotWindows,
    TransNetV2Detector,
    repeats_for,
    transitions_from_mask,
)
from conveyor.stages.video.split import ShotSplitter, SplitRules, scene_spans
from conveyor.tasks.video import Video, VideoTask
from tests.stages.video.shot_windows import detect, windowed


@pytest.fixture(scope="module")
def cuts_video(tmp_path_factory: pytest.TempPathFactory) -> SyntheticVideo:
    path = tmp_path_factory.mktemp("shots") / "cuts.mp4"
    segments = [Segment("pan", 3, 1), Segment("rings", 3, 2), Segment("checker", 3, 3)]
    return write_video(path, segments, width=160, height=90, fps=15, crossfades=None)


@pytest.fixture(scope="module")
def fade_video(tmp_path_factory: pytest.TempPathFactory) -> SyntheticVideo:
    path = tmp_path_factory.mktemp("shots") / "fade.mkv"
    segments = [Segment("shapes", 4, 4), Segment("plasma", 4, 5), Segment("pan", 3, 6)]
    return write_video(path, segments, width=160, height=90, fps=15, crossfades={0: 1.0})


@pytest.fixture(scope="module")
def transnet() -> TransNetV2Detector:
    detector = TransNetV2Detector()
    detector.setup(WorkerInfo("w", "TransNetV2Detector", "n"))
    return detector


def boundary_s(transition: tuple[int, int], fps: float) -> float:
    first, last = transition
    return (first + last + 1) / 2 / fps


def test_windows_cover_the_video_and_carry_context(cuts_video: SyntheticVideo) -> None:
    tasks = windowed(cuts_video, 2.0, TRANSNET_CONTEXT)
    spans = [(t.data.window.start, t.data.window.end) for t in tasks]  # type: ignore[union-attr]
    assert spans[0][0] == 0 and spans[-1][1] == cuts_video.num_frames
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    decoder = ShotFrameDecoder()
    first, last = tasks[0], tasks[-1]
    for task in (first, last):
        decoder.process(task)
    window = first.data.window
    assert window is not None and window.frames is not None
    assert window.frames.shape == (30 + 2 * TRANSNET_CONTEXT, 27, 48, 3)
    # before the video's first frame, the first frame is repeated (as TransNetV2 expects)
    assert all(np.array_equal(window.frames[i], window.frames[TRANSNET_CONTEXT]) for i in range(25))
    tail = last.data.window
    assert tail is not None and tail.frames is not None
    inside = tail.end - tail.start + TRANSNET_CONTEXT
    assert np.array_equal(tail.frames[-1], tail.frames[inside - 1])


def test_the_first_windows_can_end_where_a_first_clip_is_certain(
    cuts_video: SyntheticVideo,
) -> None:
    tasks = windowed(cuts_video, 2.0, TRANSNET_CONTEXT, first_end_s=3.4)  # 51 frames
    spans = [(t.data.window.start, t.data.window.end) for t in tasks]  # type: ignore[union-attr]
    assert spans[:3] == [(0, 26), (26, 51), (51, 81)]
    assert spans[-1][1] == cuts_video.num_frames


@pytest.mark.parametrize("first_end_s", [0.0, 3.4])
def test_transnetv2_finds_every_cut_within_a_frame(
    cuts_video: SyntheticVideo, transnet: TransNetV2Detector, first_end_s: float
) -> None:
    found = detect(cuts_video, transnet, ShotFrameDecoder(), 2.0, TRANSNET_CONTEXT, first_end_s)
    boundaries = [boundary_s(t, cuts_video.fps) for t in found]
    assert len(boundaries) == len(cuts_video.cuts_s)
    for cut, boundary in zip(cuts_video.cuts_s, sorted(boundaries), strict=True):
        assert abs(cut - boundary) <= 1.5 / cuts_video.fps


def test_transnetv2_finds_a_crossfade(
    fade_video: SyntheticVideo, transnet: TransNetV2Detector
) -> None:
    found = detect(fade_video, transnet, ShotFrameDecoder(), 3.0, TRANSNET_CONTEXT)
    boundaries = [boundary_s(t, fade_video.fps) for t in found]
    (start, end), cut = fade_video.fades_s[0], fade_video.cuts_s[0]
    assert any(start - 0.3 <= b <= end + 0.3 for b in boundaries)
    assert any(abs(b - cut) <= 1.5 / fade_video.fps for b in boundaries)


def test_detection_then_splitting_keeps_clips_inside_shots(
    cuts_video: SyntheticVideo, transnet: TransNetV2Detector
) -> None:
    found_windows = windowed(cuts_video, 2.0, TRANSNET_CONTEXT)
    decoder, detector = ShotFrameDecoder(), transnet
    splitter = ShotSplitter(SplitRules(min_len_s=1, max_len_s=10, crop_s=0.2))
    splitter.setup(None)
    chunks = []
    for task in reversed(found_windows):  # any order
        decoder.process(task)
        detector.process_batch([task])
        chunks += [t.data for t in splitter.process(task)]
    spans = [c.span for chunk in chunks for c in chunk.clips]
    assert len(spans) == 3
    for start, end in spans:
        assert not any(start < cut < end for cut in cuts_video.cuts_s)


def test_shots_of_exactly_the_shortest_clip_plus_crops_are_kept(
    tmp_path: Path, transnet: TransNetV2Detector
) -> None:
    """Three 3 s shots at 24 fps, cropped 0.5 s at each end: three 2.0 s clips, each
    ending at its shot's last frame less the crop (the frame before a cut was lost, and
    the first two shots fell under the 2 s minimum)."""
    truth = write_video(
        tmp_path / "three.mp4",
        [Segment("pan", 3, 1), Segment("rings", 3, 2), Segment("checker", 3, 3)],
        width=160,
        height=90,
        fps=24,
    )
    found = detect(truth, transnet, ShotFrameDecoder(), 5.0, TRANSNET_CONTEXT)
    assert found == [(72, 71), (144, 143)]  # hard cuts before frames 72 and 144
    spans = scene_spans(found, truth.num_frames, SplitRules(2.0, 10.0, "stride", 0.5), 24)
    assert spans == [(12, 60), (84, 132), (156, 204)]


def test_a_slow_source_is_shown_to_transnetv2_at_about_25_fps(
    tmp_path: Path, transnet: TransNetV2Detector
) -> None:
    """At 5 fps every frame changes a lot: shown each frame once, TransNetV2 missed this
    plasma-to-rings cut; shown each five times (and scored by the highest copy), it finds it
    at its frame."""
    segments = [Segment("plasma", 4, 11), Segment("rings", 4, 12)]
    truth = write_video(tmp_path / "timelapse.mp4", segments, width=320, height=180, fps=5)
    assert detect(truth, transnet, ShotFrameDecoder(), 20.0, TRANSNET_CONTEXT) == [(20, 19)]
    assert repeats_for(5) == 5 and repeats_for(2) == 12 and repeats_for(12) == repeats_for(8) == 1


def test_setting_up_transnetv2_changes_nothing_process_wide() -> None:
    """The package's constructor seeds every random generator and turns on deterministic
    algorithms, which imports torch's compiler (2 s of each worker's start). In a fresh
    process, so that nothing else has imported it."""
    script = """
import random, sys
import numpy as np, torch
from conveyor.cluster import WorkerInfo
from conveyor.stages.video.shots import TransNetV2Detector
random.seed(7); np.random.seed(7); torch.manual_seed(7)
TransNetV2Detector().setup(WorkerInfo("w", "TransNetV2Detector", "n"))
print(torch.are_deterministic_algorithms_enabled(), "torch._dynamo" in sys.modules,
      random.random() == random.Random(7).random(), torch.initial_seed())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False", "False", "True", "7"]


def test_transitions_group_runs_of_marked_frames() -> None:
    scores = np.array([0.1, 0.9, 0.2, 0.7, 0.8, 0.9, 0.1, 0.95])
    # a lone mark is the last frame before a cut; a run's first frame ends its shot too
    assert transitions_from_mask(scores > 0.5, 100) == [(102, 101), (104, 105), (108, 107)]
    assert transitions_from_mask(np.zeros(5, bool), 0) == []


def gradual_transitions(many: np.ndarray, fps: float, cut: int | None = None) -> list:
    """What GradualRuns makes of all-frames scores fed in windows of ``cut`` frames."""
    codes = gradual_codes(many, EXTENT_FLOOR, 0.2)
    runs, found, step = GradualRuns(fps), [], cut or len(many)
    for start in range(0, len(many), step):
        end = min(start + step, len(many))
        found += runs.feed(start, codes[start:end], end)
    return found + runs.finish()


def test_the_all_frames_head_gives_a_dissolve_its_whole_length_and_leaves_cuts_alone() -> None:
    many = np.zeros(40)
    many[4:8] = [0.1, 0.9, 0.8, 0.1]  # two frames around a hard cut: not a dissolve
    many[20:32] = [0.06, 0.1, 0.25, 0.3, 0.35, 0.3, 0.25, 0.21, 0.1, 0.06, 0.03, 0.0]
    many[36] = 0.5  # a lone mark of the all-frames head: not a cut
    assert gradual_transitions(many, 10) == [(21, 29)]
    # four frames above 0.2 make a dissolve, three do not
    three = many.copy()
    three[[22, 26, 27]] = 0.15
    assert gradual_transitions(three, 10) == []
    # the same run cut by window borders anywhere is the same transition
    for cut in (3, 7, 21, 22, 25, 30):
        assert gradual_transitions(many, 10, cut) == [(21, 29)], cut


def test_a_gradual_run_longer_than_a_transition_is_content_not_a_shot_boundary() -> None:
    """A scrolling gradient that the all-frames head scored as a 13.8 s "dissolve" took its
    whole shot with it; a run longer than MAX_TRANSITION_S (3 s) is content, however it
    falls across windows, and the runs on either side of it are judged on their own."""
    fps = 30.0
    many = np.zeros(900)
    many[100:130] = 0.5  # a 1 s dissolve
    many[300:715] = 0.4  # 13.8 s of gradual change
    many[800:891] = 0.5  # 3.03 s: one frame too long
    for cut in (None, 150, 200, 301):
        assert gradual_transitions(many, fps, cut) == [(101, 129)], cut
    runs = GradualRuns(fps)
    codes = gradual_codes(many, EXTENT_FLOOR, 0.2)
    assert runs.feed(0, codes[:200], 200) == [(101, 129)] and runs.holding is None
    runs.feed(200, codes[200:350], 350)
    assert runs.holding == 300  # open, and still short enough to become a transition
    runs.feed(350, codes[350:390], 390)
    assert runs.holding == 300  # 90 frames: 3 s
    runs.feed(390, codes[390:450], 450)  # 150 frames: content, nothing held any more
    assert runs.holding is None
    with pytest.raises(ValueError, match="gradual codes"):
        runs.feed(450, codes[450:460], 470)


def test_merged_transitions_absorb_cuts_inside_a_dissolve() -> None:
    assert merge_transitions([(30, 29), (21, 29), (6, 5), (6, 5), (40, 39), (41, 40)]) == [
        (6, 5),
        (21, 29),
        (40, 39),
        (41, 40),
    ]


def test_a_window_keeps_its_own_part_of_a_transition_across_its_border() -> None:
    """Runs are found over the context too: one crossing the border between two windows
    is split between them with no frame lost or doubled, and a cut marked in the context
    belongs to the window whose frames hold the mark."""
    mask = np.zeros(30, bool)
    mask[8:14] = True  # a dissolve over frames 8-13 of the whole array
    mask[3] = mask[20] = True  # hard cuts after frames 3 and 20
    whole = transitions_from_mask(mask, 100)
    assert whole == [(104, 103), (109, 113), (121, 120)]
    first = transitions_from_mask(mask, 100, own=(0, 11))
    second = transitions_from_mask(mask, 100, own=(11, 30))
    assert first == [(104, 103), (109, 110)] and second == [(111, 113), (121, 120)]
    # a run whose first frame is the last of a window: that window has the cut after it
    # (even should the next one score the frames past it otherwise), the next one the rest
    assert transitions_from_mask(mask, 100, own=(0, 9)) == [(104, 103), (109, 108)]
    assert transitions_from_mask(mask, 100, own=(9, 30))[0] == (109, 113)
    assert scene_spans([(9, 8), (9, 13)], 30, SplitRules(0.1, 10.0, "stride", 0.0), 10) == [
        (0, 9),
        (14, 30),
    ]


def test_transnetv2_finds_dissolves_its_single_frame_head_misses(
    tmp_path: Path, transnet: TransNetV2Detector
) -> None:
    """Two 2 s dissolves at 24 fps: the single-frame head finds neither; with the
    all-frames head each is found nearly whole, and the clips stay clear of both."""
    segments = [Segment("rings", 6, 1), Segment("bars", 6, 2), Segment("checker", 6, 3)]
    truth = write_video(
        tmp_path / "dissolves.mp4", segments, width=160, height=90, fps=24,
        crossfades={0: 2.0, 1: 2.0},
    )  # fmt: skip
    single_only = TransNetV2Detector(gradual_threshold=None)
    single_only.setup(WorkerInfo("w", "TransNetV2Detector", "n"))
    assert detect(truth, single_only, ShotFrameDecoder(), 5.0, TRANSNET_CONTEXT) == []
    found = detect(truth, transnet, ShotFrameDecoder(), 5.0, TRANSNET_CONTEXT)
    out = {f for first, last in found for f in range(first, last + 1)}
    for start_s, end_s in truth.fades_s:
        fade = set(range(round(start_s * truth.fps), round(end_s * truth.fps)))
        assert len(fade & out) >= 0.8 * len(fade)
    spans = scene_spans(found, truth.num_frames, SplitRules(1.0, 10.0, "stride", 0.5), 24)
    assert len(spans) == 3
    for start, end in spans:
        assert not any(start < b * truth.fps and end > a * truth.fps for a, b in truth.fades_s)


def test_detector_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        TransNetV2Detector(threshold=1.5)
    with pytest.raises(ValueError, match="gradual_threshold"):
        TransNetV2Detector(gradual_threshold=0.01)
    with pytest.raises(ValueError):
        ShotWindows(window_s=0)
    with pytest.raises(ValueError, match="first_end_s"):
        ShotWindows(first_end_s=-1)
    with pytest.raises(ValueError):
        ShotFrameDecoder(size=(48, 27), width=64)


def test_a_window_without_frames_is_one_still_picture_and_the_video_goes_on(
    tmp_path: Path, transnet: TransNetV2Detector
) -> None:
    """A screen recording may show nothing new for seconds (no frame at all), and damage
    may leave a stretch undecodable: nothing is detected there, and the clips over it fail
    on their own when transcoded."""
    truth = write_video(tmp_path / "short.mp4", [Segment("pan", 1, 1)], width=64, height=48, fps=10)
    video = Video(str(truth.path), "short.mp4", probe(str(truth.path)))
    (window,) = ShotWindows(10.0, 0).process_video(video)
    assert window.window is not None
    window.window.start, window.window.end = 500, 600  # no frame of the file is there
    task = VideoTask(data=window)
    ShotFrameDecoder().process(task)
    assert not task.data.failed
    frames = window.window.frames
    assert frames is not None and frames.shape == (100, 27, 48, 3) and not frames.any()
    transnet.process_batch([task])
    assert window.window.transitions == []


def test_a_damaged_window_keeps_what_decoded(tmp_path: Path) -> None:
    from .test_probe import damage_packets

    segments = [Segment("pan", 2, 1), Segment("shapes", 2, 2), Segment("noise", 2, 3)]
    truth = write_video(tmp_path / "cuts.mp4", segments, fps=10)  # a key frame every 2 s
    damage_packets(truth.path, tmp_path / "damaged.mp4", slice(2, 20))  # most of 0-2 s
    (task,) = windowed(truth, 10, 0)
    task.data.path = str(tmp_path / "damaged.mp4")  # damaged since it was probed
    ShotFrameDecoder().process(task)
    assert not task.data.failed
    window = task.data.window
    assert window is not None and window.frames is not None
    undamaged = ShotFrameDecoder()
    (clean,) = windowed(truth, 10, 0)
    undamaged.process(clean)
    assert clean.data.window is not None and clean.data.window.frames is not None
    assert np.array_equal(window.frames[:2], clean.data.window.frames[:2])
    assert np.array_equal(window.frames[20:], clean.data.window.frames[20:])  # after it
