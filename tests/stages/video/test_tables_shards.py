"""The clip table (``metadata/<video_id>.parquet``) and the WebDataset shards: what they
hold, read back with pyarrow and webdataset, and how resuming keeps every clip once."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from conveyor.media.layout import PLAIN_BELOW_ROWS, OutputLayout
from conveyor.media.table import SCORE_NAMES, clip_metas, clip_schema, clip_table
from conveyor.stages.video import shards as shards_module
from conveyor.stages.video.shards import (
    OPEN_STATE,
    ShardBook,
    ShardWriter,
    finish_shards,
    member_size,
    shard_bytes,
)
from conveyor.stages.video.writer import ClipWriter, clip_meta
from conveyor.tasks.video import Clip, Video, VideoTask, video_id
from tests.stages.video.test_layout_writer import chunk, clip, files_under, read_json

REPO = Path(__file__).resolve().parents[3]


def metas_of(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: read_json(p) for p in (out / "metas").glob("*.json")}


def rich_clips(relative: str) -> list[Clip]:
    """A kept clip with every kind of field, a filtered one, and one that failed a stage."""
    kept = clip(
        relative,
        0,
        10,
        scores={"motion_global_mean": 0.25, "aesthetic": 5, "quality_sharpness": 12.5},
        tags=[("tabby cat", 0.5), ("tiger cat", 0.25)],
        captions={"tiny": "a cat"},
        video_type={"label": "animation", "scores": {"animation": 0.75, "slideshow": 0.25}},
    )
    filtered = clip(relative, 10, 20, filtered_by="motion", scores={"motion_global_mean": 0.0})
    broken = clip(relative, 20, 30, embedding=None)
    broken.fail("ClipEmbedder", "no frames could be decoded at 2 fps")
    return [kept, filtered, broken]


# -- the clip table -----------------------------------------------------------------------
def test_the_table_holds_every_field_of_every_meta(tmp_path: Path) -> None:
    clips = rich_clips("v.mp4")
    ClipWriter(tmp_path, write_filtered=True).process(chunk("v.mp4", 0, clips, last=True))
    vid = video_id("v.mp4")
    table = pq.read_table(tmp_path / "metadata" / f"{vid}.parquet")
    assert table.schema == clip_schema()
    assert table.column("clip_id").to_pylist() == [c.clip_id for c in clips]  # one row each
    assert table.column("video_id").to_pylist() == [vid] * 3
    assert table.column("kept").to_pylist() == [True, False, False]
    assert table.column("score_aesthetic").to_pylist() == [5.0, None, None]
    assert table.column("tags").to_pylist()[0] == [
        {"label": "tabby cat", "score": 0.5},
        {"label": "tiger cat", "score": 0.25},
    ]
    assert table.column("video_type").to_pylist() == ["animation", None, None]
    assert table.column("errors").to_pylist()[2] == [
        ("ClipEmbedder", "no frames could be decoded at 2 fps")
    ]
    metas = metas_of(tmp_path)
    assert clip_metas(table) == [metas[c.clip_id] for c in clips]  # field for field


def test_a_chunked_video_gathers_its_rows_in_clip_order(tmp_path: Path) -> None:
    relative = "sub/v.mp4"
    writer = ClipWriter(tmp_path)
    first, second, third = (clip(relative, 10 * i, 10 * i + 10) for i in range(3))
    last = chunk(relative, 1, [second, third], last=True).data
    outputs = [
        writer.process(VideoTask(data=last.part_of(1, 2, [third]))),
        writer.process(chunk(relative, 0, [first])),
        writer.process(VideoTask(data=last.part_of(0, 2, [second]))),
    ]
    layout = OutputLayout(tmp_path)
    table = pq.read_table(layout.clip_table_path(video_id(relative)))
    assert table.column("clip_id").to_pylist() == [first.clip_id, second.clip_id, third.clip_id]
    assert not layout.staging_dir(video_id(relative)).exists()
    # the task that completed the video carries its record on, and only that one
    assert [o.data.record is not None for o in outputs] == [False, False, True]
    assert outputs[2].data.record == layout.read_record(relative)


def test_a_chunked_video_is_gathered_in_an_output_named_in_latin1_bytes(tmp_path: Path) -> None:
    out = Path(os.fsdecode(os.fsencode(tmp_path) + b"/out\xe9"))  # pyarrow refuses the path
    writer = ClipWriter(out)
    writer.process(chunk("v.mp4", 0, [clip("v.mp4", 0, 10)]))
    writer.process(chunk("v.mp4", 1, [clip("v.mp4", 10, 20)], last=True))
    layout = OutputLayout(out)
    assert layout.read_table(layout.clip_table_path(video_id("v.mp4"))).num_rows == 2
    assert layout.read_table(layout.embedding_path(video_id("v.mp4"))).num_rows == 2


def test_the_folder_reads_as_one_dataset_whatever_each_video_holds(tmp_path: Path) -> None:
    writer = ClipWriter(tmp_path)
    writer.process(chunk("a.mp4", 0, rich_clips("a.mp4"), last=True))
    plain = [clip("b.mp4", 0, 10), clip("b.mp4", 10, 20, embedding=None)]  # no score at all
    writer.process(chunk("b.mp4", 0, plain, last=True))
    dataset = ds.dataset(tmp_path / "metadata", format="parquet")
    assert dataset.schema == clip_schema()
    table = dataset.to_table()
    assert table.num_rows == 5 == len(metas_of(tmp_path))
    kept = dataset.to_table(filter=ds.field("kept"), columns=["clip_id"])
    assert sorted(kept.column("clip_id").to_pylist()) == sorted(
        [rich_clips("a.mp4")[0].clip_id, *(c.clip_id for c in plain)]
    )
    sharp = dataset.to_table(filter=ds.field("score_quality_sharpness") > 10)
    assert sharp.num_rows == 1
    by_id = {m["clip_id"]: m for m in clip_metas(table)}
    assert by_id == metas_of(tmp_path)


def test_a_short_table_is_written_plain_and_a_long_one_compressed(tmp_path: Path) -> None:
    """A table of a few rows is mostly its footer: zstd and dictionaries would cost time and
    bytes; from PLAIN_BELOW_ROWS rows on they pay for themselves. Either reads back alike."""
    layout = OutputLayout(tmp_path)
    metas = [
        clip_meta(c, chunk("v.mp4", 0, []).data, None)
        for c in [clip("v.mp4", 10 * i, 10 * i + 10) for i in range(PLAIN_BELOW_ROWS)]
    ]
    for rows, codec in ((1, "UNCOMPRESSED"), (PLAIN_BELOW_ROWS, "ZSTD")):
        table = clip_table("v", metas[:rows])
        path = tmp_path / f"{rows}.parquet"
        layout.write_parquet(path, table)
        column = pq.ParquetFile(path).metadata.row_group(0).column(0)
        assert column.compression == codec
        assert ("RLE_DICTIONARY" in column.encodings) == (codec == "ZSTD")
        assert layout.read_table(path).equals(table)


def test_without_meta_json_the_table_is_all(tmp_path: Path) -> None:
    clips = rich_clips("v.mp4")
    expected = [clip_meta(c, chunk("v.mp4", 0, clips).data, None) for c in clips]
    ClipWriter(tmp_path, meta_json=False).process(chunk("v.mp4", 0, clips, last=True))
    assert not (tmp_path / "metas").exists()
    table = pq.read_table(OutputLayout(tmp_path).clip_table_path(video_id("v.mp4")))
    metas = clip_metas(table)
    expected[0]["clip_location"] = f"clips/{clips[0].clip_id}.mp4"
    assert metas == expected


def test_a_redone_video_replaces_its_table(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    for _ in range(2):  # a resumed run resets the video, then writes it again
        layout.reset("v.mp4")
        ClipWriter(tmp_path).process(chunk("v.mp4", 0, rich_clips("v.mp4"), last=True))
        table = ds.dataset(tmp_path / "metadata").to_table()
        assert table.num_rows == 3 and len(set(table.column("clip_id").to_pylist())) == 3
    assert layout.reset("v.mp4") > 0
    assert not layout.clip_table_path(video_id("v.mp4")).exists()


def test_a_score_without_a_column_is_refused() -> None:
    meta = clip_meta(clip("v.mp4", 0, 10, scores={"sparkle": 1.0}), Video("/v", "v.mp4"), None)
    with pytest.raises(ValueError, match=r"sparkle have no column .*SCORE_NAMES"):
        clip_table("vid", [meta])


def test_every_score_a_filter_sets_has_a_column() -> None:
    from conveyor.stages.video.quality import quality_scores

    found = set()
    for path in (REPO / "conveyor" / "stages" / "video").glob("*.py"):
        found.update(re.findall(r"scores\[\"([a-z_]+)\"\] = ", path.read_text()))
    frames = np.random.default_rng(0).integers(0, 255, (3, 16, 16, 3), dtype=np.uint8)
    found.update(quality_scores(frames, 16.0, 3.0, 24.0))
    assert found and found <= set(SCORE_NAMES)
    assert list(SCORE_NAMES) == sorted(SCORE_NAMES)


# -- shards -------------------------------------------------------------------------------
def big_clip(relative: str, start: int, size: int = 3000) -> Clip:
    """A kept clip of ``size`` bytes (shards roll over by size)."""
    made = clip(relative, start, start + 10)
    made.encoded = bytes([start % 251]) * size
    return made


def write_videos(out: Path, names: list[str], clips_each: int = 3) -> list[VideoTask]:
    """Each video through the writer, one chunk each; the writer's outputs."""
    writer = ClipWriter(out)
    outputs = []
    for name in names:
        clips = [big_clip(name, 10 * i) for i in range(clips_each)]
        clips[-1].filtered_by = "motion"  # filtered: never in a shard
        outputs.append(writer.process(chunk(name, 0, clips, last=True)))
    return outputs


