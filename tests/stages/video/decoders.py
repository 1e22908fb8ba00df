"""Decoders opened as the NVDEC pool opens NVDEC's, for the pool and the fallbacks to be
tried where no NVDEC is: the stream's own CPU decoder, and two that open and then cannot
decode, each the way NVDEC can fail."""

from __future__ import annotations

from typing import Any


def software(stream: Any, resize: tuple[int, int] | None = None) -> Any:
    """The stream's own CPU decoder, opened as the pool opens NVDEC's (from the stream's
    parameters, apart from the container): the pool's lending, flushing and reuse are the
    same whichever decoder it keeps."""
    return _own_decoder(stream)


def _own_decoder(stream: Any, frame_threads: int = 0) -> Any:
    import av

    context = stream.codec_context
    decoder = av.CodecContext.create(context.name, "r")
    if context.extradata:
        decoder.extradata = context.extradata
    decoder.width, decoder.height = context.width, context.height
    if frame_threads:
        decoder.thread_type, decoder.thread_count = "FRAME", frame_threads
    decoder.open()
    return decoder


def refusing(stream: Any, resize: tuple[int, int] | None = None) -> Any:
    """A decoder that opens but takes none of the video's packets (a PNG decoder fed H.264),
    as NVDEC does with a stream it opened for and then cannot decode."""
    import av

    decoder = av.CodecContext.create("png", "r")
    decoder.open()
    return decoder


def drained(stream: Any, resize: tuple[int, int] | None = None) -> Any:
    """A decoder that opens and then fails on every packet with an error that is not
    damage, as NVDEC does when its driver gives up: the stream's own, told the stream has
    ended, and told again whenever it is flushed (at a seek, or lent again)."""

    class Drained:
        def __init__(self, decoder: Any) -> None:
            self.decoder = decoder
            self.flush_buffers()

        def decode(self, packet: Any) -> Any:
            return self.decoder.decode(packet)  # FFmpeg's EOFError: nothing more is taken

        def flush_buffers(self) -> None:
            self.decoder.flush_buffers()
            self.decoder.decode(None)

    return Drained(software(stream))


def silent(stream: Any, resize: tuple[int, int] | None = None) -> Any:
    """A decoder that takes every packet and gives no frame (the stream's own, told to skip
    every frame), as NVDEC could with a stream it misreads without a word."""
    decoder = software(stream)
    decoder.skip_frame = "ALL"
    return decoder


def threaded(stream: Any, resize: tuple[int, int] | None = None) -> Any:
    """The stream's own CPU decoder with four frame threads: it holds frames back, as
    NVDEC's queue of surfaces does, so a decode that seeks without flushing it would get
    frames of before the seek."""
    return _own_decoder(stream, frame_threads=4)


def nv12(stream: Any, resize: tuple[int, int] | None = None) -> Any:
    """The stream's own CPU decoder giving its frames in NV12, as NVDEC gives them (scaled
    to ``resize``, as NVDEC's scaler does)."""

    class Nv12:
        def __init__(self, decoder: Any) -> None:
            self.decoder = decoder

        def decode(self, packet: Any) -> list[Any]:
            size = {"width": resize[0], "height": resize[1]} if resize else {}
            return [f.reformat(format="nv12", **size) for f in self.decoder.decode(packet)]

        def flush_buffers(self) -> None:
            self.decoder.flush_buffers()

    return Nv12(software(stream))
