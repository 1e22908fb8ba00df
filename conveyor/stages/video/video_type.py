"""The video type: zero-shot classification of each clip with a CLIP model the user gives.

No such model ships in a package, so the user gives a directory holding a Hugging Face CLIP
model (``save_pretrained`` of a ``CLIPModel``: both towers, its tokenizer and its image
processor; nothing is downloaded). Each label becomes a text prompt, ``template`` filled in
(``"a video frame of {label}"``); the prompts are embedded once, when a worker sets up. Each
of the clip's sampled frames is embedded, and its cosine similarities to the prompts, times
the model's logit scale, are turned into probabilities over the labels with a softmax; the
clip's scores are the mean of its frames' distributions (so they sum to 1), and its type is
the label with the highest score.

Why the frames' probabilities are averaged rather than their embeddings: each frame is
classified as CLIP was trained to classify an image, and a clip that mixes types (a title
card, then footage) gets scores that say so, where the mean of unlike embeddings is a point
near neither. The cost is the same: the vision tower is the whole of it, the prompts are
one matrix product more.

A clip's meta gets ``video_type``: ``{"label": ..., "scores": {label: probability}}``. With
``keep`` (labels), a clip whose type is not among them is filtered as ``"video_type"``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, FrameConsumer, TorchStage
from conveyor.tasks.video import Clip, Video

# NumPy, torch and the model helpers are imported where used: ``VideoConfig`` checks its
# options with this module's functions in a driver that needs none of them

DEFAULT_VIDEO_TYPES = (
    "natural footage",
    "animation",
    "screen recording",
    "video game",
    "slideshow",
)
PROMPT_TEMPLATE = "a video frame of {label}"
#: a tokenizer's files, one of which a model directory must hold
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")
IMAGE_PROCESSOR_FILE = "preprocessor_config.json"


def split_labels(text: str) -> tuple[str, ...]:
    """``"a, b,c"`` -> ``("a", "b", "c")``: a comma list, blanks and empty items dropped."""
    return tuple(label.strip() for label in text.split(",") if label.strip())


def model_problem(
    model: str, what: str = "video type model", use: str = "zero-shot classification"
) -> str | None:
    """What makes ``model`` unusable as a whole CLIP model directory (``what``, for
    ``use``), found without loading it (``None``: nothing): a missing path, a file, no
    readable CLIP ``config.json``, no tokenizer or image processor."""
    path = Path(model).expanduser()
    if not path.exists():
        return f"{what} path {model!r} does not exist"
    if not path.is_dir():
        return (
            f"{what} {model!r} is a file: give a Hugging Face CLIP model directory "
            "(save_pretrained of a CLIPModel, with its tokenizer and image processor)"
        )
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"{what} {model!r}: config.json cannot be read ({reason})"
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind != "clip":
        return (
            f"{what} {model!r} holds a {kind!r} model: {use} needs a whole CLIP model "
            "(CLIPModel: image and text towers)"
        )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return f"{what} {model!r} has no tokenizer ({' or '.join(TOKENIZER_FILES)})"
    if not (path / IMAGE_PROCESSOR_FILE).is_file():
        return f"{what} {model!r} has no image processor ({IMAGE_PROCESSOR_FILE})"
    return None


def label_problems(labels: Sequence[str], keep: Sequence[str]) -> list[str]:
    """What is wrong with a label list and the labels to keep."""
    problems = []
    if not labels:
        problems.append("video types: the label list is empty")
    if any(not label.strip() for label in labels):
        problems.append("video types: a label is empty")
    repeated = sorted({label for label in labels if list(labels).count(label) > 1})
    if repeated:
        problems.append(f"video types: {', '.join(map(repr, repeated))} given more than once")
    unknown = [label for label in keep if label not in labels]
    if unknown and labels:
        problems.append(
            f"keep types {', '.join(map(repr, unknown))} not among the video types "
            f"({', '.join(labels)})"
        )
    return problems


class VideoTypeClassifier(FrameConsumer, TorchStage):
    """Classify each clip among ``labels`` (zero-shot CLIP); with ``keep``, filter clips
    whose type is not kept."""

    resources = Resources(cpus=1)
    filter_name = "video_type"
    # the local backend imports these once per machine, before forking workers
    preload_modules = ("torch", "transformers.models.clip.modeling_clip")
    max_threads = ELASTIC_THREADS

    def __init__(
        self,
        model: str,
        labels: Sequence[str] = DEFAULT_VIDEO_TYPES,
        keep: Sequence[str] = (),
        template: str = PROMPT_TEMPLATE,
        frame_rate: float = 1.0,
        *,
        score_only: bool = False,
    ) -> None:
        if not Path(model).expanduser().exists():
            raise FileNotFoundError(f"video type model path {model!r} does not exist")
        problem = model_problem(model)
        if problem is not None:
            raise ValueError(problem)
        labels, keep = tuple(labels), tuple(keep)
        problems = label_problems(labels, keep)
        if "{label}" not in template:
            problems.append(f"template must hold {{label}}, got {template!r}")
        if not frame_rate > 0:
            problems.append(f"frame_rate must be > 0, got {frame_rate}")
        if problems:
            raise ValueError("; ".join(problems))
        self.model = str(Path(model).expanduser())
        self.labels = labels
        self.keep = keep
        self.template = template
        self.frame_rate = frame_rate
        self.score_only = score_only
        self._clip: Any = None
        self._processor: Any = None
        self._prompts: Any = None
        self._device = "cpu"

    @property
    def prompts(self) -> list[str]:
        return [self.template.format(label=label) for label in self.labels]

    def setup(self, worker: Any) -> None:
        import torch
        from transformers import AutoTokenizer

        from conveyor.media.models import clip_text_embeds, load_clip

        self.limit_threads()
        self._device = self.torch_device(worker)
        path = Path(self.model)
        self._clip, self._processor = load_clip(
            path, self._device, "video type classification", text=True
        )
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        with torch.inference_mode():
            text = clip_text_embeds(self._clip, tokenizer, self.prompts, self._device)
            # the logit scale folded in: a frame's logits are one product away
            self._prompts = (text * self._clip.logit_scale.exp().float()).T.contiguous()

    def frame_probabilities(self, frames: Sequence[Any]) -> Any:
        """Each frame's (H x W x 3 uint8 RGB) probabilities over the labels: N x labels."""
        import numpy as np
        import torch

        from conveyor.media.models import clip_image_embeds, frame_batches

        out: list[Any] = []
        with torch.inference_mode():
            for part in frame_batches(len(frames), self._device):
                embeds = clip_image_embeds(self._clip, self._processor, frames[part], self._device)
                logits = embeds @ self._prompts
                out.append(logits.softmax(dim=-1).double().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, len(self.labels)))

    def process_clips(self, clips: list[Clip], video: Video) -> None:
        self.limit_threads()
        for clip, own in self.scored_together(clips, self.frame_probabilities):
            scores = own.mean(axis=0)
            best = self.labels[int(scores.argmax())]
            clip.video_type = {
                "label": best,
                "scores": {label: float(p) for label, p in zip(self.labels, scores, strict=True)},
            }
            if self.keep and not self.score_only and best not in self.keep:
                clip.reject(self.filter_name)
