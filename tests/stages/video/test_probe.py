"""Probing (metadata, and clear reasons for every kind of bad file) and decoding a range."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from conveyor.media import decode
from conveyor.media.decode import Damage, decode_range, probe
from conveyor.media.errors import InputError
from conveyor.samples.video import BAD_KINDS, CONTAINERS, Segment, SyntheticVideo, write_bad_file

from .conftest import INTERLACED_SOURCES, Media, write_interlaced

#: what each broken kind's reason must say
TELLING = {
    "empty": "empty",
    "truncated": "truncated",
    "not_video": "not a video",
    "random_bytes": "not a video",
    "audio_only": "no video stream",
    "undecodable": "cannot decode",
}

CODECS = {".mp4": "h264", ".mkv": "h264", ".mov": "h264", ".webm": "vp9", ".avi": "mpeg4"}


def long_video(media: Media, suffix: str) -> SyntheticVideo:
    """6 s at 160x120, 12 fps (72 frames), a key frame every 2 s."""
    return media.video(
        f"long{suffix}",
        [Segment("pan", 3.0, 1), Segment("shapes", 3.0, 2)],
        width=160,
        height=120,
        fps=12,
    )


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    return {kind: write_bad_file(folder / f"{kind}.mp4", kind) for kind in BAD_KINDS}


def cut(source: Path, target: Path, fraction: float) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * fraction)])
    return target


# -- probing ------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", sorted(CONTAINERS))
def test_probe_reads_every_container(media: Media, suffix: str) -> None:
    video = long_video(media, suffix)
    meta = probe(str(video.path))
    assert meta.codec == CODECS[suffix]
    assert (meta.width, meta.height) == (160, 120)
    assert meta.fps == pytest.approx(12)
    assert meta.duration_s == pytest.approx(6.0, abs=0.1)
    assert meta.num_frames == 72
    assert meta.pixel_format == "yuv420p"
    assert meta.audio_codec is None
    assert meta.size_bytes == video.path.stat().st_size
    assert meta.start_time_s == pytest.approx(0.0)
    assert meta.rotation == 0
    assert meta.container


def test_probe_reports_the_audio_codec_and_a_10_bit_pixel_format(media: Media) -> None:
    with_audio = media.video(
        "audio.mp4", [Segment("pan", 1.0, 1)], width=160, height=120, fps=12, audio=True
    )
    assert probe(str(with_audio.path)).audio_codec == "aac"
    try:
        deep = media.video(
            "deep.mp4",
            [Segment("pan", 1.0, 1)],
            width=160,
            height=120,
            fps=12,
            pix_fmt="yuv420p10le",
        )
    except av.FFmpegError:
        pytest.skip("this libx264 cannot encode 10-bit")
    assert probe(str(deep.path)).pixel_format == "yuv420p10le"


def test_probe_without_verify_skips_decoding(media: Media, tmp_path: Path) -> None:
    truncated = cut(long_video(media, ".mkv").path, tmp_path / "cut.mkv", 0.6)
    meta = probe(str(truncated), verify=False)  # the header still says 6 s
    assert meta.duration_s == pytest.approx(6.0, abs=0.1)
    with pytest.raises(InputError, match="truncated"):
        probe(str(truncated))


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_every_bad_file_is_rejected_with_a_telling_reason(
    bad_files: dict[str, Path], kind: str
) -> None:
    with pytest.raises(InputError) as raised:
        probe(str(bad_files[kind]))
    assert TELLING[kind] in str(raised.value).lower()


@pytest.mark.parametrize("suffix", [".mkv", ".webm", ".avi"])
def test_a_cut_matroska_or_avi_file_is_reported_truncated(
    media: Media, tmp_path: Path, suffix: str
) -> None:
    truncated = cut(long_video(media, suffix).path, tmp_path / f"cut{suffix}", 0.6)
    with pytest.raises(InputError, match="truncated") as raised:
        probe(str(truncated))
    assert "6.00 s" in str(raised.value)


def test_a_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read the file"):
        probe(str(tmp_path / "nowhere.mp4"))


@pytest.mark.parametrize(
    "error",
    [PermissionError(13, "Permission denied"), OSError(5, "Input/output error")],
    ids=["permission", "io"],
)
def test_a_file_the_machine_cannot_read_is_not_a_bad_video(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError
) -> None:
    """Recorded as bad, it was never tried again once its permissions were fixed: now the
    probe fails as a stage does (the video incomplete, the next run tries it again)."""
    source = write_bad_file(tmp_path / "v.mp4", "random_bytes")

    def refuse(path: str) -> int:
        raise error

    monkeypatch.setattr(decode, "file_size", refuse)
    with pytest.raises(OSError, match=r"cannot read the file \(.*\): '.*v.mp4'") as raised:
        probe(str(source))
    assert not isinstance(raised.value, InputError) and raised.value.errno == error.errno
    monkeypatch.setattr(decode, "file_size", os.path.getsize)  # then PyAV refuses to open it
    failed = av.error.PermissionError(13, "Permission denied", str(source))

    def refuse_open(source: str) -> None:
        raise failed

    monkeypatch.setattr(decode, "open_input", refuse_open)
    with pytest.raises(OSError, match="cannot read the file") as raised:
        probe(str(source))
    assert not isinstance(raised.value, InputError)


def test_a_broken_symbolic_link_names_its_missing_target(tmp_path: Path) -> None:
    link = tmp_path / "moved.mp4"
    link.symlink_to(tmp_path / "elsewhere" / "original.mp4")
    with pytest.raises(InputError, match=r"broken symbolic link \(to .*elsewhere/original.mp4"):
        probe(str(link))


def test_a_named_pipe_a_device_or_a_folder_is_refused_for_what_it_is(tmp_path: Path) -> None:
    # nothing is read: a pipe with no writer would block the probe, a device never ends
    pipe = tmp_path / "pipe.mp4"
    os.mkfifo(pipe)
    with pytest.raises(InputError, match="not a regular file but a named pipe"):
        probe(str(pipe))
    with pytest.raises(InputError, match="not a regular file but a character device"):
        probe("/dev/zero")
    folder = tmp_path / "folder.mp4"
    folder.mkdir()
    with pytest.raises(InputError, match="not a regular file but a directory"):
        probe(f"file://{folder}")


def test_probing_a_corrupt_file_prints_nothing(media: Media, tmp_path: Path) -> None:
    truncated = cut(long_video(media, ".mkv").path, tmp_path / "cut.mkv", 0.6)
    script = (
        "import sys\n"
        "from conveyor.media.errors import InputError\n"
        "from conveyor.media.decode import probe\n"
        "try:\n"
        "    probe(sys.argv[1])\n"
        "except InputError:\n"
        "    print('rejected')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(truncated)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "rejected"
    assert done.stderr == ""


# -- decoding a range --------------------------------------------------------------------
@pytest.fixture(scope="module")
def sequential(media: Media) -> dict[str, list[np.ndarray]]:
    """Every frame of each long video, decoded from the start."""
    frames = {}
    for suffix in CONTAINERS:
        with av.open(str(long_video(media, suffix).path)) as container:
            frames[suffix] = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return frames


class SeekCounter:
    """Wraps ``decode.open_video`` and counts the seeks made on what it opened."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, wrapper: type[_Counted] | None = None
    ) -> None:
        self.seeks = 0
        original = decode.open_video
        wrap = wrapper or _Counted

        def counting(path: str, threads: int = 1, vectors: bool = False) -> tuple[Any, Any]:
            container, stream = original(path, threads, vectors)
            return wrap(container, self), stream

        monkeypatch.setattr(decode, "open_video", counting)