def kept_clips(out: Path) -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for p in (out / "clips").glob("*.mp4")}


def read_shards(out: Path) -> list[dict[str, Any]]:
    import webdataset as wds

    urls = sorted(str(p) for p in (out / "shards").glob("*.tar"))
    return list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))


def check_shards(out: Path) -> list[dict[str, Any]]:
    """Every kept clip exactly once, with its bytes, meta and embedding."""
    samples = read_shards(out)
    clips = kept_clips(out)
    assert sorted(s["__key__"] for s in samples) == sorted(clips)  # once each
    layout = OutputLayout(out)
    for sample in samples:
        cid = sample["__key__"]
        assert sample["mp4"] == clips[cid]
        meta = json.loads(sample["json"])
        assert meta == read_json(layout.meta_path(cid))
        vid = video_id(meta["source_video"])
        embeddings = pq.read_table(layout.embedding_path(vid)).to_pylist()
        vector = next(r["embedding"] for r in embeddings if r["clip_id"] == cid)
        loaded = np.load(io.BytesIO(sample["npy"]))
        assert loaded.dtype == np.float32
        np.testing.assert_array_equal(loaded, np.asarray(vector, np.float32))
    indexed = [
        cid
        for p in (out / "shards").glob("*.json")
        for ids in read_json(p)["videos"].values()
        for cid in ids
    ]
    assert sorted(indexed) == sorted(clips)
    for tar in (out / "shards").glob("*.tar"):
        with tarfile.open(tar) as archive:  # a well-formed tar, ended and padded
            assert len(archive.getnames()) == 3 * read_json(tar.with_suffix(".json"))["samples"]
        assert tar.stat().st_size % tarfile.RECORDSIZE == 0
    return samples


