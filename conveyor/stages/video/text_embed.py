"""Text embeddings of what a clip is said to show: its caption, or else its tags.

The packaged all-MiniLM-L6-v2 (``conveyor.media.minilm``) turns the text into a 384-value
L2-normalised vector, so clips can be searched by words as well as by pictures. ``model`` takes
another Hugging Face encoder directory by path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from conveyor.media.minilm import PACKAGED, SentenceEncoder
from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, ClipStage, TorchStage
from conveyor.tasks.video import Clip, Video

__all__ = ["PACKAGED", "TextEmbedder", "clip_text"]


def clip_text(clip: Clip) -> str:
    """The text a clip's text embedding is made from: its first caption, else its tags."""
    if clip.captions:
        return next(iter(clip.captions.values()))
    return ", ".join(label for label, _ in clip.tags)


class TextEmbedder(ClipStage, TorchStage):
    """``clip.text_embedding`` for every active clip that has a caption or tags."""

    resources = Resources(cpus=1)
    preload_modules = ("torch", "transformers.models.bert.modeling_bert")
    max_threads = ELASTIC_THREADS

    def __init__(self, model: str = PACKAGED, batch: int = 64) -> None:
        if model != PACKAGED and not Path(model).expanduser().exists():
            raise FileNotFoundError(f"text embedding model path {model!r} does not exist")
        self.model = model
        self.batch = batch
        self._encoder: SentenceEncoder | None = None

    def setup(self, worker: Any) -> None:
        self.limit_threads()
        self.device = self.torch_device(worker)
        self._encoder = SentenceEncoder(self.model, self.device)

    def embed(self, texts: list[str]) -> np.ndarray:
        """L2-normalised mean-pooled embeddings of ``texts`` (one row each)."""
        assert self._encoder is not None, "setup() loads the model"
        return self._encoder.embed(texts, self.batch)

    def process_clips(self, clips: list[Clip], video: Video) -> None:
        self.limit_threads()
        todo = [(c, clip_text(c)) for c in clips]
        todo = [(c, text) for c, text in todo if text]
        if not todo:
            return
        vectors = self.embed([text for _, text in todo])
        for (clip, _), vector in zip(todo, vectors, strict=True):
            clip.text_embedding = vector.astype(np.float32)
