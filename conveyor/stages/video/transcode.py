"""Cutting clips out of their source and encoding them to H.264 MP4 (yuv420p) with PyAV.

A chunk's stretch of the source is decoded once, from one seek, and every decoded frame is
given to the encoder of each clip that contains it (clips may overlap); the same pass samples
the frames the models downstream need and reads the source's motion vectors, so that no later
stage decodes the clip again. Each clip leaves as soon as its encoder closes, as one part of
its chunk. Encoding uses ``libx264`` on a CPU (preset and CRF configurable) or ``h264_nvenc``
where the worker was given a GPU and the driver takes it (``encoder="auto"``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.media.decode import (
    Damage,
    DecodeNote,
    check_decoder,
    decode_range,
    decodes_on_nvdec,
)
from conveyor.media.errors import InputError, describe_error, input_errors
from conveyor.resources import Resources
from conveyor.scratch import scratch_dir, scratch_dirs
from conveyor.stages.video.base import ELASTIC_THREADS, VideoStage
from conveyor.stages.video.frames import FrameSampler, model_size
from conveyor.stages.video.motion import FrameMotion, MotionGrid, MotionTally
from conveyor.tasks.video import Clip, Video, VideoMetadata, VideoTask

log = logging.getLogger(__name__)

ENCODERS = ("auto", "libx264", "h264_nvenc")
#: libx264's presets, fastest first (one it does not know fails at its first frame)
X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)


def output_size(
    width: int, height: int, max_height: int | None, sideways: bool = False
) -> tuple[int, int]:
    """Even dimensions (yuv420p needs them), scaled down to ``max_height`` keeping the shape
    (an odd limit is taken down to even: never above it). ``sideways``: the player turns
    it a quarter, so the limit is on the height shown, the stored width."""
    if sideways:
        shown_height, shown_width = output_size(height, width, max_height)
        return shown_width, shown_height
    if max_height is not None and height > max_height:
        target = max(2, max_height // 2 * 2)
        return max(2, round(width * target / height / 2) * 2), target
    # an odd side loses a pixel: rounding halves to even grew 323 to 324 and kept 321 at 320
    return max(2, width // 2 * 2), max(2, height // 2 * 2)


#: FFmpeg's AVColorRange (limited: "tv", full: "pc") and its "unspecified" colour space,
#: primaries and transfer
_RANGE_LIMITED, _RANGE_FULL, _UNSPECIFIED = 1, 2, 2

SCRATCH_PREFIX = "conveyor-clip-"


def sweep_scratch_dirs() -> None:
    """``sweep_scratch`` over every folder a scratch clip may be in."""
    for folder in scratch_dirs():
        sweep_scratch(folder)


def sweep_scratch(folder: str) -> None:
    """Remove the scratch clips of workers that died mid-clip (a crash, a ``kill -9``): each
    file names the process writing it, and one whose process is gone is garbage."""
    for path in Path(folder).glob(f"{SCRATCH_PREFIX}*-*.mp4"):
        try:
            pid = int(path.name[len(SCRATCH_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue  # not named by a process
        if not _alive(pid):
            with contextlib.suppress(OSError):  # another user's, in a shared /tmp
                path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` may still write: a zombie cannot (a worker whose host died
    first is one until init reaps it, which a container's init may never do)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs (macOS): as alive as kill says
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


#: ``VideoFrame.pict_type`` that leaves the choice to the encoder (``PictureType.NONE``)
_ANY_PICTURE = 0
#: output timestamps per frame of the nominal rate
STEPS_PER_FRAME = 100
#: a frame this close to its place at the nominal rate is put there (Matroska's stamps
#: are whole milliseconds)
SNAP_S = 0.001


#: pixel formats the encoders take as they come from the decoder (both libx264 and NVENC
#: encode 8-bit 4:2:0 from NV12 into the same stream as from yuv420p)
NATIVE_INPUTS = frozenset({"yuv420p", "nv12"})


class EncodeError(RuntimeError):
    """The encoder failed, not the source: never counted against the video or NVDEC. With
    ``encoder="auto"`` an NVENC failure sends the clips left to libx264; otherwise the
    engine retries the chunk (``max_attempts``) and then records the video failed."""


class _ClipEncoder:
    """One clip's MP4 being written (to a scratch file, so the index can go first). FFmpeg's
    errors in it are ``EncodeError``: the decoder's are the source's (``input_errors``)."""

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
        # (chosen per clip: when /dev/shm runs short, the next clips go to the disk)
        fd, self.path = tempfile.mkstemp(suffix=".mp4", prefix=prefix, dir=scratch_dir())
        os.close(fd)
        self.codec = codec
        with self._encoding():  # a codec FFmpeg cannot set up fails here
            self.container = av.open(
                self.path, "w", format="mp4", options={"movflags": "+faststart"}
            )
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
            self._step_s = float(self.time_base)  # per frame, float arithmetic, not Fraction's
            stream.codec_context.time_base = self.time_base
            self.stream = stream
        self.size = size
        self.rate = rate
        self.input_format = "yuv420p"  # what frames are converted to, if not what they are
        self.frames = 0
        self._origin: float | None = None
        self._last_pts = -1

    @contextlib.contextmanager
    def _encoding(self) -> Iterator[None]:
        import av

        try:
            yield
        except av.FFmpegError as exc:
            self.discard()
            raise EncodeError(f"encoding with {self.codec} failed: {describe_error(exc)}") from exc

    def add(self, frame: Any, t: float) -> None:
        """Append ``frame``, shown ``t`` seconds into the source."""
        width, height = self.size
        if not self.frames and frame.format.name in NATIVE_INPUTS:
            # NVDEC's NV12 goes in as it is: libx264 and NVENC take it, the stream is the
            # same bit for bit, and converting it to yuv420p cost 6.5% of a 720p encode
            self.stream.pix_fmt = self.input_format = frame.format.name
        wanted = self.input_format
        # a full-range source (MJPEG, many phones) is made limited range, as a clip's
        # yuv420p is read: passed on as it was, its clip was read with its contrast stretched
        full = frame.color_range == _RANGE_FULL or frame.format.name.startswith("yuvj")
        if frame.width != width or frame.height != height or frame.format.name != wanted or full:
            ranges = {"src_color_range": _RANGE_FULL, "dst_color_range": _RANGE_LIMITED}
            frame = frame.reformat(
                width=width, height=height, format=wanted, **(ranges if full else {})
            )
        if not self.frames:
            self._colour(frame)
        if self._origin is None:
            self._origin = t
        steps = (t - self._origin) / self._step_s
        slot = round(steps / STEPS_PER_FRAME) * STEPS_PER_FRAME  # the nominal frame's place
        if abs(steps - slot) * self._step_s <= SNAP_S:
            steps = slot  # stamps the container rounded (to milliseconds) stay even
        pts = max(round(steps), self._last_pts + 1)
        frame.pts, frame.time_base = pts, self.time_base
        # the encoder picks its own frame types: x264 makes a key frame of every frame the
        # decoder marked intra, and an intra-only source (MJPEG, ProRes, FFV1...) marks all
        frame.pict_type = _ANY_PICTURE
        self._last_pts = pts
        with self._encoding():  # the encoder opens at its first frame (NVENC may refuse)
            self.container.mux(self.stream.encode(frame))
        self.frames += 1

    def _colour(self, frame: Any) -> None:
        """The clip's colour range (limited: ``add`` makes it so; H.264's default, which
        x264 writes out only beside a colour space) and the source's colour space, said on
        the clip (before the encoder opens): a BT.709 source's clip was untagged, and
        players read it as BT.601."""
        context = self.stream.codec_context
        context.color_range = _RANGE_LIMITED
        for name in ("colorspace", "color_primaries", "color_trc"):
            value = getattr(frame, name)
            if value not in (None, 0, _UNSPECIFIED):  # (0: RGB or reserved, not a YUV clip's)
                setattr(context, name, value)

    def finish(self) -> bytes:
        try:
            with self._encoding():
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


class ClipTranscoder(VideoStage):
    """Encode each clip of a chunk to H.264 MP4 from one decoding pass over the source, and
    send each on the moment its encoder closes.

    ``encoder``: ``"libx264"``, ``"h264_nvenc"`` or ``"auto"`` (NVENC where the worker has a
    GPU and NVENC opens, else libx264; NVENC refusing later sends the clips left to libx264).
    An encoder's failure is never the source's: it is an ``EncodeError``, which the engine
    retries. ``preset``/``crf`` tune libx264 (NVENC uses ``cq``);
    ``max_height`` scales larger sources down. An interlaced source is deinterlaced
    (``deinterlace``, FFmpeg's bwdif at the source's frame rate), since an H.264 clip is
    progressive and players would show its fields combed. A clip with no decodable frame
    fails alone.

    Everything later stages need from a clip's pixels comes from the same decode, so no stage
    decodes the clip again: the frames the models ask for (``frame_rates``, short side
    ``short_side``: ``FrameSampler``) and, with ``motion_patch``, the source's motion vectors
    summed up for the ``MotionFilter`` (``MotionScores``, ``source="source"``).

    ``decoder``: ``"auto"`` decodes on the GPU's NVDEC where the worker has a GPU, ``"nvdec"``
    asks for it (a worker without a GPU fails its setup), ``"cpu"`` never uses it. A video
    NVDEC cannot take (codec, pixel format, no driver) is decoded on the CPU, as are the
    clips left when NVDEC fails or gives no frame half way, with the reason in its record
    (``Video.decoder_fallback``); NVDEC exports no motion vectors, so
    a ``MotionFilter`` then scores the clip from its own.

    ``process`` is a generator: each clip of the chunk leaves as part ``k`` of ``n`` of it
    (``Video.part_of``; ``k`` is the clip's place in the chunk), in the order the clips are
    finished, which the source and the chunk decide: every attempt at a chunk sends the same
    parts in the same order, as the engine's contract for generator stages asks.
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
        frame_rates: Iterable[float] = (),
        short_side: int = 224,
        motion_patch: int | None = None,
        decoder: str = "auto",
    ) -> None:
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {', '.join(ENCODERS)}, got {encoder!r}")
        if not 0 <= crf <= 51:
            raise ValueError(f"crf must be in 0..51, got {crf}")
        if preset not in X264_PRESETS:
            raise ValueError(f"preset must be one of {', '.join(X264_PRESETS)}, got {preset!r}")
        if max_height is not None and max_height < 2:
            raise ValueError(f"max_height must be >= 2, got {max_height}")
        self.frame_rates = tuple(sorted({float(r) for r in frame_rates}))
        if any(r <= 0 for r in self.frame_rates):
            raise ValueError(f"frame_rates must be positive, got {list(frame_rates)}")
        if isinstance(short_side, bool) or not isinstance(short_side, int) or short_side < 16:
            raise ValueError(f"short_side must be a whole number >= 16 pixels, got {short_side!r}")
        if motion_patch is not None and motion_patch < 16:
            raise ValueError(f"motion_patch must be >= 16 pixels, got {motion_patch}")
        self.encoder = encoder
        self.preset = preset
        self.crf = crf
        self.max_height = max_height
        self.cq = cq
        self.deinterlace = deinterlace
        self.short_side = short_side
        self.motion_patch = motion_patch
        self.decoder = check_decoder(decoder)
        self._codec = "libx264"
        self._nvdec = False

    def setup(self, worker: Any) -> None:
        sweep_scratch_dirs()
        self._codec = self._choose(bool(worker.gpu_ids))
        # NVDEC where the worker has a GPU; each video it cannot take is decoded on the CPU
        self._nvdec = decodes_on_nvdec(self.decoder, worker)

    def teardown(self) -> None:
        """What workers killed during the run left is swept at its end too, not by the
        next run (a killed zygote left a clip in /dev/shm until then)."""
        sweep_scratch_dirs()

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

    def process(self, task: VideoTask) -> Iterator[VideoTask]:  # type: ignore[override]
        """The chunk's clips, each as its own part the moment it is encoded (or failed); a
        failed video, or a chunk without clips, goes on whole. Clips filtered or failed
        before this stage go first. A task that is already one part of its chunk (a NeMo
        Curator-style stage split the chunk) goes on whole once its clips are encoded: the
        writer counts the parts as they were numbered."""
        video = task.data
        if video.failed or not video.clips:
            yield task
            return
        parts = _Parts(task, self._nvdec)
        active = [clip for clip in video.clips if clip.active]
        if video.parts > 1:  # already one part of its chunk: not split again
            if active:
                parts.decoding = True
                for _ in self._each_clip(active, video, parts.damage, parts.note):
                    pass
            parts.stamp(video)
            yield task
            return
        for clip in video.clips:
            if not clip.active:
                yield parts.of(clip)
        if active:
            parts.decoding = True
            for clip in self._each_clip(active, video, parts.damage, parts.note):
                yield parts.of(clip)

    def _each_clip(
        self, clips: list[Clip], video: Video, damage: Damage, nvdec: DecodeNote | None = None
    ) -> Iterator[Clip]:
        """Every clip of ``clips`` once, encoded or failed, as soon as it is finished."""
        import av

        sent: set[str] = set()
        try:
            for clip in self._transcode(clips, video, damage, nvdec):
                sent.add(clip.clip_id)
                yield clip
        except EncodeError as exc:
            if self._codec != "h264_nvenc" or self.encoder != "auto":
                raise  # not the source's fault: the engine retries the chunk
            # NVENC chosen by "auto" and then refused (out of sessions, a driver reset):
            # libx264 encodes the clips left, and every clip after them on this worker
            log.warning("%s; encoding with libx264 from now on", exc)
            self._codec = "libx264"
            rest = [clip for clip in clips if clip.clip_id not in sent]
            yield from self._each_clip(rest, video, damage, nvdec)
        except input_errors() as exc:
            rest = [clip for clip in clips if clip.clip_id not in sent]
            if nvdec is not None and nvdec.decoder == "nvdec":
                # NVDEC gave up on a stream it had opened for (or called it damaged): the
                # CPU decodes what is left, and is the judge of damage
                nvdec.decoder, nvdec.fallback = "cpu", f"NVDEC failed: {describe_error(exc)}"
                yield from self._each_clip(rest, video, damage)
            elif isinstance(exc, av.InvalidDataError) and len(clips) > 1:
                # a stretch too damaged to decode: each clip not yet sent is tried on its
                # own, so that the damage fails only the clips it is in
                for clip in rest:
                    yield from self._each_clip([clip], video, damage, nvdec)
            else:  # the clip's stretch, or the whole source, cannot be read
                for clip in rest:
                    clip.fail(self.name, describe_error(exc))
                    yield clip

    def _transcode(
        self, clips: list[Clip], video: Video, damage: Damage, nvdec: DecodeNote | None = None
    ) -> Iterator[Clip]:
        """Encode ``clips`` from one decoding pass over their stretch of the source; yields
        each as its encoder closes (or as it fails for want of frames). ``nvdec``: decode on
        NVDEC where it takes the source (``decode_range``)."""
        meta = video.metadata
        assert meta is not None
        cut = _Cut(self, meta)
        pending = sorted(clips, key=lambda c: c.frame_span[0])
        open_: dict[str, _ClipWork] = {}
        done: set[str] = set()
        start = pending[0].frame_span[0] / meta.fps
        stop = max(c.frame_span[1] for c in pending)
        end = meta.duration_s if stop >= meta.num_frames else stop / meta.fps
        frames = decode_range(
            video.path,
            meta,
            start,
            end,
            threads=self.threads,
            deinterlace=self.deinterlace,
            damage=damage,
            motion_vectors=cut.grid is not None,
            nvdec=nvdec,
        )
        seen = False
        try:
            with contextlib.closing(frames):
                for t, frame in frames:
                    seen = True
                    index = round(t * meta.fps)
                    decoded = _Decoded(frame, cut)
                    for clip in pending:
                        first, last = clip.frame_span
                        if clip.clip_id in done:
                            continue
                        if index >= last and last < meta.num_frames:  # the last clip takes
                            yield self._close(clip, open_, done, damage)  # all to the end (VFR)
                        elif index >= first:
                            work = open_.get(clip.clip_id)
                            if work is None:
                                work = open_[clip.clip_id] = cut.start(clip)
                            work.add(decoded, t)
            if not seen and nvdec is not None and nvdec.decoder == "nvdec":
                raise InputError("NVDEC gave no frame of the clips' stretch")
            for clip in pending:
                if clip.clip_id not in done:
                    yield self._close(clip, open_, done, damage)
        finally:
            for work in open_.values():
                work.encoder.discard()

    def _close(
        self, clip: Clip, open_: dict[str, _ClipWork], done: set[str], damage: Damage
    ) -> Clip:
        done.add(clip.clip_id)
        work = open_.pop(clip.clip_id, None)
        if work is None or work.encoder.frames == 0:
            if work is not None:
                work.encoder.discard()
            span = f"{clip.span[0]:.2f}-{clip.span[1]:.2f} s"
            if damage.packets:
                clip.fail(self.name, f"no frame could be decoded in {span}")
            else:  # nothing refused on the way: the file has no frame there
                clip.fail(self.name, f"the source has no frame in {span} (its timestamps skip it)")
            return clip
        work.finish(clip)
        return clip


