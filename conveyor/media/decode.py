"""Reading video files with PyAV: probing with clear reasons for bad files, and decoding a
time range with one seek.

Every decoder here runs with one thread per CPU the stage declared (``threads``), so a stage's
``Resources`` say what it really uses. Times are seconds from the stream's first frame, and a
frame's index is its time times the nominal frame rate, so spans and ids do not depend on how
a container numbers its timestamps.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections import deque
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from conveyor.media.errors import InputError, check_access, describe_error
from conveyor.media.limits import MAX_VIDEO_PIXELS, MIN_FPS
from conveyor.storage import READ_BLOCK, ObjectPath, is_url, special_file
from conveyor.storage import size as file_size
from conveyor.tasks.video import VideoMetadata

#: how far back (s) to seek before a range when the container's seek lands late
_RESEEK_S = 10.0
#: packets to read before giving up on decoding a first frame
_FIRST_FRAME_PACKETS = 600
#: damaged packets skipped before a range is given up on (and then only where most are)
_DAMAGED_PACKETS = 16
#: FFmpeg's field orders that mean interlaced (AV_FIELD_TT, _BB, _TB, _BT)
_INTERLACED_ORDERS = (2, 3, 4, 5)


_QUIET = False


def _quiet_logs() -> None:
    """Keep FFmpeg's errors for exception messages ("last error log") without printing them:
    a corrupt file would otherwise fill the terminal with decoder complaints."""
    global _QUIET
    import logging

    import av.logging

    if av.logging.get_level() != av.logging.ERROR:
        av.logging.set_level(av.logging.ERROR)
    if not _QUIET:
        libav = logging.getLogger("libav")
        libav.addHandler(logging.NullHandler())
        libav.propagate = False
        _QUIET = True


@contextlib.contextmanager
def _capture() -> Iterator[list[tuple[int, str, str]]]:
    """Capture FFmpeg's messages (warnings too: they explain why a file did not open)."""
    import av.logging

    _quiet_logs()
    av.logging.set_level(av.logging.WARNING)
    try:
        with av.logging.Capture() as logs:
            yield logs
    finally:
        av.logging.set_level(av.logging.ERROR)


def _source(path: str, stack: contextlib.ExitStack) -> Any:
    """What ``av.open`` reads: a local path itself, or for a URL a seekable file streamed
    through fsspec (closed by ``stack``; PyAV never closes a file object it is given)."""
    if not is_url(path):
        return path
    return stack.enter_context(ObjectPath(path).open("rb", block_size=READ_BLOCK))


def open_input(source: Any) -> Any:
    """``av.open`` for reading, whatever text the file's tags hold: a tag that is not UTF-8
    (an old muxer's Latin-1 title) must not cost the video. PyAV 19 reads tags with
    ``surrogateescape``, which never fails, and dropped the ``metadata_errors`` argument
    that PyAV 18 and older need for that (PyAV 19 is what Python 3.12 and later install)."""
    import av

    if _strict_tags():
        return av.open(source, metadata_errors="ignore")
    return av.open(source)


@functools.cache
def _strict_tags() -> bool:
    """Whether this PyAV reads tags strictly unless told not to (before 19)."""
    import av

    return int(av.__version__.split(".")[0]) < 19


def main_video_stream(container: Any) -> Any | None:
    """The container's video, or None: its video stream that is not a cover picture (an
    MP4 or Matroska file may carry its artwork as a one-frame stream ahead of the video);
    of several, the longest, then the largest picture, then the first. (FFmpeg's own pick
    prefers the stream marked default, which a muxer gives the first: a thumbnail track
    ahead of the real video made the video a single frame.)"""
    import av

    videos = [
        s for s in container.streams.video if not s.disposition & av.stream.Disposition.attached_pic
    ]
    if len(videos) < 2:
        return videos[0] if videos else None
    return max(videos, key=_stream_size)


def _stream_size(stream: Any) -> tuple[float, int]:
    """(seconds the container says the stream lasts, 0 where it does not say; pixels).
    Matroska's per-track DURATION tag first: FFmpeg gives its first track the whole
    file's duration."""
    seconds = _tag_seconds(stream.metadata) or 0.0
    if not seconds and stream.duration and stream.time_base:
        seconds = float(stream.duration * stream.time_base)
    context = stream.codec_context
    return seconds, (context.width or 0) * (context.height or 0)


def open_video(path: Any, threads: int = 1, motion_vectors: bool = False) -> tuple[Any, Any]:
    """Open ``path`` (a local path or an open binary file) and its video stream
    (``main_video_stream``), decoding with ``threads`` threads; with ``motion_vectors`` the
    decoder attaches the codec's motion vectors to each frame (where it can: H.264, MPEG-2,
    MPEG-4 Part 2)."""
    import av

    _quiet_logs()
    container = open_input(path)
    stream = main_video_stream(container)
    if stream is None:
        container.close()
        raise InputError("no video stream")
    # slice threads only: frame threads keep decoded frames in a pool the encoder may still
    # hold, and closing such a decoder mid-stream can hang (seen with libx264 consumers)
    stream.thread_type = "SLICE"
    stream.thread_count = max(1, threads)
    if motion_vectors:
        stream.codec_context.flags2 |= av.codec.context.Flags2.export_mvs
    return container, stream


