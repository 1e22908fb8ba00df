"""The models on images: embeddings, ImageNet tags, NSFW, aesthetic and CLIP scores.

They are the video pipeline's models (``conveyor.stages.video``: EfficientNet-Lite0 and its
ImageNet head, Open-NSFW, the user's aesthetic scorer), run on each image's working copy
instead of a clip's frames, a part's images in the batches each model takes
(``frame_batches``). The embedder of the packaged EfficientNet-Lite0 also ranks the tags: its
classifier head is one matrix product past the features it pools, so no second network runs.

The CLIP score (``ImageClipScoreFilter``) is how LAION-5B and DataComp keep image-text pairs
whose caption says what the image shows: the cosine similarity of the image's and the
caption's embeddings in a CLIP model the user gives (LAION kept pairs at 0.28 and above with
OpenAI's ViT-B/32; the scale differs from one CLIP model to another).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from conveyor.media.models import EFFICIENTNET_LITE0, check_model_path, load_frame_encoder
from conveyor.resources import Resources
from conveyor.stages.image.base import ImageStage
from conveyor.stages.video.aesthetic import AestheticScorer, check_aesthetic_model
from conveyor.stages.video.base import ELASTIC_THREADS, TorchStage
from conveyor.stages.video.nsfw import OpenNSFW, check_nsfw_threshold
from conveyor.stages.video.tags import check_tag_rule, imagenet_labels, top_tags
from conveyor.tasks.image import ImageBatch, ImageRecord

#: ``ImageTagger``'s defaults: the five most likely labels scoring at least 5 %
TOP_K = 5
MIN_SCORE = 0.05


class ImageEmbedder(ImageStage, TorchStage):
    """``image.embedding``: the model's L2-normalised features of the working copy; with
    ``tags`` and the packaged EfficientNet-Lite0, also ``image.tags`` from its head."""

    resources = Resources(cpus=1)
    preload_modules = ("torch",)
    max_threads = ELASTIC_THREADS
    #: ``ImageTagger`` runs the network for its head alone
    keep_embeddings = True

    def __init__(
        self,
        model: str = EFFICIENTNET_LITE0,
        *,
        tags: bool = False,
        top_k: int = TOP_K,
        min_score: float = MIN_SCORE,
    ) -> None:
        check_model_path(model, "embedding")
        check_tag_rule(top_k, min_score)
        if tags and model != EFFICIENTNET_LITE0:
            raise ValueError(
                "tags come from the embedder only with the packaged efficientnet-lite0: run "
                "an ImageTagger for another model"
            )
        self.model = model
        self.tags = tags
        self.top_k = top_k
        self.min_score = min_score
        self._encoder: Any = None
        self._labels: list[str] = []

    def setup(self, worker: Any) -> None:
        self.limit_threads()
        self._encoder = load_frame_encoder(self.model, self.torch_device(worker))
        if self.tags:
            self._labels = imagenet_labels()

    def process_images(self, images: list[ImageRecord], task: ImageBatch) -> None:
        ready = self.working_copies(images)
        if not ready:
            return
        self.limit_threads()
        features, classes = self._encoder.encode_each([image.pixels for image in ready])
        for i, image in enumerate(ready):
            if self.keep_embeddings:
                image.embedding = features[i]
            if self.tags and classes is not None:
                image.tags = top_tags(classes[i], self._labels, self.top_k, self.min_score)


class ImageTagger(ImageEmbedder):
    """``image.tags``: its most likely ImageNet labels from the packaged EfficientNet-Lite0
    (where the embedder runs another model, or none); the vectors are not kept."""

    keep_embeddings = False

    def __init__(self, top_k: int = TOP_K, min_score: float = MIN_SCORE) -> None:
        super().__init__(EFFICIENTNET_LITE0, tags=True, top_k=top_k, min_score=min_score)


class ImageNSFWFilter(ImageStage):
    """``scores["nsfw"]``: Open-NSFW's probability; images at or above ``threshold`` are
    filtered as ``nsfw``."""

    resources = Resources(cpus=1)
    preload_modules = ("onnxruntime",)
    filter_name = "nsfw"

    def __init__(self, threshold: float = 0.8, *, score_only: bool = False) -> None:
        check_nsfw_threshold(threshold)
        self.threshold = threshold
        self.score_only = score_only
        self._model: OpenNSFW | None = None

    def setup(self, worker: Any) -> None:
        self._model = OpenNSFW(worker, round(self.resources.cpus))

    def process_images(self, images: list[ImageRecord], task: ImageBatch) -> None:
        ready = self.working_copies(images)
        if not ready:
            return
        assert self._model is not None, "setup() loads the model"
        scores = self._model.probabilities([image.pixels for image in ready])
        for image, score in zip(ready, scores, strict=True):
            if not scored(image, self.name, "nsfw", score):
                continue
            if not self.score_only and score >= self.threshold:
                image.reject(self.filter_name)


def scored(image: ImageRecord, stage: str, name: str, score: float) -> bool:
    """Record ``score`` as ``image.scores[name]``; a score that is no number (a model's NaN
    passed every threshold, as no comparison with it holds) fails the image instead."""
    value = float(score)
    if not math.isfinite(value):
        image.fail(stage, f"the {name} model gave {value} for it, not a score")
        return False
    image.scores[name] = round(value, 6)
    return True


class ImageAestheticFilter(ImageStage, TorchStage):
    """``scores["aesthetic"]``: the user's aesthetic model (LAION's scale, 1-10); images
    below ``threshold`` are filtered as ``aesthetic``."""

    resources = Resources(cpus=1)
    preload_modules = ("torch",)
    max_threads = ELASTIC_THREADS
    filter_name = "aesthetic"

    def __init__(self, model: str, threshold: float = 4.5, *, score_only: bool = False) -> None:
        self.preload_modules = check_aesthetic_model(model)
        if not math.isfinite(threshold):
            raise ValueError(f"threshold must be a finite number, got {threshold}")
        self.model = model
        self.threshold = threshold
        self.score_only = score_only
        self._scorer: AestheticScorer | None = None

    def setup(self, worker: Any) -> None:
        self.limit_threads()
        self._scorer = AestheticScorer(self.model, self.torch_device(worker))

    def process_images(self, images: list[ImageRecord], task: ImageBatch) -> None:
        ready = self.working_copies(images)
        if not ready:
            return
        assert self._scorer is not None, "setup() loads the model"
        self.limit_threads()
        scores = self._scorer.scores([image.pixels for image in ready])
        for image, score in zip(ready, scores, strict=True):
            if not scored(image, self.name, "aesthetic", score):
                continue
            if not self.score_only and score < self.threshold:
                image.reject(self.filter_name)


#: LAION-5B's CLIP score threshold with OpenAI's ViT-B/32 (English pairs)
CLIP_SCORE_THRESHOLD = 0.28


def check_clip_score_model(model: str) -> None:
    """``FileNotFoundError``/``ValueError`` where ``model`` is no whole CLIP directory."""
    from conveyor.stages.video.video_type import model_problem

    problem = model_problem(model, "clip score model", "the image-text score")
    if problem is not None and not Path(model).expanduser().exists():
        raise FileNotFoundError(problem)
    if problem is not None:
        raise ValueError(problem)


class ImageClipScoreFilter(ImageStage, TorchStage):
    """``scores["clip_score"]``: the cosine similarity of each image and its caption in the
    user's CLIP model; a captioned image below ``threshold`` is filtered as ``clip_score``.
    An image without a caption has nothing to compare: no score, never filtered for it."""

    resources = Resources(cpus=1)
    # the local backend imports these once per machine, before forking workers
    preload_modules = ("torch", "transformers.models.clip.modeling_clip")
    max_threads = ELASTIC_THREADS
    filter_name = "clip_score"

    def __init__(
        self, model: str, threshold: float = CLIP_SCORE_THRESHOLD, *, score_only: bool = False
    ) -> None:
        check_clip_score_model(model)
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be a cosine in [-1, 1], got {threshold}")
        self.model = str(Path(model).expanduser())
        self.threshold = threshold
        self.score_only = score_only
        self._clip: Any = None
        self._processor: Any = None
        self._tokenizer: Any = None
        self._device = "cpu"

    def setup(self, worker: Any) -> None:
        from transformers import AutoTokenizer

        from conveyor.media.models import load_clip

        self.limit_threads()
        self._device = self.torch_device(worker)
        self._clip, self._processor = load_clip(
            Path(self.model), self._device, "the CLIP score", text=True
        )
        self._tokenizer = AutoTokenizer.from_pretrained(self.model)

    def scores(self, pixels: list[Any], captions: list[str]) -> list[float]:
        """The cosine similarity of each image (H x W x 3 uint8 RGB) and its caption."""
        import torch

        from conveyor.media.models import clip_image_embeds, clip_text_embeds, frame_batches

        out: list[float] = []
        with torch.inference_mode():
            for part in frame_batches(len(pixels), self._device):
                images = clip_image_embeds(self._clip, self._processor, pixels[part], self._device)
                texts = clip_text_embeds(self._clip, self._tokenizer, captions[part], self._device)
                out += (images * texts).sum(dim=-1).double().cpu().tolist()
        return out

    def process_images(self, images: list[ImageRecord], task: ImageBatch) -> None:
        ready = [image for image in self.working_copies(images) if (image.caption or "").strip()]
        if not ready:
            return
        assert self._clip is not None, "setup() loads the model"
        self.limit_threads()
        scores = self.scores([image.pixels for image in ready], [image.caption for image in ready])
        for image, score in zip(ready, scores, strict=True):
            if not scored(image, self.name, "clip_score", score):
                continue
            if not self.score_only and score < self.threshold:
                image.reject(self.filter_name)
