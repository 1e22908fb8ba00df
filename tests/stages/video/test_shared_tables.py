"""Short videos written together share one clip table (``metadata/group-<hash>.parquet``):
what it holds, what each record says, and how a failed or redone video leaves every clip's
row exactly once."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from conveyor.media.layout import OutputLayout, is_group_table
from conveyor.stages.video.reader import VideoSources, list_videos, pending_videos
from conveyor.stages.video.shards import ShardWriter, finish_shards
from conveyor.stages.video.writer import ClipWriter
from conveyor.tasks.video import VideoTask, video_id
from tests.stages.video.test_layout_writer import chunk, clip

NAMES = ("a.mp4", "sub/b.mp4", "c.mp4", "d.mp4")


def short(relative: str, clips: int = 1, embedded: bool = False) -> VideoTask:
    """A video whole in one task (one chunk, the last), with ``clips`` clips."""
    made = [clip(relative, 10 * i, 10 * i + 10) for i in range(clips)]
    if not embedded:
        for c in made:
            c.embedding = None
    return chunk(relative, 0, made, last=True)


def rows_by_video(out: Path) -> dict[str, list[str]]:
    """Clip ids per video over the whole ``metadata/`` folder, read as one dataset."""
    table = ds.dataset(out / "metadata", format="parquet").to_table()
    found: dict[str, list[str]] = {}
    for vid, cid in zip(
        table.column("video_id").to_pylist(), table.column("clip_id").to_pylist(), strict=True
    ):
        found.setdefault(vid, []).append(cid)
    return found


def test_videos_written_together_share_one_table(tmp_path: Path) -> None:
    tasks = [short(name, clips=i + 1) for i, name in enumerate(NAMES)]
    expected = {t.data.video_id: [c.clip_id for c in t.data.clips] for t in tasks}
    outputs = ClipWriter(tmp_path).process_batch(tasks)
    layout = OutputLayout(tmp_path)
    tables = sorted(p.name for p in layout.metadata.iterdir())
    assert len(tables) == 1 and tables[0].startswith("group-")
    assert rows_by_video(tmp_path) == expected  # every clip once, each video's in order
    for task, name in zip(outputs, NAMES, strict=True):
        record = layout.read_record(name)
        assert record is not None and task.data.record == record
        assert record["clip_table"] == f"metadata/{tables[0]}"
        assert task.data.clips[0].encoded is None  # what goes back to the driver is small
    assert all((tmp_path / "clips" / f"{c}.mp4").exists() for ids in expected.values() for c in ids)
    assert not any(layout.staging.iterdir())
    # the same videos again (a run redoing them all) replace the table, not add one
    ClipWriter(tmp_path).process_batch([short(name, clips=i + 1) for i, name in enumerate(NAMES)])
    assert sorted(p.name for p in layout.metadata.iterdir()) == tables


def test_chunks_parts_and_embedded_videos_keep_a_table_each(tmp_path: Path) -> None:
    embedded = short("e.mp4", embedded=True)
    first_chunk = chunk("long.mp4", 0, [clip("long.mp4", 0, 10)])
    tasks = [short("a.mp4"), embedded, first_chunk, short("b.mp4")]
    ClipWriter(tmp_path).process_batch(tasks)
    layout = OutputLayout(tmp_path)
    names = {p.name for p in layout.metadata.iterdir()}
    own = f"{video_id('e.mp4')}.parquet"
    assert own in names and len(names) == 2  # e's own, and a and b's shared one
    assert layout.read_record("e.mp4")["clip_table"] == f"metadata/{own}"  # type: ignore[index]
    assert layout.embedding_path(video_id("e.mp4")).exists()  # dedup rewrites per video
    assert layout.read_record("long.mp4") is None  # its other chunk has yet to come
    assert is_group_table(layout.read_record("a.mp4")["clip_table"])  # type: ignore[index]


def test_one_video_alone_in_its_batch_has_its_own_table(tmp_path: Path) -> None:
    ClipWriter(tmp_path).process_batch([short("a.mp4")])
    vid = video_id("a.mp4")
    assert [p.name for p in (tmp_path / "metadata").iterdir()] == [f"{vid}.parquet"]
    assert OutputLayout(tmp_path).read_record("a.mp4")["clip_table"] == (  # type: ignore[index]
        f"metadata/{vid}.parquet"
    )


def test_a_video_without_clips_names_no_table(tmp_path: Path) -> None:
    empty = short("empty.mp4", clips=0)
    ClipWriter(tmp_path).process_batch([short("a.mp4"), empty, short("b.mp4")])
    layout = OutputLayout(tmp_path)
    assert layout.read_record("empty.mp4")["clip_table"] is None  # type: ignore[index]
    assert set(rows_by_video(tmp_path)) == {video_id("a.mp4"), video_id("b.mp4")}


def test_a_batch_that_fails_after_its_table_leaves_each_clip_once_when_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = [short(name, clips=2) for name in NAMES]
    retries = copy.deepcopy(tasks)  # the engine retries what was queued, not what was sent
    writer = ClipWriter(tmp_path)
    layout = writer._output()
    write_json = OutputLayout.write_json
    third = layout.video_record(NAMES[2])

    def full_disk(self: OutputLayout, path: Path, obj: object) -> None:
        if path == third:
            raise OSError(28, "No space left on device")
        write_json(self, path, obj)

    monkeypatch.setattr(OutputLayout, "write_json", full_disk)
    with pytest.raises(OSError, match="No space"):
        writer.process_batch(tasks)
    group = next(p for p in layout.metadata.iterdir() if p.name.startswith("group-"))
    assert layout.read_record(NAMES[0]) is not None  # two records made it, pointing there
    monkeypatch.setattr(OutputLayout, "write_json", write_json)
    # the engine tries each input of a failed batch again alone
    for n, task in enumerate(retries):
        writer.process_batch([task])
        if n == 0:  # the group holds the others' rows until each is redone
            assert set(rows_by_video(tmp_path)[video_id(NAMES[1])]) and group.exists()
    assert not group.exists()  # every row it held now lives in its video's own table
    assert rows_by_video(tmp_path) == {
        t.data.video_id: [c.clip_id for c in t.data.clips] for t in retries
    }


def test_a_redone_video_leaves_the_others_rows_in_the_shared_table(tmp_path: Path) -> None:
    tasks = [short(name) for name in NAMES]
    ClipWriter(tmp_path).process_batch(tasks)
    layout = OutputLayout(tmp_path)
    before = rows_by_video(tmp_path)
    # the source of one changed: the next run resets it, then writes it again
    assert layout.reset(NAMES[1]) > 0
    after = rows_by_video(tmp_path)
    assert set(after) == set(before) - {video_id(NAMES[1])}
    assert all(after[v] == before[v] for v in after)
    ClipWriter(tmp_path).process(short(NAMES[1]))
    assert rows_by_video(tmp_path) == before
    # reset of every member leaves no table behind
    for name in NAMES:
        layout.reset(name)
    assert not any(layout.metadata.iterdir())


def test_a_video_killed_before_its_record_is_dropped_from_the_group_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = [short(name) for name in NAMES]
    layout = OutputLayout(tmp_path)
    write_json = OutputLayout.write_json
    last = layout.video_record(NAMES[-1])

    def killed(self: OutputLayout, path: Path, obj: object) -> None:
        if path == last:
            raise KeyboardInterrupt  # as good as a kill for what is on disk
        write_json(self, path, obj)

    monkeypatch.setattr(OutputLayout, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        ClipWriter(tmp_path).process_batch(tasks)
    monkeypatch.setattr(OutputLayout, "write_json", write_json)
    # the next run finds the last video unfinished (its intent is in staging)
    assert video_id(NAMES[-1]) in layout.started_videos()
    layout.reset(NAMES[-1])
    assert set(rows_by_video(tmp_path)) == {video_id(n) for n in NAMES[:-1]}


@pytest.mark.parametrize("records", ["counted", "written before the count"])
@pytest.mark.parametrize("listing", ["streamed", "all at once"])
def test_a_deleted_record_leaves_no_second_row_of_its_clips(
    tmp_path: Path, listing: str, records: str
) -> None:
    """Deleting a record (how a user has a video done again) left its old rows in the
    group table beside its new ones: the same clip twice in ``metadata/``. The listing
    counts the records naming each group against its ``clip_table_videos``."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    for name in NAMES:  # sources of the size and time the records say
        (inputs / name).parent.mkdir(parents=True, exist_ok=True)
        (inputs / name).write_bytes(b"x" * 1234)
        os.utime(inputs / name, (1700000000.5, 1700000000.5))
    ClipWriter(out).process_batch([short(name, clips=2) for name in NAMES])
    before = rows_by_video(out)
    layout = OutputLayout(out)
    assert layout.read_record(NAMES[0])["clip_table_videos"] == len(NAMES)  # type: ignore[index]
    if records != "counted":  # an output of the version before: its tables are read
        for name in NAMES:
            record = layout.read_record(name)
            assert record is not None
            del record["clip_table_videos"]
            layout.write_json(layout.video_record(name), record)
    layout.video_record(NAMES[1]).unlink()
    if listing == "streamed":  # run_video's
        todo = [s.relative_path for s in VideoSources(str(inputs), str(out))]
    else:  # VideoListing's, given a seed task
        todo = [s.relative_path for s in pending_videos(list_videos(str(inputs)), str(out))]
    assert todo == [NAMES[1]]
    assert set(rows_by_video(out)) == {video_id(n) for n in NAMES} - {video_id(NAMES[1])}
    ClipWriter(out).process(short(NAMES[1], clips=2))
    assert rows_by_video(out) == before  # each clip once
    # a consistent output costs no rewrite: the next listing drops nothing
    group = next(layout.metadata.glob("group-*.parquet"))
    stamp = group.stat().st_mtime_ns
    assert list(VideoSources(str(inputs), str(out))) == [] and group.stat().st_mtime_ns == stamp


