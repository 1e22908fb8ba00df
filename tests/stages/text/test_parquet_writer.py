"""ParquetWriter: deterministic names, atomic writes, empty batches, clear errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.stages.text import ParquetWriter
from conveyor.tasks import DocumentBatch, FileGroupTask


def _batch(task_id: str = "0.3", rows: int = 2, **metadata: object) -> DocumentBatch:
    table = pa.table({"text": [f"doc {i}" for i in range(rows)], "n": list(range(rows))})
    return DocumentBatch(data=table, dataset_name="web", task_id=task_id, metadata=dict(metadata))


def test_writes_one_file_named_from_the_task_id(tmp_path: Path) -> None:
    out_dir = tmp_path / "out" / "nested"
    out = ParquetWriter(out_dir).process(_batch(rejected_by={"word_count": 1}))
    assert isinstance(out, FileGroupTask)
    assert out.data == [str(out_dir / "part-0-3.parquet")]
    assert out.dataset_name == "web"
    assert out.metadata == {"rejected_by": {"word_count": 1}, "num_rows": 2}
    table = pq.read_table(out.data[0])
    assert table.column("text").to_pylist() == ["doc 0", "doc 1"]
    assert sorted(p.name for p in out_dir.iterdir()) == ["part-0-3.parquet"]  # no temp files


def test_rewriting_the_same_task_replaces_the_file(tmp_path: Path) -> None:
    writer = ParquetWriter(tmp_path, prefix="docs")
    writer.process(_batch(rows=5))
    out = writer.process(_batch(rows=1))
    assert [p.name for p in tmp_path.iterdir()] == ["docs-0-3.parquet"]
    assert pq.read_table(out.data[0]).num_rows == 1


def test_source_id_names_a_batch_without_task_id(tmp_path: Path) -> None:
    out = ParquetWriter(tmp_path).process(_batch(task_id="", source_id="abc123"))
    assert Path(out.data[0]).name == "part-abc123.parquet"


def test_a_batch_without_any_id_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a task_id nor metadata\\['source_id'\\]"):
        ParquetWriter(tmp_path).process(_batch(task_id=""))


def test_empty_batch_writes_nothing_but_keeps_metadata(tmp_path: Path) -> None:
    out = ParquetWriter(tmp_path / "out").process(_batch(rows=0, rejected_by={"x": 2}))
    assert out.data == []
    assert out.metadata == {"rejected_by": {"x": 2}, "num_rows": 0}
    assert not (tmp_path / "out").exists()


def test_output_path_that_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "out"
    blocker.write_text("not a directory")
    with pytest.raises(NotADirectoryError, match=r"output path .*out' is a file"):
        ParquetWriter(blocker).process(_batch())


def test_prefix_is_validated_and_resources_declared(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefix must be letters"):
        ParquetWriter(tmp_path, prefix="../escape")
    assert ParquetWriter(tmp_path).resources.cpus == 0.5
