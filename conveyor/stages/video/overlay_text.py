"""The overlay-text filter: how much of the clip's frames is covered by text (burnt-in
subtitles, titles, tickers, lower thirds), found by a real text detector.

The detector is PaddleOCR's PP-OCRv4 text detection network (DBNet), the ONNX file that ships
inside the ``rapidocr-onnxruntime`` package (``models/ch_PP-OCRv4_det_infer.onnx``; nothing
is downloaded). Only the detection model is used, never the recognition one: the filter asks
where text is, not what it says. The stage finds the file without importing the package (its
``__init__`` loads OpenCV's GUI build, pyclipper and shapely, which the detector does not
need), runs it on onnxruntime and post-processes the probability map the way RapidOCR does
(DBNet's boxes: threshold 0.3, 2 x 2 dilation, the minimum-area rectangle of each region kept
where its mean probability is 0.5 or more, grown by DBNet's unclip ratio 1.6).

Per sampled frame the score is the fraction of the frame's area covered by the detected
boxes: every box is filled into one mask, so overlapping boxes are counted once. A clip
records the largest fraction over its frames as ``"overlay_text"`` and the mean as
``"overlay_text_mean"``, and is filtered as ``"overlay_text"`` when the largest is above
``threshold``: a caption shown on only some of the clip's frames still puts text into the
clip, and the mean of a clip whose caption comes and goes would let it through. ``score_only``
records the scores and filters nothing.

Frames are detected at ``short_side`` pixels on their short side (224 by default, the size
the transcoder samples the models' frames at, so they are not resized), each side rounded to
a multiple of 32 as the network needs. RapidOCR itself upscales to a 736 pixel short side to
read small print; text big enough to spoil a clip is found at 224, where the network sees an
eleventh of the pixels and no text in the synthetic patterns (from 320 on it takes some of
the rings and shapes for text).

onnxruntime runs with as many intra-op threads as the stage has CPUs, on CUDA where the worker
was given a GPU and the installed onnxruntime has the CUDA provider.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.video.base import FrameConsumer, check_rate
from conveyor.stages.video.nsfw import choose_providers
from conveyor.tasks.video import Clip, Video

PACKAGE = "rapidocr_onnxruntime"
DETECTION_MODEL = "ch_PP-OCRv4_det_infer.onnx"
#: frames per onnxruntime call (of one size; a chunk's clips are scored together): on a CPU
#: one at a time is fastest (at 398 x 224, one thread: 20 ms a frame alone, 29 in eights)
CPU_BATCH = 1
GPU_BATCH = 16
#: RapidOCR's DBNet post-processing (its config.yaml's ``Det`` section)
BINARY_THRESHOLD = 0.3
BOX_THRESHOLD = 0.5
UNCLIP_RATIO = 1.6
MIN_SIDE = 3
MAX_CANDIDATES = 1000


def packaged_model_path() -> str:
    """The PP-OCRv4 detection ONNX file inside the ``rapidocr-onnxruntime`` package, found
    without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the overlay-text filter needs the rapidocr-onnxruntime package for its text "
            "detection model: pip install --no-deps 'rapidocr-onnxruntime>=1.4' (`make "
            "install` does; its own dependencies, OpenCV's GUI build among them, are not needed)"
        )
    model = Path(next(iter(spec.submodule_search_locations))) / "models" / DETECTION_MODEL
    if not model.is_file():
        raise FileNotFoundError(
            f"the rapidocr-onnxruntime package has no bundled models/{DETECTION_MODEL}: "
            "reinstall it"
        )
    return str(model)


def detection_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """The network's input size for a ``height`` x ``width`` frame: the short side scaled to
    ``short_side``, each side rounded to a multiple of 32 (at least 32)."""
    ratio = short_side / min(height, width)
    return (
        max(32, round(height * ratio / 32) * 32),
        max(32, round(width * ratio / 32) * 32),
    )


def text_boxes(probabilities: np.ndarray) -> list[np.ndarray]:
    """DBNet's text boxes (4 x 2 float corners, in the map's pixels) from its probability
    map (H x W floats in [0, 1]), as RapidOCR finds them."""
    import cv2

    bitmap = cv2.dilate(
        (probabilities > BINARY_THRESHOLD).astype(np.uint8), np.ones((2, 2), np.uint8)
    )
    contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    height, width = probabilities.shape
    boxes: list[np.ndarray] = []
    for contour in contours[:MAX_CANDIDATES]:
        centre, (w, h), angle = cv2.minAreaRect(contour)
        if min(w, h) < MIN_SIDE:
            continue
        corners = cv2.boxPoints((centre, (w, h), angle))
        # the box's mean probability (RapidOCR's "fast" score)
        x0, y0 = np.clip(np.floor(corners.min(axis=0)).astype(int), 0, [width - 1, height - 1])
        x1, y1 = np.clip(np.ceil(corners.max(axis=0)).astype(int), 0, [width - 1, height - 1])
        inside = np.zeros((y1 - y0 + 1, x1 - x0 + 1), np.uint8)
        cv2.fillPoly(inside, [(corners - (x0, y0)).astype(np.int32)], 1)
        if cv2.mean(probabilities[y0 : y1 + 1, x0 : x1 + 1], inside)[0] < BOX_THRESHOLD:
            continue
        # DBNet predicts shrunken regions: grow the rectangle by area * ratio / perimeter on
        # every side (what pyclipper's offset and a second minimum-area rectangle give)
        grow = w * h * UNCLIP_RATIO / (2 * (w + h))
        grown = (w + 2 * grow, h + 2 * grow)
        if min(grown) < MIN_SIDE + 2:
            continue
        boxes.append(cv2.boxPoints((centre, grown, angle)))
    return boxes


