"""What every video stage shares (failed videos pass, clip errors stay on the clip, frames
from the extractor), and the video data model."""

from __future__ import annotations

import uuid

import av
import numpy as np
import pytest

from conveyor.cluster import WorkerInfo
from conveyor.stages.video.base import (
    ELASTIC_THREADS,
    ClipStage,
    FrameConsumer,
    InputError,
    TorchStage,
    VideoStage,
    describe_error,
    input_errors,
)
from conveyor.tasks.video import (
    ERROR_FILTER,
    ID_NAMESPACE,
    Clip,
    FrameWindow,
    Video,
    VideoMetadata,
    VideoTask,
    clip_id,
    video_id,
)

META = VideoMetadata(duration_s=4.0, fps=10.0, num_frames=40, width=64, height=48, codec="h264")


def make_video(n: int = 3, **fields: object) -> Video:
    clips = [
        Clip(clip_id("v.mp4", 10 * i, 10 * i + 10), "v.mp4", (i, i + 1.0), (10 * i, 10 * i + 10))
        for i in range(n)
    ]
    return Video("/in/v.mp4", "v.mp4", metadata=META, clips=clips, **fields)  # type: ignore[arg-type]


class Recorder(VideoStage):
    def __init__(self, result: object = None, error: BaseException | None = None) -> None:
        self.seen: list[Video] = []
        self.result = result
        self.error = error

    def process_video(self, video: Video) -> list[Video] | None:
        self.seen.append(video)
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


# -- VideoStage ---------------------------------------------------------------------------
def test_a_failed_video_passes_through_untouched() -> None:
    stage = Recorder()
    video = make_video(0, errors={"VideoProbe": "empty file"})
    task = VideoTask(data=video)
    assert stage.process(task) is task
    assert stage.seen == []


def test_a_video_changed_in_place_is_returned() -> None:
    task = VideoTask(data=make_video())
    assert Recorder().process(task) is task


def test_fanning_out_keeps_the_dataset_and_copies_the_metadata() -> None:
    parent = VideoTask(data=make_video(), dataset_name="ds", metadata={"k": 1})
    parts = [parent.data.chunk(parent.data.clips[:1], 0, False), parent.data.chunk([], 1, True)]
    children = Recorder(result=parts).process(parent)
    assert isinstance(children, list) and [c.data for c in children] == parts
    for child in children:
        assert child.dataset_name == "ds" and child.metadata == {"k": 1}
        assert child.metadata is not parent.metadata
    assert Recorder(result=[]).process(parent) == []


@pytest.mark.parametrize(
    "error", [InputError("bad media"), av.error.InvalidDataError(1094995529, "x"), EOFError()]
)
def test_an_input_error_fails_the_video(error: BaseException) -> None:
    task = VideoTask(data=make_video())
    assert Recorder(error=error).process(task) is task
    assert list(task.data.errors) == ["Recorder"]
    assert task.data.clips == []


def test_any_other_error_is_a_defect_for_the_engine() -> None:
    with pytest.raises(ZeroDivisionError):
        Recorder(error=ZeroDivisionError("bug")).process(VideoTask(data=make_video()))


def test_a_stage_without_process_video_says_so() -> None:
    class Lazy(VideoStage):
        pass

    with pytest.raises(NotImplementedError, match="Lazy"):
        Lazy().process(VideoTask(data=make_video()))


def test_describe_error() -> None:
    assert describe_error(InputError("empty file\nmore detail")) == "empty file"
    assert describe_error(InputError("")) == "InputError"
    assert describe_error(ValueError("no good")) == "ValueError: no good"
    assert describe_error(EOFError()) == "EOFError"
    assert InputError in input_errors() and av.FFmpegError in input_errors()


# -- ClipStage ----------------------------------------------------------------------------
class PerClip(ClipStage):
    def __init__(self, failing: dict[int, BaseException] | None = None) -> None:
        self.failing = failing or {}
        self.done: list[int] = []

    def process_clip(self, clip: Clip, video: Video) -> None:
        index = clip.frame_span[0] // 10
        if index in self.failing:
            raise self.failing[index]
        self.done.append(index)
        clip.scores["seen"] = 1.0


def test_only_active_clips_are_processed() -> None:
    video = make_video(4)
    video.clips[1].reject("motion")
    video.clips[2].fail("Earlier", "broken")
    stage = PerClip()
    stage.process(VideoTask(data=video))
    assert stage.done == [0, 3]


