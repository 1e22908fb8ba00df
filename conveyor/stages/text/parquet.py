"""Writing ``DocumentBatch``es as Parquet files with names derived from the task's lineage id."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.text import _arrow  # noqa: F401 - pandas/pyarrow set-up once
from conveyor.storage import ObjectPath, atomic_write, location
from conveyor.tasks import DocumentBatch, FileGroupTask

_UNSAFE = re.compile(r"[^0-9A-Za-z_-]+")


class ParquetWriter(ProcessingStage[DocumentBatch, FileGroupTask]):
    """Writes each batch to ``output_dir/{prefix}-{task_id}.parquet`` and emits the path
    (``output_dir`` may be a URL such as ``s3://bucket/out``).

    The name comes from the task's lineage id (``metadata["source_id"]`` when it has none), so
    a rerun over the same inputs rewrites the same files instead of adding new ones. Files are
    written under a hidden temporary name and renamed (copied, on a store), so a crashed or
    retried attempt never leaves a half-written file with a real name. An empty batch writes
    nothing and gives a ``FileGroupTask`` without paths, which still carries the batch's
    metadata (its counts).
    Writing is I/O bound, hence the half CPU.
    """

    resources = Resources(cpus=0.5)

    def __init__(
        self, output_dir: str | Path | ObjectPath, prefix: str = "part", compression: str = "snappy"
    ) -> None:
        if not prefix or _UNSAFE.search(prefix):
            raise ValueError(
                f"ParquetWriter: prefix must be letters, digits, '_' or '-', got {prefix!r}"
            )
        self.output_dir = str(output_dir)
        self.prefix = prefix
        self.compression = compression

    def file_name(self, task: DocumentBatch) -> str:
        """The deterministic file name for ``task``."""
        key = task.task_id or str(task.metadata.get("source_id", ""))
        if not key:
            raise ValueError(
                f"stage {self.name!r}: cannot name the output file of a batch with neither a "
                "task_id nor metadata['source_id'] (set one when calling process() directly)"
            )
        return f"{self.prefix}-{_UNSAFE.sub('-', key)}.parquet"

    def process(self, task: DocumentBatch) -> FileGroupTask:
        table = task.to_pyarrow()
        metadata: dict[str, Any] = dict(task.metadata)
        metadata["num_rows"] = table.num_rows
        if table.num_rows == 0:
            return FileGroupTask(data=[], dataset_name=task.dataset_name, metadata=metadata)
        out = location(self.output_dir)
        if isinstance(out, Path) and out.is_file():  # a store's key and prefix may coexist
            raise NotADirectoryError(
                f"stage {self.name!r}: output path {self.output_dir!r} is a file, expected a "
                "directory"
            )
        final = out / self.file_name(task)
        with atomic_write(final) as stream:
            pq.write_table(table, stream, compression=self.compression)
        return FileGroupTask(data=[str(final)], dataset_name=task.dataset_name, metadata=metadata)
