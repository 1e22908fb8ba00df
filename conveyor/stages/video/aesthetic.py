"""The aesthetic filter: a CLIP-based aesthetic score per frame, reduced over the clip.

No aesthetic model ships in a package, so the user gives one by path (nothing is downloaded):

- a directory holding a Hugging Face CLIP model (``save_pretrained`` of a ``CLIPModel`` or a
  ``CLIPVisionModelWithProjection``, with its image processor) and the weights of the LAION
  "improved aesthetic predictor" head in ``aesthetic_head.safetensors`` or
  ``aesthetic_head.pt``: ``layers.{0,2,4,6,7}.weight/bias``, the linear layers of
  ``Linear(d, 1024), Dropout, Linear(1024, 128), Dropout, Linear(128, 64), Dropout,
  Linear(64, 16), Linear(16, 1)`` (it has no activations), applied to the L2-normalised
  image embedding; ``d`` is read from the weights. Only the vision tower is loaded;
- a single TorchScript file (or pickled module) that maps float frames ``N x 3 x 224 x 224``
  in ``[0, 1]`` to ``N`` scores (it does its own normalisation).

A clip's ``"aesthetic"`` score is the ``"min"`` (default: one ugly frame is enough to spoil
a clip) or the ``"mean"`` of its frames' scores; it is filtered as ``"aesthetic"`` below
``threshold`` (LAION's scale runs from 1 to 10; 3.5 drops only clearly poor footage).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from conveyor.media.models import (
    check_model_path,
    clip_image_embeds,
    frame_batches,
    load_clip,
    load_torch_module,
    to_tensor,
)
from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, FrameConsumer, TorchStage, check_rate
from conveyor.tasks.video import Clip, Video

HEAD_FILES = ("aesthetic_head.safetensors", "aesthetic_head.pt")
REDUCTIONS = ("min", "mean")
#: the input size of a TorchScript scorer
SCRIPT_SIZE = 224


def find_head(directory: Path) -> Path:
    """The aesthetic head's weights file in a CLIP model directory."""
    for name in HEAD_FILES:
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(
        f"aesthetic model directory {str(directory)!r} has no {' or '.join(HEAD_FILES)}"
    )


def load_head(path: Path, device: str) -> Any:
    """The MLP head from its weights: a ``Linear`` at each ``layers.N`` index that has weights,
    identity (an eval-mode dropout) at the others."""
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
    if not isinstance(state, dict):
        raise TypeError(f"{path} holds a {type(state).__name__}, not a state dict")
    linear: dict[int, tuple[Any, Any]] = {}
    for key, weight in state.items():
        parts = key.split(".")
        if len(parts) >= 3 and parts[-3] == "layers" and parts[-1] == "weight":
            index = int(parts[-2])
            bias = state.get(key[: -len("weight")] + "bias")
            linear[index] = (weight, bias)
    if not linear:
        raise ValueError(f"{path} has no layers.N.weight tensors (LAION aesthetic head layout)")
    modules: list[Any] = []
    width = None
    for index in range(max(linear) + 1):
        if index not in linear:
            modules.append(torch.nn.Identity())
            continue
        weight, bias = linear[index]
        if weight.ndim != 2 or (width is not None and weight.shape[1] != width):
            raise ValueError(
                f"{path}: layers.{index}.weight has shape {tuple(weight.shape)}, "
                f"which does not follow {width} features"
            )
        layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        with torch.no_grad():
            layer.weight.copy_(weight.float())
            if bias is not None:
                layer.bias.copy_(bias.float())
        modules.append(layer)
        width = weight.shape[0]
    if width != 1:
        raise ValueError(f"{path}: the head ends in {width} outputs, not one score")
    return torch.nn.Sequential(*modules).eval().to(device)