def test_an_input_error_fails_that_clip_only() -> None:
    video = make_video(3)
    stage = PerClip({1: InputError("cannot decode"), 2: av.error.EOFError(541478725, "x")})
    stage.process(VideoTask(data=video))
    first, second, third = video.clips
    assert stage.done == [0]
    assert first.errors == {} and first.scores == {"seen": 1.0}
    assert second.errors == {"PerClip": "cannot decode"}
    assert second.filtered_by == ERROR_FILTER and not second.active
    assert "PerClip" in third.errors
    assert not video.failed


def test_a_defect_in_one_clip_goes_to_the_engine() -> None:
    with pytest.raises(KeyError):
        PerClip({1: KeyError("bug")}).process(VideoTask(data=make_video()))


def test_a_chunk_wide_input_error_fails_the_active_clips_not_the_video() -> None:
    class Chunkwise(ClipStage):
        def process_clips(self, clips: list[Clip], video: Video) -> None:
            raise InputError("the source vanished")

    video = make_video(3)
    video.clips[0].reject("motion")
    Chunkwise().process(VideoTask(data=video))
    assert not video.failed and len(video.clips) == 3
    assert video.clips[0].errors == {} and video.clips[0].filtered_by == "motion"
    for clip in video.clips[1:]:
        assert clip.errors == {"Chunkwise": "the source vanished"}


def test_a_chunk_without_active_clips_is_not_processed() -> None:
    class Never(ClipStage):
        def process_clips(self, clips: list[Clip], video: Video) -> None:
            raise AssertionError("called")

    video = make_video(1)
    video.clips[0].reject("motion")
    Never().process(VideoTask(data=video))


# -- FrameConsumer ------------------------------------------------------------------------
class Consumer(FrameConsumer):
    frame_rate = 2.0

    def __init__(self) -> None:
        self.got: list[np.ndarray] = []

    def process_clip(self, clip: Clip, video: Video) -> None:
        self.got.append(self.frames_of(clip))


def test_frames_of_gives_the_frames_at_the_stage_rate() -> None:
    video = make_video(1)
    frames = np.zeros((2, 4, 4, 3), np.uint8)
    video.clips[0].frames = {1.0: frames[:1], 2.0: frames}
    stage = Consumer()
    stage.process(VideoTask(data=video))
    assert stage.got[0] is frames
    assert video.clips[0].frames  # kept: not the last consumer


def test_the_last_consumer_releases_the_frames() -> None:
    video = make_video(2)
    for clip in video.clips:
        clip.frames = {2.0: np.zeros((2, 4, 4, 3), np.uint8)}
    stage = Consumer()
    stage.release_frames = True
    stage.process(VideoTask(data=video))
    assert len(stage.got) == 2
    assert all(clip.frames == {} for clip in video.clips)


def test_missing_frames_are_a_defect_and_empty_frames_an_input_error() -> None:
    video = make_video(1)
    video.clips[0].frames = {1.0: np.zeros((1, 4, 4, 3), np.uint8)}
    with pytest.raises(RuntimeError, match=r"needs frames at 2 fps .* has 1"):
        Consumer().process(VideoTask(data=video))
    video.clips[0].frames = {2.0: np.zeros((0, 4, 4, 3), np.uint8)}
    Consumer().process(VideoTask(data=video))
    assert "no frames could be decoded at 2 fps" in video.clips[0].errors["Consumer"]
    # an encoded clip that holds no frame has none for any stage: its input's fault
    video = make_video(1)
    video.clips[0].encoded, video.clips[0].num_frames = b"", 0
    Consumer().process(VideoTask(data=video))
    assert "the clip holds no frame" in video.clips[0].errors["Consumer"]


def test_torch_stages_run_on_the_cpu_without_a_gpu() -> None:
    class Model(TorchStage):
        pass

    worker = WorkerInfo("w", "Model", "n")
    assert Model().torch_device(worker) == "cpu"


def test_torch_threads_follow_the_batch() -> None:
    import torch

    from conveyor.stages.video.embed import ClipEmbedder

    before = torch.get_num_threads()
    stage = ClipEmbedder()
    try:
        stage._threads = 2  # a batch sent while another core idled
        stage.limit_threads()
        assert torch.get_num_threads() == 2
        stage._threads = None  # the next one: the stage's own CPU
        stage.limit_threads()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "name",
    [
        "AestheticFilter",
        "ClipEmbedder",
        "ClipTranscoder",
        "ImageNetTagger",
        "TextEmbedder",
        "TransNetV2Detector",
    ],
)
def test_the_model_and_encoder_stages_can_use_idle_cores(name: str) -> None:
    import conveyor.stages.video as video

    assert getattr(video, name).max_threads == ELASTIC_THREADS