# -- NVDEC ------------------------------------------------------------------------------
#: where decoding happens: ``auto`` (NVDEC where the worker has a GPU that takes the video),
#: ``cpu``, or ``nvdec``
DECODERS = ("auto", "cpu", "nvdec")

#: FFmpeg's software decoder -> its NVDEC decoder (FFmpeg's ``*_cuvid``)
CUVID = {
    "h264": "h264_cuvid",
    "hevc": "hevc_cuvid",
    "av1": "av1_cuvid",
    "vp9": "vp9_cuvid",
    "vp8": "vp8_cuvid",
    "mpeg1video": "mpeg1_cuvid",
    "mpeg2video": "mpeg2_cuvid",
    "mpeg4": "mpeg4_cuvid",
    "vc1": "vc1_cuvid",
    "mjpeg": "mjpeg_cuvid",
}

#: pixel formats NVDEC decodes (4:2:0 at 8, 10 and 12 bits; 4:4:4 and 4:2:2 it does not)
_NVDEC_PIX_FMTS = ("yuv420p", "yuvj420p", "nv12", "yuv420p10le", "p010le", "yuv420p12le")


@dataclass
class DecodeNote:
    """How a decode ran: ``decoder`` (``"nvdec"`` or ``"cpu"``) and, where NVDEC was asked
    for and could not take the video, ``fallback``: why it was decoded on the CPU."""

    decoder: str = "cpu"
    fallback: str | None = None


def nvdec_decoder(stream: Any, resize: tuple[int, int] | None = None) -> Any:
    """An opened NVDEC decoder for ``stream`` (its ``decode(packet)`` gives frames in system
    memory, NV12 or P010); ``NvdecUnavailable`` says why NVDEC cannot take this video: a
    codec without an NVDEC decoder, a pixel format it does not decode, an odd width or
    height, a build of FFmpeg without it, or no GPU driver (a size out of the decoder's
    range fails at the first packet: the stages then decode on the CPU, saying why).
    ``resize`` = (width, height): the GPU's scaler shrinks each frame before it is copied
    to memory (``nvdec_size``)."""
    import av

    context = stream.codec_context
    name = CUVID.get(context.name)
    if name is None:
        raise NvdecUnavailable(f"NVDEC has no decoder for {context.name}")
    if name not in av.codecs_available:
        raise NvdecUnavailable(f"this FFmpeg has no {name}")
    pix_fmt = context.pix_fmt
    if pix_fmt is not None and pix_fmt not in _NVDEC_PIX_FMTS:
        raise NvdecUnavailable(f"NVDEC does not decode {pix_fmt}")
    if context.width % 2 or context.height % 2:  # its NV12 surfaces halve both sides
        raise NvdecUnavailable(
            f"NVDEC does not decode an odd size ({context.width}x{context.height})"
        )
    try:
        decoder = av.CodecContext.create(name, "r")
        if context.extradata:
            decoder.extradata = context.extradata
        decoder.width, decoder.height = context.width, context.height
        if resize is not None:
            decoder.options = {"resize": f"{resize[0]}x{resize[1]}"}
        decoder.open()
    except Exception as exc:  # noqa: BLE001 - any failure: the CPU decodes this video
        raise NvdecUnavailable(f"{name} does not open: {describe_error(exc)}") from None
    return decoder


