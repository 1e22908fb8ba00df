"""Decoding on NVDEC: the pool that keeps decoders open between decodes, the shot
detector's small frames, and what a video NVDEC cannot take gets (here no GPU driver takes
NVDEC: the CPU decodes, and the window says why). Where NVDEC works, the last tests decode
on it and compare with the CPU's frames; elsewhere they skip, saying so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.media import decode
from conveyor.media.decode import DecodeNote, DecoderPool, decode_range, nvdec_size, nvdec_works
from conveyor.samples.video import Segment, SyntheticVideo, write_video
from conveyor.stages.video.shots import TRANSNET_CONTEXT, ShotFrameDecoder
from conveyor.tasks.video import VideoTask
from tests.stages.video.decoders import drained, refusing, silent, software, threaded
from tests.stages.video.shot_windows import windowed

GPU = WorkerInfo("w", "ShotFrameDecoder", "n", gpu_ids=(0,))
NO_GPU = WorkerInfo("w", "ShotFrameDecoder", "n")


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> SyntheticVideo:
    path = tmp_path_factory.mktemp("nvdec") / "cuts.mp4"
    segments = [Segment("pan", 3, 1), Segment("rings", 3, 2), Segment("checker", 3, 3)]
    # key frames a second apart, so that a range starts mid-GOP and the seek matters
    return write_video(path, segments, width=320, height=180, fps=15, crossfades=None, gop=15)


def pixels(frames: Iterator[tuple[float, Any]]) -> list[tuple[float, np.ndarray]]:
    return [(t, f.to_ndarray(format="rgb24")) for t, f in frames]


def assert_same(got: list[tuple[float, np.ndarray]], want: list[tuple[float, np.ndarray]]) -> None:
    assert [t for t, _ in got] == [t for t, _ in want] and want
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, want, strict=True))


# -- sizes and the pool -------------------------------------------------------------------
def test_nvdec_shrinks_to_four_times_the_target_in_even_numbers_never_past_the_source() -> None:
    assert nvdec_size((48, 27), (1280, 720)) == (192, 108)
    assert nvdec_size((48, 27), (1920, 1080)) == (192, 108)
    assert nvdec_size((48, 27), (160, 90)) == (160, 90)  # the source is smaller: whole
    assert nvdec_size((48, 27), (101, 57)) == (100, 56)  # NV12 needs even sizes
    assert nvdec_size((48, 27), (100, 100)) == (100, 100)


def test_a_pooled_decoder_gives_every_decode_the_frames_a_fresh_decode_gives(
    video: SyntheticVideo, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = DecoderPool(software)
    monkeypatch.setattr(decode, "NVDEC_POOL", pool)
    meta = decode.probe(str(video.path))
    path = str(video.path)
    ranges = [(0.0, 2.5), (3.3, 6.0), (1.2, 4.4), (6.5, meta.duration_s)]
    for start, end in ranges:
        note = DecodeNote()
        got = pixels(decode_range(path, meta, start, end, nvdec=note))
        assert_same(got, pixels(decode_range(path, meta, start, end)))
        assert note.decoder == "nvdec" and note.fallback is None
    assert pool.opened == 1  # one decoder for every range of the video
    # a decode left half way (a window that had what it needed) leaves nothing behind
    partial = decode_range(path, meta, 0.0, 9.0, nvdec=DecodeNote())
    next(partial)
    partial.close()
    assert_same(
        pixels(decode_range(path, meta, 4.0, 5.0, nvdec=DecodeNote())),
        pixels(decode_range(path, meta, 4.0, 5.0)),
    )
    # a decode started inside another gets its own decoder; both give their frames
    outer = decode_range(path, meta, 0.0, 3.0, nvdec=DecodeNote())
    head = pixels(iter([next(outer), next(outer)]))
    inner = pixels(decode_range(path, meta, 5.0, 6.0, nvdec=DecodeNote()))
    assert_same(head + pixels(outer), pixels(decode_range(path, meta, 0.0, 3.0)))
    assert_same(inner, pixels(decode_range(path, meta, 5.0, 6.0)))
    assert pool.opened == 2 and len(pool._idle) == 2


def test_the_pool_keeps_a_few_decoders_and_opens_one_per_kind_of_decode(
    video: SyntheticVideo,
) -> None:
    import av

    pool = DecoderPool(software, keep=2)
    with av.open(str(video.path)) as container:
        stream = container.streams.video[0]
        with pool.acquire(stream) as a, pool.acquire(stream) as b, pool.acquire(stream) as c:
            assert len({id(a), id(b), id(c)}) == 3
        # c went back first: the least recently used, it is the one let go
        assert pool.opened == 3 and [d for _, d in pool._idle] == [b, a]
        with pool.acquire(stream, (64, 36)) as smaller:  # another size: another decoder
            assert smaller not in (a, b)
        assert pool.opened == 4 and [d for _, d in pool._idle] == [a, smaller]
        with pool.acquire(stream) as again:
            assert again is a
        assert pool.opened == 4


# -- the shot detector's decoder ----------------------------------------------------------
def shot_decoder(scaler: str, width: int = 128) -> ShotFrameDecoder:
    """TransNetV2's decoder (``ffmpeg``) or the PySceneDetect-style one (``opencv``)."""
    if scaler == "ffmpeg":
        return ShotFrameDecoder()
    return ShotFrameDecoder(size=None, width=width, scaler="opencv")