# -- the data model -----------------------------------------------------------------------
def test_ids_are_deterministic_uuid5() -> None:
    assert video_id("a/b.mp4") == video_id("a/b.mp4")
    assert video_id("a/b.mp4") != video_id("a/c.mp4")
    assert video_id("a/b.mp4") == str(uuid.uuid5(ID_NAMESPACE, "video:a/b.mp4"))
    assert clip_id("a/b.mp4", 0, 10) == str(uuid.uuid5(ID_NAMESPACE, "clip:a/b.mp4#0-10"))
    assert clip_id("a/b.mp4", 0, 10) != clip_id("a/b.mp4", 0, 11)
    assert clip_id("a/b.mp4", 0, 10) != clip_id("a/c.mp4", 0, 10)
    assert uuid.UUID(clip_id("x", 1, 2)).version == 5
    assert make_video().video_id == video_id("v.mp4")


def test_clip_states() -> None:
    clip = Clip("c", "v.mp4", (1.0, 3.5), (10, 35))
    assert clip.duration_s == 2.5
    assert not clip.made and not clip.kept and clip.active
    clip.num_frames = 25
    assert clip.made and clip.kept
    clip.frames[1.0] = np.zeros((1, 2, 2, 3), np.uint8)
    clip.reject("motion")
    clip.reject("aesthetic")  # the first filter wins
    assert clip.filtered_by == "motion" and not clip.kept and not clip.active
    assert clip.frames == {}
    other = Clip("d", "v.mp4", (0.0, 1.0), (0, 10), encoded=b"x")
    other.fail("Stage", "why")
    assert other.errors == {"Stage": "why"} and other.filtered_by == ERROR_FILTER
    assert other.made and not other.kept and not other.active


def test_video_fail_drops_its_clips_and_window_frames() -> None:
    video = make_video(2)
    video.window = FrameWindow(0, 1, 0, 10, frames=np.zeros((10, 2, 2, 3), np.uint8))
    video.fail("Stage", "why")
    assert video.failed and video.clips == [] and video.window.frames is None
    assert video.window.index == 0


def test_chunk_is_a_copy_with_its_own_clips() -> None:
    video = make_video(3, transitions=[(10, 9)], source_size=5, source_mtime=1.5)
    video.window = FrameWindow(0, 1, 0, 10)
    part = video.chunk(video.clips[1:], 2, True)
    assert part is not video
    assert part.clips == video.clips[1:] and (part.chunk_index, part.last_chunk) == (2, True)
    assert part.window is None and part.transitions == []
    assert (part.path, part.relative_path, part.metadata) == (video.path, "v.mp4", META)
    assert (part.source_size, part.source_mtime) == (5, 1.5)
    assert len(video.clips) == 3 and video.chunk_index == 0 and video.transitions == [(10, 9)]


def test_a_part_of_a_chunk_holds_one_clip_and_the_chunks_own_facts_ride_on_part_0() -> None:
    video = make_video(3, chunk_index=2, last_chunk=True, transitions=[(10, 9)])
    video.damaged_packets = 4
    parts = [video.part_of(k, 3, [clip]) for k, clip in enumerate(video.clips)]
    assert [(p.part, p.parts, p.chunk_index, p.last_chunk) for p in parts] == [
        (0, 3, 2, True),
        (1, 3, 2, True),
        (2, 3, 2, True),
    ]
    assert [p.clips for p in parts] == [[c] for c in video.clips]
    assert [p.transitions for p in parts] == [[(10, 9)], [], []]
    assert [p.damaged_packets for p in parts] == [4, 0, 0]
    assert "part=1/3" in VideoTask(data=parts[1]).short_repr()
    again = parts[1].chunk(video.clips, 5, False)  # a chunk made from it is whole again
    assert (again.part, again.parts) == (0, 1)
    assert "part=" not in VideoTask(data=again).short_repr()


def test_metadata_as_dict_and_task_summary() -> None:
    meta = VideoMetadata(
        duration_s=1 / 3, fps=30000 / 1001, num_frames=10, width=2, height=2, codec="h264"
    )
    as_dict = meta.as_dict()
    assert as_dict["duration_s"] == 0.333333 and as_dict["fps"] == 29.97003
    assert set(as_dict) == {
        "duration_s",
        "fps",
        "num_frames",
        "width",
        "height",
        "codec",
        "pixel_format",
        "bit_rate",
        "audio_codec",
        "container",
        "size_bytes",
        "start_time_s",
        "rotation",
        "sample_aspect",
        "interlaced",
    }
    task = VideoTask(data=make_video(3, chunk_index=4))
    assert task.video is task.data and task.num_items == 3
    assert "chunk=4" in task.short_repr() and "clips=3" in task.short_repr()
    assert VideoTask().num_items == 0