def nvdec_size(target: tuple[int, int], source: tuple[int, int]) -> tuple[int, int]:
    """The size NVDEC's scaler gives frames wanted at ``target`` from a ``source`` video:
    four times the target, never larger than the source, in even numbers (NV12 halves the
    colour planes). The CPU then shrinks these small frames the rest of the way with the
    scaler the stage always uses, so frames look as the CPU path makes them (a one-step
    26x shrink on the GPU would alias), while the copy from the GPU stays a few kilobytes.
    """
    width = min(source[0], 4 * target[0])
    height = min(source[1], 4 * target[1])
    return max(2, width // 2 * 2), max(2, height // 2 * 2)


def to_rgb(frame: Any, size: tuple[int, int] | None = None) -> Any:
    """``frame`` as an RGB array (``size`` = (width, height) scales it), the same pixels
    whichever decoder gave it. NVDEC's NV12 at its own size goes through yuv420p: FFmpeg
    has a direct yuv420p-to-RGB path but turns NV12 to RGB with its general scaler, which
    filters the colour planes (0.7 apart on average) and costs a third more. Scaled, both
    take the general scaler and agree."""
    if frame.format.name == "nv12" and (size is None or size == (frame.width, frame.height)):
        frame = frame.reformat(format="yuv420p")
    if size is None:
        return frame.to_ndarray(format="rgb24")
    return frame.to_ndarray(width=size[0], height=size[1], format="rgb24")


class DecoderPool:
    """Opened decoders kept between decodes, so that a worker opens one per kind of video
    rather than one per window: opening an NVDEC decoder creates a CUDA context, tens of
    milliseconds of CPU, against a few seconds of video a window holds.

    ``acquire(stream, resize)`` lends a decoder opened for this stream's codec, extradata,
    size and ``resize`` (flushed, so that nothing of an earlier decode comes out of it), or
    opens one with ``opener``; the ``with`` block's end puts it back, up to ``keep`` of them
    (the least recently used go). A decoder is lent to one decode at a time: a decode
    started inside another gets its own.
    """

    def __init__(self, opener: Any = nvdec_decoder, keep: int = 2) -> None:
        self.opener = opener
        self.keep = keep
        self.opened = 0  # for inspection: decoders opened so far
        self._idle: list[tuple[tuple[Any, ...], Any]] = []

    @contextlib.contextmanager
    def acquire(self, stream: Any, resize: tuple[int, int] | None = None) -> Iterator[Any]:
        context = stream.codec_context
        key = (context.name, bytes(context.extradata or b""), context.width, context.height)
        key += (resize,)
        found = next((i for i, (k, _) in enumerate(self._idle) if k == key), None)
        if found is None:
            decoder = self.opener(stream, resize)
            self.opened += 1
        else:
            decoder = self._idle.pop(found)[1]
            decoder.flush_buffers()
        try:
            yield decoder
        finally:
            self._idle.append((key, decoder))
            del self._idle[: max(0, len(self._idle) - self.keep)]


#: the process's NVDEC decoders (a worker process decodes for one stage)
NVDEC_POOL = DecoderPool()


def check_decoder(decoder: str) -> str:
    """``decoder`` if it is one of ``DECODERS``; a ``ValueError`` naming them otherwise."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    return decoder


def decodes_on_nvdec(decoder: str, worker: Any) -> bool:
    """Whether a stage asking for ``decoder`` decodes on NVDEC on ``worker`` (in its
    ``setup``): ``auto`` where the worker has a GPU, ``nvdec`` always, where a worker
    without a GPU is a mistake of the stage's resources, said at once rather than as a
    fallback on every video."""
    has_gpu = bool(worker.gpu_ids)
    if decoder == "nvdec" and not has_gpu:
        raise RuntimeError(
            "decoder='nvdec' needs a GPU on the worker: give the stage a GPU share or NVDEC "
            "units (Resources(gpus=...) or Resources(nvdecs=...)), or decode with 'auto' or "
            "'cpu'"
        )
    return decoder == "nvdec" or (decoder == "auto" and has_gpu)


_NVDEC: bool | None = None


def nvdec_works() -> bool:
    """Whether NVDEC opens here (once per process): the decoder is built in and a driver
    takes it."""
    global _NVDEC
    if _NVDEC is None:
        import av

        try:
            decoder = av.CodecContext.create("h264_cuvid", "r")
            decoder.width, decoder.height = 256, 256
            decoder.open()
            _NVDEC = True
        except Exception:  # noqa: BLE001 - any failure means: not usable here
            _NVDEC = False
    return _NVDEC


class NvdecUnavailable(Exception):
    """NVDEC cannot decode this video (the message says why); the CPU does instead."""


# -- probing ---------------------------------------------------------------------------
def _open_reason(exc: BaseException, logs: list[tuple[int, str, str]]) -> str:
    text = " ".join(str(m) for _, _, m in logs) + " " + str(exc)
    if "low score" in text:
        return "not a video file: no container format recognises its contents"
    if "moov atom not found" in text:
        return (
            "truncated or unfinished MP4/MOV: its index (moov atom) is missing, so no frame "
            "can be located"
        )
    if "Invalid data found" in text:
        return "not a readable video file: FFmpeg found invalid data where a container should be"
    return f"cannot open as a video: {str(exc).strip()}"


def _streams_text(container: Any) -> str:
    import av

    kinds = [
        ("cover picture" if s.disposition & av.stream.Disposition.attached_pic else s.type)
        + f" ({s.codec_context.name if s.codec_context else 'unknown codec'})"
        for s in container.streams
    ]
    return ", ".join(kinds) if kinds else "no streams at all"


def _frame_rate(stream: Any) -> float | None:
    for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        if rate:
            value = float(rate)
            if math.isfinite(value) and 0 < value < 1000:
                return value
    return None


#: frames looked at before deciding which of their timestamps to trust
_STAMP_LOOKAHEAD = 8


def trusted_stamps(frames: Iterator[Any]) -> Iterator[tuple[int | None, Any]]:
    """``(timestamp, frame)``: each decoded frame with the timestamp to trust.

    Presentation timestamps, except where they are out of order while the decode
    timestamps are not: an AVI file with B-frames stores decode-order stamps as ``pts``, so
    frames come out in the right order with scrambled ``pts`` (FFmpeg's own best-effort
    guess does the same). Decode stamps are then shifted by the first frame's (a key frame,
    whose ``pts`` is right) difference, so that times agree with the probe's.
    """
    head = list(itertools.islice(frames, _STAMP_LOOKAHEAD))
    pts = [f.pts for f in head if f.pts is not None]
    dts = [f.dts for f in head if f.dts is not None]
    use_dts = len(dts) == len(head) and _increasing(dts) and not _increasing(pts)
    shift = head[0].dts - head[0].pts if use_dts and head[0].pts is not None else 0
    for frame in itertools.chain(head, frames):
        if not use_dts:
            yield frame.pts, frame
        else:  # a frame without one follows the one before (see ``_decode_from``)
            yield (None if frame.dts is None else frame.dts - shift), frame


def _increasing(values: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def probe(
    path: str, *, verify: bool = True, max_pixels: int | None = MAX_VIDEO_PIXELS
) -> VideoMetadata:
    """Metadata of ``path``'s (a local path or a URL) first video stream; ``InputError`` with
    the reason otherwise.

    With ``verify``, a first frame is decoded (the codec works on this file) and the last
    seconds are decoded (the file holds as much video as its header says: a truncated file
    fails here rather than half-way through the pipeline). A frame of more than
    ``max_pixels`` pixels (``None``: no limit) fails the video before any is decoded.
    """
    special = special_file(path)
    if special is not None:
        raise InputError(f"not a regular file but {special}")
    try:
        size = file_size(path)
    except OSError as exc:
        check_access(exc, path)
        raise InputError(f"cannot read the file: {exc.strerror or exc}") from None
    if size == 0:
        raise InputError("empty file (0 bytes)")
    with contextlib.ExitStack() as stack:
        source = _source(path, stack)
        with _capture() as logs:
            try:
                import av

                container = open_input(source)
            except (av.FFmpegError, UnicodeDecodeError) as exc:
                check_access(exc, path)
                raise InputError(_open_reason(exc, logs)) from None
        with container:
            return _probe_open(container, size, verify, max_pixels)


def probe_bytes(data: bytes, *, verify: bool = True) -> VideoMetadata:
    """``probe`` of a video held in memory (NeMo Curator's ``source_bytes``, an encoded
    clip); ``InputError`` with the reason otherwise."""
    import io

    if not data:
        raise InputError("empty video (0 bytes)")
    with _capture() as logs:
        try:
            import av

            container = open_input(io.BytesIO(data))
        except (av.FFmpegError, UnicodeDecodeError) as exc:
            raise InputError(_open_reason(exc, logs)) from None
    with container:
        return _probe_open(container, len(data), verify, None)


def _check_size(width: int, height: int, max_pixels: int | None) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise InputError(
            f"frames of {width}x{height} ({width * height:,} pixels) are over the limit of "
            f"{max_pixels:,} (--max-pixels)"
        )


def _probe_open(
    container: Any, size: int, verify: bool, max_pixels: int | None = MAX_VIDEO_PIXELS
) -> VideoMetadata:
    """``probe``'s work once the container is open."""
    stream = main_video_stream(container)
    if stream is None:
        raise InputError(f"no video stream (the file has: {_streams_text(container)})")
    context = stream.codec_context
    if context is None or not context.name:
        raise InputError(f"no decoder for the video stream's codec ({stream.codec.name})")
    container_name = container.format.name if container.format else None
    kind = container_name or ""
    if kind.endswith("_pipe") or kind == "image2":
        raise InputError(f"a {context.name} image, not a video (FFmpeg reads it as {kind})")
    width, height = context.width, context.height
    _check_size(width or 0, height or 0, max_pixels)  # before a frame is decoded
    fps = _frame_rate(stream)
    time_base = float(stream.time_base) if stream.time_base else 0.0
    # the video track's own length, where the stream says it; a Matroska DURATION tag
    # (an end time when written by FFmpeg, a length by others) and the container's
    # duration (which may span a longer audio track) are only hints of where it ends
    declared = stream.duration * time_base if stream.duration and time_base else None
    tag = _tag_seconds(stream.metadata)
    hint = tag or (container.duration / 1_000_000 if container.duration else None)
    start = stream.start_time * time_base if stream.start_time and time_base else 0.0
    frames = stream.frames or 0
    if fps is None and frames and (declared or hint):
        fps = frames / (declared or hint)  # type: ignore[operator]
    if fps is None:
        raise InputError("the video stream declares no frame rate and no frame count")
    if fps < MIN_FPS:
        raise InputError(
            f"a frame rate of {fps:.3g} fps (a frame every {1 / fps:,.0f} s) is below "
            f"{MIN_FPS:g}: its timestamps are broken"
        )
    duration = declared or (frames / fps if frames else None) or hint
    audio = container.streams.audio[0].codec_context.name if container.streams.audio else None
    bit_rate = context.bit_rate or container.bit_rate or None
    pix_fmt = context.pix_fmt
    rotation = 0
    interlaced = context.field_order in _INTERLACED_ORDERS
    if verify:
        # one thread: FFmpeg's default starts a thread per core for each file, which costs
        # more than the frame or two decoded here (1.5 -> 1.2 CPU-ms a 2 s 160x90 video, and
        # 3-4.5 -> 1.6-1.8 ms of wall time on busy cores)
        stream.thread_count = 1
        first = _first_frame(container, stream)
        width = width or first.width
        height = height or first.height
        pix_fmt = pix_fmt or first.format.name
        rotation = int(getattr(first, "rotation", 0) or 0)
        interlaced = interlaced or bool(first.interlaced_frame)
        start_pts = first.pts if first.pts is not None else 0
        if declared is not None and start_pts * time_base > start:
            # the stream's first frames cannot be decoded (a file cut mid-GOP): its length
            # runs from its first packet, the video's from its first frame
            declared -= start_pts * time_base - start
        start = start_pts * time_base
        if container_name in _UNINDEXED:
            _check_continuous(container, stream, time_base, start)
        offset = start if tag else (container.start_time or 0) / 1_000_000
        ends = [] if hint is None else [hint, hint + offset]
        duration = _check_tail(container, stream, start_pts, time_base, fps, declared, ends)
        measured = round(duration * fps)
        if frames > measured * 1.02 + 2 and container_name == "avi":
            # an AVI header's frame count is written when recording ends; the index (lost
            # with the end of a cut file) is rebuilt by reading what is there
            raise InputError(
                f"truncated: its frames stop at {duration:.2f} s of the {frames / fps:.2f} s "
                "its header declares"
            )
        if declared is None or frames > measured * 1.02 + 2:
            # an MP4's sample count includes the samples its edit list leaves out (frames
            # before the start, cut when it was trimmed): the length shown is what counts
            frames = measured
    if not width or not height:
        raise InputError("the video stream has no frame size")
    _check_size(width, height, max_pixels)
    if not duration:
        raise InputError("the video's duration is unknown (neither stream nor container say)")
    return VideoMetadata(
        duration_s=float(duration),
        fps=float(fps),
        num_frames=int(frames or round(duration * fps)),
        width=int(width),
        height=int(height),
        codec=context.codec.canonical_name or context.name,  # "av1", not its decoder (libdav1d)
        pixel_format=pix_fmt,
        bit_rate=int(bit_rate) if bit_rate else None,
        audio_codec=audio,
        container=container_name,
        size_bytes=size,
        start_time_s=float(start),
        rotation=rotation % 360,
        sample_aspect=_sample_aspect(stream),
        interlaced=interlaced,
    )