def decoded_windows(
    stage: ShotFrameDecoder, truth: SyntheticVideo, window_s: float, worker: WorkerInfo = NO_GPU
) -> tuple[list[np.ndarray], list[VideoTask]]:
    """Every window's frames as ``stage`` on ``worker`` decodes them, and the windows."""
    stage.setup(worker)
    tasks = windowed(truth, window_s, TRANSNET_CONTEXT)
    frames = []
    for task in tasks:
        stage.process(task)
        window = task.data.window
        assert window is not None and window.frames is not None
        frames.append(window.frames)
    return frames, tasks


def assert_cpu_frames(
    got: list[np.ndarray], want: list[np.ndarray], tasks: list[VideoTask], reason: str | None
) -> None:
    """The CPU decoded every window, the same frames as without NVDEC, and each window
    says why (its fallback starts with ``reason``; ``None``: NVDEC was never asked)."""
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    for task in tasks:
        assert task.data.decoder == "cpu"
        if reason is None:
            assert task.data.decoder_fallback is None
        else:
            assert (task.data.decoder_fallback or "").startswith(reason)


def test_the_shot_decoder_asks_nvdec_where_its_worker_has_a_gpu_and_falls_back_per_window(
    video: SyntheticVideo,
) -> None:
    """Here no driver takes NVDEC: each window is decoded on the CPU, with the same frames,
    and says why."""
    if nvdec_works():
        pytest.skip("NVDEC works here: test_nvdec_decodes_the_shot_frames covers it")
    with pytest.raises(ValueError, match="decoder must be one of auto, cpu, nvdec"):
        ShotFrameDecoder(decoder="gpu")
    with pytest.raises(RuntimeError, match="decoder='nvdec' needs a GPU on the worker"):
        ShotFrameDecoder(decoder="nvdec").setup(NO_GPU)
    want, tasks = decoded_windows(ShotFrameDecoder(), video, 2.0)
    assert_cpu_frames(want, want, tasks, None)
    for decoder, reason in (
        ("auto", "h264_cuvid does not open"),
        ("nvdec", "h264_cuvid does not open"),
        ("cpu", None),
    ):
        got, tasks = decoded_windows(ShotFrameDecoder(decoder=decoder), video, 2.0, GPU)
        assert_cpu_frames(got, want, tasks, reason)


@pytest.mark.parametrize(
    ("scaler", "opener", "reason"),
    [
        ("ffmpeg", refusing, "NVDEC gave no frame of it"),
        ("opencv", refusing, "NVDEC gave no frame of it"),
        ("ffmpeg", drained, "NVDEC failed: EOFError"),
        ("ffmpeg", silent, "NVDEC gave no frame of it"),
    ],
)
def test_a_window_nvdec_opens_for_but_cannot_decode_is_decoded_on_the_cpu(
    video: SyntheticVideo, monkeypatch: pytest.MonkeyPatch, scaler: str, opener: Any, reason: str
) -> None:
    want, _ = decoded_windows(shot_decoder(scaler), video, 3.0)
    monkeypatch.setattr(decode, "NVDEC_POOL", DecoderPool(opener))
    got, tasks = decoded_windows(shot_decoder(scaler), video, 3.0, GPU)
    assert_cpu_frames(got, want, tasks, reason)


@pytest.mark.parametrize("scaler", ["ffmpeg", "opencv"])
def test_frames_as_nvdec_gives_them_make_the_shot_frames_the_cpu_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scaler: str
) -> None:
    """The NVDEC path's own work on what NVDEC hands over (NV12, shrunk by its scaler for
    TransNetV2), with a CPU decoder giving frames so standing in for it: every window says
    NVDEC decoded it, and its frames are the CPU path's, exactly whole, close once shrunk
    in two steps."""
    from .decoders import nv12

    segments = [Segment("pan", 2, 1), Segment("rings", 2, 2), Segment("checker", 2, 3)]
    truth = write_video(tmp_path / "hd.mp4", segments, width=640, height=360, fps=30, gop=30)
    want, _ = decoded_windows(shot_decoder(scaler, width=256), truth, 2.0)
    monkeypatch.setattr(decode, "NVDEC_POOL", DecoderPool(nv12))
    got, tasks = decoded_windows(shot_decoder(scaler, width=256), truth, 2.0, GPU)
    assert all(t.data.decoder == "nvdec" and t.data.decoder_fallback is None for t in tasks)
    for a, b in zip(got, want, strict=True):
        if scaler == "opencv":
            assert np.array_equal(a, b)
        else:
            assert np.abs(a.astype(np.int16) - b.astype(np.int16)).mean() <= 6.0