def test_shards_read_back_with_webdataset(tmp_path: Path) -> None:
    stage = ShardWriter(tmp_path)
    for output in write_videos(tmp_path, ["a.mp4", "b.mp4"]):
        assert stage.process(output) is output  # the task goes on unchanged
    assert not (tmp_path / "shards").exists()  # the shard being filled is not published
    finish_shards(tmp_path, stage.shard_mb, ["a.mp4", "b.mp4"])
    samples = check_shards(tmp_path)
    assert len(samples) == 4 and [p.name for p in (tmp_path / "shards").iterdir()] == sorted(
        ["shard-000000.json", "shard-000000.tar"]
    )
    index = read_json(tmp_path / "shards" / "shard-000000.json")
    assert index["complete"] == [video_id("a.mp4"), video_id("b.mp4")]
    assert files_under(tmp_path / ".conveyor" / "shards") == []


def test_a_task_of_an_unfinished_video_passes_through(tmp_path: Path) -> None:
    task = ClipWriter(tmp_path).process(chunk("v.mp4", 0, [big_clip("v.mp4", 0)]))
    assert task.data.record is None
    assert ShardWriter(tmp_path).process(task) is task
    assert not (tmp_path / "shards").exists() and not (tmp_path / ".conveyor" / "shards").exists()


def sample_bytes(out: Path, output: VideoTask) -> int:
    """What the first kept clip of ``output`` takes in a shard (mp4, json, npy)."""
    layout = OutputLayout(out)
    cid = output.data.record["kept"][0]
    meta = read_json(layout.meta_path(cid))
    members = shards_module._sample(cid, layout, meta, np.zeros(8, np.float32))
    return sum(member_size(len(data)) for _, data in members)