#: containers without an index, read by timestamps alone (MPEG-TS, MPEG-PS)
_UNINDEXED = ("mpegts", "mpeg")
#: how far (s) decode stamps may step back before they are a discontinuity
_STEP_BACK_S = 1.0


def _check_continuous(container: Any, stream: Any, time_base: float, start: float) -> None:
    """``InputError`` where the video's decode stamps jump back: two recordings joined end
    to end (``cat a.ts b.ts``) or a stream restarted. Clips are cut by time, so such a file
    would give clips of the wrong stretch and lose the rest; FFmpeg's own tools make the
    stamps continuous when remuxing. Reads every packet (not decoding): about 200-400 MB/s.
    """
    import av

    last: int | None = None
    try:
        for packet in container.demux(stream):
            stamp = packet.dts if packet.dts is not None else packet.pts
            if stamp is None:
                continue
            if last is not None and (last - stamp) * time_base > _STEP_BACK_S:
                raise InputError(
                    f"its timestamps jump back by {(last - stamp) * time_base:.1f} s after "
                    f"{last * time_base - start:.1f} s "
                    "(recordings joined end to end, or a stream that restarted): clips cut "
                    "by time would be wrong; remux it first, e.g. `ffmpeg -i IN -c copy "
                    "OUT.ts`, which makes them continuous"
                )
            last = stamp if last is None else max(last, stamp)
    except av.FFmpegError:
        pass  # damage is judged elsewhere


