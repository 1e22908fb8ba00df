"""The video stages on URLs, in-process through fsspec's memory store: listing, probing and
decoding streamed from the store, the output layout and the writer, and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.media.decode import decode_range, probe
from conveyor.media.errors import InputError
from conveyor.media.layout import OutputLayout
from conveyor.samples.video import write_bad_file
from conveyor.stages.video.reader import (
    VideoListing,
    check_inputs,
    input_root,
    list_videos,
    pending_videos,
)
from conveyor.stages.video.writer import ClipWriter
from conveyor.storage import ObjectPath
from conveyor.tasks.base import Task
from conveyor.tasks.video import video_id
from tests.s3_server import put

from .conftest import Media
from .test_layout_writer import chunk, clip


def test_listing_a_prefix(memory: ObjectPath) -> None:
    for name in ("b.mp4", "a.MOV", "sub/c.mkv", "notes.txt", ".d.mp4", "sub/.git/e.mp4"):
        put(memory / "in" / name, b"x" * 10)
    put(memory / "in" / "out" / "clips" / "f.mp4", b"clip")  # the output, inside the input
    found = list_videos(str(memory / "in"), exclude=[str(memory / "in" / "out")])
    assert [s.relative_path for s in found] == ["a.MOV", "b.mp4", "sub/c.mkv"]
    assert found[1].path == f"{memory}/in/b.mp4" and found[1].size == 10
    assert found[1].mtime > 0
    assert [s.relative_path for s in list_videos(f"{memory}/in/sub/c.mkv")] == ["c.mkv"]
    both = list_videos([f"{memory}/in/b.mp4", f"{memory}/in/sub/c.mkv"])
    assert [s.relative_path for s in both] == ["b.mp4", "sub/c.mkv"]
    assert input_root([f"{memory}/in/b.mp4", f"{memory}/in/sub"]) == memory / "in"
    with pytest.raises(FileNotFoundError, match=rf"input '{memory}/nothing' does not exist"):
        check_inputs(f"{memory}/nothing")
    with pytest.raises(ValueError, match="mix local paths and URLs"):
        list_videos([f"{memory}/in/b.mp4", "local.mp4"])


def test_probe_and_decode_stream_from_the_store(media: Media, memory: ObjectPath) -> None:
    source = media.standard()
    url = put(memory / "standard.mp4", source.path.read_bytes())
    meta = probe(url)
    assert meta == media.metadata(source.path)
    local = [round(t, 4) for t, _ in decode_range(str(source.path), meta, 1.0, 2.5)]
    remote = [round(t, 4) for t, _ in decode_range(url, meta, 1.0, 2.5)]
    assert remote == local and len(remote) == 18


def test_bad_inputs_on_a_url_fail_with_their_reason(memory: ObjectPath, tmp_path: Path) -> None:
    truncated = write_bad_file(tmp_path / "t.mp4", "truncated")
    url = put(memory / "t.mp4", truncated.read_bytes())
    with pytest.raises(InputError, match="truncated or unfinished MP4"):
        probe(url)
    with pytest.raises(InputError, match="empty file"):
        probe(put(memory / "e.mp4", b""))
    with pytest.raises(InputError, match=rf"cannot read the file: '{memory}/gone.mp4' does not"):
        probe(f"{memory}/gone.mp4")


def test_the_writer_and_resume_on_a_store(memory: ObjectPath) -> None:
    out = memory / "out"
    writer = ClipWriter(str(out))
    clips = [clip("v.mp4", 0, 10), clip("v.mp4", 10, 20, filtered_by="motion")]
    writer.process(chunk("v.mp4", 1, [clips[1]], last=True))
    layout = OutputLayout(str(out))
    vid = video_id("v.mp4")
    assert layout.started_videos() == {vid}  # staging only, so far
    assert layout.read_records(["v.mp4"]) == {"v.mp4": None}
    writer.process(chunk("v.mp4", 0, [clips[0]]))

    record = json.loads((out / "videos" / "v.mp4.json").read_bytes())
    assert record["clips"] == [clips[0].clip_id, clips[1].clip_id]
    assert record["kept"] == [clips[0].clip_id]
    kept = out / "clips" / f"{clips[0].clip_id}.mp4"
    assert kept.read_bytes() == f"mp4 of {clips[0].clip_id}".encode()
    assert layout.read_table(layout.embedding_path(vid)).num_rows == 1
    assert not layout.staging_dir(vid).exists() and (out / ".conveyor" / "tmp").find() == []
    assert layout.started_videos() == {vid}  # the record now
    assert layout.is_complete("v.mp4", 1234, 1700000000.5)

    # resume: the finished video is skipped, a changed one is reset and done again
    source = put(memory / "in" / "v.mp4", b"x" * 1234)
    listed = list_videos(source)
    assert pending_videos(listed, str(out)) == listed  # another modification time
    put(out / ".conveyor" / "tmp" / ".x.json.abc.tmp", b"{half")  # a killed run's temporary
    tasks = VideoListing(source, str(out)).process(Task(data=None))
    assert [t.data.relative_path for t in tasks] == ["v.mp4"]
    assert layout.read_record("v.mp4") is None and layout.started_videos() == set()
    assert not kept.exists()
    assert (out / ".conveyor" / "tmp").find() == []


def test_started_videos_on_a_local_output_too(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    writer.process(chunk("a/v.mp4", 0, [clip("a/v.mp4", 0, 10)]))  # unfinished: staging only
    writer.process(chunk("w.mp4", 0, [clip("w.mp4", 0, 10)], last=True))  # finished: a record
    assert OutputLayout(tmp_path).started_videos() == {video_id("a/v.mp4"), video_id("w.mp4")}
    assert OutputLayout(tmp_path / "fresh").started_videos() == set()