class _Counted:
    def __init__(self, container: Any, counter: SeekCounter) -> None:
        self._container = container
        self._counter = counter

    def seek(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.seeks += 1
        return self._container.seek(*args, **kwargs)

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self._container.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._container, name)


@pytest.mark.parametrize("suffix", sorted(CONTAINERS))
@pytest.mark.parametrize(
    ("start", "end"),
    [(0.0, 1.0), (2.5, 3.5), (1.0, 2.0), (5.5, 7.0), (0.04, 0.5), (4.0, 4.0)],
)
def test_decode_range_gives_exactly_the_frames_of_the_range(
    media: Media,
    sequential: dict[str, list[np.ndarray]],
    monkeypatch: pytest.MonkeyPatch,
    suffix: str,
    start: float,
    end: float,
) -> None:
    path = str(long_video(media, suffix).path)
    meta = media.metadata(path)
    counter = SeekCounter(monkeypatch)
    got = list(decode_range(path, meta, start, end))
    indices = [round(t * meta.fps) for t, _ in got]
    expected = list(range(round(start * 12), min(round(end * 12), 72)))
    assert indices == expected
    for (t, frame), index in zip(got, indices, strict=True):
        assert t == pytest.approx(index / 12, abs=1e-3)
        assert np.array_equal(frame.to_ndarray(format="rgb24"), sequential[suffix][index])
    assert counter.seeks <= 1