def test_nv12_becomes_the_rgb_the_cpu_decoders_yuv420p_does(video: SyntheticVideo) -> None:
    """Whole or scaled, NVDEC's NV12 gives the pixels the CPU decoder's yuv420p gives (at
    its own size FFmpeg's direct NV12 path would filter the colour planes)."""
    import av

    from conveyor.media.decode import to_rgb

    with av.open(video.path) as container:
        frames = [f for _, f in zip(range(5), container.decode(video=0), strict=False)]
    for frame in frames:
        nv12 = frame.reformat(format="nv12")
        assert np.array_equal(to_rgb(nv12), to_rgb(frame))
        for size in ((48, 27), (frame.width, frame.height)):
            assert np.array_equal(to_rgb(nv12, size), to_rgb(frame, size))
        assert to_rgb(frame, (48, 27)).shape == (27, 48, 3)


# -- on NVDEC, where it works ---------------------------------------------------------------
needs_nvdec = pytest.mark.skipif(
    "not __import__('conveyor.media.decode', fromlist=['x']).nvdec_works()",
    reason="no NVDEC here (it needs an NVIDIA GPU and its driver)",
)


@needs_nvdec
@pytest.mark.parametrize("scaler", ["ffmpeg", "opencv"])
def test_nvdec_decodes_the_shot_frames(tmp_path: Path, scaler: str) -> None:
    """NVDEC's frames against the CPU's: exact whole (H.264's decode is exact), close once
    its scaler shrank them; one decoder opened for every window of the video."""
    segments = [Segment("pan", 2, 1), Segment("rings", 2, 2), Segment("checker", 2, 3)]
    truth = write_video(tmp_path / "hd.mp4", segments, width=1280, height=720, fps=30, gop=30)

    want, _ = decoded_windows(shot_decoder(scaler, width=256), truth, 2.0)
    opened = decode.NVDEC_POOL.opened
    got, tasks = decoded_windows(shot_decoder(scaler, width=256), truth, 2.0, GPU)
    assert decode.NVDEC_POOL.opened - opened <= 1
    assert all(t.data.decoder == "nvdec" and t.data.decoder_fallback is None for t in tasks)
    for a, b in zip(got, want, strict=True):
        difference = np.abs(a.astype(np.int16) - b.astype(np.int16)).mean()
        assert difference <= (1.0 if scaler == "opencv" else 6.0), difference


def test_a_pooled_decoder_is_flushed_at_every_seek_of_a_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MPEG-TS seeks land late, so a decode seeks again further back: what the lent decoder
    held from the first landing must not come out after the second. Here MPEG-2 with
    B-frames, decoded with frame threads: a decoder that holds frames back, as NVDEC's
    queue of surfaces does."""
    import av

    from conveyor.samples.video import render_frames

    path = tmp_path / "broadcast.ts"
    with av.open(str(path), "w", format="mpegts") as container:
        stream = container.add_stream("mpeg2video", rate=12)  # broadcast's codec
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.options = {"bf": "2", "b": "1M"}  # B-frames: the decoder holds frames
        stream.codec_context.gop_size = 24
        for image in render_frames([Segment("pan", 16.0, 3)], 160, 120, 12):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode(None))
    monkeypatch.setattr(decode, "NVDEC_POOL", DecoderPool(threaded))
    passes: list[int] = []  # each pass over the file: after a seek, or from its start
    counted = decode._decode_from

    def counting(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return counted(*args, **kwargs)

    monkeypatch.setattr(decode, "_decode_from", counting)
    meta = decode.probe(str(path))
    # past 10 s the second seek is one more seek in the open file, before it the file's start
    for start, end in [(11.5, 12.5), (13.2, 15.0), (0.5, 1.5), (14.1, meta.duration_s)]:
        passes.clear()
        want = pixels(decode_range(str(path), meta, start, end))
        on_cpu = len(passes)
        passes.clear()
        note = DecodeNote()
        assert_same(pixels(decode_range(str(path), meta, start, end, nvdec=note)), want)
        assert note.decoder == "nvdec"
        # the second landing's frames are taken as they come, as the CPU's are: no stale
        # frame of the first sends the decode back to the file's start
        assert len(passes) == on_cpu == 2