def test_shards_read_a_video_s_metas_from_its_shared_table(tmp_path: Path) -> None:
    written = ClipWriter(tmp_path).process_batch([short(name, clips=2) for name in NAMES])
    sharder = ShardWriter(tmp_path)
    for task in written:
        sharder.process(task)
    finish_shards(tmp_path, sharder.shard_mb, NAMES)
    import tarfile

    (shard,) = (tmp_path / "shards").glob("*.tar")
    with tarfile.open(shard) as tar:
        members = tar.getnames()
    ids = [c.clip_id for t in written for c in t.data.clips]
    assert members == [f"{cid}.{ext}" for cid in ids for ext in ("mp4", "json")]


def test_a_shared_table_in_a_bucket_loses_a_redone_video_s_rows(bucket: str) -> None:
    output = f"{bucket}/out"
    written = ClipWriter(output).process_batch([short(name) for name in NAMES])
    layout = OutputLayout(output)
    (table,) = layout.metadata.glob("*.parquet")
    assert table.name.startswith("group-") and layout.read_table(table).num_rows == len(NAMES)
    layout.reset(NAMES[0])
    rows = layout.read_table(table)
    assert rows.column("video_id").to_pylist() == [t.data.video_id for t in written[1:]]
    for name in NAMES[1:]:
        layout.reset(name)
    assert not table.exists()