def damage_packets(source: Path, target: Path, which: slice) -> list[int]:
    """Copy ``source`` with the NAL length prefix of the ``which`` video packets overwritten
    (the decoder refuses them); returns the damaged packets' indices."""
    data = bytearray(source.read_bytes())
    with av.open(str(source)) as container:
        positions = [p.pos for p in container.demux(video=0) if p.size and p.pos is not None]
    chosen = list(range(len(positions)))[which]
    for index in chosen:
        data[positions[index] : positions[index] + 4] = b"\xff\xff\xff\xff"
    target.write_bytes(bytes(data))
    return chosen


def test_a_few_damaged_packets_cost_a_few_frames_not_the_video(
    media: Media, sequential: dict[str, list[np.ndarray]], tmp_path: Path
) -> None:
    video = long_video(media, ".mp4")
    damaged = damage_packets(video.path, tmp_path / "damaged.mp4", slice(40, 46, 2))
    meta, damage = media.metadata(str(video.path)), Damage()
    got = list(decode_range(str(tmp_path / "damaged.mp4"), meta, 0, 6, damage=damage))
    assert damage.packets == len(damaged) == 3  # counted, for the video's record
    indices = [round(t * 12) for t, _ in got]
    assert len(got) >= 72 - 12 and indices == sorted(set(indices))
    for (_, frame), index in zip(got, indices, strict=True):
        if index < min(damaged) - 4:  # decoded before the damage: exactly as written
            assert np.array_equal(frame.to_ndarray(format="rgb24"), sequential[".mp4"][index])


def test_damage_near_the_end_does_not_make_a_file_look_truncated(
    media: Media, tmp_path: Path
) -> None:
    video = long_video(media, ".mp4")  # 72 packets; the last 3 s are read to check the end
    damage_packets(video.path, tmp_path / "damaged.mp4", slice(36, 42))
    meta = probe(str(tmp_path / "damaged.mp4"))
    assert meta.duration_s == pytest.approx(6.0, abs=0.1) and meta.num_frames == 72


def test_a_range_mostly_damaged_fails_with_the_decoders_reason(
    media: Media, tmp_path: Path
) -> None:
    video = long_video(media, ".mp4")
    damage_packets(video.path, tmp_path / "damaged.mp4", slice(2, None))
    with pytest.raises(av.InvalidDataError, match="Invalid data"):
        list(decode_range(str(tmp_path / "damaged.mp4"), media.metadata(str(video.path)), 0, 6))


def test_decode_range_past_the_end_gives_nothing(media: Media) -> None:
    path = str(long_video(media, ".mp4").path)
    assert list(decode_range(path, media.metadata(path), 7.0, 9.0)) == []


