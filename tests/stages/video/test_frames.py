"""Sampling a clip's frames once, at every rate the models downstream ask for."""

from __future__ import annotations

import copy
import io

import av
import numpy as np
import pytest

from conveyor.samples.video import SyntheticVideo
from conveyor.stages.video.frames import ClipFrameExtractor, FrameSampler, scaled_size
from conveyor.tasks.video import VideoTask


def picks(times: list[float], expected: int, fps: float, rates: list[float]) -> dict:
    """The frames (by number) a ``FrameSampler`` picks of frames shown at ``times``."""
    sampler = FrameSampler(rates, expected, fps, (4, 2))
    for number, at in enumerate(times):
        sampler.add(at, lambda n=number: np.full((2, 4, 3), n, np.uint8))
    return {rate: [int(f[0, 0, 0]) for f in frames] for rate, frames in sampler.frames().items()}


@pytest.mark.parametrize(
    ("frames", "fps", "rate", "expected"),
    [
        (48, 24, 1.0, [12, 36]),
        (60, 24, 1.0, [12, 36]),  # a partial last interval is not sampled
        (24, 24, 4.0, [3, 9, 15, 21]),
        (12, 12, 2.0, [3, 9]),
        (24, 24, 48.0, list(range(24))),  # never more than every frame
        (10, 24, 1.0, [5]),  # a clip shorter than an interval: its middle frame
    ],
)
def test_a_constant_rate_clip_gives_the_frames_at_the_middle_of_each_interval(
    frames: int, fps: float, rate: float, expected: list[int]
) -> None:
    times = [n / fps for n in range(frames)]
    assert picks(times, frames, fps, [rate]) == {rate: expected}
    # stamps a container rounded to milliseconds pick the same frames
    assert picks([round(t, 3) for t in times], frames, fps, [rate]) == {rate: expected}


@pytest.mark.parametrize(
    ("fps", "rate"), [(30000 / 1001, 1.0), (24000 / 1001, 1.0), (25.0, 2.0), (30.0, 4.0),
                      (12.0, 8.0), (60000 / 1001, 1.0)],
)  # fmt: skip
def test_a_constant_rate_clip_gives_the_frames_it_gave_by_position(fps: float, rate: float) -> None:
    """The frames by time are those the positions gave (a quarter-frame tolerance picked
    the next frame at NTSC rates: 15, 45... for 14, 44...)."""
    frames = int(fps * 5)
    by_position = sorted(
        {
            min(frames - 1, int((k + 0.5) / rate * fps))
            for k in range(int(frames / fps * rate + 1e-9))
        }
    )
    times = [n / fps for n in range(frames)]
    assert picks(times, frames, fps, [rate]) == {rate: by_position}
    assert picks([round(t, 3) for t in times], frames, fps, [rate]) == {rate: by_position}


def test_a_variable_rate_clip_gives_the_frames_shown_at_those_times() -> None:
    """By position, a clip of 2 s at 30 fps and then 2 s at 10 fps gave the models frames
    of its first 1.1 s only, its last one repeated: moving clips were filtered as frozen."""
    times = [n / 30 for n in range(60)] + [2 + n / 10 for n in range(20)]
    # its span is 4 s of the nominal (average) 20 fps: 80 slots; a frame is on its nearest
    # slot (frame 8, shown at 0.267 s, is on slot 5: 0.25 s), as frames are given to clips
    found = picks(times, 80, 20.0, [1.0, 2.0])
    assert found[1.0] == [15, 45, 65, 75]  # at 0.5, 1.5, 2.5, 3.5 s
    assert found[2.0] == [8, 23, 38, 53, 62, 67, 72, 77]
    # a clip ending before its last times: those take its last frame, once
    assert picks([0.0, 0.1], 40, 10.0, [1.0]) == {1.0: [1]}
    assert picks([], 40, 10.0, [1.0]) == {}


