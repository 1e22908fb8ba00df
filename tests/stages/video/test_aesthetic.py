"""The aesthetic filter: a tiny random CLIP saved with ``save_pretrained`` plus a LAION-layout
head (scores known by construction or recomputed by hand), and a TorchScript scorer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conveyor.stages.video.aesthetic import AestheticFilter
from conveyor.tasks.video import Clip

from .conftest import Media, pattern_frames, save_clip_processor, tiny_clip_config

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.*is deprecated:DeprecationWarning")

RATE = 1.0
EMBED = 12
#: the LAION improved-aesthetic-predictor head: index in ``layers`` -> (out, in)
LAYERS = {0: (1024, EMBED), 2: (128, 1024), 4: (64, 128), 6: (16, 64), 7: (1, 16)}


def head_weights(seed: int | None = None, bias: float = 5.0) -> dict[str, torch.Tensor]:
    """Random weights (``seed``), or all zeros with a last bias of ``bias``: every frame then
    scores exactly ``bias``."""
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    state = {}
    for index, (out, inp) in LAYERS.items():
        if generator is None:
            weight, b = torch.zeros(out, inp), torch.zeros(out)
        else:
            weight = torch.randn(out, inp, generator=generator) / inp**0.5
            b = torch.randn(out, generator=generator) * 0.1
        state[f"layers.{index}.weight"], state[f"layers.{index}.bias"] = weight, b
    if generator is None:
        state["layers.7.bias"] = torch.tensor([bias])
    return state


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A full CLIPModel checkpoint with a constant head (every frame scores 5.0)."""
    from safetensors.torch import save_file
    from transformers import CLIPModel

    directory = tmp_path_factory.mktemp("aesthetic") / "clip"
    torch.manual_seed(0)
    CLIPModel(tiny_clip_config(EMBED)).save_pretrained(directory)
    save_clip_processor(directory)
    save_file(head_weights(), str(directory / "aesthetic_head.safetensors"))
    return directory


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    return pattern_frames()


def run(stage: AestheticFilter, frame_sets: list[np.ndarray]) -> list[Clip]:
    return Media.run_frames(stage, frame_sets, RATE)


def test_a_constant_head_keeps_above_the_threshold_and_filters_below(
    clip_dir: Path, frames: list[np.ndarray]
) -> None:
    kept = run(Media.ready(AestheticFilter(str(clip_dir))), frames)
    assert all(clip.filtered_by is None for clip in kept)
    assert all(clip.scores["aesthetic"] == pytest.approx(5.0, abs=1e-5) for clip in kept)
    dropped = run(Media.ready(AestheticFilter(str(clip_dir), threshold=6.0)), frames)
    assert all(clip.filtered_by == "aesthetic" and clip.frames == {} for clip in dropped)
    scored = run(
        Media.ready(AestheticFilter(str(clip_dir), threshold=6.0, score_only=True)), frames
    )
    assert all(clip.filtered_by is None for clip in scored)
    assert all(clip.scores["aesthetic"] == pytest.approx(5.0, abs=1e-5) for clip in scored)


def expected_scores(
    directory: Path, state: dict[str, torch.Tensor], frames: np.ndarray, model: Any
) -> np.ndarray:
    """Per-frame scores recomputed independently: CLIP image features, L2-normalised, then
    the head's linear layers as plain matrix products."""
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(str(directory))
    inputs = processor(images=list(frames), return_tensors="pt")
    with torch.inference_mode():
        if hasattr(model, "get_image_features"):
            features = model.get_image_features(**inputs)
            features = getattr(features, "pooler_output", features)
        else:
            features = model(**inputs).image_embeds
    x = features.double() / features.double().norm(dim=-1, keepdim=True)
    for index in LAYERS:
        x = x @ state[f"layers.{index}.weight"].double().T + state[f"layers.{index}.bias"].double()
    return x.reshape(-1).numpy()