class _Parts:
    """A chunk's clips sent on one by one: its ``k``-th clip is part ``k`` of as many as it
    has clips (``Video.part_of``). Each part carries the packets the decoder skipped as
    damaged since the part before it, so that the chunk's count is added up exactly once
    (the last part leaves once the decode is over)."""

    def __init__(self, task: VideoTask, nvdec: bool = False) -> None:
        self.task = task
        self.place = {id(clip): k for k, clip in enumerate(task.data.clips)}
        self.damage = Damage()
        self._reported = 0
        #: how the decode runs, once it has started (``None``: the CPU decodes, as asked)
        self.note: DecodeNote | None = DecodeNote() if nvdec else None
        self.decoding = False

    def of(self, clip: Clip) -> VideoTask:
        video = self.task.data
        part = video.part_of(self.place[id(clip)], len(video.clips), [clip])
        self.stamp(part)
        task = self.task
        return VideoTask(data=part, dataset_name=task.dataset_name, metadata=dict(task.metadata))

    def stamp(self, part: Video) -> None:
        """Add to ``part`` the packets skipped since the last part, and what decoded it."""
        part.damaged_packets += self.damage.packets - self._reported
        self._reported = self.damage.packets
        if self.decoding:
            note = self.note or DecodeNote()
            part.decoder, part.decoder_fallback = note.decoder, note.fallback


