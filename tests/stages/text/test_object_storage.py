"""Text stages on URLs: JSONL (plain and gzip) read and Parquet written through fsspec's memory
store in-process, and a whole pipeline from one S3 bucket prefix to another on the local
backend, giving the same files as the same run on local disk."""

from __future__ import annotations

import gzip
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest

from conveyor import Pipeline
from conveyor.backends import LocalBackend
from conveyor.demos.text import FIELDS, generate_sample_data
from conveyor.executors import StreamingExecutor
from conveyor.stages.io import FilePartitioningStage, list_files
from conveyor.stages.text import HeuristicFilter, JsonlReader, JsonlReaderStage, ParquetWriter
from conveyor.storage import ObjectPath
from conveyor.tasks import DocumentBatch, FileGroupTask
from tests.s3_server import put


def test_jsonl_and_parquet_on_a_url(memory: ObjectPath) -> None:
    plain = put(memory / "in" / "a.jsonl", b'{"id": 1, "text": "one"}\n\n{"id": 2, "text": "t"}\n')
    zipped = put(memory / "in" / "b.jsonl.gz", gzip.compress(b'{"id": 3, "text": "three"}\n'))
    put(memory / "in" / ".a.jsonl.1234.tmp", b"{half")  # a writer's temporary: never listed
    assert [str(p) for p in list_files(memory / "in", "*.jsonl*")] == [plain, zipped]
    batch = JsonlReaderStage().process(FileGroupTask(data=[plain, zipped], task_id="0.1"))
    assert isinstance(batch, DocumentBatch)
    assert batch.data.column("id").to_pylist() == [1, 2, 3]
    batch.task_id = "0.1"
    out = ParquetWriter(str(memory / "out")).process(batch)
    assert out.data == [f"{memory}/out/part-0-1.parquet"]
    assert [p.name for p in (memory / "out").iterdir()] == ["part-0-1.parquet"]
    with (memory / "out" / "part-0-1.parquet").open() as stream:
        assert pq.read_table(stream).equals(batch.data)


def test_bad_urls_are_named(memory: ObjectPath) -> None:
    bad = put(memory / "bad.jsonl", b'{"id": 1}\n{oops\n')
    with pytest.raises(ValueError, match=rf"{bad}, line 2: malformed JSON"):
        JsonlReaderStage().process(FileGroupTask(data=[bad]))
    with pytest.raises(FileNotFoundError, match=rf"JSONL file '{memory}/gone.jsonl' does not"):
        JsonlReaderStage().process(FileGroupTask(data=[f"{memory}/gone.jsonl"]))
    with pytest.raises(FileNotFoundError, match=rf"input directory '{memory}/nowhere' does not"):
        FilePartitioningStage(f"{memory}/nowhere", "*.jsonl").partitions()
    with pytest.raises(NotADirectoryError, match="is a file, expected a directory"):
        list_files(bad)


def test_listing_a_prefix_like_glob_and_rglob(memory: ObjectPath) -> None:
    for name in ("a.jsonl", "sub/b.jsonl", "sub/.hidden/c.jsonl", "sub/d.txt", ".e.jsonl"):
        put(memory / name, b"{}\n")
    assert [p.name for p in list_files(memory, "*.jsonl")] == ["a.jsonl", "b.jsonl"]
    assert [p.name for p in list_files(memory, "*.jsonl", recursive=False)] == ["a.jsonl"]
    assert [p.name for p in list_files(memory, "sub/*")] == ["b.jsonl", "d.txt"]


def _pipeline(source: str, output: str) -> Pipeline:
    return Pipeline(
        "text-urls",
        [
            JsonlReader(source, files_per_partition=2, fields=FIELDS),
            HeuristicFilter(drop_empty=False),
            ParquetWriter(output),
        ],
    )


def _tables(paths: list[str]) -> dict[str, object]:
    tables = {}
    for path in paths:
        with fsspec.open(path, "rb") as stream:
            tables[path.rsplit("/", 1)[-1]] = pq.read_table(stream)
    return tables


def test_a_pipeline_from_a_bucket_to_a_bucket_writes_what_a_local_run_writes(
    bucket: str, tmp_path: Path
) -> None:
    generate_sample_data(tmp_path / "in", files=4, docs_per_file=30)
    fs = fsspec.filesystem("s3")
    fs.put(str(tmp_path / "in") + "/", f"{bucket[5:]}/in/", recursive=True)
    executor = StreamingExecutor(LocalBackend(num_cpus=2))
    local = _pipeline(str(tmp_path / "in"), str(tmp_path / "out")).run(executor)
    remote = _pipeline(f"{bucket}/in", f"{bucket}/out").run(
        StreamingExecutor(LocalBackend(num_cpus=2))
    )
    assert local.ok and remote.ok, (local.failures, remote.failures)
    local_paths = sorted(p for task in local.outputs for p in task.data)
    remote_paths = sorted(p for task in remote.outputs for p in task.data)
    assert all(p.startswith(f"{bucket}/out/part-") for p in remote_paths)
    local_tables, remote_tables = _tables(local_paths), _tables(remote_paths)
    assert sorted(local_tables) == sorted(remote_tables) and len(local_tables) == 2
    for name, table in local_tables.items():
        assert remote_tables[name].equals(table)  # type: ignore[attr-defined]
    # only finished objects in the bucket: every temporary was copied and removed
    assert sorted(fs.find(f"{bucket[5:]}/out")) == sorted(p[5:] for p in remote_paths)