@pytest.mark.parametrize("layout", ["CLIPModel", "CLIPVisionModelWithProjection"])
def test_a_random_head_scores_the_normalised_embedding(
    layout: str, clip_dir: Path, frames: list[np.ndarray], tmp_path: Path
) -> None:
    import shutil

    from safetensors.torch import save_file
    from transformers import CLIPModel, CLIPVisionModelWithProjection

    directory = tmp_path / layout
    state = head_weights(seed=7)
    if layout == "CLIPModel":  # a full checkpoint, the head in safetensors
        shutil.copytree(clip_dir, directory)
        save_file(state, str(directory / "aesthetic_head.safetensors"))
        model = CLIPModel.from_pretrained(str(directory)).eval()
    else:  # the vision tower alone, the head as a torch state dict
        config = tiny_clip_config(EMBED).vision_config  # type: ignore[attr-defined]
        config.projection_dim = EMBED
        torch.manual_seed(1)
        model = CLIPVisionModelWithProjection(config).eval()
        model.save_pretrained(directory)
        save_clip_processor(directory)
        torch.save(state, directory / "aesthetic_head.pt")

    by_frame = [expected_scores(directory, state, f, model) for f in frames]
    assert max(s.max() - s.min() for s in by_frame) > 1e-3  # frames really score differently
    least = AestheticFilter(str(directory), threshold=-1e9)
    lowest = run(Media.ready(least), frames)
    average = AestheticFilter(str(directory), reduction="mean", threshold=-1e9)
    mean = run(Media.ready(average), frames)
    for expected, low, middle in zip(by_frame, lowest, mean, strict=True):
        assert low.scores["aesthetic"] == pytest.approx(expected.min(), abs=1e-4)
        assert middle.scores["aesthetic"] == pytest.approx(expected.mean(), abs=1e-4)


class Brightness(torch.nn.Module):
    """Frames in [0, 1] -> ten times their mean brightness."""

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return frames.mean(dim=(1, 2, 3)) * 10.0


def test_a_torchscript_scorer_with_min_and_mean(tmp_path: Path) -> None:
    path = tmp_path / "brightness.pt"
    torch.jit.save(torch.jit.script(Brightness()), str(path))
    dark_and_bright = np.zeros((2, 224, 298, 3), np.uint8)
    dark_and_bright[0], dark_and_bright[1] = 51, 204  # 2.0 and 8.0
    bright = np.full((2, 224, 298, 3), 204, np.uint8)  # 8.0
    low, high = run(Media.ready(AestheticFilter(str(path))), [dark_and_bright, bright])
    assert low.scores["aesthetic"] == pytest.approx(2.0, abs=1e-4)
    assert low.filtered_by == "aesthetic"
    assert high.scores["aesthetic"] == pytest.approx(8.0, abs=1e-4) and high.filtered_by is None
    (average,) = run(Media.ready(AestheticFilter(str(path), reduction="mean")), [dark_and_bright])
    assert average.scores["aesthetic"] == pytest.approx(5.0, abs=1e-4)
    assert average.filtered_by is None


def test_a_clip_without_frames_fails_alone(clip_dir: Path, frames: list[np.ndarray]) -> None:
    empty, fine = run(
        Media.ready(AestheticFilter(str(clip_dir))),
        [np.zeros((0, 224, 224, 3), np.uint8), frames[0]],
    )
    assert "no frames" in empty.errors["AestheticFilter"] and "aesthetic" not in empty.scores
    assert fine.filtered_by is None and fine.scores["aesthetic"] == pytest.approx(5.0, abs=1e-5)


def test_missing_models_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        AestheticFilter(str(tmp_path / "nowhere"))
    (tmp_path / "headless").mkdir()
    with pytest.raises(FileNotFoundError, match="aesthetic_head"):
        AestheticFilter(str(tmp_path / "headless"))


