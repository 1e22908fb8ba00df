"""The quality rules and the models on images: embeddings with tags from the same network,
the tagger alone, NSFW and aesthetic scores, score-only, and the working copies dropped
after the last stage that reads them. Each model is loaded once for the module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.resources import Resources
from conveyor.samples.image import render_image
from conveyor.stages.image.models import (
    ImageAestheticFilter,
    ImageClipScoreFilter,
    ImageEmbedder,
    ImageNSFWFilter,
    ImageTagger,
)
from conveyor.stages.image.quality import ImageQualityFilter
from conveyor.tasks.image import ImageBatch, ImageRecord
from tests.stages.image import kinds


def ready(stage):  # type: ignore[no-untyped-def]
    stage.setup(WorkerInfo("w", stage.name, "n"))
    return stage


def images(*pixels: np.ndarray, sizes: list[tuple[int, int]] | None = None) -> list[ImageRecord]:
    made = []
    for i, p in enumerate(pixels):
        image = ImageRecord(f"k{i}", "s", i, pixels=p)
        image.height, image.width = sizes[i] if sizes else p.shape[:2]
        made.append(image)
    return made


def run(stage, found: list[ImageRecord]) -> list[ImageRecord]:  # type: ignore[no-untyped-def]
    stage.process(ImageBatch(data=found))
    return found


@pytest.fixture(scope="module")
def embedder() -> ImageEmbedder:
    return ready(ImageEmbedder(tags=True, min_score=0.0))


def test_quality_filters_small_extreme_and_blank_images_by_the_first_rule() -> None:
    flat = np.full((80, 80, 3), 128, np.uint8)
    found = images(
        render_image(0, 200, 150),
        render_image(1, 60, 40),
        render_image(2, 500, 100),
        flat,
        np.full((20, 200, 3), 7, np.uint8),
        sizes=[(150, 200), (40, 60), (100, 500), (80, 80), (20, 200)],
    )
    run(ImageQualityFilter(min_size=64, max_aspect=4.0, min_contrast=2.0), found)
    assert [i.filtered_by for i in found] == [
        None,
        "too_small",
        "aspect_ratio",
        "blank",
        "too_small",
    ]
    assert found[2].scores["aspect_ratio"] == 5.0 and found[3].scores["contrast"] == 0.0
    assert found[0].scores["contrast"] > 10 and found[0].pixels is not None
    assert found[1].pixels is None  # a filtered image travels without its working copy


def test_quality_score_only_filters_nothing() -> None:
    found = images(np.full((80, 80, 3), 5, np.uint8))
    run(ImageQualityFilter(score_only=True), found)
    assert found[0].kept and found[0].scores == {"aspect_ratio": 1.0, "contrast": 0.0}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_size": -1}, "min_size"),
        ({"max_aspect": 0.5}, "max_aspect"),
        ({"min_contrast": 300}, "min_contrast"),
    ],
)
def test_quality_settings_are_validated(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ImageQualityFilter(**options)  # type: ignore[arg-type]


def test_the_embedder_gives_unit_vectors_and_tags_from_its_own_head(
    embedder: ImageEmbedder,
) -> None:
    found = images(render_image(0, 300, 200), render_image(1, 120, 160), render_image(0, 300, 200))
    run(embedder, found)
    vectors = np.stack([i.embedding for i in found])
    assert vectors.shape == (3, 1280)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert vectors[0] @ vectors[2] == pytest.approx(1.0, abs=1e-5)
    assert vectors[0] @ vectors[1] < 0.95
    assert all(len(i.tags) == 5 for i in found)
    tagger = ready(ImageTagger(min_score=0.0))
    alone = images(render_image(0, 300, 200))
    run(tagger, alone)
    assert [t[0] for t in alone[0].tags] == [t[0] for t in found[0].tags]


def test_the_embedder_skips_images_without_a_working_copy(embedder: ImageEmbedder) -> None:
    found = images(render_image(0, 64, 64))
    failed = ImageRecord("bad", "s", 9)
    failed.fail("ImageDecoder", "not an image")
    run(embedder, [failed, *found])
    assert failed.embedding is None and found[0].embedding is not None


def test_tags_from_the_embedder_need_its_packaged_network(tmp_path: Path) -> None:
    other = tmp_path / "model.pt"
    other.write_bytes(b"PK\x03\x04")  # as torch.save begins (the file is not loaded here)
    with pytest.raises(ValueError, match="efficientnet-lite0"):
        ImageEmbedder(str(other), tags=True)


def test_nsfw_scores_generated_pictures_as_safe_and_the_threshold_filters() -> None:
    found = images(render_image(0, 300, 200), render_image(1, 100, 300))
    run(ready(ImageNSFWFilter()), found)
    assert all(0 <= i.scores["nsfw"] < 0.5 and i.kept for i in found)
    strict = images(render_image(2, 100, 100))
    run(ready(ImageNSFWFilter(threshold=0.0)), strict)
    assert strict[0].filtered_by == "nsfw" and strict[0].pixels is None
    lenient = images(render_image(2, 100, 100))
    run(ready(ImageNSFWFilter(threshold=0.0, score_only=True)), lenient)
    assert lenient[0].kept and "nsfw" in lenient[0].scores


def test_nsfw_runs_with_the_stage_threads() -> None:
    stage = ready(ImageNSFWFilter().with_(resources=Resources(cpus=2)))
    assert stage._model is not None and stage._model.threads == 2


@pytest.fixture(scope="module")
def brightness_scorer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A TorchScript aesthetic model: the mean brightness of the frame, times 10."""
    pytest.importorskip("torch")
    return kinds.brightness_scorer(tmp_path_factory.mktemp("aesthetic"))


