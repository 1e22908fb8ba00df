"""The quality filter: dark, blank and frozen clips filtered, every moving pattern kept, scores
recorded in score-only mode, thresholds validated."""

from __future__ import annotations

import copy

import cv2
import numpy as np
import pytest

from conveyor.samples.video import KINDS, Segment, render_frames
from conveyor.stages.video.quality import QualityFilter, quality_scores
from conveyor.stages.video.transcode import ClipTranscoder
from conveyor.tasks.video import Clip, Video, VideoTask

from .conftest import Media

RATE = 2.0
FPS = 12
SCORES = {
    "quality_sharpness",
    "quality_brightness",
    "quality_dark_fraction",
    "quality_blank_fraction",
    "quality_frozen_fraction",
}


def sampled(segment: Segment, width: int = 320, height: int = 240) -> np.ndarray:
    """The segment's frames as the extractor keeps them: 2 per second, short side 224."""
    frames = list(render_frames([segment], width, height, FPS))
    picked = [frames[int((k + 0.5) / RATE * FPS)] for k in range(int(segment.duration_s * RATE))]
    scale = 224 / min(width, height)
    size = (round(width * scale), round(height * scale))
    return np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in picked])


def uniform(colour: tuple[int, int, int], count: int = 6) -> np.ndarray:
    frames = np.zeros((count, 224, 298, 3), np.uint8)
    frames[:] = colour
    return frames


def task_of(*frame_sets: np.ndarray) -> VideoTask:
    clips = [
        Clip(f"c{i}", "v.mp4", (i * 3.0, i * 3.0 + 3.0), (i * 36, i * 36 + 36), frames={RATE: f})
        for i, f in enumerate(frame_sets)
    ]
    return VideoTask(data=Video("v.mp4", "v.mp4", clips=clips))


def filtered(stage: QualityFilter, *frame_sets: np.ndarray) -> list[Clip]:
    task = task_of(*frame_sets)
    Media.ready(stage).process(task)
    return task.data.clips


#: the textured patterns (the shot detectors' negatives and black came later: a smooth
#: gradient in a palette of nearly equal luma is another test's subject, black is blank)
TEXTURED = [
    k for k in KINDS if k in ("pan", "shapes", "noise", "plasma", "rings", "bars", "checker")
]


@pytest.mark.parametrize("kind", TEXTURED)
def test_a_moving_pattern_is_kept_and_its_frozen_copy_filtered(kind: str) -> None:
    moving, frozen = filtered(
        QualityFilter(),
        sampled(Segment(kind, 3.0, seed=8)),  # seed 8: a palette of nearly equal luma
        sampled(Segment(kind, 3.0, seed=8, static=True)),
    )
    assert moving.filtered_by is None, moving.scores
    assert moving.scores["quality_frozen_fraction"] == 0.0
    assert moving.scores["quality_blank_fraction"] == 0.0
    assert moving.scores["quality_dark_fraction"] == 0.0
    assert frozen.filtered_by == "quality"
    assert frozen.scores["quality_frozen_fraction"] == 1.0
    assert set(moving.scores) == set(frozen.scores) == SCORES


def test_a_small_moving_marker_is_not_frozen() -> None:
    # colour bars: only a marker 1/20 of the height walks along the bottom
    scores = quality_scores(sampled(Segment("bars", 4.0), 1280, 720))
    assert scores["quality_frozen_fraction"] == 0.0


def test_slow_smooth_motion_is_not_frozen() -> None:
    """A gradient drifting 5 px per sampled frame changes no pixel by more than 24 levels,
    yet shifts every region by about 15: moving, not frozen (a slowly turning ring pattern
    was filtered as frozen)."""
    x = np.arange(320)
    rows = [128 + 120 * np.sin(2 * np.pi * (x - 5 * i) / 160) for i in range(6)]
    frames = np.stack([np.broadcast_to(r[None, :, None], (240, 320, 3)) for r in rows])
    frames = np.round(frames).astype(np.uint8)
    assert np.abs(np.diff(frames.astype(int), axis=0)).max() <= 24
    assert quality_scores(frames)["quality_frozen_fraction"] == 0.0


def test_black_grey_and_coloured_clips_are_filtered() -> None:
    black, grey, red = filtered(
        QualityFilter(), uniform((0, 0, 0)), uniform((128, 128, 128)), uniform((200, 30, 30))
    )
    assert all(clip.filtered_by == "quality" for clip in (black, grey, red))
    assert black.scores["quality_dark_fraction"] == 1.0
    assert black.scores["quality_brightness"] == 0.0
    assert grey.scores["quality_dark_fraction"] == 0.0
    assert grey.scores["quality_brightness"] == pytest.approx(128, abs=1)
    for clip in (black, grey, red):
        assert clip.scores["quality_blank_fraction"] == 1.0
        assert clip.scores["quality_sharpness"] == 0.0
        assert clip.frames == {}  # a rejected clip drops its frames