def test_a_head_of_the_wrong_width_is_refused(clip_dir: Path, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import save_file

    directory = tmp_path / "clip"
    shutil.copytree(clip_dir, directory)
    state = head_weights()
    state["layers.0.weight"] = torch.zeros(1024, EMBED + 1)
    save_file(state, str(directory / "aesthetic_head.safetensors"))
    stage = AestheticFilter(str(directory))
    with pytest.raises(ValueError, match="13 features"):
        Media.ready(stage)


def test_settings_are_validated(clip_dir: Path) -> None:
    with pytest.raises(ValueError, match="reduction"):
        AestheticFilter(str(clip_dir), reduction="median")
    with pytest.raises(ValueError, match="frame_rate"):
        AestheticFilter(str(clip_dir), frame_rate=0)
    with pytest.raises(ValueError, match="threshold"):
        AestheticFilter(str(clip_dir), threshold=float("nan"))
    stage = AestheticFilter(str(clip_dir))
    assert (stage.threshold, stage.reduction, stage.frame_rate) == (3.5, "min", 1.0)


def test_the_command_scores_clips_and_filters_below_its_threshold(tmp_path: Path) -> None:
    """``--aesthetic-model`` with a scorer file and ``--aesthetic-threshold`` reach the
    stage: scores in every clip's meta, and the threshold decides which are filtered."""
    import json

    from typer.testing import CliRunner

    from conveyor.cli import app
    from conveyor.samples.video import Segment, write_video

    inputs = tmp_path / "in"
    inputs.mkdir()
    write_video(
        inputs / "a.mp4", [Segment("pan", 2, 1), Segment("rings", 2, 2)], width=160, height=96
    )
    scorer = tmp_path / "brightness.pt"
    torch.jit.save(torch.jit.script(Brightness()), str(scorer))
    fast = ["--no-embed", "--no-tags", "--no-quality", "--no-motion", "--no-live", "--no-report"]
    base = ["--splitter", "fixed", "--clip-len", "2", *fast, "--aesthetic-model", str(scorer)]

    def run(output: Path, threshold: float) -> list[dict[str, Any]]:
        args = ["video", str(inputs), str(output), *base, "--aesthetic-threshold", str(threshold)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        metas = [json.loads(p.read_text()) for p in (output / "metas").glob("*.json")]
        return sorted(metas, key=lambda m: m["scores"]["aesthetic"])

    every = run(tmp_path / "all", 0.0)
    scores = [m["scores"]["aesthetic"] for m in every]
    assert (
        len(scores) == 2 and scores[0] < scores[1] and all(m["filtered_by"] is None for m in every)
    )
    between = run(tmp_path / "some", (scores[0] + scores[1]) / 2)
    assert [m["filtered_by"] for m in between] == ["aesthetic", None]
    assert [m["scores"]["aesthetic"] for m in between] == pytest.approx(scores, abs=1e-4)


def test_a_file_that_is_no_model_fails_at_construction(tmp_path: Path) -> None:
    """It failed in every worker once the run had started ("Memo value not found")."""
    (tmp_path / "notes.pt").write_text("hi")
    with pytest.raises(ValueError, match="is neither a model folder nor a TorchScript or PyTorch"):
        AestheticFilter(str(tmp_path / "notes.pt"))
    legacy = tmp_path / "legacy.pt"  # torch.save's format before the zip archive
    torch.save(Brightness(), str(legacy), _use_new_zipfile_serialization=False)
    AestheticFilter(str(legacy))


@pytest.mark.parametrize("model", ["empty", "notes.pt"])
def test_the_command_refuses_a_model_it_cannot_use_before_writing(
    tmp_path: Path, model: str
) -> None:
    """An empty folder was a traceback; a file that is no model failed the run."""
    from typer.testing import CliRunner

    from conveyor.cli import app
    from conveyor.samples.video import Segment, write_video

    write_video(tmp_path / "in" / "a.mp4", [Segment("pan", 1, 1)], width=64, height=48)
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.pt").write_text("hi")
    args = ["video", str(tmp_path / "in"), str(tmp_path / "out"), "--no-live"]
    result = CliRunner().invoke(app, [*args, "--aesthetic-model", str(tmp_path / model)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error: ")
    assert not (tmp_path / "out").exists()