def _sample_aspect(stream: Any) -> tuple[int, int]:
    """The stream's pixel shape (1:1 where it says none or something unusable)."""
    for ratio in (stream.sample_aspect_ratio, stream.codec_context.sample_aspect_ratio):
        if ratio and 0.1 <= float(ratio) <= 10:
            return ratio.numerator, ratio.denominator
    return 1, 1


def _first_frame(container: Any, stream: Any) -> Any:
    import av

    packets = 0
    try:
        for packet in container.demux(stream):
            packets += bool(packet.size)  # not the empty packet that flushes the decoder
            for frame in packet.decode():
                return frame
            if packets >= _FIRST_FRAME_PACKETS:
                break
    except av.FFmpegError as exc:
        raise InputError(
            f"cannot decode the {stream.codec_context.name} video stream: {exc.strerror or exc}"
        ) from None
    if not packets:
        raise InputError(
            f"cannot decode the {stream.codec_context.name} video stream: it holds no frame "
            "(no packet of it can be read)"
        )
    raise InputError(
        f"cannot decode the {stream.codec_context.name} video stream: no frame could be "
        f"decoded ({packets} packet{'s' if packets != 1 else ''} read; the data is corrupt or "
        f"not really {stream.codec_context.name})"
    )


def _tag_seconds(metadata: Any) -> float | None:
    """Seconds from a ``DURATION`` tag such as ``00:01:02.500000000``."""
    value = metadata.get("DURATION") or metadata.get("duration")
    if not value:
        return None
    try:
        hours, minutes, seconds = value.split(":")
        total = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        return None
    return total if total > 0 else None