def test_the_aesthetic_model_scores_and_filters_below_the_threshold(brightness_scorer: str) -> None:
    found = images(np.full((90, 120, 3), 230, np.uint8), np.full((120, 90, 3), 20, np.uint8))
    run(ready(ImageAestheticFilter(brightness_scorer, threshold=5.0)), found)
    assert found[0].scores["aesthetic"] == pytest.approx(230 / 255 * 10, abs=1e-3)
    assert found[0].kept and found[1].filtered_by == "aesthetic"
    again = images(np.full((40, 40, 3), 20, np.uint8))
    run(ready(ImageAestheticFilter(brightness_scorer, threshold=5.0, score_only=True)), again)
    assert again[0].kept and again[0].scores["aesthetic"] < 1


def test_a_model_score_that_is_no_number_fails_the_image(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A scorer giving NaN kept every image (no comparison with NaN holds), its score NaN."""
    torch = pytest.importorskip("torch")

    class Nan(torch.nn.Module):
        def forward(self, frames: torch.Tensor) -> torch.Tensor:
            return frames.mean(dim=(1, 2, 3)) * float("nan")

    path = tmp_path_factory.mktemp("nan") / "nan.pt"
    torch.jit.script(Nan()).save(str(path))
    found = images(np.full((90, 120, 3), 230, np.uint8))
    run(ready(ImageAestheticFilter(str(path), threshold=5.0)), found)
    assert found[0].filtered_by == "error" and "aesthetic" not in found[0].scores
    assert found[0].errors["ImageAestheticFilter"] == (
        "the aesthetic model gave nan for it, not a score"
    )


def test_the_aesthetic_model_must_exist(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="aesthetic model path"):
        ImageAestheticFilter(str(tmp_path / "missing.pt"))


def test_the_last_reader_of_the_working_copies_drops_them() -> None:
    stage = ImageQualityFilter()
    stage.release_pixels = True
    found = images(render_image(0, 100, 100))
    run(stage, found)
    assert found[0].kept and found[0].pixels is None and "contrast" in found[0].scores


@pytest.fixture(scope="module")
def whole_clip(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("transformers")
    from tests.stages.video.conftest import save_whole_clip

    return str(save_whole_clip(tmp_path_factory.mktemp("clip-score") / "clip"))


def cosines(model_dir: str, pixels: list[np.ndarray], captions: list[str]) -> list[float]:
    """Each pair's cosine recomputed through CLIPModel's own forward pass: its logits are
    the cosines times the logit scale."""
    import torch
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(model_dir).eval()
    tokens = AutoTokenizer.from_pretrained(model_dir)(captions, padding=True, return_tensors="pt")
    inputs = AutoImageProcessor.from_pretrained(model_dir)(images=pixels, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**tokens, **inputs).logits_per_image / model.logit_scale.exp()
    return [float(logits[i, i]) for i in range(len(captions))]


def test_the_clip_score_is_the_cosine_of_image_and_caption(whole_clip: str) -> None:
    """What LAION and DataComp filter on; a captionless image has nothing to compare."""
    pixels = [render_image(i, 120, 90) for i in range(4)]
    captions = ["a red square", "blue rings on grey", "", None]
    expected = cosines(whole_clip, pixels[:2], captions[:2])
    threshold = sum(expected) / 2  # one above, one below
    found = images(*pixels)
    for image, caption in zip(found, captions, strict=True):
        image.caption = caption
    run(ready(ImageClipScoreFilter(whole_clip, threshold=threshold)), found)
    got = [image.scores.get("clip_score") for image in found]
    assert got[:2] == pytest.approx(expected, abs=1e-5)
    assert got[2:] == [None, None] and found[2].kept and found[3].kept
    low = int(np.argmin(expected))
    assert found[low].filtered_by == "clip_score" and found[1 - low].kept
    again = images(*pixels[:2])
    for image, caption in zip(again, captions[:2], strict=True):
        image.caption = caption
    run(ready(ImageClipScoreFilter(whole_clip, threshold=threshold, score_only=True)), again)
    assert all(image.kept for image in again)


def test_a_clip_score_model_that_cannot_score_is_refused_before_the_run(
    whole_clip: str, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match="clip score model path"):
        ImageClipScoreFilter(str(tmp_path / "none"))
    vision_only = tmp_path / "vision"
    vision_only.mkdir()
    (vision_only / "config.json").write_text('{"model_type": "clip_vision_model"}')
    with pytest.raises(ValueError, match="the image-text score needs a whole CLIP model"):
        ImageClipScoreFilter(str(vision_only))
    with pytest.raises(ValueError, match=r"threshold must be a cosine in \[-1, 1\]"):
        ImageClipScoreFilter(whole_clip, threshold=28)
