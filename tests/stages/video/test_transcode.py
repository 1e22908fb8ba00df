"""Cutting clips out of their source into H.264 yuv420p MP4s, one decoding pass per chunk."""

from __future__ import annotations

import copy
import io
import logging
import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.samples.video import CONTAINERS, Segment, SyntheticVideo
from conveyor.stages.video import transcode
from conveyor.stages.video.motion import motion_scores
from conveyor.stages.video.transcode import ClipTranscoder, output_size
from conveyor.stages.video.writer import clip_meta
from conveyor.tasks.video import Clip, VideoTask

from .conftest import INTERLACED_SOURCES, Media, combing, write_interlaced
from .decoders import drained, refusing, silent

#: overlapping clips starting between key frames (every 24 frames), the last at the end
SPANS = [(18, 30), (24, 40), (40, 48)]


@pytest.fixture(autouse=True)
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The encoders' scratch files go to a folder of the test's own, checked empty after."""
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(transcode, "scratch_dir", lambda: str(folder))
    monkeypatch.setattr(transcode, "scratch_dirs", lambda: [str(folder)])
    yield folder
    assert list(folder.iterdir()) == []


def noise_video(media: Media, suffix: str, **options: Any) -> SyntheticVideo:
    """4 s of noise (every frame differs from its neighbours), 48 frames at 12 fps."""
    settings = {"width": 160, "height": 120, "fps": 12, **options}
    return media.video(f"noise{suffix}", [Segment("noise", 4.0, 7)], **settings)


def decoded(data: bytes) -> tuple[Any, list[np.ndarray]]:
    """``(stream facts, RGB frames)`` of an encoded clip."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        facts = {
            "codec": stream.codec_context.name,
            "pix_fmt": stream.codec_context.pix_fmt,
            "size": (stream.codec_context.width, stream.codec_context.height),
            "rate": float(stream.average_rate),
            "audio": len(container.streams.audio),
            "format": container.format.name,
        }
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    return facts, frames


def source_frames(path: Path, size: tuple[int, int] | None = None) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        if size is None:
            return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        width, height = size
        return [
            f.to_ndarray(width=width, height=height, format="rgb24")
            for f in container.decode(video=0)
        ]


def transcoded(
    media: Media, path: Path, spans: list[tuple[int, int]], **options: Any
) -> list[Clip]:
    task = media.task(path, media.metadata(path), spans)
    stage = media.ready(ClipTranscoder(encoder="libx264", preset="ultrafast", **options))
    assert_parts(list(stage.process(task)), task)
    return task.data.clips


def assert_parts(parts: list[VideoTask], task: VideoTask) -> None:
    """Each clip of the chunk left once, alone, as the part its place in the chunk says."""
    clips = task.data.clips
    assert sorted(p.data.part for p in parts) == list(range(len(clips)))
    for part in parts:
        assert part is not task and part.data.parts == len(clips)
        assert part.data.clips == [clips[part.data.part]]
        assert part.data.clips[0] is clips[part.data.part]  # the same clip, finished
        assert part.data.chunk_index == task.data.chunk_index
        assert part.data.last_chunk == task.data.last_chunk


def assert_good_clip(clip: Clip, size: tuple[int, int], fps: float = 12.0) -> list[np.ndarray]:
    assert not clip.errors
    assert clip.encoded is not None
    facts, frames = decoded(clip.encoded)
    first, last = clip.frame_span
    assert facts["codec"] == "h264"
    assert facts["pix_fmt"] == "yuv420p"
    assert facts["size"] == size
    assert size[0] % 2 == 0 and size[1] % 2 == 0
    assert facts["rate"] == pytest.approx(fps)
    assert facts["audio"] == 0
    assert len(frames) == last - first == clip.num_frames
    assert (clip.width, clip.height) == size
    assert clip.fps == pytest.approx(fps)
    assert clip.codec == "h264"
    return frames


def assert_aligned(frames: list[np.ndarray], source: list[np.ndarray], first: int) -> None:
    """Clip frame k is source frame first + k (closer to it than to its neighbours)."""
    for k, frame in enumerate(frames):
        want = first + k
        errors = {
            i: np.abs(frame.astype(np.int16) - source[i]).mean()
            for i in range(max(0, want - 2), min(len(source), want + 3))
        }
        assert min(errors, key=errors.__getitem__) == want, (k, errors)


# -- sizes and settings -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("width", "height", "max_height", "expected"),
    [
        (320, 240, None, (320, 240)),
        (321, 241, None, (320, 240)),
        (323, 243, None, (322, 242)),  # never a pixel more than the source (was 324 x 244)
        (1920, 1080, 720, (1280, 720)),
        (1080, 1920, 720, (404, 720)),
        (640, 360, 720, (640, 360)),
        (1, 1, None, (2, 2)),
        (1920, 1080, 361, (640, 360)),  # an odd limit: never above it
        (320, 240, 3, (2, 2)),
    ],
)
def test_output_size(
    width: int, height: int, max_height: int | None, expected: tuple[int, int]
) -> None:
    assert output_size(width, height, max_height) == expected


def test_a_sideways_source_is_limited_by_the_height_it_is_shown_at() -> None:
    """A phone's portrait video (stored 1920x1080, turned) was limited by its stored height:
    --max-height 720 left it 1280 tall as shown."""
    assert output_size(1920, 1080, 720, sideways=True) == (720, 404)
    assert output_size(1920, 1080, None, sideways=True) == (1920, 1080)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="encoder"):
        ClipTranscoder(encoder="libx265")
    with pytest.raises(ValueError, match="crf"):
        ClipTranscoder(crf=60)
    with pytest.raises(ValueError, match=r"preset must be one of ultrafast, .*, got 'bogus'"):
        ClipTranscoder(preset="bogus")
    with pytest.raises(ValueError, match="max_height"):
        ClipTranscoder(max_height=1)


