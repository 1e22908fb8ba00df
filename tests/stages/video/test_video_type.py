"""The video type classifier: a tiny random CLIP (both towers, a character-level tokenizer and
its image processor) saved with ``save_pretrained`` and loaded through the stage's real path;
scores recomputed with ``CLIPModel``'s own forward pass, ``keep_types`` chosen from the types
the model gives, the errors, and ``conveyor video`` end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.pipelines.video import VideoConfig, build_video_pipeline
from conveyor.samples.video import Segment, write_video
from conveyor.stages.video.video_type import DEFAULT_VIDEO_TYPES, VideoTypeClassifier
from conveyor.stages.video.writer import clip_meta
from conveyor.tasks.video import Clip, Video

from .conftest import Media, pattern_frames, save_whole_clip

runner = CliRunner()


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole CLIPModel checkpoint with its tokenizer and image processor."""
    return save_whole_clip(tmp_path_factory.mktemp("video-type") / "clip")


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    return pattern_frames()


def expected_scores(directory: Path, labels: list[str], frames: np.ndarray) -> np.ndarray:
    """A clip's scores recomputed independently: CLIPModel's own forward pass over the
    prompts and frames, softmax per frame, mean over the frames."""
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(str(directory)).eval()
    tokens = AutoTokenizer.from_pretrained(str(directory))(
        [f"a video frame of {label}" for label in labels], padding=True, return_tensors="pt"
    )
    pixels = AutoImageProcessor.from_pretrained(str(directory))(
        images=list(frames), return_tensors="pt"
    )
    with torch.inference_mode():
        logits = model(**tokens, **pixels).logits_per_image
    return logits.softmax(dim=-1).mean(dim=0).double().numpy()


def test_scores_are_a_distribution_over_the_labels_and_go_into_the_meta(
    clip_dir: Path, frames: list[np.ndarray]
) -> None:
    stage = Media.ready(VideoTypeClassifier(str(clip_dir)))
    assert stage.prompts[0] == "a video frame of natural footage"
    clips = Media.run_frames(stage, frames)
    for clip, own in zip(clips, frames, strict=True):
        kind = clip.video_type
        assert kind is not None and list(kind["scores"]) == list(DEFAULT_VIDEO_TYPES)
        scores = np.array(list(kind["scores"].values()))
        assert scores.sum() == pytest.approx(1.0, abs=1e-6) and (scores > 0).all()
        assert kind["label"] == DEFAULT_VIDEO_TYPES[int(scores.argmax())]
        expected = expected_scores(clip_dir, list(DEFAULT_VIDEO_TYPES), own)
        np.testing.assert_allclose(scores, expected, atol=1e-5)
        assert clip.filtered_by is None  # no keep list: all kept
        meta = clip_meta(clip, Video("v.mp4", "v.mp4"), None)
        assert json.loads(json.dumps(meta))["video_type"] == kind
    # frames really differ to the model: scores are not one constant distribution
    assert len({tuple(np.round(list(c.video_type["scores"].values()), 6)) for c in clips}) > 1


def test_keep_types_filters_clips_whose_type_is_not_kept(
    clip_dir: Path, frames: list[np.ndarray]
) -> None:
    labels = ["natural footage", "animation", "screen recording"]

    def classify(keep: list[str], score_only: bool = False) -> list[Clip]:
        stage = VideoTypeClassifier(str(clip_dir), labels, keep, score_only=score_only)
        return Media.run_frames(Media.ready(stage), frames)

    found = [c.video_type["label"] for c in classify([])]  # type: ignore[index]
    first = found[0]  # the type the tiny model gives the first clip
    kept = classify([first])
    assert [c.filtered_by is None for c in kept] == [label == first for label in found]
    assert {c.filtered_by for c in kept if c.filtered_by} <= {"video_type"}
    assert [c.video_type["label"] for c in kept] == found  # type: ignore[index]
    others = [label for label in labels if label != first]
    dropped = classify(others)
    assert dropped[0].filtered_by == "video_type" and dropped[0].frames == {}
    assert all(c.filtered_by is None for c in classify(others, score_only=True))


def test_a_clip_without_frames_fails_alone(clip_dir: Path, frames: list[np.ndarray]) -> None:
    empty, fine = Media.run_frames(
        Media.ready(VideoTypeClassifier(str(clip_dir))),
        [np.zeros((0, 224, 224, 3), np.uint8), frames[0]],
    )
    assert "no frames" in empty.errors["VideoTypeClassifier"] and empty.video_type is None
    assert fine.video_type is not None and fine.filtered_by is None


def test_a_custom_template_makes_the_prompts(clip_dir: Path) -> None:
    stage = VideoTypeClassifier(str(clip_dir), ["cartoon", "lecture"], template="{label} video")
    assert stage.prompts == ["cartoon video", "lecture video"]


