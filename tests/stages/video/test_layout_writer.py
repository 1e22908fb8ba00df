"""The output layout (atomic writes, resume bookkeeping) and the writer that fills it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.media import layout as layout_module
from conveyor.media.layout import OutputLayout, relative_paths
from conveyor.stages.video.writer import NO_CLIPS, ClipWriter
from conveyor.tasks.video import Clip, Video, VideoMetadata, VideoTask, clip_id, video_id

META = VideoMetadata(duration_s=10.0, fps=10.0, num_frames=100, width=64, height=48, codec="h264")
DIM = 8


def clip(relative: str, start: int, end: int, **fields: object) -> Clip:
    """A made (encoded) clip of ``relative`` with an embedding, kept unless told otherwise."""
    cid = clip_id(relative, start, end)
    rng = np.random.default_rng(start)
    made = Clip(
        cid,
        relative,
        (start / 10, end / 10),
        (start, end),
        encoded=f"mp4 of {cid}".encode(),
        width=64,
        height=48,
        fps=10.0,
        num_frames=end - start,
        codec="h264",
        embedding=rng.standard_normal(DIM).astype(np.float32),
    )
    for name, value in fields.items():
        setattr(made, name, value)
    return made


def chunk(
    relative: str, index: int, clips: list[Clip], last: bool = False, **fields: object
) -> VideoTask:
    video = Video(
        f"/data/{relative}",
        relative,
        metadata=META,
        clips=clips,
        chunk_index=index,
        last_chunk=last,
        source_size=1234,
        source_mtime=1700000000.5,
        **fields,  # type: ignore[arg-type]
    )
    return VideoTask(data=video, dataset_name="test")


def read_json(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# -- the layout ---------------------------------------------------------------------------
def test_paths(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    assert layout.clip_path("c") == tmp_path / "clips" / "c.mp4"
    assert layout.clip_path("c", kept=False) == tmp_path / "filtered_clips" / "c.mp4"
    assert layout.meta_path("c") == tmp_path / "metas" / "c.json"
    assert layout.embedding_path("v") == tmp_path / "embeddings" / "v.parquet"
    assert layout.text_embedding_path("v") == tmp_path / "text_embeddings" / "v.parquet"
    assert layout.video_record("a/b.mp4") == tmp_path / "videos" / "a" / "b.mp4.json"
    assert layout.staging_dir("v") == tmp_path / ".conveyor" / "staging" / "v"


def test_writes_go_through_tmp_and_leave_nothing_there(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    layout.write_bytes(tmp_path / "deep" / "er" / "x.bin", b"abc")
    layout.write_json(tmp_path / "y.json", {"k": "é"})
    layout.write_parquet(tmp_path / "z.parquet", pa.table({"a": [1, 2]}))
    assert (tmp_path / "deep" / "er" / "x.bin").read_bytes() == b"abc"
    assert read_json(tmp_path / "y.json") == {"k": "é"}
    assert pq.read_table(tmp_path / "z.parquet").column("a").to_pylist() == [1, 2]
    assert layout.tmp.is_dir() and list(layout.tmp.iterdir()) == []


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = OutputLayout(tmp_path)
    seen: list[str] = []

    def broken_replace(source: str, target: object) -> None:
        seen.append(source)
        assert Path(source).parent == layout.tmp  # written under .conveyor/tmp first
        raise OSError("disk full")

    monkeypatch.setattr(layout_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        layout.write_bytes(tmp_path / "x.bin", b"abc")
    with pytest.raises(OSError, match="disk full"):
        layout.write_parquet(tmp_path / "z.parquet", pa.table({"a": [1]}))
    assert len(seen) == 2
    assert not (tmp_path / "x.bin").exists() and not (tmp_path / "z.parquet").exists()
    assert list(layout.tmp.iterdir()) == []


def test_read_record_and_is_complete(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    assert layout.read_record("v.mp4") is None
    record = layout.video_record("v.mp4")
    record.parent.mkdir(parents=True)
    record.write_text("{half")
    assert layout.read_record("v.mp4") is None
    record.write_text("[1, 2]")
    assert layout.read_record("v.mp4") is None
    layout.write_json(record, {"source": {"size_bytes": 10, "mtime": 5.25}})
    assert layout.read_record("v.mp4") == {"source": {"size_bytes": 10, "mtime": 5.25}}
    assert layout.is_complete("v.mp4", 10, 5.25)
    assert not layout.is_complete("v.mp4", 11, 5.25)
    assert not layout.is_complete("v.mp4", 10, 5.5)
    assert not layout.is_complete("other.mp4", 10, 5.25)


def test_sweep_tmp(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    assert layout.sweep_tmp() == 0
    layout.tmp.mkdir(parents=True)
    for name in ("a.json.1", "b.mp4.2"):
        (layout.tmp / name).write_text("half")
    assert layout.sweep_tmp() == 2
    assert list(layout.tmp.iterdir()) == []


def test_relative_paths(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    for rel in ("b.mp4", "a/c.mkv"):
        layout.write_json(layout.video_record(rel), {})
    records = list(layout.videos.rglob("*.json"))
    assert relative_paths(records, layout.videos) == ["a/c.mkv", "b.mp4"]


@pytest.mark.parametrize("name", ["w" * 251 + ".mp4", "視" * 83 + ".mp4"], ids=["ascii", "cjk"])
def test_a_video_named_up_to_the_file_system_limit_gets_its_record(
    tmp_path: Path, name: str
) -> None:
    # 255 bytes, the most a file name can have: with ".json" the record's name was too long
    # for the disk, and the video stayed "incomplete" in every run
    writer = ClipWriter(tmp_path)
    writer.process(chunk(f"sub/{name}", 0, [clip(f"sub/{name}", 0, 10)], last=True))
    layout = OutputLayout(tmp_path)
    record = layout.video_record(f"sub/{name}")
    assert record.parent == layout.videos / "sub" and len(record.name.encode()) <= 255
    assert record.name.endswith(".json") and record.name.startswith(name[:40])
    assert layout.read_record(f"sub/{name}")["source_video"] == f"sub/{name}"  # type: ignore[index]
    assert layout.is_complete(f"sub/{name}", 1234, 1700000000.5)
    assert layout.video_record("sub/short.mp4").name == "short.mp4.json"  # as before


def test_reset_removes_a_finished_video_found_through_its_record(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path, write_filtered=True)
    kept, filtered = clip("v.mp4", 0, 10), clip("v.mp4", 10, 20, filtered_by="motion")
    kept.text_embedding = np.ones(4, np.float32)
    writer.process(chunk("v.mp4", 0, [kept, filtered], last=True))
    writer.process(chunk("other.mp4", 0, [clip("other.mp4", 0, 10)], last=True))
    before = files_under(tmp_path)
    layout = OutputLayout(tmp_path)

    removed = layout.reset("v.mp4")

    vid = video_id("v.mp4")
    gone = {
        f"clips/{kept.clip_id}.mp4",
        f"filtered_clips/{filtered.clip_id}.mp4",
        f"metas/{kept.clip_id}.json",
        f"metas/{filtered.clip_id}.json",
        f"metadata/{vid}.parquet",
        f"embeddings/{vid}.parquet",
        f"text_embeddings/{vid}.parquet",
        "videos/v.mp4.json",
    }
    assert gone <= set(before)
    assert removed == len(gone)
    assert files_under(tmp_path) == sorted(set(before) - gone)
    assert layout.read_record("other.mp4") is not None


def test_reset_removes_what_an_unfinished_video_left(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    first = [clip("v.mp4", 0, 10), clip("v.mp4", 10, 20)]
    writer.process(chunk("v.mp4", 0, first))  # killed before the last chunk came
    layout = OutputLayout(tmp_path)
    assert layout.clip_path(first[0].clip_id).exists()

    layout.reset("v.mp4")

    assert not layout.staging_dir(video_id("v.mp4")).exists()
    assert files_under(tmp_path / "clips") == []
    assert files_under(tmp_path / "metas") == []


def test_reset_always_removes_the_staging(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    writer.process(chunk("v.mp4", 0, [clip("v.mp4", 0, 10)]))
    layout = OutputLayout(tmp_path)
    assert layout.staging_dir(video_id("v.mp4")).is_dir()
    layout.reset("v.mp4")
    assert not layout.staging_dir(video_id("v.mp4")).exists()
    assert layout.reset("never-seen.mp4") == 0


# -- the writer ---------------------------------------------------------------------------
def test_a_chunk_is_staged_with_its_intent_first(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    kept = clip("v.mp4", 0, 10)
    filtered = clip("v.mp4", 10, 20, filtered_by="motion")
    broken = clip("v.mp4", 20, 30, encoded=None, num_frames=0, embedding=None)
    broken.fail("ClipTranscoder", "no frame could be decoded")
    writer.process(chunk("v.mp4", 0, [kept, filtered, broken]))

    layout = OutputLayout(tmp_path)
    staging = layout.staging_dir(video_id("v.mp4"))
    assert sorted(p.name for p in staging.iterdir()) == [
        "chunk-000000-000000.json",
        "clips-000000-000000.parquet",
        "embed-000000-000000.parquet",
        "intent-000000-000000.json",
    ]
    intent = read_json(staging / "intent-000000-000000.json")
    assert intent == {
        "clip_ids": [kept.clip_id, filtered.clip_id, broken.clip_id],
        "clip_table": f"metadata/{video_id('v.mp4')}.parquet",
    }
    record = read_json(staging / "chunk-000000-000000.json")
    assert record["clips"] == [kept.clip_id, filtered.clip_id]
    assert record["kept"] == [kept.clip_id]
    assert record["filtered"] == {"motion": [filtered.clip_id]}
    assert record["clip_errors"][0]["clip_id"] == broken.clip_id
    assert files_under(tmp_path / "clips") == [f"{kept.clip_id}.mp4"]
    assert files_under(tmp_path / "metas") == sorted(
        [f"{kept.clip_id}.json", f"{filtered.clip_id}.json"]
    )
    assert not (tmp_path / "filtered_clips").exists()
    assert layout.read_record("v.mp4") is None  # not finished: one more chunk to come
    assert not (tmp_path / "embeddings").exists()


def test_the_meta_of_a_clip(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    kept = clip(
        "v.mp4",
        0,
        10,
        scores={"motion_global_mean": 0.25, "aesthetic": 5},
        tags=[("tabby cat", 0.5)],
        captions={"tiny": "a cat"},
    )
    encoded = kept.encoded
    writer.process(chunk("v.mp4", 0, [kept], last=True))
    meta = read_json(tmp_path / "metas" / f"{kept.clip_id}.json")
    assert meta["clip_id"] == kept.clip_id
    assert meta["source_video"] == "v.mp4"
    assert meta["span"] == [0.0, 1.0] and meta["frame_span"] == [0, 10]
    assert meta["duration_s"] == 1.0
    assert (meta["width"], meta["height"], meta["fps"], meta["num_frames"]) == (64, 48, 10.0, 10)
    assert meta["codec"] == "h264"
    assert meta["num_bytes"] == len(f"mp4 of {kept.clip_id}")
    assert meta["clip_location"] == f"clips/{kept.clip_id}.mp4"
    assert meta["scores"] == {"aesthetic": 5.0, "motion_global_mean": 0.25}
    assert meta["filtered_by"] is None and meta["errors"] == {}
    assert meta["tags"] == [{"label": "tabby cat", "score": 0.5}]
    assert meta["captions"] == {"tiny": "a cat"}
    assert meta["has_embedding"] is True
    assert meta["duplicate_of"] is None
    assert meta["source"] == {"width": 64, "height": 48, "fps": 10.0, "codec": "h264"}
    assert (tmp_path / "clips" / f"{kept.clip_id}.mp4").read_bytes() == encoded


def test_chunks_in_any_order_finalise_the_video_once_all_are_in(tmp_path: Path) -> None:
    relative = "sub/dir/v.mp4"
    writer = ClipWriter(tmp_path)
    chunks = {
        0: [clip(relative, 0, 10)],
        1: [clip(relative, 10, 20), clip(relative, 20, 30, filtered_by="motion")],
        2: [clip(relative, 30, 40, embedding=None), clip(relative, 40, 50)],
    }
    layout = OutputLayout(tmp_path)
    vectors = {c.clip_id: c.embedding for cs in chunks.values() for c in cs}
    for index in (2, 0):
        writer.process(chunk(relative, index, chunks[index], last=index == 2))
        assert layout.read_record(relative) is None
    writer.process(
        chunk(relative, 1, chunks[1], transitions=[(10, 9)])  # a cut before frame 10
    )

    vid = video_id(relative)
    record = read_json(tmp_path / "videos" / "sub" / "dir" / "v.mp4.json")
    all_ids = [c.clip_id for index in (0, 1, 2) for c in chunks[index]]
    kept_ids = [i for i in all_ids if i != chunks[1][1].clip_id]
    assert record["video_id"] == vid
    assert record["source_video"] == relative
    assert record["path"] == f"/data/{relative}"
    assert record["source"] == {"size_bytes": 1234, "mtime": 1700000000.5}
    assert record["status"] == "ok" and record["errors"] == {}
    assert record["metadata"] == META.as_dict()
    assert record["num_chunks"] == 3
    assert record["clips"] == all_ids
    assert record["kept"] == kept_ids
    assert record["kept_seconds"] == pytest.approx(4.0)
    assert record["filtered"] == {"motion": [chunks[1][1].clip_id]}
    assert record["transitions"] == [[10, 9]]
    assert record["boundaries_s"] == [1.0]
    assert record["no_clips"] is None
    assert record["embeddings"] == f"embeddings/{vid}.parquet"
    assert layout.is_complete(relative, 1234, 1700000000.5)

    table = pq.read_table(layout.embedding_path(vid))
    assert table.schema.field("clip_id").type == pa.string()
    assert table.schema.field("embedding").type == pa.list_(pa.float32())
    with_vectors = [i for i in kept_ids if vectors[i] is not None]
    assert table.column("clip_id").to_pylist() == with_vectors  # one row per kept clip
    for cid, row in zip(with_vectors, table.column("embedding").to_pylist(), strict=True):
        np.testing.assert_array_equal(np.asarray(row, np.float32), vectors[cid])

    assert not layout.staging_dir(vid).exists()
    assert list(layout.tmp.iterdir()) == []
    assert not (tmp_path / "text_embeddings").exists()


def test_filtered_clips_are_written_only_when_asked(tmp_path: Path) -> None:
    for write_filtered in (False, True):
        out = tmp_path / str(write_filtered)
        filtered = clip("v.mp4", 0, 10, filtered_by="motion")
        ClipWriter(out, write_filtered=write_filtered).process(
            chunk("v.mp4", 0, [filtered], last=True)
        )
        meta = read_json(out / "metas" / f"{filtered.clip_id}.json")
        assert meta["filtered_by"] == "motion"
        location = f"filtered_clips/{filtered.clip_id}.mp4"
        assert (out / location).exists() is write_filtered
        assert meta["clip_location"] == (location if write_filtered else None)
        assert not (out / "clips").exists()
        record = OutputLayout(out).read_record("v.mp4")
        assert record is not None and record["kept"] == [] and record["embeddings"] is None
        assert not (out / "embeddings").exists()  # the filtered clip's vector is not written


def test_a_readable_video_too_short_for_a_clip_says_so(tmp_path: Path) -> None:
    ClipWriter(tmp_path).process(chunk("short.mp4", 0, [], last=True))
    record = OutputLayout(tmp_path).read_record("short.mp4")
    assert record is not None and record["status"] == "ok" and record["clips"] == []
    assert record["no_clips"] == NO_CLIPS and "--min-clip" in NO_CLIPS


def test_a_failed_video_is_recorded_as_failed(tmp_path: Path) -> None:
    video = Video("/data/bad.mp4", "bad.mp4", source_size=3, source_mtime=2.0)
    video.fail("VideoProbe", "empty file (0 bytes)")
    video.last_chunk = True
    ClipWriter(tmp_path).process(VideoTask(data=video))
    layout = OutputLayout(tmp_path)
    record = layout.read_record("bad.mp4")
    assert record is not None
    assert record["status"] == "failed"
    assert record["errors"] == {"VideoProbe": "empty file (0 bytes)"}
    assert record["metadata"] is None and record["clips"] == [] and record["embeddings"] is None
    assert record["no_clips"] is None  # its errors say why
    assert layout.is_complete("bad.mp4", 3, 2.0)
    assert files_under(tmp_path) == ["videos/bad.mp4.json"]


def test_a_video_that_fails_in_a_later_chunk_is_failed(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    writer.process(chunk("v.mp4", 0, [clip("v.mp4", 0, 10)]))
    writer.process(chunk("v.mp4", 1, [], last=True, errors={"ShotDetector": "decode error"}))
    record = OutputLayout(tmp_path).read_record("v.mp4")
    assert record is not None
    assert record["status"] == "failed" and record["errors"] == {"ShotDetector": "decode error"}


def test_a_clip_that_failed_after_it_was_made_gets_a_meta_but_is_not_kept(tmp_path: Path) -> None:
    made = clip("v.mp4", 0, 10)
    made.fail("ClipEmbedder", "no frames could be decoded at 2 fps")
    ClipWriter(tmp_path).process(chunk("v.mp4", 0, [made], last=True))
    meta = read_json(tmp_path / "metas" / f"{made.clip_id}.json")
    assert meta["filtered_by"] == "error" and meta["clip_location"] is None
    assert meta["errors"] == {"ClipEmbedder": "no frames could be decoded at 2 fps"}
    record = OutputLayout(tmp_path).read_record("v.mp4")
    assert record is not None
    assert record["filtered"] == {} and record["kept"] == []
    assert record["clip_errors"] == [
        {
            "clip_id": made.clip_id,
            "span": [0.0, 1.0],
            "stage": "ClipEmbedder",
            "reason": "no frames could be decoded at 2 fps",
        }
    ]


def test_text_embeddings_are_gathered_too(tmp_path: Path) -> None:
    first = clip("v.mp4", 0, 10, captions={"m": "a dog runs"})
    second = clip("v.mp4", 10, 20, tags=[("dog", 0.6), ("cat", 0.2)])
    first.text_embedding = np.full(4, 0.5, np.float32)
    second.text_embedding = np.full(4, 0.25, np.float32)
    writer = ClipWriter(tmp_path)
    writer.process(chunk("v.mp4", 1, [second], last=True))
    writer.process(chunk("v.mp4", 0, [first]))
    table = pq.read_table(OutputLayout(tmp_path).text_embedding_path(video_id("v.mp4")))
    assert table.column_names == ["clip_id", "source_video", "start_s", "text", "embedding"]
    assert table.column("clip_id").to_pylist() == [first.clip_id, second.clip_id]
    assert table.column("text").to_pylist() == ["a dog runs", "dog, cat"]
    assert table.column("embedding").to_pylist()[1] == [0.25] * 4


def test_the_returned_chunk_carries_no_bulk(tmp_path: Path) -> None:
    made = clip("v.mp4", 0, 10)
    made.frames[1.0] = np.zeros((1, 4, 4, 3), np.uint8)
    made.text_embedding = np.ones(3, np.float32)
    out = ClipWriter(tmp_path).process(chunk("v.mp4", 0, [made], last=True))
    back = out.data.clips[0]
    assert back.encoded is None and back.embedding is None and back.text_embedding is None
    assert back.frames == {}
    assert back.num_frames == 10  # still says it was made


def test_finalising_twice_is_harmless(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers finishing a video's last chunks at once both finalise it."""
    writer = ClipWriter(tmp_path)
    clips = [clip("v.mp4", 0, 10), clip("v.mp4", 10, 20)]
    layout = OutputLayout(tmp_path)
    staging = layout.staging_dir(video_id("v.mp4"))
    removals: list[Path] = []
    # the first finalisation keeps its staging, as if the other worker read it meanwhile
    monkeypatch.setattr(OutputLayout, "remove_tree", lambda self, p: removals.append(Path(p)))
    writer.process(chunk("v.mp4", 1, [clips[1]], last=True))
    writer.process(chunk("v.mp4", 0, [clips[0]]))
    assert removals == [staging]
    first_record = read_json(layout.video_record("v.mp4"))
    first_table = pq.read_table(layout.embedding_path(video_id("v.mp4")))
    monkeypatch.undo()

    writer._finalise_if_complete(chunk("v.mp4", 0, []).data, layout, staging)  # the other one

    second_record = read_json(layout.video_record("v.mp4"))
    first_record.pop("finished_at"), second_record.pop("finished_at")
    assert second_record == first_record
    assert pq.read_table(layout.embedding_path(video_id("v.mp4"))).equals(first_table)
    assert not staging.exists()
    # and once the staging is gone, a third call finds nothing to do
    writer._finalise_if_complete(chunk("v.mp4", 0, []).data, layout, staging)
    assert read_json(layout.video_record("v.mp4"))["clips"] == first_record["clips"]
    assert list(layout.tmp.iterdir()) == []


