"""The CPU shot detectors: PySceneDetect's detectors through our windows find what
PySceneDetect finds in one pass, and the hybrid asks TransNetV2 about gradual stretches only
(dissolves found, steady gradual change left alone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.media.decode import probe
from conveyor.pipelines.video import DEFAULT_THRESHOLDS
from conveyor.samples.video import Segment, SyntheticVideo, render_frames, write_video
from conveyor.stages.video import cut_detectors
from conveyor.stages.video.cut_detectors import (
    SCENEDETECT_WIDTH,
    AdaptiveDetector,
    ContentDetector,
    HistogramDetector,
    HybridDetector,
    changing_stretches,
    detector_for,
)
from conveyor.stages.video.shots import TRANSNET_CONTEXT, ShotFrameDecoder, ShotWindows
from conveyor.tasks.video import Video, VideoTask
from tests.stages.video.shot_windows import detect as detect_in_windows


@pytest.fixture(scope="module")
def cuts_video(tmp_path_factory: pytest.TempPathFactory) -> SyntheticVideo:
    """Wider than PySceneDetect's 256 pixels, so that both shrink the frames."""
    segments = [
        Segment("pan", 2.5, 1), Segment("fast", 2.5, 2), Segment("rings", 2, 3),
        Segment("shapes", 2, 4), Segment("checker", 2.5, 5),
    ]  # fmt: skip
    path = tmp_path_factory.mktemp("cuts") / "cuts.mp4"
    return write_video(path, segments, width=512, height=288, fps=24)


@pytest.fixture(scope="module")
def texture_video(tmp_path_factory: pytest.TempPathFactory) -> SyntheticVideo:
    """A moving checker texture at 640x360 in which the adaptive detector cut twice when its
    frames were shrunk by FFmpeg's filter rather than as PySceneDetect shrinks them."""
    segments = [
        Segment("slowpan", 2.0, 390464), Segment("checker", 3.3667, 422474),
        Segment("rings", 2.0, 953871),
    ]  # fmt: skip
    path = tmp_path_factory.mktemp("texture") / "texture.mp4"
    return write_video(path, segments, width=640, height=360, fps=30)


@pytest.fixture(scope="module")
def hybrid() -> HybridDetector:
    detector = HybridDetector()
    detector.setup(WorkerInfo("w", "HybridDetector", "n"))
    return detector


def detect(truth: SyntheticVideo, detector: object, window_s: float) -> list[tuple[int, int]]:
    """Every transition the splitter would take, from frames decoded as PySceneDetect's."""
    decoder = ShotFrameDecoder(size=None, width=SCENEDETECT_WIDTH, scaler="opencv")
    return detect_in_windows(truth, detector, decoder, window_s, TRANSNET_CONTEXT)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (AdaptiveDetector, "AdaptiveDetector"),
        (ContentDetector, "ContentDetector"),
        (HistogramDetector, "HistogramDetector"),
    ],
)
@pytest.mark.parametrize("video", ["cuts_video", "texture_video"])
def test_windows_find_the_cuts_pyscenedetect_finds_in_one_pass(
    video: str, ours: type, theirs: str, request: pytest.FixtureRequest
) -> None:
    """2 s windows (every cut near a border or in a context) against scenedetect.detect on
    the whole file, its own decode and downscale: the same cuts, at the same frames."""
    import scenedetect
    import scenedetect.detectors

    cuts_video: SyntheticVideo = request.getfixturevalue(video)
    scenes = scenedetect.detect(str(cuts_video.path), getattr(scenedetect.detectors, theirs)())
    reference = [start.frame_num for start, _ in scenes[1:]]
    found = [first for first, _ in detect(cuts_video, ours(), 2.0)]
    assert found == reference  # the frames PySceneDetect makes, the cuts it finds
    cuts = [round(c * cuts_video.fps) for c in cuts_video.cuts_s]
    assert sum(any(abs(f - c) <= 1 for f in found) for c in cuts) >= 2, (found, cuts)


def test_the_hybrid_finds_a_dissolve_the_adaptive_detector_misses(
    tmp_path: Path, hybrid: HybridDetector
) -> None:
    segments = [Segment("pan", 4, 1), Segment("shapes", 4, 2), Segment("rings", 3, 3)]
    truth = write_video(
        tmp_path / "dissolve.mp4", segments, width=320, height=180, fps=30, crossfades={0: 1.0}
    )
    (start_s, end_s), cut = truth.fades_s[0], round(truth.cuts_s[0] * truth.fps)
    fade = set(range(round(start_s * truth.fps), round(end_s * truth.fps)))
    adaptive = detect(truth, AdaptiveDetector(), 20.0)
    assert [first for first, _ in adaptive] == [cut]  # the hard cut only
    found = detect(truth, hybrid, 20.0)
    assert any(abs(first - cut) <= 1 for first, _ in found)
    inside = {f for first, last in found for f in range(first, last + 1)}
    assert len(fade & inside) >= 0.7 * len(fade)
    assert len(found) == 2