def covered_fraction(probabilities: np.ndarray) -> float:
    """The fraction of the map covered by text boxes (their union: overlaps count once)."""
    import cv2

    mask = np.zeros(probabilities.shape, np.uint8)
    # one box at a time: fillPoly given several polygons fills their overlaps by the even-odd
    # rule, leaving where two boxes overlap empty
    for box in text_boxes(probabilities):
        cv2.fillConvexPoly(mask, np.round(box).astype(np.int32), 1)
    return float(np.count_nonzero(mask)) / mask.size


class TextDetector:
    """PP-OCRv4's text detection network on onnxruntime: frames in, text boxes or the
    fraction of each frame they cover out."""

    def __init__(
        self,
        model_path: str | None = None,
        *,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        threads: int = 1,
        short_side: int = 224,
    ) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(
            model_path or packaged_model_path(), options, providers=list(providers)
        )
        self.input_name = self.session.get_inputs()[0].name
        self.short_side = short_side
        gpu = self.session.get_providers()[0] == "CUDAExecutionProvider"
        self.batch_frames = GPU_BATCH if gpu else CPU_BATCH

    def probability_maps(self, frames: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The network's text probability map of each frame (H x W x 3 uint8 RGB; sizes may
        differ), at the frame's detection size."""
        import cv2

        maps: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * len(frames)
        by_size: dict[tuple[int, int], list[int]] = {}
        for index, frame in enumerate(frames):
            if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
                raise ValueError(f"frames must be H x W x 3 uint8, got {frame.shape} {frame.dtype}")
            by_size.setdefault(frame.shape[:2], []).append(index)
        for (height, width), indices in by_size.items():
            size = detection_size(height, width, self.short_side)
            for start in range(0, len(indices), self.batch_frames):
                part = indices[start : start + self.batch_frames]
                batch = np.empty((len(part), 3, *size), np.float32)
                for row, index in enumerate(part):
                    frame = frames[index]
                    if frame.shape[:2] != size:
                        frame = cv2.resize(frame, size[::-1], interpolation=cv2.INTER_LINEAR)
                    # RapidOCR's normalisation: (x / 255 - 0.5) / 0.5, channels first
                    batch[row] = frame.transpose(2, 0, 1)
                batch *= 1 / 127.5
                batch -= 1.0
                (out,) = self.session.run(None, {self.input_name: batch})
                for row, index in enumerate(part):
                    maps[index] = out[row, 0]
        return maps

    def text_fractions(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """The fraction of each frame's area covered by detected text (0 to 1)."""
        return np.asarray(
            [covered_fraction(p) for p in self.probability_maps(frames)], dtype=np.float64
        )


class OverlayTextFilter(FrameConsumer):
    """Score how much of each clip's frames is text (the largest and the mean fraction of a
    frame covered by detected text) and filter clips whose largest is above ``threshold``."""

    resources = Resources(cpus=1)
    filter_name = "overlay_text"
    preload_modules = ("onnxruntime",)

    def __init__(
        self,
        threshold: float = 0.02,
        frame_rate: float = 1.0,
        *,
        short_side: int = 224,
        score_only: bool = False,
    ) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        check_rate(frame_rate)
        if isinstance(short_side, bool) or not isinstance(short_side, int) or short_side < 32:
            raise ValueError(f"short_side must be a whole number >= 32 pixels, got {short_side!r}")
        packaged_model_path()  # a missing package is an error now, not when workers start
        self.threshold = threshold
        self.frame_rate = frame_rate
        self.short_side = short_side
        self.score_only = score_only
        self._detector: TextDetector | None = None
        #: the onnxruntime providers asked for (set by ``setup``)
        self.providers: list[str] = []

    def setup(self, worker: Any) -> None:
        self.providers = choose_providers(worker)
        self._detector = TextDetector(
            packaged_model_path(),
            providers=self.providers,
            threads=max(1, round(self.resources.cpus)),
            short_side=self.short_side,
        )

    def text_fractions(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """The fraction of each frame (H x W x 3 uint8 RGB) covered by detected text."""
        if self._detector is None:
            raise RuntimeError("OverlayTextFilter.setup has not run")
        return self._detector.text_fractions(frames)

    def process_clips(self, clips: list[Clip], video: Video) -> None:
        for clip, fractions in self.scored_together(clips, self.text_fractions):
            largest = float(fractions.max())
            clip.scores["overlay_text"] = largest
            clip.scores["overlay_text_mean"] = float(fractions.mean())
            if not self.score_only and largest > self.threshold:
                clip.reject(self.filter_name)