def test_shards_roll_over_at_the_target_size(tmp_path: Path) -> None:
    names = ["a.mp4", "b.mp4", "c.mp4"]  # two kept clips each
    outputs = write_videos(tmp_path, names, clips_each=3)
    shard_mb = 3.5 * sample_bytes(tmp_path, outputs[0]) / 2**20  # three clips a shard
    stage = ShardWriter(tmp_path, shard_mb)
    for output in outputs:
        stage.process(output)
    finish_shards(tmp_path, shard_mb, names)
    check_shards(tmp_path)
    tars = sorted((tmp_path / "shards").glob("*.tar"))
    assert [t.name for t in tars] == ["shard-000000.tar", "shard-000001.tar"]
    indexes = [read_json(t.with_suffix(".json")) for t in tars]
    for tar, index in zip(tars, indexes, strict=True):
        assert index["bytes"] == tar.stat().st_size and index["samples"] == 3
        assert index["bytes"] - 2 * tarfile.BLOCKSIZE <= shard_bytes(shard_mb) + tarfile.RECORDSIZE
    # b.mp4's clips were cut by the rollover: a clip in each shard, the second one says
    # that b.mp4 is complete
    assert [len(i["videos"][video_id("b.mp4")]) for i in indexes] == [1, 1]
    assert [i["complete"] for i in indexes] == [
        [video_id("a.mp4")],
        [video_id("b.mp4"), video_id("c.mp4")],
    ]


def test_a_crash_while_filling_a_shard_never_puts_a_clip_in_two(tmp_path: Path) -> None:
    names = [f"{i}.mp4" for i in range(6)]
    outputs = write_videos(tmp_path, names, clips_each=3)
    shard_mb = 3.5 * sample_bytes(tmp_path, outputs[0]) / 2**20  # three clips a shard
    first = ShardWriter(tmp_path, shard_mb)
    for output in outputs[:4]:
        first.process(output)
    # killed while appending the next video: half a sample after what open.json records
    work = tmp_path / ".conveyor" / "shards"
    state = read_json(work / OPEN_STATE)
    with open(work / f"shard-{state['shard']:06d}.tar", "ab") as tar:
        tar.write(b"half a header")
    closed_before = {p.name: p.read_bytes() for p in (tmp_path / "shards").iterdir()}
    assert len(closed_before) >= 2
    # the next run: a new worker sees video 3 again (done: skipped) and the rest
    again = ShardWriter(tmp_path, shard_mb)
    for output in outputs[3:]:
        again.process(output)
    finish_shards(tmp_path, shard_mb, names)
    check_shards(tmp_path)
    for name, data in closed_before.items():  # closed shards are never touched again
        assert (tmp_path / "shards" / name).read_bytes() == data


def test_a_video_complete_before_the_crash_but_in_no_shard_is_added_at_the_end(
    tmp_path: Path,
) -> None:
    outputs = write_videos(tmp_path, ["a.mp4", "b.mp4", "c.mp4"])
    stage = ShardWriter(tmp_path)
    stage.process(outputs[0])  # b.mp4's record was written, then the run was killed
    ShardWriter(tmp_path).process(outputs[2])  # the next run: b.mp4 is not redone
    finish_shards(tmp_path, stage.shard_mb, ["a.mp4", "b.mp4", "c.mp4"])
    check_shards(tmp_path)
    again = sorted(p.read_bytes() for p in (tmp_path / "shards").iterdir())
    finish_shards(tmp_path, stage.shard_mb, ["a.mp4", "b.mp4", "c.mp4"])  # nothing to add
    assert sorted(p.read_bytes() for p in (tmp_path / "shards").iterdir()) == again


def test_a_crash_between_the_index_and_the_rename_takes_the_shard_up_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = write_videos(tmp_path, ["a.mp4", "b.mp4"])
    stage = ShardWriter(tmp_path)
    for output in outputs:
        stage.process(output)

    replace = shards_module.os.replace

    def killed(source: Any, target: Any) -> None:
        if str(target).endswith(".tar"):  # the index is written, the tar not renamed
            raise OSError("killed before the rename")
        replace(source, target)

    monkeypatch.setattr(shards_module.os, "replace", killed)
    with pytest.raises(OSError, match="killed"):
        finish_shards(tmp_path, stage.shard_mb, ["a.mp4", "b.mp4"])
    assert [p.name for p in (tmp_path / "shards").iterdir()] == ["shard-000000.json"]
    monkeypatch.undo()
    finish_shards(tmp_path, stage.shard_mb, ["a.mp4", "b.mp4"])
    check_shards(tmp_path)
    assert len(list((tmp_path / "shards").glob("*.tar"))) == 1


