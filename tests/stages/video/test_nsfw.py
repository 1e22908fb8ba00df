"""The NSFW filter with the packaged Open-NSFW model: synthetic patterns are safe, the
threshold filters, score-only records, the chunk's clips are scored apart."""

from __future__ import annotations

import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.resources import Resources
from conveyor.samples.video import KINDS, Segment, render_frames
from conveyor.stages.video.nsfw import NSFWFilter, choose_providers, packaged_model_path
from conveyor.tasks.video import Clip, Video, VideoTask

from .conftest import Media

RATE = 1.0


def pattern(kind: str, seed: int = 0, seconds: int = 2) -> np.ndarray:
    """One frame per second of a pattern, at 298 x 224 (the extractor's size for 4:3)."""
    frames = list(render_frames([Segment(kind, float(seconds), seed)], 298, 224, 12))
    return np.stack([frames[6 + 12 * k] for k in range(seconds)])


@pytest.fixture(scope="module")
def patterns() -> dict[str, np.ndarray]:
    return {kind: pattern(kind, seed=3) for kind in KINDS}


def task_of(frame_sets: list[np.ndarray], rate: float = RATE) -> VideoTask:
    clips = [
        Clip(f"c{i}", "v.mp4", (i * 2.0, i * 2.0 + 2.0), (i * 24, i * 24 + 24), frames={rate: f})
        for i, f in enumerate(frame_sets)
    ]
    return VideoTask(data=Video("v.mp4", "v.mp4", clips=clips))


def run(stage: NSFWFilter, frame_sets: list[np.ndarray]) -> list[Clip]:
    task = task_of(frame_sets)
    stage.process(task)
    return task.data.clips


@pytest.fixture(scope="module")
def stage() -> NSFWFilter:
    return Media.ready(NSFWFilter())


def test_synthetic_patterns_are_safe_and_kept(
    stage: NSFWFilter, patterns: dict[str, np.ndarray]
) -> None:
    clips = run(stage, list(patterns.values()))
    for kind, clip in zip(patterns, clips, strict=True):
        assert 0.0 <= clip.scores["nsfw"] < 0.5, kind
        assert clip.filtered_by is None and not clip.errors


def test_the_score_is_the_most_explicit_frame(
    stage: NSFWFilter, patterns: dict[str, np.ndarray]
) -> None:
    first, second = patterns["pan"], patterns["checker"]
    clips = run(stage, [first, second, np.concatenate([first, second])])
    for frames, clip in zip([first, second], clips[:2], strict=True):
        assert clip.scores["nsfw"] == pytest.approx(stage.nsfw_probabilities(frames).max())
    assert clips[2].scores["nsfw"] == pytest.approx(max(c.scores["nsfw"] for c in clips[:2]))


def test_a_threshold_of_zero_filters_everything(patterns: dict[str, np.ndarray]) -> None:
    strict = Media.ready(NSFWFilter(threshold=0.0))
    clips = run(strict, [patterns["rings"], patterns["bars"]])
    assert all(clip.filtered_by == "nsfw" and "nsfw" in clip.scores for clip in clips)
    assert all(clip.frames == {} for clip in clips)


def test_score_only_keeps_everything_and_scores_it(patterns: dict[str, np.ndarray]) -> None:
    lenient = Media.ready(NSFWFilter(threshold=0.0, score_only=True))
    clips = run(lenient, [patterns["noise"], patterns["plasma"]])
    assert all(clip.filtered_by is None and 0 <= clip.scores["nsfw"] < 0.5 for clip in clips)


def test_a_clip_without_frames_fails_alone(
    stage: NSFWFilter, patterns: dict[str, np.ndarray]
) -> None:
    empty, fine = run(stage, [np.zeros((0, 224, 224, 3), np.uint8), patterns["shapes"]])
    assert "no frames" in empty.errors["NSFWFilter"] and "nsfw" not in empty.scores
    assert fine.filtered_by is None and "nsfw" in fine.scores


def test_runs_on_the_cpu_with_the_stage_threads() -> None:
    stage = NSFWFilter().with_(resources=Resources(cpus=2))
    assert isinstance(stage, NSFWFilter)
    stage.setup(WorkerInfo("w", "s", "n"))
    assert stage.providers == ["CPUExecutionProvider"]
    assert stage._model is not None and stage._model.threads == 2
    import onnxruntime

    gpu = choose_providers(WorkerInfo("w", "s", "n", gpu_ids=(0,)))
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        assert gpu[0] == "CUDAExecutionProvider"
    else:
        assert gpu == ["CPUExecutionProvider"]
    assert packaged_model_path().endswith("open-nsfw.onnx")


@pytest.mark.parametrize(("setting", "value"), [("threshold", 1.5), ("threshold", -0.1)])
def test_threshold_is_validated(setting: str, value: float) -> None:
    with pytest.raises(ValueError, match=setting):
        NSFWFilter(**{setting: value})
    with pytest.raises(ValueError, match="frame_rate"):
        NSFWFilter(frame_rate=0)