def test_decode_range_reads_again_from_further_back_when_a_seek_lands_late(
    media: Media, sequential: dict[str, list[np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container whose first seek lands after the start is read from 10 s earlier: here
    the start of the file, opened anew and read without a seek."""
    path = str(long_video(media, ".mkv").path)
    meta = media.metadata(path)

    class LateFirstSeek(_Counted):
        def seek(self, offset: int, *args: Any, **kwargs: Any) -> Any:
            self._counter.seeks += 1
            if self._counter.seeks == 1:  # land on the key frame at 4 s instead
                offset = round(4.0 / float(self._container.streams.video[0].time_base))
            return self._container.seek(offset, *args, **kwargs)

    counter = SeekCounter(monkeypatch, LateFirstSeek)
    got = list(decode_range(path, meta, 2.5, 3.0))
    assert [round(t * 12) for t, _ in got] == list(range(30, 36))
    assert np.array_equal(got[0][1].to_ndarray(format="rgb24"), sequential[".mkv"][30])
    assert counter.seeks == 1


# -- sources whose timestamps do not start at zero, and MPEG-TS ---------------------------
class _Unseekable(io.RawIOBase):
    """A file that can only be appended to, as a pipe or a live recording is: a muxer
    writing to it can never go back to fill in the length or an index."""

    def __init__(self, file: Any) -> None:
        self.file = file

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self.file.write(data)


def write_raw(
    path: Path,
    fmt: str,
    first_pts: int,
    seconds: float = 4.0,
    audio_s: float = 0.0,
    seekable: bool = True,
    gop: int = 24,
    codec: str = "libx264",
) -> list[np.ndarray]:
    """Noise at 160x120, 12 fps, a key frame every ``gop`` frames (2 s), timestamps from
    ``first_pts`` (as a stream cut out of a longer one keeps them), and ``audio_s`` of
    silence in AAC; returns the frames as decoded. ``seekable=False`` writes as into a
    pipe."""

    from conveyor.samples.video import render_frames

    rate = Fraction(12)
    with contextlib.ExitStack() as stack:
        target: Any = str(path)
        if not seekable:
            target = _Unseekable(stack.enter_context(path.open("wb")))
        container = stack.enter_context(av.open(target, "w", format=fmt))
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.options = {"preset": "ultrafast"} if codec == "libx264" else {"b": "2M"}
        stream.codec_context.gop_size = gop
        sound = container.add_stream("aac", rate=48000) if audio_s else None
        for i, image in enumerate(render_frames([Segment("noise", seconds, 7)], 160, 120, 12)):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = first_pts + i
            frame.time_base = 1 / rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            for start in range(0, int(audio_s * 48000), 1024):
                samples = av.AudioFrame.from_ndarray(
                    np.zeros((1, 1024), np.float32), format="fltp", layout="mono"
                )
                samples.sample_rate, samples.pts = 48000, start
                for packet in sound.encode(samples):
                    container.mux(packet)
            for packet in sound.encode():
                container.mux(packet)
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def test_an_mp4_starting_late_is_read_from_its_first_frame(tmp_path: Path) -> None:
    path = tmp_path / "late.mp4"
    frames = write_raw(path, "mp4", first_pts=30)
    meta = probe(str(path))
    assert meta.start_time_s == pytest.approx(2.5)
    assert meta.duration_s == pytest.approx(4.0, abs=0.1) and meta.num_frames == 48
    got = list(decode_range(str(path), meta, 2.5, 3.0))
    assert [round(t * 12) for t, _ in got] == list(range(30, 36))
    assert np.array_equal(got[0][1].to_ndarray(format="rgb24"), frames[30])


def test_an_mkv_starting_late_is_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "late.mkv"
    write_raw(path, "matroska", first_pts=30)
    meta = probe(str(path))
    assert meta.start_time_s == pytest.approx(2.5)
    assert meta.duration_s == pytest.approx(4.0, abs=0.1) and meta.num_frames == 48


@pytest.mark.parametrize("first_pts", [0, 30])
def test_a_recording_never_finalised_is_measured_by_reading_it(
    tmp_path: Path, first_pts: int
) -> None:
    """A Matroska file written as a stream (a crashed screen recording, a browser's
    MediaRecorder) says nothing of its length: its packets are read to find it."""
    path = tmp_path / "recording.mkv"
    frames = write_raw(path, "matroska", first_pts=first_pts, seconds=6.0, seekable=False)
    with av.open(str(path)) as container:  # the premise: no length anywhere
        assert container.duration is None and not container.streams.video[0].duration
    meta = probe(str(path))
    start = first_pts / 12
    assert meta.start_time_s == pytest.approx(start)
    assert meta.duration_s == pytest.approx(6.0, abs=0.01) and meta.num_frames == 72
    got = list(decode_range(str(path), meta, 2.5, 3.0))  # seconds from the first frame
    assert [round(t * 12) for t, _ in got] == list(range(30, 36))
    assert np.array_equal(got[0][1].to_ndarray(format="rgb24"), frames[30])


def test_a_bare_stream_or_an_image_is_rejected_for_what_it_is(tmp_path: Path) -> None:
    bare = tmp_path / "camera.mp4"  # Annex B H.264, no container, named as an MP4
    write_raw(bare, "h264", first_pts=0, seconds=2.0)
    with pytest.raises(InputError, match="bare h264 stream with no container"):
        probe(str(bare))
    image = tmp_path / "still.mov"
    with av.open(str(image), "w", format="image2pipe") as container:
        stream = container.add_stream("png", rate=1)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "rgb24"
        frame = av.VideoFrame.from_ndarray(np.zeros((24, 32, 3), np.uint8), format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    with pytest.raises(InputError, match="a png image, not a video"):
        probe(str(image))


def with_cover(path: Path, video: bool) -> Path:
    """An MP4 whose first stream is cover art (one MJPEG picture), then 2 s of 12 fps
    video (or, without ``video``, AAC silence, as a podcast has it)."""

    with av.open(str(path), "w", format="mp4") as container:
        cover = container.add_stream("mjpeg", rate=1)
        cover.width, cover.height, cover.pix_fmt = 64, 48, "yuvj420p"
        cover.disposition = av.stream.Disposition.attached_pic
        if video:
            stream = container.add_stream("libx264", rate=12)
            stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        else:
            stream = container.add_stream("aac", rate=48000)
        picture = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 90, np.uint8), format="rgb24")
        picture = picture.reformat(format="yuvj420p")
        picture.pts, picture.time_base = 0, Fraction(1, 1)
        container.mux([*cover.encode(picture), *cover.encode(None)][:1])
        for i in range(24 if video else 94):
            if video:
                image = np.full((120, 160, 3), 10 * i, np.uint8)
                frame: Any = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts, frame.time_base = i, Fraction(1, 12)
            else:
                frame = av.AudioFrame.from_ndarray(
                    np.zeros((1, 1024), np.float32), format="fltp", layout="mono"
                )
                frame.sample_rate, frame.pts = 48000, i * 1024
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    # FFmpeg stores the art in moov/udta, after the tracks; other writers put udta first,
    # and the art then comes out as stream 0: move it there (the boxes keep their sizes)
    data = path.read_bytes()
    at = 0
    while data[at + 4 : at + 8] != b"moov":
        at += int.from_bytes(data[at : at + 4], "big")
    end = at + int.from_bytes(data[at : at + 4], "big")
    boxes, inner = [], at + 8
    while inner < end:
        size = int.from_bytes(data[inner : inner + 4], "big")
        boxes.append(data[inner : inner + size])
        inner += size
    boxes.sort(key=lambda box: box[4:8] not in (b"mvhd", b"udta"))
    path.write_bytes(data[: at + 8] + b"".join(boxes) + data[end:])
    with av.open(str(path)) as container:
        assert container.streams[0].disposition & av.stream.Disposition.attached_pic
    return path


def test_cover_art_ahead_of_the_video_is_passed_over(tmp_path: Path) -> None:
    path = with_cover(tmp_path / "album.mp4", video=True)
    meta = probe(str(path))
    assert (meta.width, meta.height, meta.num_frames) == (160, 120, 24)
    got = list(decode_range(str(path), meta, 1.0, 1.5))
    assert [round(t * 12) for t, _ in got] == list(range(12, 18))
    assert got[0][1].width == 160


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_of_two_video_tracks_the_real_video_is_taken_not_a_thumbnail_ahead_of_it(
    tmp_path: Path, suffix: str
) -> None:
    # a one-frame 64x48 track first (marked default by the muxer, so FFmpeg's own pick took
    # it): the 2 s video behind it came out as a single frame, "too short for any clip"
    path = tmp_path / f"two{suffix}"
    with av.open(str(path), "w") as container:
        thumb = container.add_stream("libx264", rate=12)
        thumb.width, thumb.height, thumb.pix_fmt = 64, 48, "yuv420p"
        video = container.add_stream("libx264", rate=12)
        video.width, video.height, video.pix_fmt = 160, 120, "yuv420p"
        for stream, count in ((thumb, 1), (video, 24)):
            for i in range(count):
                picture = np.full((stream.height, stream.width, 3), 10 * i, np.uint8)
                frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
                frame.pts, frame.time_base = i, Fraction(1, 12)
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
    meta = probe(str(path))
    assert (meta.width, meta.height, meta.num_frames) == (160, 120, 24)
    got = list(decode_range(str(path), meta, 1.0, 1.5))
    assert [round(t * 12) for t, _ in got] == list(range(12, 18))
    assert got[0][1].width == 160


def test_a_video_track_without_frames_is_called_empty(tmp_path: Path) -> None:
    path = tmp_path / "silent.mkv"  # a recorder that wrote the sound and no picture
    with av.open(str(path), "w", format="matroska") as container:
        video = container.add_stream("libx264", rate=12)
        video.width, video.height, video.pix_fmt = 160, 120, "yuv420p"
        sound = container.add_stream("aac", rate=48000)
        for i in range(10):
            samples = av.AudioFrame.from_ndarray(
                np.zeros((1, 1024), np.float32), format="fltp", layout="mono"
            )
            samples.sample_rate, samples.pts = 48000, i * 1024
            container.mux(sound.encode(samples))
        container.mux(sound.encode(None))
    with pytest.raises(InputError, match=r"h264 video stream: it holds no frame \(no packet"):
        probe(str(path))


def test_audio_with_cover_art_has_no_video(tmp_path: Path) -> None:
    path = with_cover(tmp_path / "podcast.mp4", video=False)
    with pytest.raises(InputError, match=r"no video stream .*cover picture \(mjpeg\)"):
        probe(str(path))


def test_an_mpeg_ts_file_named_explicitly_is_probed(tmp_path: Path) -> None:
    path = tmp_path / "broadcast.ts"
    frames = write_raw(path, "mpegts", first_pts=0, seconds=6.0)
    meta = probe(str(path))
    assert meta.duration_s == pytest.approx(6.0, abs=0.1) and meta.num_frames == 72
    got = list(decode_range(str(path), meta, 2.5, 3.0))
    assert [round(t * 12) for t, _ in got] == list(range(30, 36))
    assert np.array_equal(got[0][1].to_ndarray(format="rgb24"), frames[30])


def test_a_stream_cut_mid_gop_lasts_from_its_first_frame(tmp_path: Path) -> None:
    """Its length counted from its first packet, frames it cannot decode included: the
    last clip's span and the summary's seconds were half a second too long."""
    whole = tmp_path / "whole.ts"
    write_raw(whole, "mpegts", first_pts=0, seconds=8.0, gop=60)
    data = whole.read_bytes()
    cut = tmp_path / "cut.ts"
    cut.write_bytes(data[(len(data) // 4) // 188 * 188 :])  # on a TS packet's boundary
    with av.open(str(cut)) as container:
        times = [float(f.time) for f in container.decode(video=0)]
    meta = probe(str(cut))
    assert meta.start_time_s == pytest.approx(times[0], abs=1e-3)
    assert meta.duration_s == pytest.approx(times[-1] + 1 / 12 - times[0], abs=0.1)


@pytest.mark.parametrize(
    ("name", "fmt", "codec"),
    [
        ("dvd.mpg", "mpeg", "mpeg2video"),  # MPEG program stream
        ("win.wmv", "asf", "wmv2"),
        ("web.flv", "flv", "flv"),
        ("studio.mxf", "mxf", "mpeg2video"),
        ("phone.m4v", "ipod", "libx264"),
        ("VTS_01_1.VOB", "vob", "mpeg2video"),  # a DVD's title
        ("open.ogv", "ogv", "libvpx"),
        ("tape.dv", "dv", "dvvideo"),  # DV is 720 x 576 (PAL) or 720 x 480
        ("flash.f4v", "f4v", "libx264"),
        ("old.asf", "asf", "wmv2"),
        ("mobile.3g2", "3g2", "libx264"),
    ],
)
def test_older_and_device_containers_are_read(
    tmp_path: Path, name: str, fmt: str, codec: str
) -> None:
    path = tmp_path / name
    width, height = (720, 576) if fmt == "dv" else (160, 120)
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(100):
            image = np.full((height, width, 3), i * 2, np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    meta = probe(str(path))
    assert meta.duration_s == pytest.approx(4.0, abs=0.05) and meta.num_frames == 100
    got = list(decode_range(str(path), meta, 2.0, 2.4))
    assert [round(t * 25) for t, _ in got] == list(range(50, 60))
    assert abs(int(got[0][1].to_ndarray(format="rgb24").mean()) - 100) <= 3


def test_an_mpeg_ts_range_after_the_last_key_frame(tmp_path: Path) -> None:
    path = tmp_path / "broadcast.ts"
    frames = write_raw(path, "mpegts", first_pts=0, seconds=6.0)
    meta = probe(str(path))
    got = list(decode_range(str(path), meta, 4.5, 5.0))
    assert [round(t * 12) for t, _ in got] == list(range(54, 60))
    assert np.array_equal(got[0][1].to_ndarray(format="rgb24"), frames[54])


def test_an_mkv_whose_audio_outlasts_its_video_is_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "long-audio.mkv"
    write_raw(path, "matroska", first_pts=0, audio_s=8.0)
    meta = probe(str(path))
    assert meta.audio_codec == "aac"
    assert meta.duration_s == pytest.approx(4.0, abs=0.1) and meta.num_frames == 48


def test_an_mp4_whose_audio_outlasts_its_video_is_read(tmp_path: Path) -> None:
    path = tmp_path / "long-audio.mp4"
    write_raw(path, "mp4", first_pts=0, audio_s=8.0)
    meta = probe(str(path))
    assert meta.duration_s == pytest.approx(4.0, abs=0.1) and meta.num_frames == 48


def test_an_avi_with_b_frames_is_read_in_order_with_the_right_times(tmp_path: Path) -> None:
    """AVI stores decode-order stamps: with B-frames the frames' ``pts`` come out scrambled
    (1, 4, 3, 5, 2, ...). Their decode stamps are trusted instead, so a range gives exactly
    its frames (two were lost per clip before)."""

    from conveyor.samples.video import render_frames

    path = tmp_path / "bframes.avi"
    rate = Fraction(12)
    with av.open(str(path), "w", format="avi") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.options = {"preset": "ultrafast", "bf": "3", "x264-params": "b-adapt=0"}
        stream.codec_context.gop_size = 24
        for image in render_frames([Segment("shapes", 4.0, 3)], 160, 120, 12):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(path)) as container:
        decoded = [(f.pts, f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
    stamps = [pts for pts, _ in decoded]
    assert stamps != sorted(stamps)  # the file does have the problem
    meta = probe(str(path))
    assert meta.num_frames == 48
    for start, end in ((0.0, 4.0), (1.0, 2.5), (2.0, 3.0)):
        got = list(decode_range(str(path), meta, start, end))
        indices = [round(t * 12) for t, _ in got]
        assert indices == list(range(round(start * 12), round(end * 12)))
        for (_, frame), index in zip(got, indices, strict=True):
            assert np.array_equal(frame.to_ndarray(format="rgb24"), decoded[index][1])


@pytest.mark.parametrize(
    ("name", "fmt", "codec"),
    [
        ("obs.ts", "mpegts", "libx264"),
        ("tv.ts", "mpegts", "mpeg2video"),
        ("dvd.mpg", "mpeg", "mpeg2video"),
    ],
)
def test_mpeg_ts_and_ps_with_a_key_frame_every_10_s(
    tmp_path: Path, name: str, fmt: str, codec: str
) -> None:
    """MPEG-TS and -PS seek to any packet, not to a key frame (no index). With x264's
    default of a key frame every 250 frames, reading the last seconds decoded nothing and
    the file failed as truncated; and a range in the first group of pictures, read again
    "from the start", was sought to the first frame's stamp, landed a frame late and gave
    nothing before the next key frame."""
    path = tmp_path / name
    frames = write_raw(path, fmt, first_pts=0, seconds=15.0, gop=120, codec=codec)
    meta = probe(str(path))
    assert meta.duration_s == pytest.approx(15.0, abs=0.1) and meta.num_frames == 180
    for start in (0.5, 13.0):  # mid-way through the first and the last group of pictures
        got = list(decode_range(str(path), meta, start, start + 0.5))
        first = round(start * 12)
        assert [round(t * 12) for t, _ in got] == list(range(first, first + 6))
        assert np.array_equal(got[0][1].to_ndarray(format="rgb24"), frames[first])


@pytest.mark.parametrize(("name", "fmt", "codec"), INTERLACED_SOURCES)
def test_an_interlaced_source_is_reported_as_such(
    media: Media, tmp_path: Path, name: str, fmt: str, codec: str
) -> None:
    meta = probe(str(write_interlaced(tmp_path / name, fmt, codec)))
    assert meta.interlaced and meta.as_dict()["interlaced"] is True
    assert not media.metadata(media.standard().path).interlaced


def test_an_mp4_trimmed_by_its_edit_list_counts_the_frames_it_shows(tmp_path: Path) -> None:
    """Frames stamped before 0 are left out by the MP4's edit list, but its sample count
    still holds them: the video had 48 frames for 36 shown, and its last clip was planned
    past the end and never cropped."""
    path = tmp_path / "trimmed.mp4"
    write_raw(path, "mp4", first_pts=-12)  # 4 s written, the first of them before 0
    meta = probe(str(path))
    assert meta.duration_s == pytest.approx(3.0, abs=0.1) and meta.num_frames == 36
    got = list(decode_range(str(path), meta, 2.5, 3.0))
    assert [round(t * 12) for t, _ in got] == list(range(30, 36))


def test_the_codec_is_named_for_the_format_not_its_decoder(tmp_path: Path) -> None:
    """AV1 is decoded by libdav1d: the metadata says "av1", as it says "h264" or "vp9"."""
    path = tmp_path / "av1.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libsvtav1", rate=25, options={"preset": "8"})
        stream.width, stream.height, stream.pix_fmt = 160, 128, "yuv420p"
        for i in range(25):
            image = np.full((128, 160, 3), i * 8, np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode(None))
    meta = probe(str(path))
    assert meta.codec == "av1" and meta.num_frames == 25


def test_an_mpeg_ts_whose_clock_wraps_is_read_on_both_sides_of_the_wrap(tmp_path: Path) -> None:
    """MPEG-TS stamps are 33-bit (26.5 h at 90 kHz): a recording made as the broadcast's
    clock wraps has stamps that start near 2**33 and go on from 0. FFmpeg unwraps them
    (negative before the wrap); a range before the wrap, read again from the start, was
    sought to stamp 0, after the wrap, and gave nothing."""
    path = tmp_path / "wrap.ts"
    with av.open(str(path), "w", format="mpegts") as container:
        stream = container.add_stream("libx264", rate=25, options={"preset": "ultrafast"})
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.codec_context.gop_size = 250  # x264's default: one key frame here
        for i in range(200):
            image = np.full((120, 160, 3), i, np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = 2**33 - 4 * 90000 + i * 3600, Fraction(1, 90000)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    meta = probe(str(path))
    assert meta.duration_s == pytest.approx(8.0, abs=0.1) and meta.num_frames == 200
    for start in (1.0, 6.0):  # before and after the wrap at 4 s
        got = list(decode_range(str(path), meta, start, start + 0.2))
        first = round(start * 25)
        assert [round(t * 25) for t, _ in got] == list(range(first, first + 5))
        assert abs(float(got[0][1].to_ndarray(format="rgb24").mean()) - start * 25) <= 3


def test_mpeg_ts_files_joined_end_to_end_are_refused_with_the_remedy(tmp_path: Path) -> None:
    """``cat a.ts b.ts``: the stamps start again half-way. FFmpeg measured the length by
    the second file's stamps (4 s of 8) and clips were cut from the wrong stretch."""
    write_raw(tmp_path / "a.ts", "mpegts", first_pts=0)
    write_raw(tmp_path / "b.ts", "mpegts", first_pts=0)
    joined = tmp_path / "joined.ts"
    joined.write_bytes((tmp_path / "a.ts").read_bytes() + (tmp_path / "b.ts").read_bytes())
    with pytest.raises(InputError, match=r"timestamps jump back by 3\.9 s after 3\.9 s .*remux"):
        probe(str(joined))
    assert probe(str(tmp_path / "a.ts")).num_frames == 48


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_a_tag_that_is_not_utf8_costs_nothing(tmp_path: Path, suffix: str) -> None:
    # an old muxer's Latin-1 title ("café" as one byte e9): PyAV reading tags as strict UTF-8
    # failed the file at opening; the same bytes in place of a marker keep the file valid
    path = tmp_path / f"latin1{suffix}"
    with av.open(str(path), "w") as container:
        container.metadata["title"] = "caf@@@@"
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        for i in range(24):
            picture = np.full((120, 160, 3), 10 * i, np.uint8)
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 12)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    data = path.read_bytes()
    assert data.count(b"@@@@") == 1
    path.write_bytes(data.replace(b"@@@@", b"\xe9 \xff\xfe"))
    meta = probe(str(path))
    assert (meta.width, meta.height, meta.num_frames) == (160, 120, 24)
    got = list(decode_range(str(path), meta, 1.0, 1.5))
    assert [round(t * 12) for t, _ in got] == list(range(12, 18))


def test_a_video_over_the_pixel_limit_fails_before_a_frame_is_decoded(
    media: Media, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 16,000 x 16,000 video took a worker to 21 GB: its size is refused from the header."""
    path = str(long_video(media, ".mp4").path)
    decoded: list[object] = []
    monkeypatch.setattr(decode, "_first_frame", lambda *a: decoded.append(a))
    refused = r"frames of 160x120 \(19,200 pixels\) are over the limit of 19,199"
    with pytest.raises(InputError, match=refused):
        probe(path, max_pixels=160 * 120 - 1)
    assert decoded == []
    monkeypatch.undo()
    assert probe(path, max_pixels=160 * 120).width == 160
    assert probe(path, max_pixels=None).width == 160


def test_a_frame_rate_too_low_for_any_clip_is_a_bad_video(tmp_path: Path) -> None:
    """Near-zero rates (a broken stts) failed the transcoder with a ZeroDivisionError, called
    a failure of the run, every run."""
    path = tmp_path / "stills.mkv"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(1, 200))
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 60, np.uint8))
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with pytest.raises(InputError, match=r"frame rate of 0\.005 fps \(a frame every 200 s\)"):
        probe(str(path))
