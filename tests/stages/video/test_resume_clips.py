"""A video stopped part way resumes from the clips it finished: the listing keeps their
staged parts (``OutputLayout.resume_video``), the splitter marks them restored, no stage
works on them again, and the writer adopts them, so that the output is the one a run never
stopped writes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from conveyor.media.layout import OutputLayout, resumed_clips
from conveyor.stages.video.reader import VideoListing, list_videos
from conveyor.stages.video.split import chunk_clips, make_clips
from conveyor.stages.video.writer import ClipWriter
from conveyor.storage import ObjectPath
from conveyor.tasks import EmptyTask
from conveyor.tasks.video import Video, VideoTask, video_id
from tests.stages.video.test_layout_writer import META, files_under

REL = "v.mp4"
SIZE, MTIME = 1234, 1700000000.5
#: six clips of one video; chunks of 1, 2, 2, 1 clips
SPANS = [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50), (50, 60)]


def tasks(resume: tuple[int, str] | None = None, spans=SPANS, per_chunk: int = 2) -> list[Any]:
    """The video's parts as the splitter and transcoder send them: restored clips as they
    are, the others "encoded" (bytes, frames, an embedding from their span)."""
    generation, finished = resume or (0, None)
    video = Video(
        f"/data/{REL}",
        REL,
        metadata=META,
        source_size=SIZE,
        source_mtime=MTIME,
        resume=finished,
        generation=generation,
    )
    parts = []
    for chunk in chunk_clips(video, make_clips(video, list(spans)), per_chunk):
        for clip in chunk.clips:
            if not clip.restored:
                clip.encoded = f"mp4 of {clip.clip_id}".encode()
                clip.width, clip.height, clip.fps, clip.codec = 64, 48, 10.0, "h264"
                clip.num_frames = clip.frame_span[1] - clip.frame_span[0]
                rng = np.random.default_rng(clip.frame_span[0])
                clip.embedding = rng.standard_normal(8).astype(np.float32)
                if clip.frame_span[0] == 20:
                    clip.reject("motion")
        for k, clip in enumerate(chunk.clips):
            parts.append(VideoTask(data=chunk.part_of(k, len(chunk.clips), [clip])))
    return parts


def written(root: Path | ObjectPath, parts: list[Any]) -> list[Any]:
    writer = ClipWriter(root, write_filtered=True)
    return [writer.process(part) for part in parts]


def output(root: Path) -> dict[str, Any]:
    """What a reader of the output sees (the record without its time)."""
    layout = OutputLayout(root)
    record = layout.read_record(REL)
    assert record is not None
    record.pop("finished_at")
    vid = video_id(REL)
    return {
        "record": record,
        "files": files_under(root / "clips")
        + files_under(root / "filtered_clips")
        + files_under(root / "metas"),
        "metas": [json.loads(p.read_text()) for p in sorted((root / "metas").glob("*.json"))],
        "clips": pq.read_table(layout.clip_table_path(vid)).to_pylist(),
        "embeddings": pq.read_table(layout.embedding_path(vid)).to_pylist(),
        "staging": files_under(root / ".conveyor" / "staging"),
    }


@pytest.fixture
def reference(tmp_path: Path) -> dict[str, Any]:
    written(tmp_path / "ref", tasks())
    return output(tmp_path / "ref")


def with_resumed(reference: dict[str, Any], clips: int, seconds: float) -> dict[str, Any]:
    """``reference`` as a resumed output records it: with the clips it adopted."""
    record = {**reference["record"], "resumed_clips": clips, "resumed_seconds": seconds}
    return {**reference, "record": record}


def stamps(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in (root / "clips").glob("*.mp4")}


def test_a_video_stopped_part_way_ends_as_a_run_never_stopped(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    out = tmp_path / "out"
    layout = OutputLayout(out)
    first = tasks()
    written(out, first[:3])  # chunk 0, and chunk 1 whole: three clips finished
    before = stamps(out)
    # the fourth part was being written: its intent and clip, no record
    stopped = first[3].data.clips[0]
    writer = ClipWriter(out)
    writer._write_clips(first[3].data, layout, "metadata/x.parquet")
    assert layout.clip_path(stopped.clip_id).exists()

    resume = layout.resume_video(REL, SIZE, MTIME)
    assert resume is not None and resume[0] == 1
    finished = [c.clip_id for t in first[:3] for c in t.data.clips]
    assert sorted(resumed_clips(resume[1])) == sorted(finished)
    assert not layout.clip_path(stopped.clip_id).exists()  # the unfinished part's clip went

    again = tasks(resume)
    restored = [c.clip_id for t in again for c in t.data.clips if c.restored]
    assert restored == finished
    assert all(not c.active for t in again for c in t.data.clips if c.restored)
    written(out, again)
    found = output(out)
    assert found["record"]["resumed_clips"] == 3 and found["record"]["resumed_seconds"] == 3.0
    assert found == with_resumed(reference, 3, 3.0)
    # the finished clips were not written again
    assert {n: i for n, i in stamps(out).items() if n in before} == before


def test_the_resumed_attempt_may_group_its_clips_otherwise(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """The shot splitter's chunks follow the order its windows came in: another attempt at
    the video groups the same clips in other chunks."""
    out = tmp_path / "out"
    first = tasks(per_chunk=1)  # every clip its own chunk
    written(out, [first[0], first[2], first[4]])
    resume = OutputLayout(out).resume_video(REL, SIZE, MTIME)
    assert resume is not None
    written(out, list(reversed(tasks(resume, per_chunk=4))))
    found = output(out)
    assert found["record"].pop("num_chunks") == 3  # this attempt's (the reference's: 4)
    reference["record"].pop("num_chunks")
    assert found == with_resumed(reference, 3, 3.0)


def test_a_finished_clip_the_next_attempt_does_not_make_is_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    layout = OutputLayout(out)
    spans = [(0, 10), (10, 25), (25, 30)]  # an attempt whose second shot came out longer
    first = tasks(spans=spans)
    written(out, first[:2])
    gone = first[1].data.clips[0].clip_id
    resume = layout.resume_video(REL, SIZE, MTIME)
    assert resume is not None
    written(out, tasks(resume))
    assert not layout.clip_path(gone).exists() and not layout.meta_path(gone).exists()
    written(tmp_path / "ref", tasks())
    assert output(out) == with_resumed(output(tmp_path / "ref"), 1, 1.0)


def test_a_video_stopped_twice_adopts_both_earlier_attempts(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    out = tmp_path / "out"
    layout = OutputLayout(out)
    written(out, tasks()[:2])
    first = layout.resume_video(REL, SIZE, MTIME)
    assert first is not None
    written(out, tasks(first)[:5])  # two adopted, three made
    second = layout.resume_video(REL, SIZE, MTIME)
    assert second is not None and second[0] == 2
    assert len(resumed_clips(second[1])) == 5
    written(out, tasks(second))
    assert output(out) == with_resumed(reference, 5, 5.0)


@pytest.mark.parametrize("change", ["size", "mtime"])
def test_a_changed_source_starts_its_video_over(tmp_path: Path, change: str) -> None:
    out = tmp_path / "out"
    layout = OutputLayout(out)
    written(out, tasks()[:3])
    size, mtime = (SIZE + 1, MTIME) if change == "size" else (SIZE, MTIME + 1)
    assert layout.resume_video(REL, size, mtime) is None
    assert files_under(out / "clips") == files_under(out / "metas") == []
    assert not layout.staging_dir(video_id(REL)).exists()


def test_a_video_with_a_record_starts_over(tmp_path: Path) -> None:
    """A record of a pending video is outdated (another source), or one of its kept clips
    was deleted: nothing of it is kept."""
    out = tmp_path / "out"
    layout = OutputLayout(out)
    written(out, tasks()[:3])
    layout.write_json(layout.video_record(REL), {"clips": [], "source": {}})
    assert layout.resume_video(REL, SIZE, MTIME) is None
    assert layout.read_record(REL) is None
    assert files_under(out / "clips") == []


def test_nothing_finished_or_an_unreadable_part_record_starts_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    layout = OutputLayout(out)
    written(out, tasks()[:1])
    staging = layout.staging_dir(video_id(REL))
    (record,) = staging.glob("chunk-*.json")
    record.write_text("{cut off")
    assert layout.resume_video(REL, SIZE, MTIME) is None
    assert files_under(out / "clips") == [] and not staging.exists()


def test_the_listing_stage_resumes_the_videos_it_lists(tmp_path: Path) -> None:
    """``VideoListing(inputs, output)`` listing itself (the Python API's reader)."""
    source = tmp_path / "in" / REL
    source.parent.mkdir()
    source.write_bytes(b"x" * SIZE)
    os.utime(source, (MTIME, MTIME))
    out = tmp_path / "out"
    written(out, tasks()[:3])
    (listed,) = VideoListing(tmp_path / "in", out).process(EmptyTask())
    assert listed.data.generation == 1 and listed.data.resume is not None
    assert len(resumed_clips(listed.data.resume)) == 3
    (source_task,) = list_videos(tmp_path / "in")
    assert source_task.size == SIZE and source_task.mtime == MTIME


def test_the_shot_windows_carry_the_resume_to_the_splitter() -> None:
    from conveyor.stages.video.shots import ShotWindows

    video = Video(f"/data/{REL}", REL, metadata=META, resume="/o/resume-g2.json", generation=2)
    windows = ShotWindows(window_s=3.0).process_video(video)
    assert len(windows) > 1
    assert {(w.resume, w.generation) for w in windows} == {("/o/resume-g2.json", 2)}


def test_a_video_in_a_bucket_resumes_from_its_finished_clips(memory: ObjectPath) -> None:
    out = memory / "out"
    layout = OutputLayout(out)
    written(out, tasks()[:3])
    resume = layout.resume_video(REL, SIZE, MTIME)
    assert resume is not None and len(resumed_clips(resume[1])) == 3
    written(out, tasks(resume))
    record = layout.read_record(REL)
    assert record is not None and record["resumed_clips"] == 3
    assert record["clips"] == [c.clip_id for t in tasks() for c in t.data.clips]
    assert len(layout.clips.glob("*.mp4")) == len(record["kept"]) == 5
    assert layout.staging.find() == []


def test_a_part_whose_staged_table_is_gone_is_not_finished(tmp_path: Path) -> None:
    """Adopted, it would have kept its video from ever being finalised."""
    out = tmp_path / "out"
    layout = OutputLayout(out)
    written(out, tasks()[:3])
    staging = layout.staging_dir(video_id(REL))
    gone = sorted(staging.glob("embed-*.parquet"))[-1]
    gone.unlink()
    resume = layout.resume_video(REL, SIZE, MTIME)
    assert resume is not None and len(resumed_clips(resume[1])) == 2
    written(out, tasks(resume))
    assert output(out)["record"]["resumed_clips"] == 2


def test_an_adopted_part_whose_own_record_is_gone_keeps_its_tables(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """Deleting the first attempt's record of a part the second adopted removed the tables
    the second's record names: the video never finalised, said as "not finished"."""
    out = tmp_path / "out"
    layout = OutputLayout(out)
    written(out, tasks()[:2])
    first = layout.resume_video(REL, SIZE, MTIME)
    assert first is not None
    written(out, tasks(first)[:5])
    (layout.staging_dir(video_id(REL)) / "chunk-000000-000000.json").unlink()
    second = layout.resume_video(REL, SIZE, MTIME)
    assert second is not None
    written(out, tasks(second))
    assert output(out)["record"]["clips"] == reference["record"]["clips"]
    assert output(out)["staging"] == []


def test_a_part_whose_kept_clip_was_deleted_is_redone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    layout = OutputLayout(out)
    first = tasks()
    written(out, first[:3])
    gone = first[0].data.clips[0].clip_id
    layout.clip_path(gone).unlink()
    resume = layout.resume_video(REL, SIZE, MTIME)
    assert resume is not None and gone not in resumed_clips(resume[1])
    written(out, tasks(resume))
    assert layout.clip_path(gone).exists()
    assert output(out)["record"]["resumed_clips"] == 2


def test_a_complete_video_s_leftover_staging_is_swept_at_the_next_listing(
    tmp_path: Path,
) -> None:
    """A stop between the record and the staging's removal left it for good."""
    from conveyor.stages.video.reader import pending_videos

    source = tmp_path / "in" / REL
    source.parent.mkdir()
    source.write_bytes(b"x" * SIZE)
    os.utime(source, (MTIME, MTIME))
    out = tmp_path / "out"
    written(out, tasks())
    staging = OutputLayout(out).staging_dir(video_id(REL))
    staging.mkdir(parents=True)
    (staging / "chunk-000000-000000.json").write_text("{}")
    assert pending_videos(list_videos(tmp_path / "in"), out) == []
    assert not staging.exists()
