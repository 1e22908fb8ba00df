"""Reading JSON Lines files into ``DocumentBatch``es.

Parsing uses the stdlib ``json`` one line at a time, so that a bad record is reported with its
file and line number; for the document sizes of curation work the parse is not the bottleneck.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from conveyor.resources import Resources
from conveyor.stage import CompositeStage, ProcessingStage
from conveyor.stages.io.partitioning import FilePartitioningStage
from conveyor.stages.text import _arrow  # noqa: F401 - pandas/pyarrow set-up once
from conveyor.stages.text.readers import (
    DEFAULT_MAX_DOC_BYTES,
    TOO_DEEP,
    read_line,
    too_deep,
)
from conveyor.storage import is_url, open_input
from conveyor.tasks import DocumentBatch, FileGroupTask

_SNIPPET = 60


@contextlib.contextmanager
def _open(path: str) -> Iterator[IO[bytes]]:
    """The file's bytes (a local path or a URL), decompressed when it ends in ``.gz``."""
    try:
        raw = open_input(path)
    except FileNotFoundError as exc:
        detail = str(exc)
        if is_url(path) and "bucket" in detail.lower():
            raise FileNotFoundError(f"JSONL file {detail}") from None
        raise FileNotFoundError(f"JSONL file {path!r} does not exist") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"JSONL path {path!r} is a directory, expected a file") from None
    with raw:
        if path.endswith(".gz"):
            with gzip.open(raw, "rb") as unzipped:
                yield unzipped
        else:
            yield raw


def iter_jsonl(
    path: str | Path,
    fields: Sequence[str] | None = None,
    max_doc_bytes: int | None = DEFAULT_MAX_DOC_BYTES,
) -> Iterator[dict[str, Any]]:
    """Records of one JSONL file, a local path or a URL (blank lines skipped; ``.gz``
    decompressed).

    Raises ``ValueError`` naming the file and 1-based line number for invalid UTF-8, malformed
    JSON, a line that is not an object, a record that lacks one of ``fields``, a line longer
    than ``max_doc_bytes`` (``None``: no limit; never held whole: a ``.gz`` bomb's gigabyte
    line took gigabytes) or a record nested deeper than ``readers.MAX_DEPTH`` levels.
    """
    path = str(path)
    with _open(path) as stream:
        lineno = 0
        while True:
            raw, size = read_line(stream, max_doc_bytes)
            if not size:
                return
            lineno += 1
            if raw is None:
                raise ValueError(
                    f"{path}, line {lineno}: a line of {size:,} bytes: longer than the limit "
                    f"of {max_doc_bytes:,} on a document"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path}, line {lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                snippet = line.strip()
                if len(snippet) > _SNIPPET:
                    snippet = snippet[: _SNIPPET - 3] + "..."
                raise ValueError(
                    f"{path}, line {lineno}: malformed JSON: {exc.msg} at column {exc.colno} "
                    f"in {snippet!r}"
                ) from None
            except RecursionError:
                raise ValueError(f"{path}, line {lineno}: {TOO_DEEP}") from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{path}, line {lineno}: expected a JSON object, got {type(record).__name__}"
                )
            if too_deep(raw, record):
                raise ValueError(f"{path}, line {lineno}: {TOO_DEEP}")
            if fields:
                missing = [f for f in fields if f not in record]
                if missing:
                    raise ValueError(
                        f"{path}, line {lineno}: record lacks field(s) {', '.join(missing)} "
                        f"(it has: {', '.join(record) or 'nothing'})"
                    )
                record = {f: record[f] for f in fields}
            yield record


class JsonlReaderStage(ProcessingStage[FileGroupTask, DocumentBatch]):
    """Reads every file of a ``FileGroupTask`` into one ``DocumentBatch`` (a pyarrow Table).

    ``fields`` keeps only those keys and makes each of them required; without it every key
    becomes a column. A group whose files hold no record gives no output (counted as filtered).
    Reading is I/O bound, hence the half CPU.
    """

    resources = Resources(cpus=0.5)

    def __init__(
        self,
        fields: Sequence[str] | None = None,
        max_doc_bytes: int | None = DEFAULT_MAX_DOC_BYTES,
    ) -> None:
        if isinstance(fields, str):
            raise TypeError(f"JsonlReaderStage: fields must be a list of names, got {fields!r}")
        if max_doc_bytes is not None and max_doc_bytes < 1:
            raise ValueError(
                f"JsonlReaderStage: max_doc_bytes must be None or >= 1, got {max_doc_bytes}"
            )
        self.fields = list(fields) if fields is not None else None
        self.max_doc_bytes = max_doc_bytes

    def outputs(self) -> tuple[list[str], list[str]] | None:
        return ([], list(self.fields)) if self.fields else None

    def process(self, task: FileGroupTask) -> DocumentBatch | None:
        import pyarrow as pa

        if not isinstance(task, FileGroupTask):
            raise TypeError(
                f"stage {self.name!r} expects a FileGroupTask, got {type(task).__name__}"
            )
        records: list[dict[str, Any]] = []
        for path in task.data:
            records.extend(iter_jsonl(path, self.fields, self.max_doc_bytes))
        if not records:
            return None
        try:
            table = pa.Table.from_pylist(records)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(
                f"stage {self.name!r}: records of {', '.join(task.data)} do not form one table "
                f"(a field changes type between records?): {exc}"
            ) from None
        metadata = dict(task.metadata)
        metadata["source_files"] = list(task.data)
        metadata["source_id"] = task.content_id
        return DocumentBatch(data=table, dataset_name=task.dataset_name, metadata=metadata)


class JsonlReader(CompositeStage[Any, DocumentBatch]):
    """Partition the ``*.jsonl`` files under ``path`` (a directory or a URL such as
    ``s3://bucket/docs``) and read each group: two stages in one."""

    def __init__(
        self,
        path: str | Path,
        pattern: str = "*.jsonl",
        files_per_partition: int = 1,
        fields: Sequence[str] | None = None,
        *,
        recursive: bool = True,
        limit: int | None = None,
        dataset_name: str = "",
    ) -> None:
        self.partitioner = FilePartitioningStage(
            path,
            pattern,
            files_per_partition,
            recursive=recursive,
            limit=limit,
            dataset_name=dataset_name,
        )
        self.reader = JsonlReaderStage(fields=fields)

    def decompose(self) -> list[ProcessingStage[Any, Any]]:
        return [self.partitioner, self.reader]