def test_the_encoder_follows_the_worker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cpu = WorkerInfo("w", "ClipTranscoder", "n")
    gpu = WorkerInfo("w", "ClipTranscoder", "n", gpu_ids=(0,))
    monkeypatch.setattr(transcode, "nvenc_works", lambda: False)
    for encoder in ("auto", "libx264"):
        stage = ClipTranscoder(encoder=encoder)
        stage.setup(cpu)
        assert stage._codec == "libx264"
        assert stage._options() == {"preset": "veryfast", "crf": "23"}
    with caplog.at_level(logging.WARNING):
        auto = ClipTranscoder()
        auto.setup(gpu)
    assert auto._codec == "libx264" and "NVENC" in caplog.text
    with pytest.raises(RuntimeError, match="h264_nvenc"):
        ClipTranscoder(encoder="h264_nvenc").setup(gpu)
    monkeypatch.setattr(transcode, "nvenc_works", lambda: True)
    nvenc = ClipTranscoder(cq=19)
    nvenc.setup(gpu)
    assert nvenc._codec == "h264_nvenc" and nvenc._options()["cq"] == "19"


def test_the_decoder_follows_the_worker_and_falls_back_per_video(media: Media) -> None:
    """NVDEC where the worker has a GPU: here no driver takes it (a declared GPU), so each
    part says the CPU decoded it and why, and every clip is made all the same."""
    from conveyor.media.decode import nvdec_works

    if nvdec_works():
        pytest.skip("NVDEC works here: test_nvdec_decodes_where_it_works covers it")
    with pytest.raises(ValueError, match="decoder must be one of auto, cpu, nvdec"):
        ClipTranscoder(decoder="gpu")
    with pytest.raises(RuntimeError, match="decoder='nvdec' needs a GPU on the worker"):
        ClipTranscoder(decoder="nvdec").setup(WorkerInfo("w", "ClipTranscoder", "n"))
    source = noise_video(media, ".mp4")
    gpu = WorkerInfo("w", "ClipTranscoder", "n", gpu_ids=(0,))
    for decoder, worker, fallback in (
        ("auto", gpu, True),
        ("nvdec", gpu, True),
        ("auto", WorkerInfo("w", "ClipTranscoder", "n"), False),
        ("cpu", gpu, False),
    ):
        task = media.task(source.path, media.metadata(source.path), SPANS)
        stage = ClipTranscoder(encoder="libx264", preset="ultrafast", decoder=decoder)
        stage.setup(worker)
        parts = list(stage.process(task))
        assert_parts(parts, task)
        for part in parts:
            assert part.data.decoder == "cpu"
            if fallback:
                assert "h264_cuvid" in (part.data.decoder_fallback or "")
            else:
                assert part.data.decoder_fallback is None
        for clip in task.data.clips:
            assert_good_clip(clip, (160, 120))


def test_nvdec_takes_only_what_it_decodes() -> None:
    from types import SimpleNamespace

    from conveyor.media.decode import NvdecUnavailable, nvdec_decoder

    def stream(codec: str, pix_fmt: str = "yuv420p", width: int = 64) -> Any:
        context = SimpleNamespace(
            name=codec, pix_fmt=pix_fmt, extradata=None, width=width, height=48
        )
        return SimpleNamespace(codec_context=context)

    with pytest.raises(NvdecUnavailable, match="NVDEC has no decoder for ffv1"):
        nvdec_decoder(stream("ffv1"))
    with pytest.raises(NvdecUnavailable, match="NVDEC does not decode yuv444p"):
        nvdec_decoder(stream("h264", "yuv444p"))
    with pytest.raises(NvdecUnavailable, match=r"NVDEC does not decode an odd size \(65x48\)"):
        nvdec_decoder(stream("h264", width=65))


@pytest.mark.parametrize(
    ("opener", "reason"),
    [
        (refusing, "NVDEC failed: InvalidDataError"),
        (drained, "NVDEC failed: EOFError"),
        (silent, "NVDEC failed: NVDEC gave no frame of the clips' stretch"),
    ],
)
def test_a_chunk_nvdec_opens_for_but_cannot_decode_is_decoded_on_the_cpu(
    media: Media, monkeypatch: pytest.MonkeyPatch, opener: Any, reason: str
) -> None:
    """NVDEC opened for the video, then refused its packets, gave up, or gave nothing:
    the CPU decodes the chunk's clips, every one is made, and the parts say why."""
    from conveyor.media import decode

    monkeypatch.setattr(decode, "NVDEC_POOL", decode.DecoderPool(opener))
    source = noise_video(media, ".mp4")
    task = media.task(source.path, media.metadata(source.path), SPANS)
    stage = ClipTranscoder(encoder="libx264", preset="ultrafast")
    stage.setup(WorkerInfo("w", "ClipTranscoder", "n", gpu_ids=(0,)))
    parts = list(stage.process(task))
    assert_parts(parts, task)
    for part in parts:
        assert part.data.decoder == "cpu"
        assert (part.data.decoder_fallback or "").startswith(reason)
    for clip in task.data.clips:
        assert_good_clip(clip, (160, 120))


def test_nvdec_decodes_where_it_works(media: Media) -> None:
    from conveyor.media.decode import nvdec_works

    if not nvdec_works():
        pytest.skip("no NVDEC here (it needs an NVIDIA GPU and its driver)")
    source = noise_video(media, ".mp4")
    task = media.task(source.path, media.metadata(source.path), SPANS)
    stage = ClipTranscoder(encoder="libx264", preset="ultrafast", decoder="nvdec")
    stage.setup(WorkerInfo("w", "ClipTranscoder", "n", gpu_ids=(0,)))
    parts = list(stage.process(task))
    assert all(p.data.decoder == "nvdec" and p.data.decoder_fallback is None for p in parts)
    for clip in task.data.clips:
        assert_good_clip(clip, (160, 120))


