"""JsonlReaderStage / JsonlReader: records to a DocumentBatch, bad input named by file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pytest

from conveyor import Pipeline
from conveyor.stages.io import FilePartitioningStage
from conveyor.stages.text import JsonlReader, JsonlReaderStage, iter_jsonl
from conveyor.tasks import DocumentBatch, FileGroupTask


def _write(path: Path, *lines: str) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _records(*texts: str) -> list[str]:
    return [json.dumps({"id": i, "text": t, "extra": True}) for i, t in enumerate(texts)]


def test_reads_a_group_of_files_into_one_batch(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", *_records("one", "two"))
    b = _write(tmp_path / "b.jsonl", *_records("three"))
    task = FileGroupTask(data=[a, b], dataset_name="web", metadata={"partition_index": 4})
    out = JsonlReaderStage().process(task)
    assert isinstance(out, DocumentBatch)
    assert isinstance(out.data, pa.Table)
    assert out.data.column("text").to_pylist() == ["one", "two", "three"]
    assert out.columns == ["id", "text", "extra"]
    assert out.dataset_name == "web"
    assert out.metadata["partition_index"] == 4
    assert out.metadata["source_files"] == [a, b]
    assert out.metadata["source_id"] == task.content_id


def test_fields_keep_only_those_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", *_records("x", "y"))
    out = JsonlReaderStage(fields=["text", "id"]).process(FileGroupTask(data=[path]))
    assert out is not None
    assert out.columns == ["text", "id"]
    assert JsonlReaderStage(fields=["text"]).outputs() == ([], ["text"])
    assert JsonlReaderStage().outputs() is None


def test_blank_lines_are_skipped_and_gzip_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "a"}) + "\n\n   \n" + json.dumps({"text": "b"}) + "\r\n")
    out = JsonlReaderStage().process(FileGroupTask(data=[str(path)]))
    assert out is not None
    assert out.data.column("text").to_pylist() == ["a", "b"]


def test_empty_files_give_no_output(tmp_path: Path) -> None:
    path = _write(tmp_path / "empty.jsonl", "", "  ")
    assert JsonlReaderStage().process(FileGroupTask(data=[path])) is None


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    good = json.dumps({"text": "ok"})
    path = _write(tmp_path / "bad.jsonl", good, "", '{"text": "unterminated', good)
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 3: malformed JSON") as info:
        JsonlReaderStage().process(FileGroupTask(data=[path]))
    assert "unterminated" in str(info.value)


def test_a_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = _write(tmp_path / "list.jsonl", json.dumps({"text": "ok"}), "[1, 2]")
    with pytest.raises(ValueError, match=r"list\.jsonl, line 2: expected a JSON object, got list"):
        JsonlReaderStage().process(FileGroupTask(data=[path]))


def test_a_record_without_a_required_field(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", json.dumps({"text": "ok"}), json.dumps({"body": "x"}))
    with pytest.raises(ValueError, match=r"a\.jsonl, line 2: record lacks field\(s\) text"):
        JsonlReaderStage(fields=["text"]).process(FileGroupTask(data=[path]))


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl, line 2: not valid UTF-8"):
        JsonlReaderStage().process(FileGroupTask(data=[str(path)]))


def test_missing_file_is_named(tmp_path: Path) -> None:
    present = _write(tmp_path / "a.jsonl", json.dumps({"text": "ok"}))
    missing = str(tmp_path / "gone.jsonl")
    with pytest.raises(FileNotFoundError, match=r"gone\.jsonl' does not exist"):
        JsonlReaderStage().process(FileGroupTask(data=[present, missing]))


def test_a_field_changing_type_names_the_files(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", json.dumps({"n": 1}), json.dumps({"n": {"x": 1}}))
    with pytest.raises(ValueError, match=r"a\.jsonl do not form one table"):
        JsonlReaderStage().process(FileGroupTask(data=[path]))


def test_wrong_input_type_is_reported() -> None:
    with pytest.raises(TypeError, match="expects a FileGroupTask, got str"):
        JsonlReaderStage().process("a.jsonl")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fields must be a list"):
        JsonlReaderStage(fields="text")


def test_iter_jsonl_streams_records(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", *_records("x", "y"))
    assert [r["text"] for r in iter_jsonl(path)] == ["x", "y"]


def test_composite_expands_to_partitioning_and_reading(tmp_path: Path) -> None:
    reader = JsonlReader(tmp_path, files_per_partition=3, fields=["text"], dataset_name="d")
    parts = reader.decompose()
    assert [type(p) for p in parts] == [FilePartitioningStage, JsonlReaderStage]
    partitioner = parts[0]
    assert isinstance(partitioner, FilePartitioningStage)
    assert (partitioner.pattern, partitioner.files_per_partition) == ("*.jsonl", 3)
    assert [s.resources.cpus for s in parts] == [0.5, 0.5]
    specs = Pipeline("p", [reader]).build()
    assert [s.name for s in specs] == ["FilePartitioningStage", "JsonlReaderStage"]


def test_a_line_over_the_limit_is_named_and_never_held_whole(tmp_path: Path) -> None:
    """A .gz bomb's one line of gigabytes was read whole."""
    import tracemalloc

    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb") as out:
        out.write(b'{"text": "ok"}\n{"text": "')
        for _ in range(24):
            out.write(b"a" * (1 << 20))
        out.write(b'"}\n')
    tracemalloc.start()
    with pytest.raises(ValueError, match=r"bomb\.jsonl\.gz, line 2: a line of 25,165,837 bytes"):
        JsonlReaderStage(max_doc_bytes=1 << 20).process(FileGroupTask(data=[str(path)]))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20
    assert next(r["text"] for r in iter_jsonl(path, max_doc_bytes=None)) == "ok"
    with pytest.raises(ValueError, match="max_doc_bytes must be None or >= 1"):
        JsonlReaderStage(max_doc_bytes=0)


@pytest.mark.parametrize("depth", [51, 300, 2000])
def test_a_record_nested_too_deep_is_named(tmp_path: Path, depth: int) -> None:
    """At 300 levels a batch could not be pickled; deeper, the parser raised RecursionError."""
    nested = '{"a": ' * (depth - 1) + "1" + "}" * (depth - 1)
    path = _write(tmp_path / "deep.jsonl", json.dumps({"text": "ok"}), f'{{"x": {nested}}}')
    with pytest.raises(ValueError, match=r"deep\.jsonl, line 2: nested deeper than 50 levels"):
        JsonlReaderStage().process(FileGroupTask(data=[path]))
    fifty = '{"a": ' * 48 + "1" + "}" * 48
    ok = _write(tmp_path / "ok.jsonl", f'{{"x": {fifty}}}')
    assert JsonlReaderStage().process(FileGroupTask(data=[ok])) is not None