def test_a_single_chunk_video_written_again_gives_the_same_output(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    clips = [clip("v.mp4", 0, 10), clip("v.mp4", 10, 20)]
    writer.process(chunk("v.mp4", 0, list(clips), last=True))
    before = files_under(tmp_path)
    table = pq.read_table(OutputLayout(tmp_path).embedding_path(video_id("v.mp4")))
    again = [clip("v.mp4", 0, 10), clip("v.mp4", 10, 20)]
    writer.process(chunk("v.mp4", 0, again, last=True))
    assert files_under(tmp_path) == before
    assert pq.read_table(OutputLayout(tmp_path).embedding_path(video_id("v.mp4"))).equals(table)


def test_a_whole_video_in_one_task_skips_the_staging_and_records_the_same(
    tmp_path: Path,
) -> None:
    whole, chunked = tmp_path / "whole", tmp_path / "chunked"
    clips = [clip("v.mp4", 0, 10), clip("v.mp4", 10, 20, filtered_by="motion")]
    ClipWriter(whole).process(chunk("v.mp4", 0, copy.deepcopy(clips), last=True))
    ClipWriter(chunked).process(chunk("v.mp4", 0, copy.deepcopy(clips[:1])))
    ClipWriter(chunked).process(chunk("v.mp4", 1, copy.deepcopy(clips[1:]), last=True))

    for root in (whole, chunked):
        assert not (root / ".conveyor" / "staging" / video_id("v.mp4")).exists()
    assert files_under(whole) == files_under(chunked)
    one, two = (read_json(OutputLayout(r).video_record("v.mp4")) for r in (whole, chunked))
    for record in (one, two):
        record.pop("finished_at")
    assert one == {**two, "num_chunks": 1}
    vid = video_id("v.mp4")
    tables = [pq.read_table(OutputLayout(r).embedding_path(vid)) for r in (whole, chunked)]
    assert tables[0].equals(tables[1])


def test_a_whole_video_cut_off_after_its_clip_leaves_an_intent_that_resets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = clip("v.mp4", 0, 10)
    real = OutputLayout.write_json

    def cut_off(self: OutputLayout, path: Path, obj: object) -> None:
        if path.parent.name == "videos":
            raise OSError("disk full")
        real(self, path, obj)

    monkeypatch.setattr(OutputLayout, "write_json", cut_off)
    with pytest.raises(OSError, match="disk full"):
        ClipWriter(tmp_path).process(chunk("v.mp4", 0, [kept], last=True))
    monkeypatch.undo()
    layout = OutputLayout(tmp_path)
    assert layout.read_record("v.mp4") is None
    assert layout.clip_path(kept.clip_id).exists()
    assert layout.reset("v.mp4") >= 2  # the clip and its meta, found through the intent
    assert not layout.clip_path(kept.clip_id).exists()
    assert not layout.meta_path(kept.clip_id).exists()


# -- parts of chunks (the transcoder sends each clip on as it is encoded) ---------------------
def parts_of(task: VideoTask) -> list[VideoTask]:
    """The chunk as the transcoder sends it: each clip its own part."""
    video = task.data
    return [
        VideoTask(data=video.part_of(k, len(video.clips), [clip]), dataset_name="test")
        for k, clip in enumerate(video.clips)
    ]


def test_parts_in_any_order_finalise_the_video_once_every_part_is_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ClipWriter(tmp_path)
    layout = OutputLayout(tmp_path)
    first = chunk("v.mp4", 0, [clip("v.mp4", 0, 10)], transitions=[(10, 9)])
    second = chunk(
        "v.mp4",
        1,
        [clip("v.mp4", 10, 20), clip("v.mp4", 20, 30, filtered_by="motion"), clip("v.mp4", 30, 40)],
        last=True,
        transitions=[(30, 28)],
        damaged_packets=2,  # counted while its clips were cut
    )
    order = [first.data.clips, second.data.clips]
    ids = [c.clip_id for clips in order for c in clips]
    vectors = {c.clip_id: c.embedding for clips in order for c in clips}
    a, b, c = parts_of(second)
    (whole,) = parts_of(first)
    finals: list[str] = []
    record_path = layout.video_record("v.mp4")
    real_write = OutputLayout.write_json

    def counting(self: OutputLayout, path: object, obj: object) -> None:
        if path == record_path:
            finals.append("record")
        real_write(self, path, obj)  # type: ignore[arg-type]

    monkeypatch.setattr(OutputLayout, "write_json", counting)
    for part in (c, whole, a):  # the last chunk's parts first, one still missing
        writer.process(part)
        assert layout.read_record("v.mp4") is None and finals == []
    staging = layout.staging_dir(video_id("v.mp4"))
    assert sorted(p.name for p in staging.glob("chunk-*.json")) == [
        "chunk-000000-000000.json",
        "chunk-000001-000000.json",
        "chunk-000001-000002.json",
    ]
    writer.process(b)
    assert finals == ["record"]  # finalised once, by the last part in
    record = read_json(record_path)
    assert record["clips"] == ids  # in clip order, whatever order the parts came in
    assert record["kept"] == [i for i in ids if i != second.data.clips[1].clip_id]
    assert record["num_chunks"] == 2
    assert record["transitions"] == [[10, 9], [30, 28]]  # each chunk's once
    assert record["damaged_packets"] == 2
    assert record["filtered"] == {"motion": [second.data.clips[1].clip_id]}
    table = pq.read_table(layout.embedding_path(video_id("v.mp4")))
    assert table.column("clip_id").to_pylist() == record["kept"]
    for cid, row in zip(record["kept"], table.column("embedding").to_pylist(), strict=True):
        np.testing.assert_array_equal(np.asarray(row, np.float32), vectors[cid])
    assert not staging.exists()


def test_a_part_written_again_changes_nothing(tmp_path: Path) -> None:
    """A retried transcoder sends its parts again: written twice, they are the same files."""
    writer = ClipWriter(tmp_path)
    task = chunk("v.mp4", 0, [clip("v.mp4", 0, 10), clip("v.mp4", 10, 20)], last=True)
    first, second = parts_of(task)
    retried = copy.deepcopy(first)  # (the writer strips what it was given)
    writer.process(first)
    writer.process(retried)
    writer.process(second)
    record = OutputLayout(tmp_path).read_record("v.mp4")
    assert record is not None and record["clips"] == [c.clip_id for c in task.data.clips]
    assert record["kept"] == record["clips"]


def test_reset_removes_the_parts_an_unfinished_video_left(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    task = chunk("v.mp4", 0, [clip("v.mp4", 0, 10), clip("v.mp4", 10, 20)], last=True)
    first, _ = parts_of(task)
    writer.process(first)  # killed before the second part came
    layout = OutputLayout(tmp_path)
    assert layout.clip_path(task.data.clips[0].clip_id).exists()
    assert layout.reset("v.mp4") == 2  # its clip and meta
    assert files_under(tmp_path / "clips") == [] and files_under(tmp_path / "metas") == []
    assert not layout.staging_dir(video_id("v.mp4")).exists()


def test_the_meta_says_whose_motion_vectors_scored_the_clip(tmp_path: Path) -> None:
    from conveyor.tasks.video import MotionScores

    scored = clip("v.mp4", 0, 10, motion=MotionScores(256, 0.1, 0.1, 9, "source"))
    fallback = clip("v.mp4", 10, 20, motion=MotionScores(256, 0.1, 0.1, 9, "clip"))
    unscored = clip("v.mp4", 20, 30)
    ClipWriter(tmp_path).process(chunk("v.mp4", 0, [scored, fallback, unscored], last=True))
    sources = [
        read_json(tmp_path / "metas" / f"{c.clip_id}.json")["motion_source"]
        for c in (scored, fallback, unscored)
    ]
    assert sources == ["source", "clip", None]


def test_staged_tables_of_an_older_version_gather_with_newer_ones(tmp_path: Path) -> None:
    """A part an interrupted run of an earlier version staged has no keep-rule columns
    (``duration_s``, the scores): gathered with this version's, its rows get nulls."""
    from conveyor.stages.video.writer import _concat

    layout = OutputLayout(tmp_path)
    older = pa.table({"clip_id": ["a"], "start_s": [0.0]})
    newer = pa.table({"clip_id": ["b"], "start_s": [1.0], "duration_s": [2.0]})
    pq.write_table(older, tmp_path / "old.parquet")
    pq.write_table(newer, tmp_path / "new.parquet")
    table = _concat(layout, layout.root, ["old.parquet", "new.parquet"])
    assert table.column("duration_s").to_pylist() == [None, 2.0]