def _check_tail(
    container: Any,
    stream: Any,
    start_pts: int,
    time_base: float,
    fps: float,
    declared: float | None,
    ends: list[float],
) -> float:
    """Read the last seconds and return the video's length; ``InputError`` if the file was
    cut short.

    With a length of its own (``declared``), the video track must reach it. Without one, the
    file's data (any stream) must reach the end the container gives (read either as a length
    or as an end time), and the video's length is where its frames stop: a Matroska file
    whose audio outlasts its video, or whose timestamps start late, is complete.
    """
    start = start_pts * time_base
    if declared is not None:
        reference = start + declared
        seek_to = reference
    elif ends:
        reference = min(ends)
        seek_to = max(ends)
    else:  # nothing says how long (a recording that was never finalised): read it through
        last_video = _last_video_packet(container, stream, time_base, start, fps)
        if last_video is None:
            raise InputError(_no_length_reason(container, stream))
        return last_video + 1 / fps - start
    tolerance = max(1.0, 0.02 * (reference - start), 3 / fps)
    last_video, last_any = _decodable_tail(container, stream, time_base, start, seek_to)
    if declared is not None:
        if last_video is None:
            raise InputError(
                f"truncated: no frame can be decoded in the last seconds of the {declared:.2f} s "
                "the file declares"
            )
        if last_video + 1 / fps < reference - tolerance:
            raise InputError(
                f"truncated: its frames stop at {last_video + 1 / fps - start:.2f} s of the "
                f"{declared:.2f} s the file declares"
            )
        # frames shown past the declared length (a variable-rate MP4 whose track length
        # leaves out the encoder's delay) are part of the video
        return max(declared, last_video + 1 / fps - start)
    if last_any is None or last_any < reference - tolerance:
        got = "nothing" if last_any is None else f"{last_any - start:.2f} s"
        raise InputError(
            f"truncated: its data stops at {got} of the {reference - start:.2f} s the file declares"
        )
    if last_video is None:  # the video ended well before the other streams: find where
        last_video = _last_video_packet(container, stream, time_base, start, fps)
    if last_video is None:
        raise InputError("no frame of the video stream can be found")
    return last_video + 1 / fps - start


def _no_length_reason(container: Any, stream: Any) -> str:
    """Why a file whose length nothing says could not be read through either."""
    kind = container.format.name if container.format else ""
    codec = stream.codec_context.name
    if kind == codec or kind in ("mpegvideo", "m4v", "rawvideo", "obu", "ivf"):
        return (
            f"a bare {codec} stream with no container: it has no timestamps or length, and "
            "it cannot be sought in to cut clips; put it in a container first (e.g. "
            "`ffmpeg -i IN -c copy OUT.mp4`)"
        )
    return (
        "the video's duration is unknown (neither stream nor container say) and its packets "
        "cannot be read through to find it"
    )


#: how far before the end the tail check reads; then further back (s), where it landed in a
#: group of pictures whose key frame is before it
_TAIL_READS_S = (3.0, 15.0, 60.0)


def _decodable_tail(
    container: Any, stream: Any, time_base: float, start: float, end: float
) -> tuple[float | None, float | None]:
    """``_scan_tail`` from a few seconds before ``end``, or from further back while it found
    video packets but no key frame to decode them from: MPEG-TS and -PS seek to any packet,
    and a recording with a key frame every 10 s is complete. Where no key frame is found
    within a minute, the video's last packet says where it ends."""
    tail = _Tail()
    for back in _TAIL_READS_S:
        tail = _scan_tail(container, stream, time_base, max(start, end - back))
        if tail.last_video is not None or tail.keyframe or tail.last_packet is None:
            break
        if end - back <= start:
            break
    if tail.last_video is None and not tail.keyframe:
        return tail.last_packet, tail.last_any
    return tail.last_video, tail.last_any


@dataclass
class _Tail:
    """What reading a file's last seconds found (times in seconds, ``None``: nothing)."""

    last_video: float | None = None  # the last video packet, once a key frame decoded
    last_any: float | None = None  # the end of the last packet of any stream
    last_packet: float | None = None  # the last video packet
    keyframe: bool = False  # whether a video packet read was a key frame
    decoded: bool = False  # whether a key frame among them decoded