class _Cut:
    """What every clip of one decoding pass shares: the encoder's settings, the models'
    frame size and the motion grid over the source."""

    def __init__(self, stage: ClipTranscoder, meta: VideoMetadata) -> None:
        self.meta = meta
        self.size = output_size(meta.width, meta.height, stage.max_height, meta.sideways)
        self.rate = Fraction(meta.fps).limit_denominator(1001)
        self.codec, self.options, self.threads = stage._codec, stage._options(), stage.threads
        self.frame_rates = stage.frame_rates
        self.model_size = model_size(*self.size, meta.sample_aspect, stage.short_side)
        self.grid: MotionGrid | None = None
        if stage.motion_patch is not None:
            # the patches cover the same part of the picture as on the clip
            scale = meta.width / self.size[0]
            self.grid = MotionGrid(meta.width, meta.height, stage.motion_patch, scale)

    def start(self, clip: Clip) -> _ClipWork:
        meta = self.meta
        encoder = _ClipEncoder(
            self.codec,
            self.options,
            self.size,
            self.rate,
            self.threads,
            meta.rotation,
            meta.sample_aspect,
        )
        sampler = None
        if self.frame_rates:
            expected = clip.frame_span[1] - clip.frame_span[0]
            sampler = FrameSampler(
                self.frame_rates, expected, float(self.rate), self.model_size, meta.rotation
            )
        tally = MotionTally(self.grid, "source") if self.grid is not None else None
        return _ClipWork(encoder, sampler, tally)