def test_an_encoder_that_cannot_open_is_the_encoders_failure_not_the_sources(
    media: Media, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NVENC asked for and refused (here: no driver, as when out of sessions): an
    ``EncodeError`` the engine retries, never a clip failed as if its source were bad; with
    ``encoder="auto"`` libx264 takes over and every clip is made."""
    if transcode.nvenc_works():
        pytest.skip("NVENC opens here: the refusal cannot be seen")
    monkeypatch.setattr(transcode, "nvenc_works", lambda: True)  # it passed at setup
    source = noise_video(media, ".mp4")
    gpu = WorkerInfo("w", "ClipTranscoder", "n", gpu_ids=(0,))
    task = media.task(source.path, media.metadata(source.path), SPANS)
    asked = ClipTranscoder(encoder="h264_nvenc", decoder="cpu")
    asked.setup(gpu)
    with pytest.raises(transcode.EncodeError, match=r"^encoding with h264_nvenc failed: "):
        list(asked.process(task))
    assert not any(clip.errors for clip in task.data.clips)

    task = media.task(source.path, media.metadata(source.path), SPANS)
    auto = ClipTranscoder(preset="ultrafast", decoder="cpu")
    auto.setup(gpu)
    assert auto._codec == "h264_nvenc"
    with caplog.at_level(logging.WARNING):
        parts = list(auto.process(task))
    assert "h264_nvenc failed" in caplog.text and "libx264 from now on" in caplog.text
    assert auto._codec == "libx264"
    assert_parts(parts, task)
    for clip in task.data.clips:
        assert_good_clip(clip, (160, 120))


def test_nvenc_refusing_half_way_sends_the_clips_left_to_libx264_and_nvdec_keeps_decoding(
    media: Media, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunk's first clip is encoded, then NVENC refuses the next: the clips sent stay
    sent, the rest are encoded with libx264 from a new decode, and the records blame
    neither the source nor NVDEC (a CPU decoder stands in for NVDEC, an encoder refusing
    its second clip for NVENC)."""
    from conveyor.media import decode

    from .decoders import software

    opened: list[str] = []

    class Refusing(transcode._ClipEncoder):
        def __init__(self, codec: str, options: dict[str, str], *args: Any) -> None:
            opened.append(codec)
            if codec == "h264_nvenc":
                codec, options = "libx264", {"preset": "ultrafast"}
            super().__init__(codec, options, *args)
            self.refuse = opened.count("h264_nvenc") > 1 and opened[-1] == "h264_nvenc"

        def add(self, frame: Any, t: float) -> None:
            if self.refuse:
                with self._encoding():
                    raise av.error.OSError(5, "out of encoder sessions")
            super().add(frame, t)

    monkeypatch.setattr(transcode, "_ClipEncoder", Refusing)
    monkeypatch.setattr(transcode, "nvenc_works", lambda: True)
    monkeypatch.setattr(decode, "NVDEC_POOL", decode.DecoderPool(software))
    source = noise_video(media, ".mp4")
    spans = [(0, 12), (12, 24), (24, 36)]  # apart: the first is sent before the second opens
    task = media.task(source.path, media.metadata(source.path), spans)
    stage = ClipTranscoder(preset="ultrafast")
    stage.setup(WorkerInfo("w", "ClipTranscoder", "n", gpu_ids=(0,)))
    parts = list(stage.process(task))
    assert opened == ["h264_nvenc", "h264_nvenc", "libx264", "libx264"]
    assert [p.data.part for p in parts] == [0, 1, 2]
    assert_parts(parts, task)
    for part in parts:
        assert part.data.decoder == "nvdec" and part.data.decoder_fallback is None
    for clip in task.data.clips:
        assert_good_clip(clip, (160, 120))


def test_nvdecs_nv12_goes_to_the_encoder_as_it_is_and_gives_the_same_clips(
    media: Media, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames in NV12 (NVDEC's) are encoded without a conversion to yuv420p, into clips the
    same bit for bit as from the CPU's decode; a clip scaled down is converted to NV12 as
    it is scaled (a CPU decoder giving NV12 stands in for NVDEC)."""
    from conveyor.media import decode

    from .decoders import nv12

    inputs: list[str] = []

    class Spy(transcode._ClipEncoder):
        def finish(self) -> bytes:
            inputs.append(self.input_format)
            return super().finish()

    monkeypatch.setattr(transcode, "_ClipEncoder", Spy)
    source = noise_video(media, ".mp4")
    gpu = WorkerInfo("w", "ClipTranscoder", "n", gpu_ids=(0,))
    clips: dict[str, list[bytes | None]] = {}
    for decoder, max_height in (("cpu", None), ("nvdec", None), ("nvdec", 60)):
        monkeypatch.setattr(decode, "NVDEC_POOL", decode.DecoderPool(nv12))
        task = media.task(source.path, media.metadata(source.path), SPANS)
        stage = ClipTranscoder(
            encoder="libx264", preset="ultrafast", decoder=decoder, max_height=max_height
        )
        stage.setup(gpu)
        parts = list(stage.process(task))
        assert {p.data.decoder for p in parts} == {decoder}
        for clip in task.data.clips:
            assert_good_clip(clip, (80, 60) if max_height else (160, 120))
        clips[f"{decoder}-{max_height}"] = [clip.encoded for clip in task.data.clips]
    assert inputs == ["yuv420p"] * 3 + ["nv12"] * 6
    assert clips["nvdec-None"] == clips["cpu-None"]


# -- transcoding ----------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", sorted(CONTAINERS))
def test_clips_of_every_container_are_h264_with_the_right_frames(media: Media, suffix: str) -> None:
    source = noise_video(media, suffix)
    clips = transcoded(media, source.path, SPANS)
    frames_of_source = source_frames(source.path)
    for clip in clips:
        frames = assert_good_clip(clip, (160, 120))
        assert_aligned(frames, frames_of_source, clip.frame_span[0])
        assert clip.encoded is not None and clip.encoded[4:8] == b"ftyp"
        assert clip.encoded.find(b"moov") < clip.encoded.find(b"mdat")  # the index first


@pytest.mark.parametrize(
    ("suffix", "codec", "pix_fmt"),
    [(".avi", "mjpeg", "yuvj420p"), (".mov", "prores_ks", "yuv422p10le")],
)
def test_a_clip_of_an_intra_only_source_gets_the_encoders_own_frame_types(
    media: Media, suffix: str, codec: str, pix_fmt: str
) -> None:
    # MJPEG, ProRes, FFV1... mark every decoded frame intra; passed on, x264 made each one
    # a key frame: clips many times larger, and no motion vectors for the motion filter
    source = media.video(
        f"intra-{codec}{suffix}",
        [Segment("pan", 3.0, 3)],
        codec=codec,
        pix_fmt=pix_fmt,
        width=160,
        height=120,
        fps=12,
    )
    (clip,) = transcoded(media, source.path, [(0, 36)])
    assert_good_clip(clip, (160, 120))
    assert clip.encoded is not None
    with av.open(io.BytesIO(clip.encoded)) as container:
        stream = container.streams.video[0]
        keys = [frame.key_frame for frame in container.decode(stream)]
    assert keys[0] and sum(keys) == 1
    assert motion_scores(clip.encoded).frames == len(keys) - 1  # vectors in every later frame


def test_one_decoding_pass_per_chunk(media: Media, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float, float]] = []
    original = transcode.decode_range

    def counting(path: str, meta: Any, start: float, end: float, **kw: Any) -> Any:
        calls.append((start, end))
        return original(path, meta, start, end, **kw)

    monkeypatch.setattr(transcode, "decode_range", counting)
    source = noise_video(media, ".mp4")
    clips = transcoded(media, source.path, [(24, 40), (18, 30), (40, 48)])
    assert calls == [(1.5, 4.0)]
    assert all(clip.num_frames == clip.frame_span[1] - clip.frame_span[0] for clip in clips)


def test_damage_fails_only_the_clips_it_is_in(media: Media, tmp_path: Path) -> None:
    from .test_probe import damage_packets

    source = noise_video(media, ".mp4")  # 48 frames, a key frame every 24
    damaged = tmp_path / "damaged.mp4"
    damage_packets(source.path, damaged, slice(2, 22))  # most of the first 2 s
    first, second = transcoded(media, damaged, [(0, 20), (26, 46)])  # one chunk
    assert "Invalid data" in first.errors["ClipTranscoder"]
    assert not second.errors
    assert_aligned(assert_good_clip(second, (160, 120)), source_frames(source.path), 26)


def test_a_clip_cut_past_a_few_damaged_packets_is_made_and_they_are_counted(
    media: Media, tmp_path: Path
) -> None:
    from .test_probe import damage_packets

    source = noise_video(media, ".mp4")
    damaged = tmp_path / "damaged.mp4"
    skipped = damage_packets(source.path, damaged, slice(30, 34, 2))  # two in the second clip
    task = media.task(damaged, media.metadata(source.path), [(0, 20), (26, 46)])
    stage = media.ready(ClipTranscoder(encoder="libx264", preset="ultrafast"))
    parts = list(stage.process(task))
    first, second = task.data.clips
    assert not first.errors and not second.errors
    assert first.num_frames == 20 and second.num_frames < 20  # the skipped frames are missing
    # each part carries what was skipped while it was cut: the chunk's count, once
    assert [p.data.damaged_packets for p in parts] == [0, 2] == [0, len(skipped)]
    clean = media.task(source.path, media.metadata(source.path), [(0, 20)])
    (part,) = stage.process(clean)
    assert part.data.damaged_packets == 0


def test_an_odd_sized_source_gives_even_dimensions(media: Media) -> None:
    source = media.video("odd.webm", [Segment("pan", 1.0, 1)], width=321, height=241, fps=12)
    assert (media.metadata(source.path).width, media.metadata(source.path).height) == (321, 241)
    (clip,) = transcoded(media, source.path, [(2, 10)])
    assert_good_clip(clip, (320, 240))


def test_a_10_bit_source_becomes_8_bit(media: Media) -> None:
    try:
        source = noise_video(media, ".mp4", pix_fmt="yuv420p10le")
    except av.FFmpegError:
        pytest.skip("this libx264 cannot encode 10-bit")
    assert media.metadata(source.path).pixel_format == "yuv420p10le"
    clips = transcoded(media, source.path, SPANS[:2])
    frames_of_source = source_frames(source.path)
    for clip in clips:
        frames = assert_good_clip(clip, (160, 120))
        assert_aligned(frames, frames_of_source, clip.frame_span[0])


def test_a_source_with_audio_gives_video_only_clips(media: Media) -> None:
    source = noise_video(media, ".mkv", audio=True)
    assert media.metadata(source.path).audio_codec == "aac"
    frames_of_source = source_frames(source.path)
    for clip in transcoded(media, source.path, SPANS):
        assert_aligned(assert_good_clip(clip, (160, 120)), frames_of_source, clip.frame_span[0])


def test_a_portrait_source_stays_portrait_and_scales_to_max_height(media: Media) -> None:
    source = noise_video(media, ".mov", width=120, height=160)
    (clip,) = transcoded(media, source.path, [(6, 20)])
    assert_aligned(assert_good_clip(clip, (120, 160)), source_frames(source.path), 6)
    (small,) = transcoded(media, source.path, [(6, 20)], max_height=80)
    frames = assert_good_clip(small, (60, 80))
    assert_aligned(frames, source_frames(source.path, (60, 80)), 6)


def test_a_clip_with_no_frames_fails_alone(media: Media) -> None:
    source = noise_video(media, ".mp4")
    good, beyond = transcoded(media, source.path, [(30, 40), (50, 60)])
    assert_good_clip(good, (160, 120))
    assert beyond.encoded is None and not beyond.made
    assert beyond.filtered_by == "error"
    assert "the source has no frame in 4.17-5.00 s" in beyond.errors["ClipTranscoder"]


def test_a_clip_in_a_hole_in_the_timestamps_says_so(media: Media, tmp_path: Path) -> None:
    # a camera recording on motion only: 2 s of frames, none for 2 s, 2 s more. A clip in
    # the hole was reported as frames that "could not be decoded", though nothing is damaged
    path = tmp_path / "hole.mkv"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        for i in [*range(24), *range(48, 72)]:
            picture = np.full((120, 160, 3), (i * 5) % 255, np.uint8)
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 12)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    before, hole, after = transcoded(media, path, [(0, 24), (30, 42), (48, 72)])
    assert before.num_frames == 24 and after.num_frames == 24
    assert hole.errors["ClipTranscoder"] == (
        "the source has no frame in 2.50-3.50 s (its timestamps skip it)"
    )


def test_only_active_clips_are_transcoded(media: Media) -> None:
    source = noise_video(media, ".mp4")
    task = media.task(source.path, media.metadata(source.path), [(0, 12), (12, 24), (24, 36)])
    filtered, failed, active = task.data.clips
    filtered.reject("motion")
    failed.fail("Earlier", "bad")
    list(media.ready(ClipTranscoder(encoder="libx264", preset="ultrafast")).process(task))
    assert filtered.encoded is None and failed.encoded is None
    assert failed.errors == {"Earlier": "bad"}
    assert_good_clip(active, (160, 120))


def test_a_failed_video_passes_through(media: Media) -> None:
    source = noise_video(media, ".mp4")
    task = media.task(source.path, media.metadata(source.path), [])
    task.data.fail("VideoProbe", "bad")
    assert list(ClipTranscoder().process(task)) == [task]  # whole, as it came
    assert isinstance(task, VideoTask) and task.data.errors == {"VideoProbe": "bad"}


def test_an_unreadable_source_fails_the_chunks_clips(media: Media, tmp_path: Path) -> None:
    source = noise_video(media, ".mp4")
    meta = media.metadata(source.path)
    broken = tmp_path / "gone.mp4"
    broken.write_bytes(b"no longer a video")
    task = media.task(broken, meta, [(0, 12), (12, 24)])
    list(media.ready(ClipTranscoder(encoder="libx264")).process(task))
    assert not task.data.failed
    for clip in task.data.clips:
        assert clip.encoded is None and "ClipTranscoder" in clip.errors


def shaped_source(
    path: Path,
    rotation: int = 0,
    sample_aspect: tuple[int, int] | None = None,
    max_height: int | None = None,
) -> VideoTask:
    """3 s of 96x64 pixels with a display rotation or a pixel shape, as one fixed-stride
    chunk transcoded to a clip, with frames at 1 per second taken in the same pass (and the
    same as a frame extractor takes from the encoded clip)."""
    from fractions import Fraction

    from conveyor.media.decode import probe
    from conveyor.stages.video.frames import ClipFrameExtractor
    from conveyor.stages.video.split import FixedStrideSplitter
    from conveyor.tasks.video import Video

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        if rotation:
            stream.set_display_rotation(rotation)
        if sample_aspect:
            stream.codec_context.sample_aspect_ratio = Fraction(*sample_aspect)
        for i in range(36):
            image = np.zeros((64, 96, 3), np.uint8)
            image[:, : 10 + i] = 200
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 12)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    meta = probe(str(path))
    (chunk,) = FixedStrideSplitter(clip_len_s=3).process_video(Video(str(path), path.name, meta))
    task = VideoTask(data=chunk)
    transcoder = ClipTranscoder(encoder="libx264", frame_rates=[1.0], max_height=max_height)
    list(transcoder.process(task))
    if max_height is not None:
        return task
    extracted = copy.deepcopy(task)
    extracted.data.clips[0].frames.clear()
    extractor = ClipFrameExtractor(rates=[1.0])
    extractor.setup(WorkerInfo("w", "ClipFrameExtractor", "n"))
    extractor.process(extracted)
    ours, theirs = task.data.clips[0].frames[1.0], extracted.data.clips[0].frames[1.0]
    assert ours.shape == theirs.shape
    assert np.abs(ours.astype(np.int16) - theirs).mean() < 4  # the source's, not the clip's
    return task


def test_a_rotated_source_keeps_its_rotation_and_models_see_it_upright(tmp_path: Path) -> None:
    task = shaped_source(tmp_path / "phone.mp4", rotation=90)  # landscape pixels, portrait
    assert task.data.metadata is not None and task.data.metadata.rotation == 90
    (clip,) = task.data.clips
    with av.open(io.BytesIO(clip.encoded)) as container:  # type: ignore[arg-type]
        assert next(container.decode(video=0)).rotation == 90
    assert clip.frames[1.0].shape[1:3] == (96, 64)  # portrait, as shown
    meta = clip_meta(clip, task.data, None)
    assert (meta["width"], meta["height"], meta["display_width"], meta["display_height"]) == (
        96,
        64,
        64,
        96,
    )
    # --max-height limits the height it is shown at: its stored width
    (small,) = shaped_source(tmp_path / "small.mp4", rotation=90, max_height=48).data.clips
    assert (small.width, small.height) == (48, 32)


def test_an_anamorphic_source_keeps_its_pixel_shape_and_models_see_it_wide(
    tmp_path: Path,
) -> None:
    task = shaped_source(tmp_path / "dvd.mkv", sample_aspect=(2, 1))  # shown 192 x 64
    meta = task.data.metadata
    assert meta is not None and meta.sample_aspect == (2, 1)
    assert meta.as_dict()["sample_aspect"] == "2:1"
    (clip,) = task.data.clips
    assert (clip.width, clip.height) == (96, 64)  # the pixels as stored
    with av.open(io.BytesIO(clip.encoded)) as container:  # type: ignore[arg-type]
        assert container.streams.video[0].sample_aspect_ratio == 2
    assert clip.frames[1.0].shape[1:3] == (64, 192)  # as a player shows it
    meta = clip_meta(clip, task.data, None)
    assert (meta["display_width"], meta["display_height"]) == (192, 64)


def write_stamped(path: Path, stamps: list[int], step: int) -> None:
    """96x64 H.264 whose ``i``-th frame, grey ``i * step``, is shown at ``stamps[i]`` ms."""
    from fractions import Fraction

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        for i, ms in enumerate(stamps):
            image = np.full((64, 96, 3), (i * step) % 250, np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = ms, Fraction(1, 1000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def one_clip(path: Path, clip_len_s: float, **options: Any) -> Clip:
    """The first clip of ``path`` cut every ``clip_len_s`` seconds, transcoded by libx264
    with ``options``."""
    from conveyor.media.decode import probe
    from conveyor.stages.video.split import FixedStrideSplitter
    from conveyor.tasks.video import Video

    meta = probe(str(path))
    chunk = next(
        iter(FixedStrideSplitter(clip_len_s=clip_len_s).process_video(Video(str(path), "v", meta)))
    )
    task = VideoTask(data=chunk)
    list(ClipTranscoder(encoder="libx264", **options).process(task))
    return task.data.clips[0]


def test_a_variable_rate_source_keeps_its_timing(tmp_path: Path) -> None:
    """A screen recording's frames come when the screen changes: the clip shows each at
    the moment it had in the source, not evenly spaced at the average rate."""

    from conveyor.media.decode import probe
    from conveyor.stages.video.split import FixedStrideSplitter
    from conveyor.tasks.video import Video

    path = tmp_path / "screen.mp4"
    gaps = [33, 33, 50, 400, 16, 100] * 8  # milliseconds
    stamps = [sum(gaps[:i]) for i in range(len(gaps))]
    write_stamped(path, stamps, step=5)
    meta = probe(str(path))
    (chunk,) = FixedStrideSplitter(clip_len_s=60).process_video(Video(str(path), "s.mp4", meta))
    task = VideoTask(data=chunk)
    list(ClipTranscoder(encoder="libx264").process(task))
    (clip,) = task.data.clips
    with av.open(io.BytesIO(clip.encoded)) as container:  # type: ignore[arg-type]
        times = [float(f.time) for f in container.decode(video=0)]
    assert clip.num_frames == len(times) == len(stamps)
    assert times == pytest.approx([ms / 1000 for ms in stamps], abs=0.002)


def test_a_sparse_clip_gives_the_models_its_frames(tmp_path: Path) -> None:
    """A static screen recorded one frame every 2 s: a 10 s clip of it holds 5 frames, fewer
    than the nominal 30 fps puts before the first 2 fps pick (frame 7), and the models got
    none (every clip failed, and the video stayed incomplete, run after run)."""

    from conveyor.media.decode import probe
    from conveyor.stages.video.split import FixedStrideSplitter
    from conveyor.tasks.video import Video

    path = tmp_path / "screen.mp4"
    # typing at 30 fps, a still screen for 20 s, typing: it averages 20 fps, and the first
    # 2 fps pick of a clip of the still part (5 frames) would be its 6th frame
    stamps = [i * 33 for i in range(600)] + [20000 + k * 2000 for k in range(10)]
    stamps += [40000 + i * 33 for i in range(600)]
    write_stamped(path, stamps, step=20)
    meta = probe(str(path))
    clips = []
    for chunk in FixedStrideSplitter(clip_len_s=10).process_video(Video(str(path), "s", meta)):
        task = VideoTask(data=chunk)
        list(ClipTranscoder(encoder="libx264", frame_rates=[2.0]).process(task))
        clips += task.data.clips
    assert [c.num_frames for c in clips if c.num_frames < 8], [c.num_frames for c in clips]
    for clip in clips:
        assert len(clip.frames[2.0]) >= 1 and clip.frames[2.0].shape[1:] == (64, 96, 3)


def test_the_models_get_a_variable_rate_clip_s_frames_shown_at_their_times(
    tmp_path: Path,
) -> None:
    """2 s at 30 fps and then 3 s at 10 fps: by position the models got the first 1.1 s
    of each clip, its last frame repeated (moving clips were filtered as frozen)."""

    path = tmp_path / "phone.mp4"
    stamps = [round(i * 1000 / 30) for i in range(60)] + [2000 + i * 100 for i in range(30)]
    write_stamped(path, stamps, step=2)  # frame i is grey (2 i) % 250
    clip = one_clip(path, 60, frame_rates=[1.0])
    greys = [round(float(f.mean()) / 2) for f in clip.frames[1.0]]
    # the span is 4.9 s (its last frame's time): at 0.5, 1.5, 2.5, 3.5 s, frames 15, 45,
    # then 60 + 5 and 60 + 15 (x264 moves a grey a little)
    expected = [15, 45, 65, 75]
    assert len(greys) == len(expected) and all(
        abs(g - e) <= 1 for g, e in zip(greys, expected, strict=True)
    ), greys


@pytest.mark.parametrize(
    ("pix_fmt", "tags", "expected"),
    [
        ("yuvj420p", {}, ((0, 1), None)),  # full range made limited (it was read as such)
        ("yuv420p", {"colorspace": 1, "color_primaries": 1, "color_trc": 1}, ((1,), 1)),
    ],
)
def test_a_clip_says_its_source_s_colour_range_and_space(
    tmp_path: Path,
    pix_fmt: str,
    tags: dict[str, int],
    expected: tuple[tuple[int, ...], int | None],
) -> None:
    """Both were lost: a full-range source's clip was read with its contrast stretched, a
    BT.709 one's as BT.601. (Limited range is H.264's default: x264 may leave it unsaid.)"""
    from fractions import Fraction

    path = tmp_path / "source.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 96, 64, pix_fmt
        for name, value in {"color_range": 1, **tags}.items():
            if pix_fmt == "yuv420p" or name != "color_range":
                setattr(stream.codec_context, name, value)
        for i in range(24):
            frame = av.VideoFrame.from_ndarray(np.full((64, 96, 3), 10 * i, np.uint8), "rgb24")
            frame = frame.reformat(format=pix_fmt)
            frame.pts, frame.time_base = i, Fraction(1, 12)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    clip = one_clip(path, 2)
    with av.open(io.BytesIO(clip.encoded)) as container:  # type: ignore[arg-type]
        context = container.streams.video[0].codec_context
        colour_range, space = context.color_range, context.colorspace
    assert colour_range in expected[0]
    if expected[1] is not None:
        assert space == expected[1]
    # the levels as the source meant them: a full-range source's darkest grey (0) is the
    # clip's black (16), not a darker-than-black it was read as
    with av.open(io.BytesIO(clip.encoded)) as container:  # type: ignore[arg-type]
        first = next(container.decode(video=0))
    assert first.format.name == "yuv420p"
    assert int(first.to_ndarray()[:64].min()) >= 15


def test_scratch_clips_of_dead_workers_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys
    import time

    import psutil

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    pid = int(dead.stdout)  # exited: its pid is free (a recycled one would keep its file)
    left = tmp_path / f"conveyor-clip-{pid}-abc.mp4"
    mine = tmp_path / f"conveyor-clip-{os.getpid()}-def.mp4"
    other = tmp_path / "conveyor-clip-notapid.mp4"
    for path in (left, mine, other):
        path.write_bytes(b"partial")
    transcode.sweep_scratch(str(tmp_path))
    assert not left.exists() and mine.exists() and other.exists()
    # a leftover another user owns (a shared /tmp) is passed over, not a failed setup
    left.write_bytes(b"partial")
    unlink = Path.unlink

    def refused(self: Path, missing_ok: bool = False) -> None:
        if self == left:
            raise PermissionError(1, "Operation not permitted", str(self))
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refused)
    transcode.sweep_scratch(str(tmp_path))
    monkeypatch.setattr(Path, "unlink", unlink)
    # at a worker's teardown as well as at its setup: a run's end leaves none behind
    left.write_bytes(b"partial")
    monkeypatch.setattr(transcode, "scratch_dirs", lambda: [str(tmp_path)])
    transcode.ClipTranscoder().teardown()
    assert not left.exists() and mine.exists()
    # a worker whose host died first is a zombie until init reaps it: it writes no more
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        dead_writer = tmp_path / f"conveyor-clip-{zombie.pid}-ghi.mp4"
        dead_writer.write_bytes(b"partial")
        transcode.sweep_scratch(str(tmp_path))
        assert not dead_writer.exists() and mine.exists()
    finally:
        zombie.wait()


def test_the_encoder_takes_the_threads_its_batch_was_given(
    media: Media, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch sent while cores idle gets more threads (``max_threads``): x264 uses them."""
    given: list[int] = []

    class Counting(transcode._ClipEncoder):
        def __init__(self, *args: Any) -> None:
            given.append(args[4])
            super().__init__(*args)

    monkeypatch.setattr(transcode, "_ClipEncoder", Counting)
    video = noise_video(media, ".mp4")
    stage = media.ready(ClipTranscoder(encoder="libx264", preset="ultrafast"))
    assert stage.max_threads and stage.max_threads > 1
    for threads, expected in ((3, 3), (None, 1)):
        stage._threads = threads
        task = media.task(video.path, media.metadata(video.path), SPANS[:1])
        list(stage.process(task))
        assert given[-1] == expected
        assert_good_clip(task.data.clips[0], (160, 120))


@pytest.mark.parametrize(("name", "fmt", "codec"), INTERLACED_SOURCES)
def test_an_interlaced_source_becomes_whole_frames(
    media: Media, tmp_path: Path, name: str, fmt: str, codec: str
) -> None:
    """A clip is progressive H.264: an interlaced source's fields are woven back into whole
    frames (bwdif), at the source's rate and frame count, instead of comb teeth on all that
    moves. ``deinterlace=False`` keeps the fields as they were."""
    path = write_interlaced(tmp_path / name, fmt, codec)
    source = [combing(f.to_ndarray(format="gray")) for f in av.open(str(path)).decode(video=0)]
    assert min(source) > 5  # the source is combed
    (clip,) = transcoded(media, path, [(10, 35)])
    (kept,) = transcoded(media, path, [(10, 35)], deinterlace=False)
    for encoded, low, high in ((clip.encoded, -1.0, 1.0), (kept.encoded, 5.0, 99.0)):
        assert encoded is not None
        with av.open(io.BytesIO(encoded)) as container:
            frames = list(container.decode(video=0))
        assert len(frames) == 25 and not any(f.interlaced_frame for f in frames)
        teeth = [combing(f.to_ndarray(format="gray")) for f in frames]
        assert all(low <= t <= high for t in teeth), teeth


# -- one clip at a time, and all a clip's pixels give from one decode -------------------------
def test_each_clip_leaves_as_soon_as_it_is_encoded(media: Media) -> None:
    source = noise_video(media, ".mp4")
    task = media.task(source.path, media.metadata(source.path), [(0, 12), (12, 24), (36, 48)])
    stage = media.ready(ClipTranscoder(encoder="libx264", preset="ultrafast"))
    parts = stage.process(task)
    first = next(parts)
    assert first.data.clips == [task.data.clips[0]]
    assert (first.data.part, first.data.parts) == (0, 3)
    assert first.data.clips[0].encoded is not None
    assert [c.encoded for c in task.data.clips[1:]] == [None, None]  # not cut yet
    rest = list(parts)
    assert_parts([first, *rest], task)
    assert all(clip.encoded for clip in task.data.clips)


def test_clips_already_out_go_first_and_every_attempt_sends_the_same_parts(
    media: Media,
) -> None:
    source = noise_video(media, ".mp4")
    spans = [(30, 42), (0, 12), (12, 24), (18, 30)]  # overlapping, out of order

    def attempt() -> list[tuple[int, str, str | None]]:
        task = media.task(source.path, media.metadata(source.path), spans, chunk_index=3)
        task.data.clips[2].reject("earlier")
        task.data.transitions = [(5, 4)]
        stage = media.ready(ClipTranscoder(encoder="libx264", preset="ultrafast"))
        parts = list(stage.process(task))
        assert_parts(parts, task)
        # what the chunk says once rides on part 0 only
        assert [p.data.transitions for p in parts if p.data.part == 0] == [[(5, 4)]]
        assert all(p.data.transitions == [] for p in parts if p.data.part != 0)
        return [(p.data.part, p.data.clips[0].clip_id, p.data.clips[0].filtered_by) for p in parts]

    sent = attempt()
    assert sent[0][0] == 2 and sent[0][2] == "earlier"  # filtered before: sent at once
    assert [part for part, _, _ in sent[1:]] == [1, 3, 0]  # as they close: by their ends
    assert attempt() == sent


def test_a_chunk_without_clips_goes_on_whole(media: Media) -> None:
    source = noise_video(media, ".mp4")
    task = media.task(source.path, media.metadata(source.path), [], last_chunk=True)
    assert list(ClipTranscoder().process(task)) == [task]
    assert (task.data.part, task.data.parts) == (0, 1)


def test_an_unreadable_source_sends_every_clip_failed(media: Media, tmp_path: Path) -> None:
    source = noise_video(media, ".mp4")
    broken = tmp_path / "gone.mp4"
    broken.write_bytes(b"no longer a video")
    task = media.task(broken, media.metadata(source.path), [(0, 12), (12, 24)])
    parts = list(media.ready(ClipTranscoder(encoder="libx264")).process(task))
    assert_parts(parts, task)
    assert all("ClipTranscoder" in p.data.clips[0].errors for p in parts)


def test_the_models_frames_come_from_the_decode_the_clips_are_cut_from(
    transcoded_standard: tuple[SyntheticVideo, VideoTask], media: Media
) -> None:
    """The frames the extractor took from each encoded clip, taken from the source as it is
    cut: same rates, indices, sizes; pixels the source's (the clip's, less its coding loss)."""
    from conveyor.stages.video.frames import ClipFrameExtractor

    source, encoded = transcoded_standard
    spans = [c.frame_span for c in encoded.data.clips]
    for max_height, short_side in ((None, 64), (80, 48), (None, 224)):
        task = media.task(source.path, media.metadata(source.path), spans)
        stage = ClipTranscoder(
            encoder="libx264",
            preset="ultrafast",
            frame_rates=[1.0, 4.0, 2.0],
            short_side=short_side,
            max_height=max_height,
        )
        list(media.ready(stage).process(task))
        extracted = copy.deepcopy(task)
        for clip in extracted.data.clips:
            clip.frames.clear()
        ClipFrameExtractor(rates=[1.0, 2.0, 4.0], short_side=short_side).process(extracted)
        for ours, theirs in zip(task.data.clips, extracted.data.clips, strict=True):
            assert sorted(ours.frames) == [1.0, 2.0, 4.0]
            for rate in (1.0, 2.0, 4.0):
                a, b = ours.frames[rate], theirs.frames[rate]
                assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
                assert np.abs(a.astype(np.int16) - b).mean() < 4


def test_the_source_motion_is_read_in_the_same_decode(media: Media) -> None:
    from conveyor.stages.video.motion import MotionFilter

    source = media.video(
        "moving-then-still.mp4",
        [Segment("pan", 2.0, 1), Segment("shapes", 2.0, 2), Segment("bars", 2.0, 3, static=True)],
        width=320,
        height=192,
        fps=12,
    )
    task = media.task(source.path, media.metadata(source.path), [(0, 24), (24, 48), (48, 72)])
    stage = ClipTranscoder(encoder="libx264", preset="ultrafast", motion_patch=256)
    list(media.ready(stage).process(task))
    pan, shapes, still = task.data.clips
    for clip in (pan, shapes, still):
        assert clip.motion is not None and clip.motion.source == "source"
        assert clip.motion.patch == 256 and clip.motion.frames > 0
    assert pan.motion.global_mean > 1e-3 and shapes.motion.global_mean > 1e-4  # type: ignore[union-attr]
    assert still.motion.global_mean < 1e-6  # type: ignore[union-attr]
    MotionFilter().process(task)
    assert pan.kept and shapes.kept and still.filtered_by == "motion"
    assert not task.data.failed


@pytest.mark.parametrize(
    ("suffix", "codec", "pix_fmt"),
    [(".webm", "libvpx-vp9", "yuv420p"), (".avi", "mjpeg", "yuvj420p")],
)
def test_a_source_without_vectors_leaves_the_clips_to_be_scored_from_their_own(
    media: Media, suffix: str, codec: str, pix_fmt: str
) -> None:
    """VP9's and MJPEG's decoders export no motion vectors: the transcoder leaves no scores,
    and the motion filter decodes the encoded clip instead (never keeping a still clip for
    want of vectors), saying so in the scores it leaves."""
    from conveyor.stages.video.motion import MotionFilter

    source = media.video(
        f"novectors-{codec}{suffix}",
        [Segment("pan", 2.0, 1), Segment("bars", 2.0, 3, static=True)],
        codec=codec,
        pix_fmt=pix_fmt,
        width=160,
        height=96,
        fps=12,
    )
    task = media.task(source.path, media.metadata(source.path), [(0, 24), (24, 48)])
    stage = ClipTranscoder(encoder="libx264", motion_patch=256)  # the pipeline's preset
    list(media.ready(stage).process(task))
    assert [clip.motion for clip in task.data.clips] == [None, None]
    MotionFilter().process(task)
    moving, still = task.data.clips
    assert moving.kept and still.filtered_by == "motion"
    assert [c.motion.source for c in (moving, still)] == ["clip", "clip"]  # type: ignore[union-attr]


def test_the_transcoders_new_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="frame_rates"):
        ClipTranscoder(frame_rates=[1.0, 0.0])
    with pytest.raises(ValueError, match="short_side"):
        ClipTranscoder(short_side=8)
    with pytest.raises(ValueError, match="motion_patch"):
        ClipTranscoder(motion_patch=8)
    assert ClipTranscoder(frame_rates=[2, 1.0, 2.0]).frame_rates == (1.0, 2.0)