def _scan_tail(container: Any, stream: Any, time_base: float, seek_to: float) -> _Tail:
    """What the file holds from ``seek_to`` to the end.

    Only key frames are decoded: one that decodes shows the codec reads the tail, and the
    packets after it, demuxed, show how far the video goes. Decoding every frame of the
    last group of pictures cost 0.2 CPU-s per 720p video (and 4 ms of a 2 s one, an eighth
    of all its work); damage in it is found, and fails only its clips, when it is cut."""
    import av

    tail = _Tail()
    context = stream.codec_context
    context.skip_frame = "NONKEY"
    # each stream's time base as a float, once: a packet's is a Fraction, slow to multiply
    bases = {s.index: float(s.time_base) if s.time_base else 0.0 for s in container.streams}
    try:
        container.seek(int(seek_to / time_base), stream=stream, backward=True)
        for packet in container.demux():
            if packet.pts is not None and bases.get(packet.stream_index):
                end = (packet.pts + (packet.duration or 0)) * bases[packet.stream_index]
                tail.last_any = end if tail.last_any is None else max(tail.last_any, end)
            if packet.stream is stream:
                if packet.size:
                    tail.keyframe = tail.keyframe or packet.is_keyframe
                    if packet.pts is not None:
                        t = packet.pts * time_base
                        tail.last_packet = (
                            t if tail.last_packet is None else max(tail.last_packet, t)
                        )
                if tail.decoded:
                    continue  # one key frame decoded shows the codec reads the tail
                try:
                    frames = packet.decode()
                except av.InvalidDataError:
                    continue  # a damaged packet: what follows may decode (``_past_damage``)
                if any(frame.pts is not None for frame in frames):
                    tail.decoded = True
    except av.FFmpegError:
        pass  # judged by how far the data got
    finally:
        context.skip_frame = "DEFAULT"
    if tail.decoded:  # the video reaches its last packet
        tail.last_video = tail.last_packet
    return tail


def _last_video_packet(
    container: Any, stream: Any, time_base: float, start: float, fps: float
) -> float | None:
    """The last video packet's time, demuxing (not decoding) from the start; where packets
    carry no timestamps (a raw stream), the time of the last one counted at ``fps``."""
    import av

    last: float | None = None
    count = 0
    try:
        container.seek(int(start / time_base), stream=stream, backward=True)
        for packet in container.demux(stream):
            if not packet.size:
                continue  # a flush packet
            count += 1
            stamp = packet.pts if packet.pts is not None else packet.dts
            if stamp is not None:
                t = stamp * time_base
                last = t if last is None else max(last, t)
    except av.FFmpegError:
        pass
    if last is None and count:
        last = start + (count - 1) / fps
    return last


# -- decoding a range -------------------------------------------------------------------
@dataclass
class Damage:
    """What a decode skipped: packets the decoder refused as damaged (their frames are
    missing from what it gave; a stretch read twice counts twice)."""

    packets: int = 0


def decode_range(
    path: str,  # a local path or a URL
    metadata: VideoMetadata,
    start_s: float,
    end_s: float,
    *,
    threads: int = 1,
    any_damage: bool = False,
    deinterlace: bool = False,
    damage: Damage | None = None,
    motion_vectors: bool = False,
    nvdec: DecodeNote | None = None,
    nvdec_resize: tuple[int, int] | None = None,
) -> Iterator[tuple[float, Any]]:
    """``(seconds, av.VideoFrame)`` for every frame in ``[start_s, end_s)``, from one seek.

    The seek lands on the key frame before ``start_s``; frames before it are decoded and
    dropped. A container whose seek lands after ``start_s`` is read again from further back,
    and at last from the start of the file opened anew (seeking to its start lands late in
    MPEG-TS and -PS, which seek by decode stamps, and in a file whose clock wraps).
    Damaged packets are skipped; a range mostly damaged fails, unless ``any_damage``: then
    it gives what decodes. With ``deinterlace``, an interlaced source's frames come out
    whole (``deinterlaced``). ``damage`` counts the packets skipped. ``motion_vectors``:
    frames carry the codec's motion vectors (``open_video``). ``nvdec``: decode on the
    GPU's NVDEC where it takes the video (no motion vectors then), and say in the note
    which decoder ran and why the CPU did where NVDEC could not; ``nvdec_resize``: NVDEC's
    frames come out at that size (``nvdec_size``), the CPU's at the video's.
    """
    with contextlib.ExitStack() as stack:
        source = _source(path, stack)
        for fresh in (False, True):
            if fresh and not isinstance(source, str):
                source.seek(0)
            with _capture():
                container, stream = open_video(source, threads, motion_vectors)
            with container, contextlib.ExitStack() as lent:
                decoder = None
                if nvdec is not None:
                    try:
                        decoder = lent.enter_context(NVDEC_POOL.acquire(stream, nvdec_resize))
                        nvdec.decoder, nvdec.fallback = "nvdec", None
                    except NvdecUnavailable as exc:
                        nvdec.decoder, nvdec.fallback = "cpu", str(exc)
                done = yield from _decode_open(
                    container,
                    stream,
                    metadata,
                    (start_s, end_s),
                    any_damage,
                    deinterlace and metadata.interlaced,
                    fresh,
                    damage,
                    decoder,
                )
            if done:
                return


