"""Sampling a clip's frames once, at every rate the models downstream ask for."""

from __future__ import annotations

import copy
import io

import av
import numpy as np
import pytest

from conveyor.samples.video import SyntheticVideo
from conveyor.stages.video.frames import ClipFrameExtractor, sample_indices, scaled_size
from conveyor.tasks.video import VideoTask


@pytest.mark.parametrize(
    ("frames", "fps", "rate", "expected"),
    [
        (48, 24, 1.0, [12, 36]),
        (60, 24, 1.0, [12, 36]),  # a partial last interval is not sampled
        (24, 24, 4.0, [3, 9, 15, 21]),
        (12, 12, 2.0, [3, 9]),
        (24, 24, 48.0, list(range(24))),  # never more than every frame
        (0, 24, 1.0, []),
    ],
)
def test_sample_indices(frames: int, fps: float, rate: float, expected: list[int]) -> None:
    assert sample_indices(frames, fps, rate) == expected


def test_a_clip_shorter_than_an_interval_gives_its_middle_frame() -> None:
    assert sample_indices(10, 24, 1.0) == [5]


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


def test_a_clip_claiming_more_frames_than_it_has_repeats_the_last(
    transcoded_standard: tuple[SyntheticVideo, VideoTask],
) -> None:
    _, encoded = transcoded_standard
    task = copy.deepcopy(encoded)
    clip = task.data.clips[0]
    clip.num_frames = 36  # the stream holds 12
    ClipFrameExtractor(rates=[1.0], short_side=64).process(task)
    frames = clip.frames[1.0]
    assert frames.shape[0] == 3
    np.testing.assert_array_equal(frames[1], frames[0])  # indices 18, 30 missing: index 6
    np.testing.assert_array_equal(frames[2], frames[0])