def test_scaled_size_never_upscales() -> None:
    assert scaled_size(320, 240, 224) == (299, 224)
    assert scaled_size(240, 320, 224) == (224, 299)
    assert scaled_size(160, 120, 224) == (160, 120)
    assert scaled_size(1920, 1080, 224) == (398, 224)
    assert scaled_size(224, 500, 224) == (224, 500)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="rates"):
        ClipFrameExtractor(rates=[])
    with pytest.raises(ValueError, match="rates"):
        ClipFrameExtractor(rates=[1.0, 0.0])
    with pytest.raises(ValueError, match="short_side"):
        ClipFrameExtractor(short_side=8)
    assert ClipFrameExtractor(rates=[2, 1.0, 2.0]).rates == (1.0, 2.0)


def clip_frames(data: bytes, size: tuple[int, int]) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as container:
        return [
            f.to_ndarray(width=size[0], height=size[1], format="rgb24")
            for f in container.decode(video=0)
        ]


def test_frames_at_every_rate_from_one_decode(
    transcoded_standard: tuple[SyntheticVideo, VideoTask],
) -> None:
    _, encoded = transcoded_standard
    task = copy.deepcopy(encoded)
    ClipFrameExtractor(rates=[1.0, 4.0, 2.0], short_side=64).process(task)
    for clip in task.data.clips:
        assert sorted(clip.frames) == [1.0, 2.0, 4.0]
        reference = clip_frames(clip.encoded or b"", (85, 64))
        for rate, expected in ((1.0, [6]), (2.0, [3, 9]), (4.0, [1, 4, 7, 10])):
            frames = clip.frames[rate]
            assert frames.shape == (len(expected), 64, 85, 3) and frames.dtype == np.uint8
            for got, index in zip(frames, expected, strict=True):
                np.testing.assert_array_equal(got, reference[index])


def test_frames_are_not_upscaled(transcoded_standard: tuple[SyntheticVideo, VideoTask]) -> None:
    _, encoded = transcoded_standard
    task = copy.deepcopy(encoded)
    ClipFrameExtractor(rates=[1.0]).process(task)
    assert task.data.clips[0].frames[1.0].shape == (1, 120, 160, 3)


def test_the_video_rate_stands_in_for_a_clip_without_one(
    transcoded_standard: tuple[SyntheticVideo, VideoTask],
) -> None:
    _, encoded = transcoded_standard
    task = copy.deepcopy(encoded)
    for clip in task.data.clips:
        clip.fps = 0.0
    ClipFrameExtractor(rates=[2.0]).process(task)
    assert all(clip.frames[2.0].shape[0] == 2 for clip in task.data.clips)


def test_a_clip_without_bytes_or_with_garbage_fails_alone(
    transcoded_standard: tuple[SyntheticVideo, VideoTask],
) -> None:
    _, encoded = transcoded_standard
    task = copy.deepcopy(encoded)
    first, second, third, fourth = task.data.clips
    first.encoded = None
    second.encoded = b"\x00" * 1000
    third.reject("motion")
    ClipFrameExtractor(rates=[1.0]).process(task)
    assert "ClipTranscoder first" in first.errors["ClipFrameExtractor"]
    assert "ClipFrameExtractor" in second.errors
    assert third.frames == {} and not third.errors  # filtered: skipped
    assert fourth.frames[1.0].shape[0] == 1 and not fourth.errors


def test_a_clip_whose_span_outlasts_its_frames_ends_with_its_last_frame_once(
    transcoded_standard: tuple[SyntheticVideo, VideoTask],
) -> None:
    _, encoded = transcoded_standard
    task = copy.deepcopy(encoded)
    clip = task.data.clips[0]
    start = clip.frame_span[0]
    assert clip.frame_span[1] - start == 12  # 1 s at 12 fps
    clip.frame_span = (start, start + 36)  # its span says 3 s: the stream holds 1 s
    ClipFrameExtractor(rates=[1.0], short_side=64).process(task)
    frames = clip.frames[1.0]
    # 0.5 s: frame 6; 1.5 and 2.5 s: past its last frame (11), which comes once
    assert frames.shape[0] == 2
    assert not np.array_equal(frames[1], frames[0])