def _decode_open(
    container: Any,
    stream: Any,
    metadata: VideoMetadata,
    span: tuple[float, float],
    any_damage: bool = False,
    deinterlace: bool = False,
    fresh: bool = False,
    damage: Damage | None = None,
    decoder: Any = None,
) -> Generator[tuple[float, Any], None, bool]:
    """``decode_range``'s work once the container is open: False where the range is to be
    read from the start of the file opened anew (``fresh``, read without seeking).
    ``decoder``: another decoder than the stream's (NVDEC), flushed at each seek as PyAV
    flushes the stream's own, so that nothing decoded before the seek comes out after."""
    import av

    start_s, end_s = span
    time_base = float(stream.time_base)
    start_pts = round(metadata.start_time_s / time_base) if time_base else 0
    half_frame = 0.5 / metadata.fps
    for back in (math.inf,) if fresh else (0.0, _RESEEK_S, math.inf):
        origin = max(0.0, start_s - back)
        if origin == 0 and back and not fresh:
            return False  # from the very start
        if origin > 0:
            try:
                container.seek(int(origin / time_base) + start_pts, stream=stream)
            except av.FFmpegError:
                continue
            if decoder is not None:
                decoder.flush_buffers()
        frames = _decode_from(
            container, stream, start_pts, time_base, metadata.fps, any_damage, damage, decoder
        )
        if deinterlace:  # before the range is cut, so the filter sees each frame's neighbours
            frames = deinterlaced(frames)
        first = next(frames, None)
        if first is None:
            if origin > 0:
                continue  # nothing decodes after this seek: read from further back
            return True
        if first[0] > start_s + half_frame and origin > 0:
            continue  # landed after the start: go further back
        if first[0] >= start_s - half_frame:
            if first[0] >= end_s - half_frame:
                return True
            yield first
        for t, frame in frames:
            if t >= end_s - half_frame:
                return True
            if t >= start_s - half_frame:
                yield t, frame
        return True
    return True


def _past_damage(
    container: Any,
    stream: Any,
    any_damage: bool = False,
    damage: Damage | None = None,
    decoder: Any = None,
) -> Iterator[Any]:
    """The stream's frames, skipping packets the decoder refuses as damaged, as FFmpeg's
    own tools do (a few flipped bits in a long file cost a moment of it, with the decoder
    concealing what it can, not the whole file); a range where damaged packets are the
    majority, past ``_DAMAGED_PACKETS`` of them, fails with the decoder's reason, unless
    ``any_damage``."""
    import av

    damaged = packets = 0
    for packet in container.demux(stream):
        packets += 1
        try:
            frames = packet.decode() if decoder is None else decoder.decode(packet)
        except av.InvalidDataError:
            damaged += 1
            if damage is not None:
                damage.packets += 1
            if not any_damage and damaged > _DAMAGED_PACKETS and damaged * 2 > packets:
                raise
            continue
        yield from frames


def _decode_from(
    container: Any,
    stream: Any,
    start_pts: int,
    time_base: float,
    fps: float,
    any_damage: bool = False,
    damage: Damage | None = None,
    decoder: Any = None,
) -> Iterator[tuple[float, Any]]:
    """Decoded frames with their seconds; frames without a timestamp follow the last one.
    ``decoder``: another decoder than the stream's (NVDEC)."""
    last: float | None = None
    frames = _past_damage(container, stream, any_damage, damage, decoder)
    for stamp, frame in trusted_stamps(frames):
        if stamp is None:
            t = 0.0 if last is None else last + 1 / fps
        else:
            t = (stamp - start_pts) * time_base
        last = t
        yield t, frame


#: the filter graph's clock: frames are numbered in it, since only their order matters
_FILTER_TIME_BASE = Fraction(1, 1000)


def deinterlaced(frames: Iterator[tuple[float, Any]]) -> Iterator[tuple[float, Any]]:
    """The frames of an interlaced source made whole, each with its time.

    FFmpeg's ``bwdif`` filter (motion-adaptive, looking one frame ahead) rebuilds each
    frame's missing lines, one frame out per frame in, so spans, ids and frame counts stay
    those of the source; a frame not flagged interlaced passes unchanged. Without it, a
    clip of a broadcast or camcorder source shows comb teeth on everything that moves, and
    the models learn from them.
    """
    graph: Any = None
    shape: tuple[int, int, str] | None = None
    times: deque[float] = deque()
    for count, (t, frame) in enumerate(frames):
        if (frame.width, frame.height, frame.format.name) != shape:  # a new graph per size
            if graph is not None:
                yield from _pull(graph, times, flush=True)
            shape = (frame.width, frame.height, frame.format.name)
            graph = _bwdif(*shape)
        frame.pts, frame.time_base = count, _FILTER_TIME_BASE  # order is all it needs
        times.append(t)
        graph.push(frame)
        yield from _pull(graph, times)
    if graph is not None:
        yield from _pull(graph, times, flush=True)


def _bwdif(width: int, height: int, pix_fmt: str) -> Any:
    import av

    graph = av.filter.Graph()
    source = graph.add_buffer(
        width=width, height=height, format=pix_fmt, time_base=_FILTER_TIME_BASE
    )
    bwdif = graph.add("bwdif", "mode=send_frame:parity=auto:deint=interlaced")
    sink = graph.add("buffersink")
    source.link_to(bwdif)
    bwdif.link_to(sink)
    graph.configure()
    return graph


def _pull(graph: Any, times: deque[float], flush: bool = False) -> Iterator[tuple[float, Any]]:
    """What the filter has ready, paired in order with the times of the frames pushed."""
    import av

    if flush:
        graph.push(None)
    while times:
        try:
            frame = graph.pull()
        except (av.error.BlockingIOError, av.error.EOFError):
            break
        yield times.popleft(), frame
    if flush:
        times.clear()  # nothing more will come for them