def test_fractions_count_frames_and_pairs() -> None:
    pattern = sampled(Segment("shapes", 3.0, seed=2))  # 6 frames, 5 pairs
    frames = pattern.copy()
    frames[:2] = 0  # two black frames
    frames[4] = frames[3]  # one repeated frame: pair 3-4 is frozen
    scores = quality_scores(frames)
    assert scores["quality_dark_fraction"] == pytest.approx(2 / 6)
    assert scores["quality_blank_fraction"] == pytest.approx(2 / 6)
    assert scores["quality_frozen_fraction"] == pytest.approx(2 / 5)  # 0-1 and 3-4
    assert quality_scores(pattern[:1])["quality_frozen_fraction"] == 0.0  # no pair
    (clip,) = filtered(QualityFilter(max_dark=0.3), frames)
    assert clip.filtered_by == "quality"
    (clip,) = filtered(QualityFilter(), frames)
    assert clip.filtered_by is None


def test_blur_is_scored_and_filters_only_when_asked() -> None:
    plasma = sampled(Segment("plasma", 2.0, seed=1))  # smooth: sharpness about 2
    noise = sampled(Segment("noise", 2.0, seed=1))  # hard edges: sharpness in the hundreds
    soft, sharp = filtered(QualityFilter(), plasma, noise)
    assert soft.scores["quality_sharpness"] < 10 < 100 < sharp.scores["quality_sharpness"]
    assert soft.filtered_by is None and sharp.filtered_by is None
    soft, sharp = filtered(QualityFilter(min_sharpness=20), plasma, noise)
    assert soft.filtered_by == "quality" and sharp.filtered_by is None


def test_score_only_keeps_everything_and_scores_it() -> None:
    clips = filtered(
        QualityFilter(score_only=True),
        uniform((0, 0, 0)),
        sampled(Segment("pan", 2.0, static=True)),
        sampled(Segment("pan", 2.0)),
    )
    assert all(clip.filtered_by is None and set(clip.scores) == SCORES for clip in clips)
    assert clips[0].scores["quality_dark_fraction"] == 1.0
    assert clips[1].scores["quality_frozen_fraction"] == 1.0


def test_clips_with_the_frames_the_transcoder_took(media: Media) -> None:
    # codec noise: the keyframes of a frozen noise pattern differ by a few levels
    source = media.video(
        "quality.mp4",
        [Segment("shapes", 2.0, 1), Segment("noise", 2.0, 4, static=True)],
        width=320,
        height=240,
        fps=FPS,
        gop=6,
    )
    task = media.task(source.path, media.metadata(source.path), [(0, 24), (24, 48)])
    list(media.ready(ClipTranscoder(encoder="libx264", frame_rates=[RATE])).process(task))
    stage = media.ready(QualityFilter())
    stage.release_frames = True
    stage.process(task)
    moving, frozen = task.data.clips
    assert moving.filtered_by is None and moving.scores["quality_frozen_fraction"] == 0.0
    assert frozen.filtered_by == "quality" and frozen.scores["quality_frozen_fraction"] == 1.0
    assert moving.frames == {} and frozen.frames == {}


def test_a_clip_without_frames_fails_alone() -> None:
    task = task_of(np.zeros((0, 224, 224, 3), np.uint8), sampled(Segment("rings", 2.0)))
    Media.ready(QualityFilter()).process(task)
    empty, fine = task.data.clips
    assert "no frames" in empty.errors["QualityFilter"] and not empty.scores
    assert fine.filtered_by is None and set(fine.scores) == SCORES
    failed = copy.deepcopy(task)
    failed.data.fail("VideoProbe", "broken")
    assert QualityFilter().process(failed) is failed  # a failed video passes through


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("frame_rate", 0.0),
        ("dark_luma", -1.0),
        ("dark_luma", 256.0),
        ("max_dark", 1.5),
        ("blank_std", -0.1),
        ("blank_std", float("nan")),
        ("max_blank", -0.1),
        ("frozen_diff", -1.0),
        ("frozen_diff", 300.0),
        ("max_frozen", 2.0),
        ("min_sharpness", -5.0),
        ("min_sharpness", float("nan")),
    ],
)
def test_thresholds_are_validated(setting: str, value: float) -> None:
    with pytest.raises(ValueError, match=setting):
        QualityFilter(**{setting: value})


def test_frames_must_be_rgb_uint8() -> None:
    with pytest.raises(ValueError, match="uint8"):
        quality_scores(np.zeros((2, 8, 8, 3), np.float32))
