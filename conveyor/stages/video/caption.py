"""Captions: a sentence per clip from a vision-language model shown a few of its frames.

The model is a local Hugging Face directory (``save_pretrained``, e.g. a Qwen2-VL or LLaVA
checkpoint the user has); nothing is downloaded. Each active clip contributes up to
``frames_per_clip`` frames, taken evenly from those the frame extractor decoded at
``frame_rate``, as images in one user message with the prompt; the processor's chat template
turns that into the model's own prompt format. Decoding is greedy, so a clip gets the same
caption every run. The caption is stored under the model directory's name (or
``name_in_output``) in ``clip.captions``.

Two engines run the model. vLLM batches and pages the KV cache, much faster on a GPU, but it
needs one; plain ``transformers`` runs anywhere. ``engine="auto"`` takes vLLM when it is
installed and the worker was given a GPU, else ``transformers``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from conveyor.media.errors import describe_error, input_errors
from conveyor.resources import Resources
from conveyor.stages.video.base import FrameConsumer, TorchStage, check_rate
from conveyor.tasks.video import Clip, Video

if TYPE_CHECKING:
    from conveyor.cluster import WorkerInfo

Engine = Literal["auto", "vllm", "transformers"]
ENGINES = ("auto", "vllm", "transformers")
DEFAULT_PROMPT = "Describe this video clip in one sentence."
#: auto classes tried in turn: the first that knows the model's config loads it
AUTO_CLASSES = ("AutoModelForImageTextToText", "AutoModelForVision2Seq", "AutoModelForCausalLM")


def vllm_installed() -> bool:
    """Whether vLLM can be imported (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def sample_frames(frames: np.ndarray, count: int) -> np.ndarray:
    """Up to ``count`` frames spread evenly over the clip: the middle of each of ``count``
    equal stretches, so the first and last frames (often mid-transition) are avoided."""
    total = len(frames)
    take = min(total, count)
    index = ((np.arange(take) + 0.5) * total / take).astype(int)
    return frames[np.minimum(index, total - 1)]


class Captioner(FrameConsumer, TorchStage):
    """``clip.captions[key]``: a vision-language model's answer to ``prompt`` about the clip's
    frames, where ``key`` is ``name_in_output`` or the model directory's name."""

    resources = Resources(cpus=1)
    # transformers' modeling code costs seconds to import and differs per model: not preloaded
    preload_modules = ("torch",)

    def __init__(
        self,
        model_path: str,
        prompt: str = DEFAULT_PROMPT,
        frames_per_clip: int = 4,
        max_new_tokens: int = 64,
        frame_rate: float = 1.0,
        engine: Engine = "auto",
        name_in_output: str | None = None,
        *,
        clips_per_batch: int = 8,
        trust_remote_code: bool = False,
        vllm_options: dict[str, Any] | None = None,
        resources: Resources | None = None,
    ) -> None:
        path = Path(model_path).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"caption model path {model_path!r} does not exist")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        for label, value in (
            ("frames_per_clip", frames_per_clip),
            ("max_new_tokens", max_new_tokens),
            ("clips_per_batch", clips_per_batch),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be an int >= 1, got {value!r}")
        check_rate(frame_rate)
        if not prompt.strip():
            raise ValueError("prompt must not be empty")
        if name_in_output is not None and not name_in_output:
            raise ValueError("name_in_output must be a non-empty string or None")
        self.model_path = str(path)
        self.prompt = prompt
        self.frames_per_clip = frames_per_clip
        self.max_new_tokens = max_new_tokens
        self.frame_rate = frame_rate
        self.engine = engine
        self.output_key = name_in_output or path.resolve().name
        self.clips_per_batch = clips_per_batch
        self.trust_remote_code = trust_remote_code
        self.vllm_options = dict(vllm_options or {})
        if resources is not None:
            self.resources = resources
        #: the engine ``setup`` chose ("vllm" or "transformers")
        self.engine_in_use: str | None = None
        self.device = "cpu"
        self._model: Any = None
        self._processor: Any = None
        self._llm: Any = None
        self._sampling: Any = None
        self._prompts: dict[int, str] = {}

    # -- setup ----------------------------------------------------------------------------
    def setup(self, worker: WorkerInfo) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.limit_threads()
        self.device = self.torch_device(worker)
        self.engine_in_use = self._choose_engine()
        self._prompts = {}
        if self.engine_in_use == "vllm":
            self._setup_vllm(worker)
        else:
            self._setup_transformers()

    def _choose_engine(self) -> str:
        if self.engine == "transformers":
            return "transformers"
        has_vllm = vllm_installed()
        if self.engine == "vllm":
            if not has_vllm:
                raise RuntimeError(
                    f"stage {self.name!r}: engine='vllm' but vLLM is not installed "
                    "(pip install vllm), or use engine='transformers' or 'auto'"
                )
            if self.device != "cuda":
                raise RuntimeError(
                    f"stage {self.name!r}: engine='vllm' needs a GPU and this worker has none "
                    "(give the stage Resources(gpus=...)), or use engine='transformers' or 'auto'"
                )
            return "vllm"
        return "vllm" if has_vllm and self.device == "cuda" else "transformers"

    def _load_processor(self) -> Any:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(
            self.model_path, trust_remote_code=self.trust_remote_code, local_files_only=True
        )

    def _setup_transformers(self) -> None:
        import transformers

        transformers.logging.disable_progress_bar()
        self._processor = self._load_processor()
        tokenizer = self._tokenizer()
        # a batch of prompts is padded on the left, so every row's new tokens start together
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self._model = load_vision_language_model(
            self.model_path, self.device, trust_remote_code=self.trust_remote_code
        )

    def _setup_vllm(self, worker: WorkerInfo) -> None:
        from vllm import LLM, SamplingParams

        self._processor = self._load_processor()  # its chat template builds the prompts
        options: dict[str, Any] = {
            "limit_mm_per_prompt": {"image": self.frames_per_clip},
            "trust_remote_code": self.trust_remote_code,
        }
        if 0 < worker.gpu_fraction < 1:  # vLLM would otherwise claim 90% of the device
            options["gpu_memory_utilization"] = round(0.9 * worker.gpu_fraction, 3)
        options.update(self.vllm_options)
        self._llm = LLM(model=self.model_path, **options)
        self._sampling = SamplingParams(max_tokens=self.max_new_tokens, temperature=0.0)

    def teardown(self) -> None:
        import gc

        # vLLM stops its engine processes when the LLM is collected
        self._model = self._llm = self._processor = self._sampling = None
        gc.collect()

    # -- work -----------------------------------------------------------------------------
    def process_clips(self, clips: list[Clip], video: Video) -> None:
        errors = input_errors()
        todo: list[tuple[Clip, list[Any]]] = []
        for clip in clips:
            try:
                todo.append((clip, self.clip_images(clip)))
            except errors as exc:
                clip.fail(self.name, describe_error(exc))
        for start in range(0, len(todo), self.clips_per_batch):
            part = todo[start : start + self.clips_per_batch]
            captions = self.caption([images for _, images in part])
            for (clip, _), caption in zip(part, captions, strict=True):
                clip.captions[self.output_key] = caption

    def clip_images(self, clip: Clip) -> list[Any]:
        """The frames the model is shown for ``clip``, as PIL images."""
        from PIL import Image

        frames = sample_frames(self.frames_of(clip), self.frames_per_clip)
        return [Image.fromarray(np.ascontiguousarray(frame)) for frame in frames]

    def caption(self, batch: list[list[Any]]) -> list[str]:
        """One caption per entry of ``batch`` (each a list of images), in order."""
        if self.engine_in_use == "vllm":
            return self._caption_vllm(batch)
        return self._caption_transformers(batch)

    def prompt_for(self, num_images: int) -> str:
        """The model's prompt text for ``num_images`` images followed by ``prompt``."""
        text = self._prompts.get(num_images)
        if text is None:
            text = self._prompts[num_images] = self._build_prompt(num_images)
        return text

    def _build_prompt(self, num_images: int) -> str:
        processor = self._processor
        if getattr(processor, "chat_template", None):
            content: list[dict[str, str]] = [{"type": "image"} for _ in range(num_images)]
            content.append({"type": "text", "text": self.prompt})
            messages = [{"role": "user", "content": content}]
            return processor.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        # no template: the model's image placeholders (if it has any), then the prompt
        token = getattr(processor, "image_token", None)
        return f"{token * num_images}\n{self.prompt}" if token else self.prompt

    def _tokenizer(self) -> Any:
        tokenizer = getattr(self._processor, "tokenizer", None)
        return self._processor if tokenizer is None else tokenizer

    def _caption_transformers(self, batch: list[list[Any]]) -> list[str]:
        import torch

        texts = [self.prompt_for(len(images)) for images in batch]
        inputs = self._processor(text=texts, images=batch, padding=True, return_tensors="pt")
        # floating inputs (pixels) take the model's dtype, token ids only move
        inputs = inputs.to(self.device, dtype=self._model.dtype)
        tokenizer = self._tokenizer()
        with torch.inference_mode():
            output = self._model.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=tokenizer.pad_token_id,
            )
        if not getattr(self._model.config, "is_encoder_decoder", False):
            output = output[:, inputs["input_ids"].shape[1] :]  # the prompt is echoed first
        decoded = tokenizer.batch_decode(output, skip_special_tokens=True)
        return [text.strip() for text in decoded]

    def _caption_vllm(self, batch: list[list[Any]]) -> list[str]:
        requests = [
            {"prompt": self.prompt_for(len(images)), "multi_modal_data": {"image": images}}
            for images in batch
        ]
        outputs = self._llm.generate(requests, self._sampling, use_tqdm=False)
        return [output.outputs[0].text.strip() for output in outputs]


def load_vision_language_model(path: str, device: str, *, trust_remote_code: bool = False) -> Any:
    """A local vision-language model in eval mode on ``device``, through the first auto
    class its config is registered with (image-text-to-text, then older registrations)."""
    import transformers

    problems = []
    for name in AUTO_CLASSES:
        auto = getattr(transformers, name, None)
        if auto is None:  # not in this transformers version
            continue
        try:
            model = auto.from_pretrained(
                path, dtype="auto", trust_remote_code=trust_remote_code, local_files_only=True
            )
        except ValueError as exc:  # "Unrecognized configuration class ..."
            problems.append(f"{name}: {str(exc).strip().splitlines()[0]}")
            continue
        return model.eval().to(device)
    raise ValueError(
        f"{path} holds no vision-language model transformers can load: " + "; ".join(problems)
    )