class _Decoded:
    """One decoded source frame, and what is taken from it once for every clip holding it
    (clips may overlap): its motion, its picture for the models."""

    def __init__(self, frame: Any, cut: _Cut) -> None:
        self.frame = frame
        self.cut = cut
        self._measured = False
        self._motion: FrameMotion | None = None
        self._image: np.ndarray | None = None

    def motion(self) -> FrameMotion | None:
        if not self._measured:
            assert self.cut.grid is not None
            self._motion = self.cut.grid.measure(self.frame)
            self._measured = True
        return self._motion

    def image(self, sampler: FrameSampler) -> np.ndarray:
        if self._image is None:
            self._image = sampler.image(self.frame)
        return self._image


class _ClipWork:
    """One clip being cut: its encoder, and what it gathers for the stages behind."""

    def __init__(
        self, encoder: _ClipEncoder, sampler: FrameSampler | None, tally: MotionTally | None
    ) -> None:
        self.encoder = encoder
        self.sampler = sampler
        self.tally = tally
        #: when the clip's first frame is shown in the source (its frames' times count from it)
        self.origin: float | None = None

    def add(self, decoded: _Decoded, t: float) -> None:
        """Append the source's frame shown ``t`` seconds in."""
        if self.tally is not None:  # before the encoder takes the frame (and its stamps)
            self.tally.add_measured(decoded.motion())
        if self.sampler is not None:
            if self.origin is None:
                self.origin = t
            sampler = self.sampler
            sampler.add(t - self.origin, lambda: decoded.image(sampler))
        self.encoder.add(decoded.frame, t)

    def finish(self, clip: Clip) -> None:
        """Close the encoder and leave the clip, its frames and its motion on ``clip``."""
        frames = self.encoder.frames
        clip.encoded = self.encoder.finish()
        clip.width, clip.height = self.encoder.size
        clip.fps = float(self.encoder.rate)
        clip.num_frames = frames
        clip.codec = "h264"
        if self.sampler is not None:
            clip.frames.update(self.sampler.frames())
        if self.tally is not None:
            motion = self.tally.scores()
            # no vectors in the source (VP9, AV1, HEVC, MJPEG...): the motion filter
            # scores the clip's own instead
            clip.motion = motion if motion.frames else None


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
