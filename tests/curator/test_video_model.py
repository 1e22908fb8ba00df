"""NeMo Curator's video model next to Conveyor's: what a Curator-style stage sees of a
Conveyor video, and what comes back of what it did."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor.curator.adapter import adapt_all
from conveyor.curator.stages.base import ProcessingStage
from conveyor.curator.tasks import VideoTask
from conveyor.curator.tasks.video import Clip, Video, _Window
from conveyor.curator.utils.decoder_utils import FrameExtractionPolicy, FrameExtractionSignature
from conveyor.curator.video_model import Call, to_conveyor_task, to_curator
from conveyor.media.errors import InputError
from conveyor.stages.video import VideoProbe
from conveyor.tasks.video import Clip as CClip
from conveyor.tasks.video import MotionScores, clip_id
from conveyor.tasks.video import Video as CVideo
from conveyor.tasks.video import VideoMetadata as CMeta
from conveyor.tasks.video import VideoTask as CVideoTask

META = CMeta(4.0, 10.0, 40, 64, 48, "h264", pixel_format="yuv420p", size_bytes=900)


def conveyor_task(clips: int = 4, **video: Any) -> CVideoTask:
    made = [
        CClip(
            clip_id("v.mp4", 10 * i, 10 * i + 10),
            "v.mp4",
            (float(i), float(i + 1)),
            (10 * i, 10 * i + 10),
            encoded=b"mp4-%d" % i,
            num_frames=10,
            tags=[("cat", 0.9)],
            frames={2.0: np.full((2, 4, 4, 3), i, np.uint8)},
            scores={"aesthetic": 0.5 + i},
        )
        for i in range(clips)
    ]
    data = CVideo("/data/v.mp4", "v.mp4", metadata=META, clips=made, last_chunk=True, **video)
    return CVideoTask(data=data, dataset_name="videos", metadata={"k": 1}, task_id="3.0")


def curator_side(task: CVideoTask) -> tuple[Call, VideoTask]:
    call = Call("stage", [pickle.loads(pickle.dumps(task))])  # as a worker gets it
    (given,) = call.inputs
    return call, given


def test_a_conveyor_video_as_nemo_curator_names_it() -> None:
    task = conveyor_task()
    task.data.clips[1].reject("quality")
    task.data.clips[2].fail("transcode", "broken")
    task.data.clips[3].motion = MotionScores(256, 0.02, 0.01, 9)
    got = to_curator(task)
    video = got.data
    assert isinstance(got, VideoTask) and got.task_id == "3.0" and got._metadata == {"k": 1}
    assert video.input_video == Path("/data/v.mp4") and video.input_path == "/data/v.mp4"
    assert (video.metadata.framerate, video.metadata.duration, video.metadata.num_frames) == (
        10.0,
        4.0,
        40,
    )
    assert video.has_metadata() and video.is_10_bit_color() is False
    # in play, filtered aside; the failed clip is not shown at all
    assert [c.span for c in video.clips] == [(0.0, 1.0), (3.0, 4.0)]
    assert [c.span for c in video.filtered_clips] == [(1.0, 2.0)]
    first, last = video.clips
    assert first.uuid == uuid.UUID(task.data.clips[0].clip_id)
    assert first.buffer == b"mp4-0" and first.aesthetic_score == 0.5
    key = FrameExtractionSignature(FrameExtractionPolicy.sequence, 2.0).to_str()
    assert list(first.extracted_frames) == [key]
    assert last.motion_score_global_mean == 0.02  # the transcoder's, before a motion filter
    assert last.motion_score_per_patch_min_256 == 0.01


def test_a_stage_filters_drops_and_changes_clips_and_conveyor_keeps_the_rest() -> None:
    task = conveyor_task()
    task.data.clips[3].fail("transcode", "broken")
    call, given = curator_side(task)
    video = given.data
    keep, aside, _dropped = video.clips  # the failed fourth is held back
    aside.aesthetic_score = 0.1
    video.filtered_clips.append(aside)
    keep.cosmos_embed1_embedding = np.ones(8, np.float32)
    keep.windows = [
        _Window(0, 5, caption={"vlm": "a cat"}),
        _Window(5, 10, caption={"vlm": "sits"}),
    ]
    keep.egomotion = {"pose": b"x"}
    video.clips = [keep]  # ``_dropped`` is in neither list now
    video.clip_stats.num_filtered_by_aesthetic += 1
    (back,) = call.outputs([given], to_conveyor=True)
    assert isinstance(back, CVideoTask) and back.task_id == "3.0"
    clips = back.data.clips
    assert [c.span[0] for c in clips] == [0.0, 1.0, 2.0, 3.0]  # the source's order
    first, second, third, fourth = clips
    assert first.kept and first.tags == [("cat", 0.9)] and first.frame_span == (0, 10)
    assert first.captions == {"vlm": "a cat sits"}
    assert first.embedding is not None and first.embedding.shape == (8,)
    assert first.carried["egomotion"] == {"pose": b"x"}
    assert second.filtered_by == "stage" and second.scores["aesthetic"] == 0.1
    assert third.filtered_by == "stage"  # dropped: rejected, and still recorded
    assert fourth.errors == {"transcode": "broken"}
    assert back.data.carried["clip_stats"].num_filtered_by_aesthetic == 1
    # the next Curator-style stage sees what Conveyor's model has no place for again
    again = to_curator(back).data
    assert len(again.clips[0].windows) == 2 and again.clips[0].egomotion == {"pose": b"x"}
    assert again.clip_stats.num_filtered_by_aesthetic == 1
    assert [c.span for c in again.filtered_clips] == [(1.0, 2.0), (2.0, 3.0)]


def test_a_clip_failed_by_a_stage_is_failed_for_conveyor() -> None:
    call, given = curator_side(conveyor_task(2))
    given.data.clips[0].errors["my_stage"] = "no faces"
    back = call.outputs(given, to_conveyor=True)  # process's single task
    first, second = back.data.clips
    assert not first.kept and first.errors == {"my_stage": "no faces"} and second.kept


def test_a_video_error_fails_the_video() -> None:
    call, given = curator_side(conveyor_task(2))
    given.data.errors["download"] = "gone"
    back = call.outputs(given, to_conveyor=True)
    assert back.data.failed and back.data.errors == {"download": "gone"} and not back.data.clips


def test_a_failed_video_passes_by_the_stage() -> None:
    task = conveyor_task(0)
    task.data.fail("VideoProbe", "not a video")
    call = Call("stage", [task])
    assert call.inputs == []
    assert call.outputs([], to_conveyor=True) == [task]
    (seen,) = call.outputs([], to_conveyor=False)
    assert isinstance(seen, VideoTask) and seen.data.errors == {"VideoProbe": "not a video"}


def test_a_video_given_as_several_tasks_becomes_parts_of_its_chunk() -> None:
    task = conveyor_task(4)
    task.data.clips[3].fail("transcode", "broken")
    call, given = curator_side(task)
    video = given.data
    halves = [
        dataclasses.replace(given, data=dataclasses.replace(video, clips=video.clips[:2])),
        dataclasses.replace(given, data=dataclasses.replace(video, clips=video.clips[2:])),
    ]
    outs = call.outputs(halves, to_conveyor=False)  # a Curator-style stage is next
    outs = [pickle.loads(pickle.dumps(t)) for t in outs]
    back = [to_conveyor_task(t, "next") for t in outs]
    assert [(t.data.part, t.data.parts) for t in back] == [(0, 2), (1, 2)]
    assert [len(t.data.clips) for t in back] == [3, 1]  # the held-back clip rides on part 0
    assert sum(c.errors != {} for t in back for c in t.data.clips) == 1
    # a part is not split again
    call, given = curator_side(back[0])
    twice = [given, dataclasses.replace(given, data=dataclasses.replace(given.data))]
    with pytest.raises(ValueError, match=r"gave 2 tasks of one part of video 'v.mp4'"):
        call.outputs(twice, to_conveyor=True)


def test_a_video_made_by_a_curator_style_stage(tmp_path: Path) -> None:
    from conveyor.samples.video import Segment, write_video

    path = tmp_path / "a.mp4"
    write_video(path, [Segment("pan", 1.0)], width=64, height=48, fps=10)
    video = Video(input_video=Path(path))
    video.populate_metadata()
    assert video.metadata.framerate == 10.0 and video.metadata.size == Path(path).stat().st_size
    assert VideoTask(dataset_name="d", data=video).validate()
    start = uuid.uuid5(uuid.NAMESPACE_URL, "a")
    video.clips = [Clip(uuid=start, source_video=str(path), span=(0.0, 0.5))]
    back = to_conveyor_task(VideoTask(dataset_name="d", data=video), "reader").data
    assert back.metadata is not None and back.metadata.fps == 10.0
    assert back.relative_path == str(Path(path)).lstrip("/") and back.whole
    assert back.source_size == Path(path).stat().st_size
    (clip,) = back.clips
    assert clip.clip_id == str(start) and clip.frame_span == (0, 5)
    # Conveyor's probe takes it from there
    probed = VideoProbe().process(CVideoTask(data=back))
    assert probed.data.metadata.num_frames == 10


def test_probing_bytes_names_what_is_wrong(tmp_path: Path) -> None:
    from conveyor.samples.video import Segment, write_video

    path = tmp_path / "a.mp4"
    write_video(path, [Segment("pan", 1.0)], width=64, height=48, fps=10)
    clip = Clip(uuid=uuid.uuid4(), source_video="a", span=(0, 1), buffer=Path(path).read_bytes())
    assert clip.extract_metadata() == {
        "width": 64,
        "height": 48,
        "framerate": 10.0,
        "num_frames": 10,
        "video_codec": "h264",
        "num_bytes": Path(path).stat().st_size,
    }
    assert Clip(uuid=uuid.uuid4(), source_video="a", span=(0, 1)).extract_metadata() is None
    with pytest.raises(InputError):
        Video(input_video=Path("x"), source_bytes=b"not a video").populate_metadata()
    assert not VideoTask(dataset_name="d", data=Video(input_video=tmp_path / "no")).validate()
    with pytest.raises(TypeError, match=r"VideoTask\.data must be a conveyor\.curator\.tasks"):
        VideoTask(dataset_name="d", data=CVideo("a", "a"))


class Passes(ProcessingStage[VideoTask, VideoTask]):
    name = "passes"

    def process(self, task: VideoTask) -> VideoTask:
        assert isinstance(task, VideoTask)
        return task


def test_the_adapter_converts_before_conveyors_stages_only() -> None:
    first, second, _probe, third = adapt_all(
        [Passes(), Passes().with_(name="again"), VideoProbe(), Passes().with_(name="last")]
    )
    assert (first.to_conveyor, second.to_conveyor, third.to_conveyor) == (False, True, False)
    task = conveyor_task(1)
    assert isinstance(first.process(task), VideoTask)
    assert isinstance(second.process(first.process(task)), CVideoTask)


class SplitsChunks(ProcessingStage[VideoTask, VideoTask]):
    """Gives each chunk as one task per clip (parts of the chunk), before the transcoder."""

    name = "splits_chunks"

    def process(self, task: VideoTask) -> list[VideoTask]:
        video = task.data
        return [
            dataclasses.replace(task, data=dataclasses.replace(video, clips=[clip]))
            for clip in video.clips
        ]


def test_parts_made_before_the_transcoder_are_all_recorded(tmp_path: Path) -> None:
    import json

    from conveyor.curator.backends.xenna import XennaExecutor
    from conveyor.curator.pipeline import Pipeline
    from conveyor.samples.video import Segment, write_video
    from conveyor.stages.video import ClipTranscoder, ClipWriter, FixedStrideSplitter

    path = tmp_path / "v.mp4"
    write_video(path, [Segment("fast", 4.0)], width=96, height=64, fps=12)
    start = CVideoTask(data=CVideo(str(path), "v.mp4"), dataset_name="videos")
    stages = [
        VideoProbe(),
        FixedStrideSplitter(clip_len_s=1.0, min_clip_s=0.5),  # chunks of 1, 2 and 1 clips
        SplitsChunks(),
        ClipTranscoder(preset="ultrafast"),
        ClipWriter(str(tmp_path / "out")),
    ]
    Pipeline("parts", "", stages).run(XennaExecutor(), initial_tasks=[start])
    record = json.loads((tmp_path / "out" / "videos" / "v.mp4.json").read_text())
    assert len(record["clips"]) == len(set(record["clips"])) == 4
    assert len(record["kept"]) == 4 and record["num_chunks"] == 3


def test_videos_a_stage_makes_anew_of_a_video_it_was_given_are_parts_of_it() -> None:
    # as NeMo Curator's transcoding stage chunks a video: Video(input_video=...) per chunk
    task = conveyor_task(4)
    task.data.clips[3].fail("transcode", "broken")
    call, given = curator_side(task)
    video = given.data
    halves = [
        VideoTask(
            task_id=f"{given.task_id}_chunk_{i}",
            dataset_name=given.dataset_name,
            data=Video(
                input_video=video.input_video,
                metadata=video.metadata,
                clips=video.clips[i * 2 : i * 2 + 2],
                num_total_clips=len(video.clips),
                num_clip_chunks=2,
                clip_chunk_index=i,
            ),
        )
        for i in range(2)
    ]
    back = call.outputs(halves, to_conveyor=True)
    assert [t.data.relative_path for t in back] == ["v.mp4", "v.mp4"]  # the source's name
    assert [(t.data.chunk_index, t.data.part, t.data.parts) for t in back] == [(0, 0, 2), (0, 1, 2)]
    assert [len(t.data.clips) for t in back] == [3, 1]  # the held-back clip rides on part 0
    assert back[0].data.clips[0].tags == [("cat", 0.9)]


def test_videos_made_anew_of_parts_given_in_one_batch_stay_their_parts() -> None:
    """A batch of two parts of one chunk (after the transcoder), each rebuilt as a new
    ``Video``: each is its own part again, not both the first."""
    task = conveyor_task(2)
    parts = [
        CVideoTask(data=task.data.part_of(i, 2, [task.data.clips[i]]), dataset_name="videos")
        for i in range(2)
    ]
    call = Call("stage", [pickle.loads(pickle.dumps(t)) for t in parts])
    rebuilt = [
        VideoTask(
            dataset_name="videos",
            data=Video(input_video=t.data.input_video, clips=list(t.data.clips)),
        )
        for t in call.inputs
    ]
    back = call.outputs(rebuilt, to_conveyor=True)
    assert [(t.data.part, t.data.parts) for t in back] == [(0, 2), (1, 2)]
    assert [t.data.clips[0].span for t in back] == [(0.0, 1.0), (1.0, 2.0)]


def test_captions_a_conveyor_stage_writes_after_windows_were_made_are_kept() -> None:
    call, given = curator_side(conveyor_task(1))
    given.data.clips[0].windows = [_Window(0, 5), _Window(5, 10)]  # to be captioned
    (back,) = call.outputs([given], to_conveyor=True)
    back.data.clips[0].captions["qwen"] = "a cat sits"  # Conveyor's captioner
    call, given = curator_side(back)
    first, second = given.data.clips[0].windows
    assert (first.caption, second.caption) == ({"qwen": "a cat sits"}, {})
    (again,) = call.outputs([given], to_conveyor=True)
    assert again.data.clips[0].captions == {"qwen": "a cat sits"}


def test_filtering_many_clips_costs_linear_time() -> None:
    import time

    clips = [
        CClip(clip_id("v.mp4", i, i + 1), "v.mp4", (i / 10, (i + 1) / 10), (i, i + 1))
        for i in range(20000)
    ]
    task = CVideoTask(data=CVideo("/data/v.mp4", "v.mp4", metadata=META, clips=clips))
    call = Call("stage", [task])
    (given,) = call.inputs
    video = given.data
    video.filtered_clips, video.clips = video.clips[::2], video.clips[1::2]
    start = time.perf_counter()
    (back,) = call.outputs([given], to_conveyor=True)
    assert time.perf_counter() - start < 2.0  # was quadratic: about 10 s
    assert sum(c.filtered_by == "stage" for c in back.data.clips) == 10000


def test_clips_a_stage_copies_are_the_clips_they_copy() -> None:
    call, given = curator_side(conveyor_task(3))
    video = given.data
    first, second, third = video.clips
    video.clips = [dataclasses.replace(first, aesthetic_score=0.9), copy.deepcopy(second)]
    video.filtered_clips = [dataclasses.replace(third)]
    (back,) = call.outputs([given], to_conveyor=True)
    clips = back.data.clips
    assert [c.span[0] for c in clips] == [0.0, 1.0, 2.0]  # each once
    assert [c.filtered_by for c in clips] == [None, None, "stage"]
    assert clips[0].scores["aesthetic"] == 0.9 and clips[0].kept and clips[1].kept


def test_two_clips_with_one_uuid_are_refused_naming_the_stage_and_video() -> None:
    """A clip cut in two with ``dataclasses.replace`` keeps its uuid: the two became one
    clip with the second's span, and the first was lost."""
    call, given = curator_side(conveyor_task(2))
    video = given.data
    first, second = video.clips
    video.clips = [
        dataclasses.replace(first, span=(0.0, 0.5)),
        dataclasses.replace(first, span=(0.5, 1.0)),
        second,
    ]
    with pytest.raises(ValueError, match=r"stage 'stage' gave video 'v.mp4' two clips with uuid"):
        call.outputs([given], to_conveyor=True)
    call, given = curator_side(conveyor_task(2))
    given.data.filtered_clips = [given.data.clips[1]]  # and left in clips too
    with pytest.raises(ValueError, match="in clips or in filtered_clips, not both"):
        call.outputs([given], to_conveyor=True)


def test_a_failed_video_passes_by_two_curator_style_stages_in_a_row() -> None:
    task = conveyor_task(0)
    task.data.fail("VideoProbe", "not a video")
    (seen,) = Call("first", [task]).outputs([], to_conveyor=False)
    second = Call("second", [pickle.loads(pickle.dumps(seen))])
    assert second.inputs == []  # not called
    (back,) = second.outputs([], to_conveyor=True)
    assert isinstance(back, CVideoTask) and back.data.errors == {"VideoProbe": "not a video"}
