"""Text readers and writers: directories, globs, .gz/.zst JSONL and Parquet in; malformed lines
of every kind counted with file and line; big files split; sharded, deterministically named,
atomic Parquet/JSONL out."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from conveyor.backends import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.stages.text.readers import (
    DOC_ID,
    FILE_ERRORS,
    MALFORMED,
    MAX_DEPTH,
    OFFSET_BITS,
    READ,
    SEGMENTS,
    InputError,
    TextPartitioner,
    TextReader,
    absolute_lines,
    classify,
    list_inputs,
    plan_reads,
    read_line,
)
from conveyor.stages.text.writers import (
    ShardedWriter,
    publish_shards,
    unify_parquet,
    write_jsonl,
)
from conveyor.tasks import DocumentBatch


def lines(*records: Any) -> bytes:
    return b"".join(
        (r if isinstance(r, bytes) else json.dumps(r, ensure_ascii=False).encode()) + b"\n"
        for r in records
    )


def read_all(source: str | Path, chunk_bytes: int = 1 << 20, **reader: Any) -> dict[str, Any]:
    """Every batch of every task of ``source``: rows, and the counts added up."""
    tasks = plan_reads(list_inputs(str(source)).files, chunk_bytes)
    stage = TextReader(**reader)
    rows: list[dict[str, Any]] = []
    counts = {"documents": 0, "malformed": 0, "blank": 0}
    samples: list[dict[str, Any]] = []
    segments: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    shards = []
    for task in tasks:
        for batch in stage.process(task):
            rows += batch.to_pyarrow().to_pylist()
            shards.append(batch.metadata["shard"])
            for key, value in batch.metadata.get(READ, {}).items():
                counts[key] += value
            samples += batch.metadata.get(MALFORMED, [])
            segments += batch.metadata.get(SEGMENTS, [])
            errors += batch.metadata.get(FILE_ERRORS, [])
    return {
        "rows": rows,
        "counts": counts,
        "malformed": absolute_lines(samples, segments),
        "errors": absolute_lines(errors, segments),
        "shards": shards,
        "tasks": tasks,
    }


# -- finding files --------------------------------------------------------------------------
def test_classify_by_suffix() -> None:
    assert classify("a.jsonl") == ("jsonl", None)
    assert classify("a.JSONL.GZ") == ("jsonl", "gzip")
    assert classify("a.json.zst") == ("jsonl", "zstd")
    assert classify("a.ndjson") == ("jsonl", None)
    assert classify("a.parquet") == ("parquet", None)
    assert classify("README.md") is None
    assert classify("notes.txt", strict=False) == ("jsonl", None)


def test_links_in_a_folder_are_followed_once_and_broken_ones_said(tmp_path: Path) -> None:
    """A linked folder and a link to nothing were both skipped without a word."""
    data, other = tmp_path / "data", tmp_path / "other"
    data.mkdir()
    other.mkdir()
    for folder, name in ((data, "a.jsonl"), (other, "b.jsonl"), (other, "c.jsonl")):
        (folder / name).write_text('{"text": "x"}\n')
    (data / "linked").symlink_to(other)  # outside the folder: followed
    (data / "twice").symlink_to(other)  # the same folder again: once
    (data / "again.jsonl").symlink_to(data / "a.jsonl")  # inside: read where it is
    (data / "up").symlink_to(tmp_path)  # holds the folder: not the whole parent
    (data / "gone.jsonl").symlink_to(tmp_path / "nothing.jsonl")
    listing = list_inputs(data)
    names = [Path(f.path).relative_to(data).as_posix() for f in listing.files]
    assert names == ["a.jsonl", "linked/b.jsonl", "linked/c.jsonl"]
    assert listing.broken == [str(data / "gone.jsonl")]


def test_earlier_outputs_inside_a_folder_are_left_out_and_said(tmp_path: Path) -> None:
    """``conveyor text data data/run2`` read ``data/run1`` (a text run's parts, its summary
    and its event log) as documents again."""
    data = tmp_path / "data"
    for folder in ("text_run/documents", "old_text_run", "video_run/clips", "dedup_run"):
        (data / folder).mkdir(parents=True)
    for folder in ("plain", "half"):
        (data / folder).mkdir()
    (data / "a.jsonl").write_text('{"text": "x"}\n')
    for name in ("documents/part-00000.parquet", "summary.json", "events.jsonl"):
        (data / "text_run" / name).write_text("{}")
    for name in ("part-00000.parquet", "summary.json"):  # as runs before documents/ left it
        (data / "old_text_run" / name).write_text("{}")
    (data / "video_run" / ".conveyor").mkdir()
    (data / "video_run" / "summary.json").write_text("{}")
    for name in ("duplicates.parquet", "dedup.json"):
        (data / "dedup_run" / name).write_text("{}")
    (data / "plain" / "summary.json").write_text('{"text": "a document"}')  # not an output
    (data / "half" / "dedup.json").write_text('{"text": "x"}')  # nor is this
    listing = list_inputs(data)
    names = [Path(f.path).relative_to(data).as_posix() for f in listing.files]
    assert names == ["a.jsonl", "half/dedup.json", "plain/summary.json"]
    outputs = ("dedup_run", "old_text_run", "text_run", "video_run")
    assert listing.outputs == [str(data / d) for d in outputs]
    # the run's own OUTPUT (excluded) is left out without a word: a second run into
    # data/text_run said it was an earlier output it did not read
    excluded = list_inputs(data, exclude=[str(data / "text_run")])
    assert excluded.outputs == [str(data / d) for d in outputs if d != "text_run"]
    # given as INPUT itself, an output is read (the user asked for it); several INPUTs keep
    # what their listings said, each once
    # given as INPUT itself, an output's documents are read (the user asked for them), not
    # its summary (it was read as a malformed document)
    assert [Path(f.path).name for f in list_inputs(data / "old_text_run").files] == [
        "part-00000.parquet"
    ]
    assert [Path(f.path).name for f in list_inputs(data / "text_run").files] == [
        "part-00000.parquet"
    ]
    (data / "plain" / "gone.jsonl").symlink_to(tmp_path / "nothing.jsonl")
    both = list_inputs([str(data), str(data / "plain")])
    assert both.broken == [str(data / "plain" / "gone.jsonl")]
    assert len(both.outputs) == 4


def test_directories_globs_and_files(tmp_path: Path) -> None:
    (tmp_path / "sub" / ".hidden").mkdir(parents=True)
    for name in (
        "b.jsonl",
        "a.jsonl.gz",
        "sub/c.jsonl.zst",
        "sub/d.parquet",
        "sub/.hidden/e.jsonl",
    ):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "README.md").write_text("not data")
    (tmp_path / ".f.jsonl").write_text("{}")
    listing = list_inputs(tmp_path)
    names = [Path(f.path).relative_to(tmp_path).as_posix() for f in listing.files]
    assert names == ["a.jsonl.gz", "b.jsonl", "sub/c.jsonl.zst", "sub/d.parquet"]
    assert [f.index for f in listing.files] == [0, 1, 2, 3]
    assert [(f.kind, f.compression) for f in listing.files] == [
        ("jsonl", "gzip"), ("jsonl", None), ("jsonl", "zstd"), ("parquet", None),
    ]  # fmt: skip
    assert listing.ignored == [str(tmp_path / "README.md")]
    assert len(listing.empty) == 4
    glob = list_inputs(str(tmp_path / "**" / "*.jsonl*"))
    assert [Path(f.path).name for f in glob.files] == ["a.jsonl.gz", "b.jsonl", "c.jsonl.zst"]
    top = list_inputs(str(tmp_path / "*"))  # a glob: its data files ...
    assert [Path(f.path).name for f in top.files] == ["a.jsonl.gz", "b.jsonl"]
    markdown = list_inputs(str(tmp_path / "*.md"))  # ... or what it names, whatever it is
    assert [(f.kind, f.compression) for f in markdown.files] == [("jsonl", None)]
    one = list_inputs(tmp_path / "README.md")  # a file named explicitly is read as JSONL
    assert [(f.kind, f.compression) for f in one.files] == [("jsonl", None)]
    out = tmp_path / "sub"
    assert [Path(f.path).name for f in list_inputs(tmp_path, exclude=[str(out)]).files] == [
        "a.jsonl.gz",
        "b.jsonl",
    ]


def test_several_inputs_are_read_in_order_each_file_once(tmp_path: Path) -> None:
    for name in ("a.jsonl", "b.jsonl", "c.parquet"):
        (tmp_path / name).write_bytes(b"x")
    listing = list_inputs(
        [str(tmp_path / "c.parquet"), str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl")]
    )
    assert [Path(f.path).name for f in listing.files] == ["c.parquet", "a.jsonl", "b.jsonl"]
    assert [f.index for f in listing.files] == [0, 1, 2]
    with pytest.raises(InputError, match=r"INPUT '.*gone\.jsonl' does not exist"):
        list_inputs([str(tmp_path / "a.jsonl"), str(tmp_path / "gone.jsonl")])


def test_bad_inputs_say_why(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"INPUT '.*nowhere' does not exist"):
        list_inputs(tmp_path / "nowhere")
    with pytest.raises(InputError, match=r"INPUT glob '.*\*\.jsonl' matches no file"):
        list_inputs(str(tmp_path / "*.jsonl"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputError, match=r"no input files under .*\(1 other file\(s\) ignored\)"):
        list_inputs(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"no input files under .*looked for \.jsonl"):
        list_inputs(tmp_path / "empty")


# -- reading --------------------------------------------------------------------------------
def test_gzip_zstd_and_parquet_are_read_with_every_column(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines({"id": 1, "text": "één"})))
    zst = zstandard.ZstdCompressor().compress(lines({"id": 2, "text": "zwei", "x": [1, 2]}))
    (tmp_path / "b.jsonl.zst").write_bytes(zst)
    pq.write_table(pa.table({"id": [3, 4], "text": ["drei", "vier"]}), tmp_path / "c.parquet")
    # named .jsonl but gzip inside: the magic number decides
    (tmp_path / "d.jsonl").write_bytes(gzip.compress(lines({"id": 5, "text": "fünf"})))
    got = read_all(tmp_path)
    assert [(r["id"], r["text"]) for r in got["rows"]] == [
        (1, "één"), (2, "zwei"), (3, "drei"), (4, "vier"), (5, "fünf"),
    ]  # fmt: skip
    assert got["counts"] == {"documents": 5, "malformed": 0, "blank": 0}
    ids = [r[DOC_ID] for r in got["rows"]]
    assert ids == sorted(ids) and len(set(ids)) == 5  # unique, in input order
    assert [i >> OFFSET_BITS for i in ids] == [0, 1, 2, 2, 3]  # the file's index
    assert got["rows"][1]["x"] == [1, 2]


def test_every_kind_of_malformed_line_is_counted_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf"  # a byte order mark before the first record is fine
        + lines(
            {"id": 1, "text": "first"},
            b"{not json",
            b"[1, 2, 3]",
            {"id": 4},
            {"id": 5, "text": 5},
            {"id": 6, "text": None},
            b"",
            b"   \t",
            b'{"id": 9, "text": "caf\xe9"}',  # Latin-1, not UTF-8
            b'{"id": 10, "text": "lone \\ud800 surrogate"}',
            {"id": 11, "text": "pair \U0001f600 ok"},
            b'"just a string"',
        )
        + b'{"id": 13, "text": "crlf"}\r\n{"id": 14, "text": "no newline at the end"}'
    )
    got = read_all(path)
    assert [r["id"] for r in got["rows"]] == [1, 11, 13, 14]
    assert got["counts"] == {"documents": 4, "malformed": 8, "blank": 2}
    found = {m["line"]: m["reason"] for m in got["malformed"]}
    assert sorted(found) == [2, 3, 4, 5, 6, 9, 10, 12]
    assert found[2].startswith("malformed JSON: ")
    assert found[3] == "expected a JSON object, got an array"
    assert found[4] == "no field 'text' (fields: id)"
    assert found[5] == "field 'text' is a number, expected a string"
    assert found[6] == "field 'text' is null, expected a string"
    assert found[9].startswith("not valid UTF-8")
    assert "lone surrogate" in found[10]
    assert found[12] == "expected a JSON object, got a string"
    assert all(m["file"] == str(path) for m in got["malformed"])


def test_a_very_long_line_between_two_short_ones(tmp_path: Path) -> None:
    long = "ü" + "word " * 1_000_000  # 5 MB of text on one line
    (tmp_path / "a.jsonl").write_bytes(lines({"text": "a"}, {"text": long}, {"text": "b"}))
    got = read_all(tmp_path, chunk_bytes=1 << 20)  # the range ends inside the long line
    assert [len(r["text"]) for r in got["rows"]] == [1, len(long), 1]
    assert got["counts"]["malformed"] == 0


def _sized(i: int, size: int) -> dict[str, Any]:
    """A record whose JSON line is ``size`` bytes long (without its line end)."""
    record = {"id": i, "text": ""}
    record["text"] = "x" * (size - len(json.dumps(record)))
    return record


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 3000])
def test_a_line_over_max_doc_bytes_is_malformed_with_its_line(
    tmp_path: Path, chunk_bytes: int
) -> None:
    """A huge document reached the stages after the reader, which split it into words: one
    600 MB line grew the run to 11.8 GB. It is refused by its length, before it is parsed,
    and in a split file too (ranges beginning inside it skip it a part at a time)."""
    most = 10_000
    at_limit = json.dumps(_sized(3, most)).encode()
    (tmp_path / "a.jsonl").write_bytes(
        lines({"id": 0, "text": "a"}, _sized(1, most), _sized(2, most + 1))
        + at_limit + b"\r\n"  # the line end is not counted
        + lines(_sized(4, 250_000), {"id": 5, "text": "b"})
    )  # fmt: skip
    (tmp_path / "b.jsonl").write_bytes(lines({"id": 6, "text": "c"}))
    got = read_all(tmp_path, chunk_bytes=chunk_bytes, max_doc_bytes=most)
    assert chunk_bytes > 1 << 19 or len(got["tasks"]) > 50
    assert [r["id"] for r in got["rows"]] == [0, 1, 3, 5, 6]
    assert got["counts"] == {"documents": 5, "malformed": 2, "blank": 0}
    assert [(m["file"], m["line"], m["reason"]) for m in got["malformed"]] == [
        (str(tmp_path / "a.jsonl"), 3, "a line of 10,002 bytes: longer than the limit of "
         "10,000 on a document"),
        (str(tmp_path / "a.jsonl"), 5, "a line of 250,001 bytes: longer than the limit of "
         "10,000 on a document"),
    ]  # fmt: skip
    whole = read_all(tmp_path, chunk_bytes=chunk_bytes)  # the default limit: 16 MiB
    assert [r["id"] for r in whole["rows"]] == [0, 1, 2, 3, 4, 5, 6]


def test_a_long_line_is_never_held_whole() -> None:
    class Stream(io.BytesIO):
        largest = 0

        def readline(self, size: int | None = -1) -> bytes:
            line = super().readline(size)
            self.largest = max(self.largest, len(line))
            return line

    stream = Stream(b"short\n" + b"x" * (8 << 20) + b"\nnext\r\n" + b"y" * 101)
    assert read_line(stream, 100) == (b"short\n", 6)
    assert read_line(stream, 100) == (None, (8 << 20) + 1)
    assert stream.largest <= 1 << 20  # read a MiB at a time
    assert read_line(stream, 100) == (b"next\r\n", 6)
    assert read_line(stream, 100) == (None, 101)  # the last line, without a line end
    assert read_line(stream, 100) == (b"", 0)


def test_a_decompression_bomb_is_one_malformed_line_read_in_little_memory(
    tmp_path: Path,
) -> None:
    """14 MB of .jsonl.gz held a 3 GiB line: it was read whole (13 GB), then failed its
    task with an ArrowCapacityError that named neither file nor line."""
    import tracemalloc

    bomb = b'{"text": "' + b"a" * (24 << 20) + b'"}\n'
    path = tmp_path / "bomb.jsonl.gz"
    first = lines({"id": 0, "text": "a"})
    path.write_bytes(gzip.compress(first + bomb + lines({"id": 2, "text": "b"}), 1))
    (tmp_path / "other.jsonl").write_bytes(lines({"id": 3, "text": "c"}))
    tracemalloc.start()
    try:
        got = read_all(tmp_path, max_doc_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # a third of the line
    assert [r["id"] for r in got["rows"]] == [0, 2, 3]
    assert got["errors"] == []
    [malformed] = got["malformed"]
    assert (malformed["file"], malformed["line"]) == (str(path), 2)
    assert malformed["reason"].startswith(f"a line of {len(bomb):,} bytes: longer than")
    # --limit counts the lines of a file the same way, a line of any length a part at a time
    [task] = plan_reads(list_inputs(path).files, limit=2)
    assert task.data[0].end == len(first) + len(bomb)  # the end of the second line


def test_a_parquet_text_over_max_doc_bytes_is_malformed_by_row(tmp_path: Path) -> None:
    """A 300 MB cell took its worker to 4.7 GB in the stages after the reader."""
    texts = ["fine", "x" * 2000, None, b"\xff".decode("latin-1") * 1500, "y" * 1000, "z"]
    pq.write_table(pa.table({"text": texts, "k": range(6)}), tmp_path / "a.parquet")
    got = read_all(tmp_path, max_doc_bytes=1000)
    assert [r["k"] for r in got["rows"]] == [0, 4, 5]
    assert {m["row"]: m["reason"] for m in got["malformed"]} == {
        1: "field 'text' holds 2,000 bytes: longer than the limit of 1,000 on a document",
        2: "field 'text' is null, expected a string",
        3: "field 'text' holds 3,000 bytes: longer than the limit of 1,000 on a document",
    }
    assert len(read_all(tmp_path)["rows"]) == 5  # the default limit keeps them


def _nested(levels: int, array: bool) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value] if array else {"a": value}
    return value


def test_a_record_nested_too_deep_is_malformed_alone(tmp_path: Path) -> None:
    """300 levels failed the whole read task (too deep to pickle: 0 of 201 documents
    written, other files' with them), 900 a RecursionError; from about 100 the Parquet part
    it was written to could not be read back. A record as deep as the limit is kept."""
    deepest = [  # the record is level 1: its field holds MAX_DEPTH - 1 more
        {"text": "deep arrays", "m": _nested(MAX_DEPTH - 1, array=True)},
        {"text": "deep objects", "m": _nested(MAX_DEPTH - 1, array=False)},
    ]
    (tmp_path / "a.jsonl").write_bytes(
        lines(
            {"text": "first"},
            *deepest,
            {"text": "too deep", "m": _nested(MAX_DEPTH, array=True)},
            {"text": "too deep", "m": [{"a": _nested(MAX_DEPTH - 2, array=False)}]},
            b'{"text":"hello","meta":' + b'{"a":' * 300 + b"1" + b"}" * 300 + b"}",
            b'{"text":"hello","meta":' + b'{"a":' * 900 + b"1" + b"}" * 900 + b"}",
            b"[" * 200_000,
            {"text": "last"},
        )
    )
    (tmp_path / "b.jsonl").write_bytes(lines({"text": "other file"}))
    tasks = plan_reads(list_inputs(tmp_path).files)
    [task] = tasks
    [batch] = TextReader().process(task)
    table = batch.to_pyarrow()
    texts = ["first", "deep arrays", "deep objects", "last", "other file"]
    assert table.column("text").to_pylist() == texts
    malformed = absolute_lines(batch.metadata[MALFORMED], batch.metadata[SEGMENTS])
    assert [(m["line"], m["reason"]) for m in malformed] == [
        (line, f"nested deeper than {MAX_DEPTH} levels") for line in (4, 5, 6, 7, 8)
    ]
    # what is kept travels between processes and is read back from Parquet
    assert pickle.loads(pickle.dumps(batch)).to_pyarrow().equals(table)
    for record in deepest:
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist([record]), buffer)
        assert pq.read_table(io.BytesIO(buffer.getvalue())).to_pylist() == [record]


def test_text_field_and_mixed_types(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(
        lines(
            {"content": "one", "n": 1, "meta": {"a": 1}},
            {"content": "two", "n": "two", "extra": True},
            {"text": "no content field"},
        )
    )
    got = read_all(path, text_field="content")
    assert [r["content"] for r in got["rows"]] == ["one", "two"]
    assert [r["n"] for r in got["rows"]] == ["1", '"two"']  # mixed types: JSON text
    assert [r["extra"] for r in got["rows"]] == [None, True]
    assert got["malformed"][0]["reason"] == "no field 'content' (fields: text)"


def test_a_big_file_is_split_and_line_numbers_stay_right(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    records: list[Any] = [{"id": i, "text": "x" * (i % 37)} for i in range(400)]
    records[123] = b"{broken"
    records[350] = b"\xff\xfe"
    path.write_bytes(lines(*records))
    got = read_all(path, chunk_bytes=1000)
    assert len(got["tasks"]) > 5
    assert [r["id"] for r in got["rows"]] == [i for i in range(400) if i not in (123, 350)]
    assert [(m["line"], m["reason"][:14]) for m in got["malformed"]] == [
        (124, "malformed JSON"),
        (351, "not valid UTF-"),
    ]
    whole = read_all(path)
    assert [r[DOC_ID] for r in got["rows"]] == [r[DOC_ID] for r in whole["rows"]]
    assert len(whole["shards"]) == 1 and len(got["shards"]) == len(got["tasks"])


def test_a_big_compressed_file_is_one_task_in_several_batches(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl.zst"
    path.write_bytes(
        zstandard.ZstdCompressor().compress(lines(*({"text": "y" * 50} for _ in range(200))))
    )
    tasks = plan_reads(list_inputs(path).files, 1000)
    assert len(tasks) == 1
    batches = TextReader(batch_bytes=1000).process(tasks[0])
    assert len(batches) > 5
    assert sum(b.num_items for b in batches) == 200
    assert [b.metadata["shard"] for b in batches] == sorted(b.metadata["shard"] for b in batches)
    assert batches[-1].metadata[READ]["documents"] == 200  # the task's counts: on its last


def test_truncated_gzip_keeps_the_lines_before_the_break(tmp_path: Path) -> None:
    data = gzip.compress(lines(*({"id": i, "text": f"doc {i} " * 20} for i in range(2000))))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    got = read_all(path)
    assert 100 < len(got["rows"]) < 2000
    assert [r["id"] for r in got["rows"]] == list(range(len(got["rows"])))
    [error] = got["errors"]
    assert error["file"] == str(path)
    assert "EOFError" in error["reason"] and "truncated" in error["reason"]


def test_a_big_parquet_file_is_read_in_runs_of_row_groups(tmp_path: Path) -> None:
    """It was one task whatever its size: a 1 GB file's worker grew with the file."""
    path = tmp_path / "big.parquet"
    texts = [f"document {i} " + "z" * (i % 50) if i % 97 else None for i in range(4000)]
    pq.write_table(pa.table({"text": texts, "k": range(4000)}), path, row_group_size=500)
    got = read_all(path, chunk_bytes=path.stat().st_size // 3)
    assert 3 <= len(got["tasks"]) <= 8
    starts = [s.start for t in got["tasks"] for s in t.data]
    assert starts[0] == 0 and all(start % 500 == 0 for start in starts)
    whole = read_all(path)
    assert len(whole["tasks"]) == 1
    # the same documents, ids and malformed rows (numbered in the file) as read whole
    assert got["rows"] == whole["rows"] and [r["k"] for r in got["rows"]][:3] == [1, 2, 3]
    assert [m["row"] for m in got["malformed"]] == list(range(0, 4000, 97))
    assert got["counts"] == whole["counts"]
    # --limit: the first 1,234 rows only, across the runs
    limited = plan_reads(list_inputs(path).files, path.stat().st_size // 3, limit=1234)
    read = [b for t in limited for b in TextReader().process(t)]
    assert sum(b.num_items for b in read) == 1234 - len(range(0, 1234, 97))


@pytest.mark.parametrize("limit", [None, 700])
def test_a_big_file_that_is_no_parquet_fails_alone(tmp_path: Path, limit: int | None) -> None:
    """Its footer, read to cut it into runs of row groups (or to count its rows for
    --limit), failed the listing task: the whole run, its good files with it."""
    pq.write_table(pa.table({"text": ["w " * 80] * 600}), tmp_path / "good.parquet")
    (tmp_path / "junk.parquet").write_bytes(os.urandom(20_000))
    tasks = plan_reads(list_inputs(tmp_path).files, 5_000, limit=limit)
    stage = TextReader()
    batches = [b for t in tasks for b in stage.process(t)]
    assert sum(b.num_items for b in batches) == 600
    errors = [e for b in batches for e in b.metadata.get(FILE_ERRORS, [])]
    assert [Path(e["file"]).name for e in errors] == ["junk.parquet"]


def test_parquet_rows_without_text_are_malformed_by_row(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["a", None, "c"], "k": [1, 2, 3]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"body": ["x", "y"]}), tmp_path / "b.parquet")
    got = read_all(tmp_path)
    assert [r["k"] for r in got["rows"]] == [1, 3]
    assert [(Path(m["file"]).name, m["row"]) for m in got["malformed"]] == [
        ("a.parquet", 1), ("b.parquet", 0), ("b.parquet", 1),
    ]  # fmt: skip
    assert got["malformed"][1]["reason"] == "no column 'text' (columns: body)"


def test_a_record_cut_short_is_said_to_be_cut_short(tmp_path: Path) -> None:
    """It was "Invalid control character at at column 30": the line's own newline, read as
    part of the string, and the message's last word doubled."""
    path = tmp_path / "cut.jsonl"
    path.write_bytes(b'{"id": 1, "text": "whole"}\n{"id": 2, "text": "cut\n{"id": 3, "t\tx": 1}\n')
    found = {m["line"]: m["reason"] for m in read_all(path)["malformed"]}
    assert found[2].startswith("malformed JSON: Unterminated string starting at column 19 in ")
    assert found[3].startswith("malformed JSON: Invalid control character at column 13 in ")


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_parquet_text_that_is_not_utf8_is_malformed_by_row(tmp_path: Path, kind: Any) -> None:
    """Parquet does not check its strings: one such row failed the whole batch it reached
    (another file's documents with it) in the first filter."""
    texts = [b"fine", b"\xffbad start", None, b"caf\xe9 latin-1", b"also fine"]
    binary = pa.large_binary() if kind == pa.large_string() else pa.binary()
    column = pa.array(texts, binary).view(kind)
    pq.write_table(pa.table({"text": column, "k": range(5)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": ["other"], "k": [9]}), tmp_path / "b.parquet")
    got = read_all(tmp_path)
    assert [r["k"] for r in got["rows"]] == [0, 4, 9]
    found = {m["row"]: m["reason"] for m in got["malformed"]}
    assert found == {
        1: "field 'text' is not valid UTF-8 (invalid start byte at byte 0)",
        2: "field 'text' is null, expected a string",
        3: "field 'text' is not valid UTF-8 (invalid continuation byte at byte 3)",
    }


def test_empty_files_give_an_empty_batch_with_counts(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b"\n\n")
    got = read_all(tmp_path)
    assert got["rows"] == [] and got["counts"]["blank"] == 2
    assert len(got["shards"]) == 1  # the counts still travel on an empty batch
    (tmp_path / "b.jsonl").write_bytes(b"")
    assert [s.path for t in plan_reads(list_inputs(tmp_path).files) for s in t.data] == [
        str(tmp_path / "a.jsonl")
    ]  # a file of no bytes is not even read


def test_limit_keeps_the_first_records(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(lines(*({"i": i, "text": "t"} for i in range(5))))
    (tmp_path / "b.jsonl.gz").write_bytes(
        gzip.compress(lines(*({"i": 5 + i, "text": "t"} for i in range(5))))
    )
    (tmp_path / "c.jsonl").write_bytes(lines({"i": 99, "text": "t"}))
    tasks = TextPartitioner(tmp_path, limit=7).tasks()
    rows = [r for t in tasks for b in TextReader().process(t) for r in b.to_pyarrow().to_pylist()]
    assert [r["i"] for r in rows] == list(range(7))


# -- writing --------------------------------------------------------------------------------
def batch(shard: str, **columns: list[Any]) -> DocumentBatch:
    return DocumentBatch(data=pa.table(columns), metadata={"shard": shard})


def test_sharded_writer_names_files_after_the_shard_and_drops_internal_columns(
    tmp_path: Path,
) -> None:
    writer = ShardedWriter(tmp_path, "parquet")
    out = writer.process(
        batch("00000003-000001", text=["a", "b"], _conveyor_doc_id=[1, 2], language=["en", None])
    )
    assert out.data == [str(tmp_path / "part-00000003-000001.parquet")]
    assert out.metadata["written"] == {"rows": 2, "by": {"en": 1, "unknown": 1}}
    assert pq.read_table(out.data[0]).column_names == ["text", "language"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
    assert oct(os.stat(out.data[0]).st_mode & 0o777) != oct(0o600)  # readable like any file
    empty = writer.process(batch("x", text=[]))
    assert empty.data == [] and empty.metadata["written"]["rows"] == 0


def test_jsonl_writer_keeps_unicode_and_nested_values(tmp_path: Path) -> None:
    for compression, opener in ((None, open), ("gzip", gzip.open)):
        writer = ShardedWriter(tmp_path, "jsonl", compression=compression)
        out = writer.process(
            batch("1", text=["ünï 😀\nline"], meta=[{"a": [1, 2]}], _conveyor_doc_id=[7])
        )
        with opener(out.data[0], "rt", encoding="utf-8") as stream:
            text = stream.read()
        assert "ünï 😀" in text  # not ASCII-escaped
        assert [json.loads(x) for x in text.splitlines()] == [
            {"text": "ünï 😀\nline", "meta": {"a": [1, 2]}}
        ]


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import conveyor.stages.text.writers as writers

    def boom(table: Any, stream: Any, compression: Any = None) -> None:
        stream.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(writers, "write_jsonl", boom)
    with pytest.raises(OSError, match="disk full"):
        ShardedWriter(tmp_path, "jsonl").process(batch("1", text=["a"]))
    assert list(tmp_path.iterdir()) == []


def test_publish_numbers_shards_in_order_and_replaces_an_earlier_run(tmp_path: Path) -> None:
    staged, out = tmp_path / "staged", tmp_path / "out"
    writer = ShardedWriter(staged, "parquet")
    for shard, texts in (
        ("00000002-000000", ["c"]),
        ("00000000-000001", ["b"]),
        ("00000000-000000", ["a"]),
    ):
        writer.process(batch(shard, text=texts))
    out.mkdir()
    (out / "part-00007.parquet").write_bytes(b"from an earlier run")
    (out / "keep.txt").write_text("not ours")
    files = publish_shards(staged, out)
    assert [Path(f).name for f in files] == [f"part-0000{i}.parquet" for i in range(3)]
    assert [pq.read_table(f).column("text").to_pylist() for f in files] == [["a"], ["b"], ["c"]]
    assert sorted(p.name for p in out.iterdir()) == [
        "keep.txt", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet",
    ]  # fmt: skip
    assert list(staged.iterdir()) == []


def test_columns_of_different_types_in_different_parts_become_json_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The folder did not read as one dataset ("Failed to parse string: 'x612' as a scalar
    of type int64"), without a word."""
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"]
    pq.write_table(pa.table({"id": [1], "meta": [{"n": 1}], "text": ["a"]}), paths[0])
    pq.write_table(pa.table({"id": ["x2"], "meta": ["m"], "text": ["b"]}), paths[1])
    pq.write_table(pa.table({"id": [3], "text": ["c"]}), paths[2])
    with caplog.at_level("WARNING", logger="conveyor.stages.text.writers"):
        assert unify_parquet(paths) == 3
    assert "column 'id' holds int64 and string in different parts" in caplog.text
    table = pq.read_table(tmp_path)
    assert table.column("id").to_pylist() == ["1", '"x2"', "3"]
    assert table.column("meta").to_pylist() == ['{"n": 1}', '"m"', None]
    assert table.column("text").to_pylist() == ["a", "b", "c"]  # agreeing columns as they were


def test_a_jsonl_field_of_mixed_types_is_written_back_as_it_was_read(tmp_path: Path) -> None:
    """Values of a field whose types differ within a batch were written as strings: 1 came
    out as "1", an object as the text of it."""
    rows = [{"id": 1, "text": "a", "meta": {"k": [1, 2]}}, {"id": "x", "text": "b", "meta": 2.5}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (batch,) = [b for t in plan_reads(list_inputs(tmp_path).files) for b in TextReader().process(t)]
    out = io.BytesIO()
    write_jsonl(batch.to_pyarrow().drop_columns(["_conveyor_doc_id"]), out)
    assert [json.loads(line) for line in out.getvalue().splitlines()] == rows


def test_objects_are_written_back_as_they_were_read(tmp_path: Path) -> None:
    """An empty object failed its task (Parquet has no struct of no fields) and its
    documents were lost; objects of other keys in the batch came out with every key
    (``{"a": 1}`` as ``{"a": 1, "b": null}``)."""
    rows = [
        {"text": "a", "meta": {}, "deep": {"x": {}}, "list": [{}]},
        {"text": "b", "meta": {"a": 1}, "deep": {"x": {"y": 1}}, "list": [{"k": 1}]},
        {"text": "c", "meta": {"b": 2}, "deep": None, "list": []},
        {"text": "d", "same": {"k": [1]}},
        {"text": "e", "same": {"k": [2, 3]}},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (batch,) = [b for t in plan_reads(list_inputs(tmp_path).files) for b in TextReader().process(t)]
    table = batch.to_pyarrow().drop_columns(["_conveyor_doc_id"])
    out = io.BytesIO()
    write_jsonl(table, out)
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [{k: v for k, v in r.items() if v is not None} for r in written] == [
        {k: v for k, v in r.items() if v is not None} for r in rows
    ]
    parquet = tmp_path / "out.parquet"
    pq.write_table(table, parquet)  # it failed: "Cannot write struct type 'meta' with no child"
    # objects of one shape stay a struct column, for Parquet readers
    assert pa.types.is_struct(table.schema.field("same").type)
    assert pq.read_table(parquet).column("same").to_pylist()[3:] == [{"k": [1]}, {"k": [2, 3]}]


def test_lists_and_objects_arrow_keeps_as_read_stay_arrow_columns() -> None:
    """A list holding a NaN was taken for one Arrow changed (NaN is not NaN) and made text."""
    import math

    from conveyor.stages.text.readers import _column

    field, array = _column("scores", [[1.0, math.nan], [2.0]])
    assert field.type == pa.list_(pa.float64()) and math.isnan(array.to_pylist()[0][1])
    field, _ = _column("meta", [{"a": math.nan, "b": [1]}, {"a": 2.0, "b": []}])
    assert pa.types.is_struct(field.type)
    field, _ = _column("meta", [{"a": 1}, {"b": 2}])
    assert field.type == pa.string()  # other keys: JSON text, as read


def test_an_integer_no_float_holds_makes_its_column_json_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Parts with integers beyond 2**53 in one and decimals in another failed the run at
    its very end, after all its work, not naming the column."""
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"]
    big = 1_700_000_000_123_456_789
    pq.write_table(pa.table({"ns": [big], "score": [1], "text": ["a"]}), paths[0])
    pq.write_table(pa.table({"ns": [1.5], "score": [2.5], "text": ["b"]}), paths[1])
    pq.write_table(pa.table({"ns": [None], "score": [3], "text": ["c"]}), paths[2])
    with caplog.at_level("WARNING", logger="conveyor.stages.text.writers"):
        assert unify_parquet(paths) == 3
    assert "column 'ns': Integer value 1700000000123456789 not in range" in caplog.text
    table = pq.read_table(tmp_path)
    assert table.column("ns").to_pylist() == [str(big), "1.5", None]  # every digit kept
    assert table.column("score").to_pylist() == [1.0, 2.5, 3.0]  # integers that fit: numbers
    assert table.schema.field("score").type == pa.float64()


def test_an_input_field_named_doc_id_is_kept(tmp_path: Path) -> None:
    """It was taken for the reader's own id column and dropped without a word."""
    (tmp_path / "a.jsonl").write_text('{"_doc_id": 1000, "text": "a"}\n')
    pq.write_table(pa.table({"_doc_id": [7], "text": ["b"]}), tmp_path / "b.parquet")
    rows = read_all(tmp_path)["rows"]
    assert [r["_doc_id"] for r in rows] == [1000, 7]
    assert len({r["_conveyor_doc_id"] for r in rows}) == 2


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_published_jsonl_records_all_have_every_field_in_one_order(
    tmp_path: Path, compression: str | None
) -> None:
    """A field first seen in a later shard was missing from the earlier shards' records,
    and came before others in its own: the README promises every field, in one order."""
    staged, out = tmp_path / "staged", tmp_path / "out"
    writer = ShardedWriter(staged, "jsonl", compression=compression)
    writer.process(batch("0", id=[1, 2], text=["a", "b"], language=["en", "de"]))
    odd = "c \u00fc\U0001f600"
    writer.process(batch("1", late=[{"k": 1}], id=[3], text=[odd], language=["fr"]))
    writer.process(batch("2", id=[4], text=["d"], language=["en"]))
    files = publish_shards(staged, out)
    opener = {None: open, "gzip": gzip.open, "zstd": zstandard.open}[compression]
    records = []
    for name in files:
        with opener(name, "rb") as stream:
            records += [json.loads(line) for line in stream.read().splitlines()]
    assert [list(r) for r in records] == [["id", "text", "language", "late"]] * 4
    assert [r["late"] for r in records] == [None, None, {"k": 1}, None]
    assert [r["text"] for r in records] == ["a", "b", odd, "d"]  # values as they were


def test_jsonl_parts_rewritten_by_the_run_s_workers_are_those_the_driver_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.stages.text import writers

    made = []
    for copy in ("one", "many"):
        folder = tmp_path / copy
        folder.mkdir()
        for n in range(4):
            extra = {"late": n} if n == 3 else {}
            lines = [json.dumps({"text": f"t{n}-{i}", "id": i, **extra}) for i in range(50)]
            (folder / f"part-{n}.jsonl").write_text("\n".join(lines) + "\n")
        made.append(sorted(folder.iterdir()))
    assert writers.unify_jsonl(made[0]) == 3
    monkeypatch.setattr(writers, "PARALLEL_REWRITE_BYTES", 0)
    executor = StreamingExecutor(LocalBackend(num_cpus=2))
    assert writers.unify_jsonl(made[1], executor=executor) == 3
    assert [p.read_bytes() for p in made[0]] == [p.read_bytes() for p in made[1]]
    assert json.loads(made[1][0].read_text().splitlines()[0]) == {
        "text": "t0-0",
        "id": 0,
        "late": None,
    }
    # a part that cannot be rewritten stops the publishing, naming it
    for broken in made[1][1:3]:
        broken.write_text('{"text": "a", "id": 1}\n{not json\n')
    for parts, how, count in ((made[1][:2], None, 1), (made[1], executor, 2)):  # driver, workers
        with pytest.raises(OSError, match=rf"{count} JSONL part\(s\) could not be rewritten"):
            writers.unify_jsonl(parts, executor=how)


def test_unify_parquet_makes_one_schema(tmp_path: Path) -> None:
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pq.write_table(pa.table({"text": ["a"], "meta": pa.nulls(1)}), paths[0])
    pq.write_table(pa.table({"text": ["b"], "meta": ["m"], "n": [1]}), paths[1])
    assert unify_parquet(paths) == 1
    table = pq.read_table(tmp_path)
    assert table.column("meta").to_pylist() == [None, "m"]
    assert table.schema.field("meta").type == pa.string()


def test_a_text_field_the_first_file_surely_lacks_is_named(tmp_path: Path) -> None:
    from conveyor.stages.text.readers import text_field_problem

    (tmp_path / "a.jsonl").write_text('not json\n{"id": 1, "body": "x"}\n[1]\n')
    listing = list_inputs(tmp_path / "a.jsonl")
    assert text_field_problem(listing, "body") is None
    assert text_field_problem(listing, "text") == (
        f"none of the first 1 record(s) of {tmp_path / 'a.jsonl'} has a field 'text' (their "
        "fields: id, body)"
    )
    # present but not a string: a malformed record the run counts, not a wrong name
    (tmp_path / "b.jsonl").write_text('{"text": 7}\n')
    assert text_field_problem(list_inputs(tmp_path / "b.jsonl"), "text") is None
    # nothing parses: the run says why, line by line
    (tmp_path / "c.jsonl").write_text("{broken\n")
    assert text_field_problem(list_inputs(tmp_path / "c.jsonl"), "text") is None
    # a gzip file is looked into; the first record with the field, past others, is enough
    lines = [json.dumps({"n": i}) for i in range(50)] + [json.dumps({"text": "x"})]
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    assert text_field_problem(list_inputs(tmp_path / "d.jsonl.gz"), "text") is None
    pq.write_table(pa.table({"id": [1], "body": ["x"]}), tmp_path / "e.parquet")
    assert "e.parquet has no column 'text' (it has id, body)" in str(
        text_field_problem(list_inputs(tmp_path / "e.parquet"), "text")
    )