class _ClipScorer:
    """CLIP image embeddings, L2-normalised, through the aesthetic head."""

    def __init__(self, directory: Path, device: str) -> None:
        import torch

        head = load_head(find_head(directory), device)
        head_features = next(m for m in head if isinstance(m, torch.nn.Linear)).in_features
        self.model, self.processor = load_clip(directory, device, "the aesthetic head")
        dim = self.model.config.projection_dim
        if dim != head_features:
            raise ValueError(
                f"the aesthetic head takes {head_features} features but the CLIP model "
                f"in {directory} embeds images in {dim}"
            )
        self.head = head
        self.device = device

    def __call__(self, frames: list[np.ndarray]) -> Any:
        embeds = clip_image_embeds(self.model, self.processor, frames, self.device)
        return self.head(embeds).reshape(len(frames))


class _ScriptScorer:
    """A user's module: float frames in [0, 1] in, one score per frame out."""

    def __init__(self, path: Path, device: str) -> None:
        self.module = load_torch_module(path, device)
        self.device = device

    def __call__(self, frames: list[np.ndarray]) -> Any:
        batch = to_tensor(frames, SCRIPT_SIZE, None, None).to(self.device)
        scores = self.module(batch)
        if scores.numel() != len(frames):
            raise ValueError(
                f"the aesthetic module gave {tuple(scores.shape)} for {len(frames)} frames: "
                "it must give one score per frame"
            )
        return scores.reshape(len(frames))


def check_aesthetic_model(model: str) -> tuple[str, ...]:
    """Refuse a missing model (or a CLIP directory without its head) now, not when the
    workers start; returns the modules a stage running it preloads."""
    check_model_path(model, "aesthetic")
    path = Path(model).expanduser()
    if path.is_dir():
        find_head(path)
        # the local backend imports these once per machine, before forking workers
        return ("torch", "transformers.models.clip.modeling_clip")
    return ("torch",)


class AestheticScorer:
    """A user's aesthetic model (a CLIP directory with its head, or a TorchScript file) on
    ``device``: what the video and image aesthetic stages share."""

    def __init__(self, model: str, device: str) -> None:
        path = Path(model).expanduser()
        self._scorer = _ClipScorer(path, device) if path.is_dir() else _ScriptScorer(path, device)
        self.device = device

    def scores(self, frames: list[np.ndarray]) -> np.ndarray:
        """The aesthetic score of each frame (H x W x 3 uint8 RGB; sizes may differ)."""
        import torch

        scores: list[np.ndarray] = []
        with torch.inference_mode():
            for part in frame_batches(len(frames), self.device):
                scores.append(self._scorer(frames[part]).float().cpu().numpy())
        return np.concatenate(scores).astype(np.float64) if scores else np.zeros(0)


class AestheticFilter(FrameConsumer, TorchStage):
    """Score each clip's aesthetics (the ``reduction`` of its frames' scores) and filter
    clips below ``threshold``."""

    resources = Resources(cpus=1)
    filter_name = "aesthetic"
    preload_modules = ("torch",)
    max_threads = ELASTIC_THREADS

    def __init__(
        self,
        model: str,
        threshold: float = 3.5,
        reduction: str = "min",
        frame_rate: float = 1.0,
        *,
        score_only: bool = False,
    ) -> None:
        self.preload_modules = check_aesthetic_model(model)
        if not np.isfinite(threshold):
            raise ValueError(f"threshold must be a finite number, got {threshold}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
        check_rate(frame_rate)
        self.model = str(Path(model).expanduser())
        self.threshold = threshold
        self.reduction = reduction
        self.frame_rate = frame_rate
        self.score_only = score_only
        self._scorer: AestheticScorer | None = None

    def setup(self, worker: Any) -> None:
        self.limit_threads()
        self._scorer = AestheticScorer(self.model, self.torch_device(worker))

    def frame_scores(self, frames: list[np.ndarray]) -> np.ndarray:
        """The aesthetic score of each frame (H x W x 3 uint8 RGB)."""
        assert self._scorer is not None, "setup() loads the model"
        return self._scorer.scores(frames)

    def process_clips(self, clips: list[Clip], video: Video) -> None:
        self.limit_threads()
        for clip, own in self.scored_together(clips, self.frame_scores):
            score = float(own.min() if self.reduction == "min" else own.mean())
            clip.scores["aesthetic"] = score
            if not self.score_only and score < self.threshold:
                clip.reject(self.filter_name)