def test_a_filling_shard_shorter_than_recorded_is_dropped_and_its_clips_written_again(
    tmp_path: Path,
) -> None:
    names = ["a.mp4", "b.mp4", "c.mp4"]
    outputs = write_videos(tmp_path, names)
    shard_mb = 1.5 * sample_bytes(tmp_path, outputs[0]) / 2**20  # a shard a clip: c.mp4's
    # first clip is in a closed shard, its second in the one being filled
    stage = ShardWriter(tmp_path, shard_mb)
    for output in outputs:
        stage.process(output)
    work = tmp_path / ".conveyor" / "shards"
    state = read_json(work / OPEN_STATE)
    tar = work / f"shard-{state['shard']:06d}.tar"
    with open(tar, "r+b") as out:  # the machine went down: the tail never reached the disk
        out.truncate(state["size"] - 1)
    finish_shards(tmp_path, shard_mb, names)
    check_shards(tmp_path)


def test_a_tar_without_its_index_is_refused(tmp_path: Path) -> None:
    stage = ShardWriter(tmp_path)
    stage.process(write_videos(tmp_path, ["a.mp4"])[0])
    finish_shards(tmp_path, stage.shard_mb, ["a.mp4"])
    (tmp_path / "shards" / "shard-000000.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"shard-000000\.tar has no index"):
        finish_shards(tmp_path, stage.shard_mb, ["a.mp4"])


def test_a_failed_append_is_taken_up_from_what_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outputs = write_videos(tmp_path, ["a.mp4", "b.mp4"])
    stage = ShardWriter(tmp_path)
    stage.process(outputs[0])
    missing = OutputLayout(tmp_path).clip_path(outputs[1].data.record["kept"][1])
    data = missing.read_bytes()
    missing.unlink()
    with pytest.raises(FileNotFoundError):
        stage.process(outputs[1])  # the engine retries the task
    missing.write_bytes(data)
    stage.process(outputs[1])
    finish_shards(tmp_path, stage.shard_mb, ["a.mp4", "b.mp4"])
    check_shards(tmp_path)


def test_a_clip_without_a_meta_is_a_clear_error(tmp_path: Path) -> None:
    output = write_videos(tmp_path, ["a.mp4"])[0]
    layout = OutputLayout(tmp_path)
    layout.clip_table_path(video_id("a.mp4")).unlink()
    ShardWriter(tmp_path).process(output)  # an output made before tables: the metas serve
    finish_shards(tmp_path, 1024, ["a.mp4"])
    check_shards(tmp_path)
    other = write_videos(tmp_path / "other", ["a.mp4"])[0]
    layout = OutputLayout(tmp_path / "other")
    layout.clip_table_path(video_id("a.mp4")).unlink()
    layout.meta_path(other.data.record["kept"][0]).unlink()
    with pytest.raises(FileNotFoundError, match="has no meta: neither"):
        ShardWriter(tmp_path / "other").process(other)


def test_a_key_with_a_dot_is_refused(tmp_path: Path) -> None:
    odd = big_clip("v.mp4", 0)
    odd.clip_id = "clip.one"
    output = ClipWriter(tmp_path).process(chunk("v.mp4", 0, [odd], last=True))
    with pytest.raises(ValueError, match="cannot be a WebDataset key"):
        ShardWriter(tmp_path).process(output)


def test_shards_need_a_size_and_a_local_output() -> None:
    with pytest.raises(ValueError, match="shard_mb must be > 0"):
        ShardWriter("out", 0)
    with pytest.raises(ValueError, match="need a local output"):
        ShardBook(OutputLayout("s3://bucket/out"), 100)


def test_the_book_numbers_new_shards_after_the_last(tmp_path: Path) -> None:
    stage = ShardWriter(tmp_path, 1e-6)  # a shard per clip
    for output in write_videos(tmp_path, ["a.mp4"]):
        stage.process(output)
    finish_shards(tmp_path, 1e-6, ["a.mp4"])
    book = ShardBook.load(OutputLayout(tmp_path), shard_bytes(1e-6))
    assert book.next_shard == 2 and book.done == {video_id("a.mp4")}