def broken_models(clip_dir: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Model paths that cannot be used, and what their error says."""
    file = root / "model.pt"
    file.write_bytes(b"")
    empty = root / "empty"
    empty.mkdir()
    vision = root / "vision"
    vision.mkdir()
    (vision / "config.json").write_text(json.dumps({"model_type": "clip_vision_model"}))
    untokenized = root / "untokenized"
    untokenized.mkdir()
    shutil.copy(clip_dir / "config.json", untokenized)
    shutil.copy(clip_dir / "preprocessor_config.json", untokenized)
    return {
        "missing": (root / "nowhere", "does not exist"),
        "file": (file, "is a file"),
        "empty": (empty, "config.json cannot be read"),
        "vision": (vision, "holds a 'clip_vision_model' model"),
        "untokenized": (untokenized, "has no tokenizer"),
    }


def test_unusable_models_and_labels_are_refused_at_construction(
    clip_dir: Path, tmp_path: Path
) -> None:
    for path, message in broken_models(clip_dir, tmp_path).values():
        error = FileNotFoundError if message == "does not exist" else ValueError
        with pytest.raises(error, match=message):
            VideoTypeClassifier(str(path))
        with pytest.raises(ValueError, match=message):
            VideoConfig("in", "out", video_type_model=str(path))
    for labels, keep, message in [
        ([], (), "label list is empty"),
        (["animation", "animation"], (), "'animation' given more than once"),
        (["animation", "slideshow"], ["cartoon"], "keep types 'cartoon' not among"),
    ]:
        with pytest.raises(ValueError, match=message):
            VideoTypeClassifier(str(clip_dir), labels, keep)
        with pytest.raises(ValueError, match=message):
            VideoConfig(
                "in", "out", video_type_model=str(clip_dir), video_types=labels, keep_types=keep
            )
    with pytest.raises(ValueError, match="template"):
        VideoTypeClassifier(str(clip_dir), template="a video frame")
    with pytest.raises(ValueError, match="need a video type model"):
        VideoConfig("in", "out", keep_types="animation")


def test_the_config_takes_comma_lists_and_builds_the_stage(clip_dir: Path, tmp_path: Path) -> None:
    config = VideoConfig(
        str(tmp_path), "o", gpus=False, video_type_model=str(clip_dir),
        video_types=" cartoon, lecture ,game,", keep_types="lecture",
    )  # fmt: skip
    assert config.video_types == ("cartoon", "lecture", "game")
    assert config.keep_types == ("lecture",)
    stage = next(s for s in build_video_pipeline(config).stages if s.name == "VideoTypeClassifier")
    assert (stage.labels, stage.keep, stage.resources.cpus) == (config.video_types, ("lecture",), 1)
    assert "video types (3, keeping lecture)" in build_video_pipeline(config).description
    on_gpu = VideoConfig(str(tmp_path), "o", gpus=True, video_type_model=str(clip_dir))
    gpu_stage = next(
        s for s in build_video_pipeline(on_gpu).build() if s.name == "VideoTypeClassifier"
    )
    assert 0 < gpu_stage.resources.gpus <= 0.25


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--video-type-model", "{nowhere}"], "does not exist"),
        (["--video-type-model", "{model}", "--video-types", " , "], "label list is empty"),
        (["--video-type-model", "{model}", "--keep-types", "cartoon"], "'cartoon' not among"),
        (["--keep-types", "animation"], "need a video type model"),
    ],
)
def test_command_errors_exit_2_with_one_line(
    args: list[str], message: str, clip_dir: Path, tmp_path: Path
) -> None:
    places = {"{nowhere}": str(tmp_path / "nowhere"), "{model}": str(clip_dir)}
    filled = [places.get(a, a) for a in args]
    inputs = tmp_path / "in"
    inputs.mkdir()
    result = runner.invoke(app, ["video", str(inputs), str(tmp_path / "out"), *filled])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_the_command_classifies_and_keeps_types_end_to_end(clip_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "in" / "v.mp4"
    write_video(source, [Segment("pan", 2, 1), Segment("rings", 2, 3)], width=96, height=64, fps=8)
    labels = ["natural footage", "animation"]
    out = tmp_path / "out"
    args = ["video", str(source.parent), str(out), "--splitter", "fixed", "--clip-len", "1"]
    args += ["--min-clip", "1", "--no-embed", "--no-tags", "--no-quality", "--no-motion"]
    args += ["--no-live", "--no-report", "--video-type-model", str(clip_dir)]
    args += ["--video-types", ",".join(labels), "--keep-types", "natural footage"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    metas = [json.loads(p.read_text()) for p in (out / "metas").glob("*.json")]
    assert len(metas) == 4
    for meta in metas:
        kind = meta["video_type"]
        assert list(kind["scores"]) == labels and kind["label"] in labels
        assert sum(kind["scores"].values()) == pytest.approx(1.0, abs=1e-6)
        kept_type = kind["label"] == "natural footage"
        assert meta["filtered_by"] == (None if kept_type else "video_type")
    kept = sum(meta["filtered_by"] is None for meta in metas)
    assert len(list((out / "clips").glob("*.mp4"))) == kept
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clips"]["kept"] == kept
    assert summary["clips"]["filtered"].get("video_type", 0) == len(metas) - kept
