"""Synthetic videos: the frames, the ground truth, every container, and the broken files."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from conveyor.samples.video import (
    BAD_KINDS,
    CONTAINERS,
    KINDS,
    Segment,
    Transition,
    flash_frames,
    render_frames,
    write_bad_file,
    write_video,
)

from .conftest import Media


def test_segment_is_validated() -> None:
    with pytest.raises(ValueError, match="kind"):
        Segment("sparkles", 1.0)
    with pytest.raises(ValueError, match="duration_s"):
        Segment("pan", 0)


@pytest.mark.parametrize("kind", KINDS)
def test_every_pattern_renders_frames_of_the_size_asked(kind: str) -> None:
    frames = list(render_frames([Segment(kind, 0.5, 3)], 37, 21, 8))
    assert len(frames) == 4
    for frame in frames:
        assert frame.shape == (21, 37, 3) and frame.dtype == np.uint8


def test_frames_are_deterministic_for_a_seed_and_differ_between_seeds() -> None:
    def once(seed: int) -> np.ndarray:
        return np.stack(list(render_frames([Segment("noise", 0.5, seed)], 32, 24, 8)))

    assert np.array_equal(once(4), once(4))
    assert not np.array_equal(once(4), once(5))


def test_a_static_segment_repeats_its_first_frame() -> None:
    frames = list(render_frames([Segment("shapes", 1.0, 2, static=True)], 48, 32, 10))
    assert len(frames) == 10
    assert all(np.array_equal(f, frames[0]) for f in frames)
    moving = list(render_frames([Segment("shapes", 1.0, 2)], 48, 32, 10))
    assert np.array_equal(moving[0], frames[0])
    assert not np.array_equal(moving[-1], frames[0])


def test_a_cut_changes_the_content() -> None:
    frames = np.stack(
        list(render_frames([Segment("pan", 1.0, 1), Segment("pan", 1.0, 2)], 64, 48, 10))
    ).astype(np.int16)
    step = np.abs(np.diff(frames, axis=0)).mean(axis=(1, 2, 3))
    assert int(np.argmax(step)) == 9  # between frame 9 and frame 10, the first of segment 2
    assert step[9] > 4 * np.delete(step, 9).max()


def test_a_crossfade_blends_one_segment_into_the_next() -> None:
    segments = [Segment("bars", 1.0, 1, static=True), Segment("rings", 1.0, 2)]
    plain = list(render_frames(segments, 40, 30, 10))
    faded = list(render_frames(segments, 40, 30, 10, crossfades={0: 0.4}))
    assert np.array_equal(plain[5], faded[5])  # before the fade
    assert not np.array_equal(plain[8], faded[8])  # inside it
    assert np.array_equal(plain[-1], faded[-1])  # the end of the next segment


def test_a_crossfade_shortens_the_timeline_by_its_length() -> None:
    segments = [Segment("bars", 1.0, 1, static=True), Segment("rings", 1.0, 2)]
    plain = list(render_frames(segments, 40, 30, 10))
    faded = list(render_frames(segments, 40, 30, 10, crossfades={0: 0.4}))
    assert len(plain) == 20
    assert len(faded) == 16  # the next segment began inside the 0.4 s fade


def test_ground_truth_of_cuts_and_static_stretches(tmp_path: Path) -> None:
    segments = [
        Segment("pan", 1.0, 1),
        Segment("shapes", 1.5, 2, static=True),
        Segment("rings", 1.0, 3),
    ]
    video = write_video(tmp_path / "truth.mp4", segments, width=64, height=48, fps=10)
    assert video.num_frames == 35
    assert video.duration_s == pytest.approx(3.5)
    assert video.cuts_s == [1.0, 2.5]
    assert video.fades_s == []
    assert video.static_s == [(1.0, 2.5)]
    assert video.boundaries_s == [1.0, 2.5]
    assert (video.width, video.height, video.fps, video.codec) == (64, 48, 10.0, "libx264")
    with av.open(str(video.path)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 35


def test_ground_truth_of_a_crossfade_matches_the_frames_written(tmp_path: Path) -> None:
    segments = [Segment("pan", 1.0, 1), Segment("rings", 1.0, 3), Segment("plasma", 1.0, 4)]
    video = write_video(
        tmp_path / "fade.mkv", segments, width=64, height=48, fps=10, crossfades={1: 0.5}
    )
    assert video.cuts_s == [1.0]
    assert video.fades_s == [(1.5, 2.0)]
    assert video.boundaries_s == [1.0, 1.75]
    rendered = list(render_frames(segments, 64, 48, 10, {1: 0.5}))
    with av.open(str(video.path)) as container:
        decoded = sum(1 for _ in container.decode(video=0))
    assert video.num_frames == len(rendered) == decoded


NEW_KINDS = ("gradient", "slowpan", "zoom", "drift", "fast", "flash")


def frames_of(kind: str, seconds: float, seed: int, fps: float = 10) -> np.ndarray:
    return np.stack(list(render_frames([Segment(kind, seconds, seed)], 64, 36, fps)))


def steps(frames: np.ndarray) -> np.ndarray:
    """Mean absolute change from each frame to the next."""
    return np.abs(np.diff(frames.astype(np.int16), axis=0)).mean(axis=(1, 2, 3))


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_the_benchmark_kinds_are_deterministic_for_a_seed(kind: str) -> None:
    assert np.array_equal(frames_of(kind, 1.0, 4), frames_of(kind, 1.0, 4))
    assert not np.array_equal(frames_of(kind, 1.0, 4), frames_of(kind, 1.0, 5))


@pytest.mark.parametrize("kind", ["gradient", "slowpan", "zoom", "drift"])
def test_slow_kinds_change_little_per_frame_and_much_over_seconds(kind: str) -> None:
    """The negatives of a shot detector: no frame-to-frame jump, yet (but for a slow pan,
    which moves a few pixels a second) a different picture after some seconds."""
    frames = frames_of(kind, 12.0, 2, fps=30)
    assert steps(frames).max() < 6
    if kind != "slowpan":
        far = np.abs(frames[-1].astype(np.int16) - frames[0]).mean()
        assert far > 5 * steps(frames).mean()


def test_a_slow_pan_is_slower_than_a_pan_and_a_fast_one_much_faster() -> None:
    slow, pan, fast = (
        steps(frames_of(k, 2.0, 3, fps=30)).mean() for k in ("slowpan", "pan", "fast")
    )
    assert slow < pan < fast
    assert fast > 4 * pan


def test_a_black_segment_is_black() -> None:
    assert not frames_of("black", 1.0, 1).any()


def test_flashes_are_brief_bright_frames_recorded_in_the_truth(tmp_path: Path) -> None:
    segments = [Segment("pan", 2.0, 1), Segment("flash", 8.0, 2), Segment("rings", 2.0, 3)]
    video = write_video(tmp_path / "flash.mp4", segments, width=64, height=36, fps=10)
    flashes = flash_frames(segments[1], 10)
    assert flashes == flash_frames(Segment("flash", 8.0, 2), 10)  # deterministic
    assert 2 <= len(flashes) <= 4 and all(1 <= count <= 3 for _, count in flashes)
    assert video.flashes_s == [(2 + f / 10, 2 + (f + n) / 10) for f, n in flashes]
    assert all(a >= 3.0 and b <= 9.0 for a, b in video.flashes_s)  # not in its first/last 1 s
    assert video.cuts_s == [2.0, 10.0]  # a flash is not a cut
    assert [t.kind for t in video.transitions()] == ["cut", "cut"]
    frames = np.stack(list(render_frames(segments, 64, 36, 10)))
    brightness = frames.astype(np.float32).mean(axis=(1, 2, 3))
    flashed = {round(a * 10) + k for a, b in video.flashes_s for k in range(round((b - a) * 10))}
    others = sorted(set(range(20, 100)) - flashed)  # the rest of the flash segment
    assert brightness[sorted(flashed)].min() > brightness[others].max() + 20


def test_a_fade_through_black_is_one_dip(tmp_path: Path) -> None:
    segments = [Segment("pan", 2.0, 1), Segment("black", 1.0), Segment("rings", 2.0, 3)]
    video = write_video(
        tmp_path / "dip.mp4", segments, width=64, height=36, fps=10, crossfades={0: 0.3, 1: 0.4}
    )
    assert video.num_frames == 43
    assert video.fades_s == [(1.7, 2.0), (2.3, 2.7)] and video.cuts_s == []
    assert video.dips_s == [(1.7, 2.7)]
    assert video.transitions() == [Transition("dip", 1.7, 2.7)]
    frames = np.stack(list(render_frames(segments, 64, 36, 10, {0: 0.3, 1: 0.4})))
    assert not frames[20:23].any()  # the black held between the fades
    assert frames[16].any() and frames[23].any()
    # through black with hard cuts, and a black at an end, which is no dip
    cut = write_video(tmp_path / "cut.mp4", segments, width=64, height=36, fps=10)
    assert cut.cuts_s == [2.0, 3.0] and cut.dips_s == [(2.0, 3.0)]
    assert cut.transitions() == [Transition("dip", 2.0, 3.0)]
    ends = [Segment("black", 1.0), Segment("pan", 2.0, 1), Segment("rings", 2.0, 3)]
    edge = write_video(
        tmp_path / "edge.mp4", ends, width=64, height=36, fps=10, crossfades={1: 0.5}
    )
    assert edge.dips_s == []
    assert edge.transitions() == [Transition("cut", 1.0, 1.0), Transition("dissolve", 2.5, 3.0)]


@pytest.mark.parametrize("suffix", sorted(CONTAINERS))
def test_every_container_is_written_with_its_codec(media: Media, suffix: str) -> None:
    video = media.video(f"sample{suffix}", [Segment("pan", 1.0, 1)], width=160, height=120, fps=12)
    _, codec, pix_fmt = CONTAINERS[suffix]
    decoder = {"libx264": "h264", "libvpx-vp9": "vp9", "mpeg4": "mpeg4"}[codec]
    with av.open(str(video.path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert stream.codec_context.name == decoder
        assert (stream.codec_context.width, stream.codec_context.height) == (160, 120)
    assert len(frames) == video.num_frames == 12
    assert frames[0].format.name == pix_fmt


def test_audio_track_is_added_when_asked(media: Media) -> None:
    video = media.video(
        "voice.mov", [Segment("pan", 1.0, 1)], width=160, height=120, fps=12, audio=True
    )
    with av.open(str(video.path)) as container:
        assert container.streams.audio[0].codec_context.name == "aac"
        assert len(container.streams.video) == 1


def test_write_video_rejects_what_it_cannot_make(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="suffix"):
        write_video(tmp_path / "x.flv", [Segment("pan", 1.0)])
    with pytest.raises(ValueError, match="segment"):
        write_video(tmp_path / "x.mp4", [])
    with pytest.raises(ValueError, match="crossfade"):
        write_video(tmp_path / "x.mp4", [Segment("pan", 1.0)], crossfades={0: 0.5})
    with pytest.raises(ValueError, match="crossfade"):
        write_video(
            tmp_path / "x.mp4", [Segment("pan", 1.0), Segment("rings", 0.5)], crossfades={0: 0.5}
        )


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_every_bad_kind_is_written(tmp_path: Path, kind: str) -> None:
    path = write_bad_file(tmp_path / "sub" / f"{kind}.mp4", kind)
    assert path.exists()
    size = path.stat().st_size
    assert size == 0 if kind == "empty" else size > 0
    assert sorted(p.name for p in path.parent.iterdir()) == [f"{kind}.mp4"]  # nothing else


def test_unknown_bad_kind_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown bad-file kind"):
        write_bad_file(tmp_path / "x.mp4", "scratched")