@pytest.mark.parametrize("kind", ["gradient", "slowpan", "zoom", "drift", "fast"])
def test_steady_gradual_change_asks_transnetv2_nothing(kind: str) -> None:
    frames = np.stack(list(render_frames([Segment(kind, 8, 3)], 256, 144, 30)))
    assert changing_stretches(frames, 30.0) == []


def test_a_dissolve_is_a_changing_stretch_unless_a_cut_explains_it() -> None:
    segments = [Segment("pan", 4, 1), Segment("shapes", 4, 2)]
    frames = np.stack(list(render_frames(segments, 256, 144, 30, {0: 1.0})))
    stretches = changing_stretches(frames, 30.0)
    assert len(stretches) == 1
    first, last = stretches[0]
    # the dissolve, frames 90-119, is inside what TransNetV2 sees (with its context)
    assert first - TRANSNET_CONTEXT <= 90 and last >= 110
    assert changing_stretches(frames, 30.0, cuts=[100]) == []
    # at a frame or two a second (a time-lapse) the sides hold no frame: nothing stands out
    assert changing_stretches(frames[::30], 1.0) == []
    assert len(changing_stretches(frames[::3], 10.0)) == 1


def test_the_hybrid_never_asks_about_frames_repeated_past_the_video(
    cuts_video: SyntheticVideo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first window's context repeats the first frame: still, then a jump into moving
    content, which must not look like a gradual change starting the video."""
    seen: list[int] = []

    def spy(
        frames: np.ndarray,
        fps: float,
        cuts: list[int] = (),  # type: ignore[assignment]
        small: np.ndarray | None = None,
    ) -> list[tuple[int, int]]:
        assert small is not None and len(small) == len(frames)
        seen.append(len(frames))
        return []

    monkeypatch.setattr(cut_detectors, "changing_stretches", spy)
    detect(cuts_video, HybridDetector(), 20.0)
    assert seen == [cuts_video.num_frames]


def test_the_hybrid_loads_transnetv2_only_when_a_stretch_asks(tmp_path: Path) -> None:
    detector = HybridDetector()
    detector.setup(WorkerInfo("w", "HybridDetector", "n"))
    steady = [Segment("slowpan", 3, 1), Segment("rings", 3, 2)]
    cut = write_video(tmp_path / "cut.mp4", steady, width=320, height=180, fps=30)
    assert len(detect(cut, detector, 20.0)) == 1  # the cut; nothing doubtful
    assert detector.transnet._model is None
    segments = [Segment("pan", 3, 1), Segment("shapes", 3, 2)]
    truth = write_video(
        tmp_path / "fade.mp4", segments, width=320, height=180, fps=30, crossfades={0: 1.0}
    )
    assert len(detect(truth, detector, 20.0)) == 1  # the dissolve, from TransNetV2
    assert detector.transnet._model is not None


def test_the_hybrid_asks_transnetv2_about_a_doubtful_sag(
    hybrid: HybridDetector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 s dissolve between two plasmas of alike palettes (frames 90-120): they change as
    much as it does, and their variance swings by more than it sags, so only TransNetV2,
    asked about the sag, finds it."""
    from tests.stages.video.test_dissolves import SWINGING

    segments, crossfades = SWINGING
    truth = write_video(
        tmp_path / "plasmas.mp4", segments, width=256, height=144, fps=30, crossfades=crossfades
    )
    ((start, end),) = detect(truth, hybrid, 20.0)
    assert 84 <= start <= 92 and 118 <= end <= 125
    monkeypatch.setattr(cut_detectors, "doubtful_sags", lambda *args: [])
    assert detect(truth, hybrid, 20.0) == []


def test_a_doubtful_sag_and_weak_transnetv2_evidence_agree_on_a_dissolve(
    hybrid: HybridDetector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 s dissolve from a plasma into a pan (frames 77-107): TransNetV2 scores it at most
    about 0.12, under the 0.3 its evidence needs alone, but the sag agrees."""
    segments = [Segment("plasma", 3.5761, 631117), Segment("pan", 4.0, 293929)]
    truth = write_video(
        tmp_path / "weak.mp4", segments, width=256, height=144, fps=30, crossfades={0: 1.0}
    )
    ((start, end),) = detect(truth, hybrid, 20.0)
    assert 74 <= start <= 92 and 100 <= end <= 110
    monkeypatch.setattr(cut_detectors, "SAG_AGREES", 1.0)  # TransNetV2 alone
    assert detect(truth, hybrid, 20.0) == []


def test_detectors_are_chosen_by_name_and_validated() -> None:
    for name in ("adaptive", "content", "histogram", "hybrid"):
        stage = detector_for(name, DEFAULT_THRESHOLDS[name])
        assert stage.threshold == DEFAULT_THRESHOLDS[name]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown cut detector 'sparkles'"):
        detector_for("sparkles")
    with pytest.raises(ValueError, match="threshold"):
        HistogramDetector(threshold=0)
    with pytest.raises(ValueError, match="threshold"):
        ContentDetector(threshold=300)
    with pytest.raises(ValueError, match="AdaptiveDetector"):
        AdaptiveDetector(window_width=0)
    with pytest.raises(ValueError, match="min_scene_len"):
        AdaptiveDetector(min_scene_len=0)


def test_a_window_without_decoded_frames_is_a_clear_error(cuts_video: SyntheticVideo) -> None:
    video = Video(str(cuts_video.path), "cuts.mp4", probe(str(cuts_video.path)))
    part = ShotWindows(20.0, TRANSNET_CONTEXT).process_video(video)[0]
    with pytest.raises(ValueError, match=r"cuts\.mp4: no decoded window"):
        AdaptiveDetector().process(VideoTask(data=part))


@pytest.mark.parametrize("kind", ["shapes", "plasma", "zoom", "pan"])
def test_sharp_cuts_find_cuts_between_scenes_of_one_kind(kind: str) -> None:
    """Two scenes of one pattern change the picture by as much as their own motion each
    frame, but all of it at once at the cut: the jump stands out from its neighbours'."""
    from conveyor.samples.video import Segment

    segments = [Segment(kind, 2, 11), Segment(kind, 2, 12), Segment(kind, 2, 13)]
    small = cut_detectors.shrink(np.stack(list(render_frames(segments, 256, 144, 30))))
    assert cut_detectors.sharp_cuts(small, 30.0) == [60, 120]


def test_sharp_cuts_find_a_cut_inside_a_whip_pan_on_their_coarse_grid() -> None:
    """Two fast-moving textures: every pixel changes each frame by nearly what the cut
    changes it by, so the pixels' test misses the cut; the grid of block means, where the
    motion averages away, still jumps at it."""
    from conveyor.samples.video import Segment

    segments = [Segment("fast", 2, 9), Segment("fast", 2, 29)]
    small = cut_detectors.shrink(np.stack(list(render_frames(segments, 256, 144, 30))))
    assert cut_detectors._sharp_jumps(small, 30.0) == []  # the pixels alone
    assert cut_detectors.sharp_cuts(small, 30.0) == [60]


@pytest.mark.parametrize("kind", ["fast", "pan", "drift", "zoom", "slowpan", "noise", "bars"])
def test_sharp_cuts_leave_motion_and_steady_change_alone(kind: str) -> None:
    from conveyor.samples.video import Segment

    frames = np.stack(list(render_frames([Segment(kind, 8, 5)], 256, 144, 30)))
    assert cut_detectors.sharp_cuts(cut_detectors.shrink(frames), 30.0) == []


def test_a_flash_is_not_a_cut_and_a_cut_into_black_still_is() -> None:
    """A bright frame or three in a shot: the picture comes back, so the jump is a flash
    (PySceneDetect's adaptive detector cuts there). A hard cut, and a cut into black that a
    fade leaves, go on to another picture or darken: they stay cuts."""
    from conveyor.samples.video import Segment

    segments = [Segment("flash", 6, 2), Segment("rings", 3, 3), Segment("black", 1, 0)]
    frames = np.stack(list(render_frames(segments, 256, 144, 30)))
    flashes_at, returns = [], []
    for i in range(1, 180):
        jump = np.abs(frames[i].astype(int) - frames[i - 1]).mean()
        if jump > 40:  # into a flash (lighter), or back out of it (darker)
            (flashes_at if frames[i].mean() > frames[i - 1].mean() else returns).append(i)
    assert flashes_at and len(returns) == len(flashes_at)  # the flash segment has flashes
    real = [180, 270]  # into rings, into black
    found = cut_detectors.flashes(frames, 30.0, [*flashes_at, *returns, *real])
    assert sorted(found) == sorted([*flashes_at, *returns])
