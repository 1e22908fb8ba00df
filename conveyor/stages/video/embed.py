"""Clip embeddings: a vector per clip from its frames, for search and deduplication.

By default the packaged EfficientNet-Lite0's image features (1280 values per frame) are
averaged over the clip's frames and L2-normalised, and its ImageNet class probabilities are
left on the clip for the tagger (``Clip.class_probabilities``). ``model`` takes another torch
model by path instead (a TorchScript or pickled module, or a Hugging Face directory such as
a CLIP or video-embedding checkpoint the user has), see ``conveyor.media.models``.
"""

from __future__ import annotations

from typing import Any

from conveyor.media.models import EFFICIENTNET_LITE0, check_model_path, load_frame_encoder
from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, FrameConsumer, TorchStage, check_rate
from conveyor.tasks.video import Clip, Video


class ClipEmbedder(FrameConsumer, TorchStage):
    """``clip.embedding``: frame features at ``frame_rate`` pooled and L2-normalised."""

    resources = Resources(cpus=1)
    preload_modules = ("torch",)
    max_threads = ELASTIC_THREADS

    def __init__(
        self,
        model: str = EFFICIENTNET_LITE0,
        frame_rate: float = 2.0,
        *,
        input_size: int = 224,
        trust_remote_code: bool = False,
        resources: Resources | None = None,
    ) -> None:
        check_model_path(model, "embedding")
        check_rate(frame_rate)
        self.model = model
        self.frame_rate = frame_rate
        self.input_size = input_size
        self.trust_remote_code = trust_remote_code
        if resources is not None:
            self.resources = resources
        self._encoder: Any = None

    def setup(self, worker: Any) -> None:
        self.limit_threads()
        self._encoder = load_frame_encoder(
            self.model,
            self.torch_device(worker),
            input_size=self.input_size,
            trust_remote_code=self.trust_remote_code,
        )

    def process_clip(self, clip: Clip, video: Video) -> None:
        self.limit_threads()
        clip.embedding, clip.class_probabilities = self._encoder.encode(self.frames_of(clip))
