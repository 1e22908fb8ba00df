"""Cutting clips out of their source and encoding them to H.264 MP4 (yuv420p) with PyAV.

A chunk's stretch of the source is decoded once, from one seek, and every decoded frame is
given to the encoder of each clip that contains it (clips may overlap). Encoding uses
``libx264`` on a CPU (preset and CRF configurable) or ``h264_nvenc`` where the worker was given
a GPU and the driver takes it (``encoder="auto"``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

from conveyor.resources import Resources
from conveyor.stages.video.base import ELASTIC_THREADS, ClipStage
from conveyor.stages.video.decode import Damage, decode_range
from conveyor.tasks.video import Clip, Video

log = logging.getLogger(__name__)

ENCODERS = ("auto", "libx264", "h264_nvenc")


def output_size(width: int, height: int, max_height: int | None) -> tuple[int, int]:
    """Even dimensions (yuv420p needs them), scaled down to ``max_height`` keeping the shape
    (an odd limit is taken down to even: never above it)."""
    if max_height is not None and height > max_height:
        target = max(2, max_height // 2 * 2)
        return max(2, round(width * target / height / 2) * 2), target
    return max(2, round(width / 2) * 2), max(2, round(height / 2) * 2)


SCRATCH_PREFIX = "conveyor-clip-"


def _scratch_dir() -> str:
    return (
        "/dev/shm"
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
        else tempfile.gettempdir()
    )


def sweep_scratch(folder: str) -> None:
    """Remove the scratch clips of workers that died mid-clip (a crash, a ``kill -9``): each
    file names the process writing it, and one whose process is gone is garbage."""
    for path in Path(folder).glob(f"{SCRATCH_PREFIX}*-*.mp4"):
        try:
            pid = int(path.name[len(SCRATCH_PREFIX) :].split("-", 1)[0])
            os.kill(pid, 0)
        except ValueError:
            continue  # not named by a process
        except ProcessLookupError:
            path.unlink(missing_ok=True)
        except PermissionError:
            continue  # another user's live process


#: ``VideoFrame.pict_type`` that leaves the choice to the encoder (``PictureType.NONE``)
_ANY_PICTURE = 0
#: output timestamps per frame of the nominal rate
STEPS_PER_FRAME = 100
#: a frame this close to its place at the nominal rate is put there (Matroska's stamps
#: are whole milliseconds)
SNAP_S = 0.001


class _ClipEncoder:
    """One clip's MP4 being written (to a scratch file, so the index can go first)."""

    def __init__(
        self,
        codec: str,
        options: dict[str, str],
        size: tuple[int, int],
        rate: Fraction,
        threads: int,
        rotation: int = 0,
        sample_aspect: tuple[int, int] = (1, 1),
    ) -> None:
        import av

        prefix = f"{SCRATCH_PREFIX}{os.getpid()}-"
        fd, self.path = tempfile.mkstemp(suffix=".mp4", prefix=prefix, dir=_scratch_dir())
        os.close(fd)
        self.container = av.open(self.path, "w", format="mp4", options={"movflags": "+faststart"})
        stream = self.container.add_stream(codec, rate=rate)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = options
        if codec == "libx264":
            stream.codec_context.thread_count = threads
        if rotation:
            stream.set_display_rotation(rotation)  # players turn the clip as the source
        if sample_aspect != (1, 1):  # and show it as wide as the source
            stream.codec_context.sample_aspect_ratio = Fraction(*sample_aspect)
        # a hundredth of a frame: a constant-rate source keeps evenly spaced stamps, and a
        # variable-rate one (screen and phone recordings) keeps its timing
        self.time_base = 1 / (rate * STEPS_PER_FRAME)
        stream.codec_context.time_base = self.time_base
        self.stream = stream
        self.size = size
        self.rate = rate
        self.frames = 0
        self._origin: float | None = None
        self._last_pts = -1

    def add(self, frame: Any, t: float) -> None:
        """Append ``frame``, shown ``t`` seconds into the source."""
        width, height = self.size
        if frame.width != width or frame.height != height or frame.format.name != "yuv420p":
            frame = frame.reformat(width=width, height=height, format="yuv420p")
        if self._origin is None:
            self._origin = t
        steps = (t - self._origin) / self.time_base
        slot = round(steps / STEPS_PER_FRAME) * STEPS_PER_FRAME  # the nominal frame's place
        if abs(steps - slot) * self.time_base <= SNAP_S:
            steps = slot  # stamps the container rounded (to milliseconds) stay even
        pts = max(round(steps), self._last_pts + 1)
        frame.pts, frame.time_base = pts, self.time_base
        # the encoder picks its own frame types: x264 makes a key frame of every frame the
        # decoder marked intra, and an intra-only source (MJPEG, ProRes, FFV1...) marks all
        frame.pict_type = _ANY_PICTURE
        self._last_pts = pts
        self.container.mux(self.stream.encode(frame))
        self.frames += 1

    def finish(self) -> bytes:
        try:
            self.container.mux(self.stream.encode(None))
            self.container.close()
            with open(self.path, "rb") as source:
                return source.read()
        finally:
            self.discard()

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self.container.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class ClipTranscoder(ClipStage):
    """Encode each clip of a chunk to H.264 MP4 from one decoding pass over the source.

    ``encoder``: ``"libx264"``, ``"h264_nvenc"`` or ``"auto"`` (NVENC where the worker has a
    GPU and NVENC opens, else libx264). ``preset``/``crf`` tune libx264 (NVENC uses ``cq``);
    ``max_height`` scales larger sources down. An interlaced source is deinterlaced
    (``deinterlace``, FFmpeg's bwdif at the source's frame rate), since an H.264 clip is
    progressive and players would show its fields combed. A clip with no decodable frame
    fails alone.
    """

    resources = Resources(cpus=1)
    max_threads = ELASTIC_THREADS  # libx264's frame threads

    def __init__(
        self,
        encoder: str = "auto",
        preset: str = "veryfast",
        crf: int = 23,
        max_height: int | None = None,
        cq: int = 21,
        deinterlace: bool = True,
    ) -> None:
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {', '.join(ENCODERS)}, got {encoder!r}")
        if not 0 <= crf <= 51:
            raise ValueError(f"crf must be in 0..51, got {crf}")
        if max_height is not None and max_height < 2:
            raise ValueError(f"max_height must be >= 2, got {max_height}")
        self.encoder = encoder
        self.preset = preset
        self.crf = crf
        self.max_height = max_height
        self.cq = cq
        self.deinterlace = deinterlace
        self._codec = "libx264"

    def setup(self, worker: Any) -> None:
        sweep_scratch(_scratch_dir())
        self._codec = self._choose(bool(worker.gpu_ids))

    def _choose(self, has_gpu: bool) -> str:
        if self.encoder == "libx264" or (self.encoder == "auto" and not has_gpu):
            return "libx264"
        if nvenc_works():
            return "h264_nvenc"
        if self.encoder == "h264_nvenc":
            raise RuntimeError("h264_nvenc was asked for but cannot be opened on this worker")
        log.warning("NVENC is not usable on this GPU worker; encoding with libx264")
        return "libx264"

    def _options(self) -> dict[str, str]:
        if self._codec == "h264_nvenc":
            return {"preset": "p4", "rc": "vbr", "cq": str(self.cq), "b": "0"}
        return {"preset": self.preset, "crf": str(self.crf)}

    def process_clips(self, clips: list[Clip], video: Video) -> None:
        import av

        try:
            self._transcode(clips, video)
        except av.InvalidDataError:
            if len(clips) == 1:
                raise
            # a stretch too damaged to decode: each clip not yet written is tried on its
            # own, so that the damage fails only the clips it is in
            rest = [clip for clip in clips if clip.active and clip.encoded is None]
            super().process_clips(rest, video)

    def process_clip(self, clip: Clip, video: Video) -> None:
        self._transcode([clip], video)

    def _transcode(self, clips: list[Clip], video: Video) -> None:
        """Encode ``clips`` from one decoding pass over their stretch of the source."""
        meta = video.metadata
        assert meta is not None
        size = output_size(meta.width, meta.height, self.max_height)
        rate = Fraction(meta.fps).limit_denominator(1001)
        threads = self.threads
        options = self._options()
        pending = sorted(clips, key=lambda c: c.frame_span[0])
        open_: dict[str, _ClipEncoder] = {}
        done: set[str] = set()
        start = pending[0].frame_span[0] / meta.fps
        stop = max(c.frame_span[1] for c in pending)
        end = meta.duration_s if stop >= meta.num_frames else stop / meta.fps
        damage = Damage()
        try:
            frames = decode_range(
                video.path,
                meta,
                start,
                end,
                threads=threads,
                deinterlace=self.deinterlace,
                damage=damage,
            )
            for t, frame in frames:
                index = round(t * meta.fps)
                for clip in pending:
                    first, last = clip.frame_span
                    if clip.clip_id in done:
                        continue
                    if index >= last and last < meta.num_frames:  # the last clip takes
                        self._close(clip, open_, done, damage)  # all to the end (VFR)
                    elif index >= first:
                        encoder = open_.get(clip.clip_id)
                        if encoder is None:
                            encoder = _ClipEncoder(
                                self._codec,
                                options,
                                size,
                                rate,
                                threads,
                                meta.rotation,
                                meta.sample_aspect,
                            )
                            open_[clip.clip_id] = encoder
                        encoder.add(frame, t)
            for clip in pending:
                if clip.clip_id not in done:
                    self._close(clip, open_, done, damage)
        finally:
            video.damaged_packets += damage.packets
            for encoder in open_.values():
                encoder.discard()

    def _close(
        self, clip: Clip, open_: dict[str, _ClipEncoder], done: set[str], damage: Damage
    ) -> None:
        done.add(clip.clip_id)
        encoder = open_.pop(clip.clip_id, None)
        if encoder is None or encoder.frames == 0:
            if encoder is not None:
                encoder.discard()
            span = f"{clip.span[0]:.2f}-{clip.span[1]:.2f} s"
            if damage.packets:
                clip.fail(self.name, f"no frame could be decoded in {span}")
            else:  # nothing refused on the way: the file has no frame there
                clip.fail(self.name, f"the source has no frame in {span} (its timestamps skip it)")
            return
        frames = encoder.frames
        clip.encoded = encoder.finish()
        clip.width, clip.height = encoder.size
        clip.fps = float(encoder.rate)
        clip.num_frames = frames
        clip.codec = "h264"


_NVENC: bool | None = None


def nvenc_works() -> bool:
    """Whether NVENC opens here (once per process): the codec is built in and a driver takes it."""
    global _NVENC
    if _NVENC is None:
        import av

        try:
            context = av.CodecContext.create("h264_nvenc", "w")
            context.width, context.height, context.pix_fmt = 256, 256, "yuv420p"
            context.time_base = Fraction(1, 30)
            context.open()
            _NVENC = True
        except Exception:  # noqa: BLE001 - any failure means: not usable here
            _NVENC = False
    return _NVENC
