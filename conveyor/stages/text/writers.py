"""Writing documents as sharded Parquet or JSONL with deterministic names, atomically.

``ShardedWriter`` writes each batch to ``{prefix}-{shard}.{ext}``, the shard being the name
the reader gave the batch (``metadata["shard"]``: it sorts in input order), through
``storage.atomic_write``: a hidden temporary renamed into place, so a crash or a retry never
leaves a half-written file under a real name. ``publish_shards`` then moves a finished run's
shards into the output as ``part-00000.parquet``, ``part-00001.parquet``, ... in that order:
the same input and options always give the same files, with the same names and rows.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import decimal
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.text import _arrow  # noqa: F401 - pandas/pyarrow set-up once
from conveyor.stages.text.readers import (
    COMPRESSION_RATIO,
    DOC_ID,
    SHARD,
    Compression,
    _jsonl_stream,
    is_json,
    json_field,
    json_text,
)
from conveyor.storage import ObjectPath, StoragePath, atomic_write, location
from conveyor.tasks import DocumentBatch, FileGroupTask

if TYPE_CHECKING:
    import pyarrow as pa

    from conveyor.executors.base import Executor
    from conveyor.executors.ray_data import RayDataExecutor

log = logging.getLogger(__name__)

Format = Literal["parquet", "jsonl"]
FORMATS: tuple[Format, ...] = ("parquet", "jsonl")
#: metadata key: what a writer wrote (rows, and rows per value of ``count_by``)
WRITTEN = "written"
_UNSAFE = re.compile(r"[^0-9A-Za-z_-]+")
_JSONL_COMPRESSIONS = {None: "", "gzip": ".gz", "zstd": ".zst"}


def extension(fmt: Format, compression: str | None = None) -> str:
    """The file extension a writer of ``fmt`` uses (``.parquet``, ``.jsonl``, ``.jsonl.gz``)."""
    if fmt == "parquet":
        return ".parquet"
    return ".jsonl" + _JSONL_COMPRESSIONS[compression]


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    return str(value)


@contextlib.contextmanager
def _compressing(stream: BinaryIO, compression: str | None) -> Iterator[Any]:
    """``stream``, or a gzip or zstd writer into it (closed at the end, ``stream`` not)."""
    if compression is None:
        yield stream
        return
    closer: Any
    if compression == "gzip":
        import gzip

        closer = gzip.GzipFile(fileobj=stream, mode="wb", mtime=0)
    else:
        import zstandard

        closer = zstandard.ZstdCompressor().stream_writer(stream, closefd=False)
    try:
        yield closer
    finally:
        closer.close()


def write_jsonl(table: Any, stream: BinaryIO, compression: str | None = None) -> None:
    """``table``'s rows as JSON lines (UTF-8, not ASCII-escaped) into ``stream``."""
    dumps = json.JSONEncoder(ensure_ascii=False, default=_json_default).encode
    # a column of mixed types, kept as JSON text: its values as they were read
    texts = [f.name for f in table.schema if is_json(f)]
    with _compressing(stream, compression) as out:
        for batch in table.to_batches(max_chunksize=4096):
            rows = batch.to_pylist()
            for row in rows if texts else ():
                for name in texts:
                    if row[name] is not None:
                        row[name] = json.loads(row[name])
            lines = [dumps(row) for row in rows]
            if lines:
                out.write(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))


class ShardedWriter(ProcessingStage[DocumentBatch, FileGroupTask]):
    """Writes each batch to ``output_dir/{prefix}-{shard}.{ext}`` (Parquet or JSONL) and
    emits a ``FileGroupTask`` with the path and the batch's metadata, plus ``written``:
    rows, and rows per value of the ``count_by`` column when there is one.

    ``drop_columns`` (the internal ``_conveyor_doc_id`` by default) are left out of the file.
    The shard name is ``metadata["shard"]``, else the task id; an empty batch writes nothing
    and emits a ``FileGroupTask`` without paths (its counts still travel). Writes are atomic
    (``storage.atomic_write``). Writing is mostly I/O, hence the half CPU.
    """

    resources = Resources(cpus=0.5)

    def __init__(
        self,
        output_dir: str | os.PathLike[str] | ObjectPath,
        format: Format = "parquet",
        *,
        prefix: str = "part",
        drop_columns: Sequence[str] = (DOC_ID,),
        compression: str | None = None,
        count_by: str | None = "language",
    ) -> None:
        if format not in FORMATS:
            raise ValueError(f"ShardedWriter: format must be one of {FORMATS}, got {format!r}")
        if not prefix or _UNSAFE.search(prefix):
            raise ValueError(
                f"ShardedWriter: prefix must be letters, digits, '_' or '-', got {prefix!r}"
            )
        if format == "jsonl" and compression not in _JSONL_COMPRESSIONS:
            raise ValueError(
                f"ShardedWriter: JSONL compression must be None, 'gzip' or 'zstd', got "
                f"{compression!r}"
            )
        self.output_dir = str(output_dir)
        self.format: Format = format
        self.prefix = prefix
        self.drop_columns = tuple(drop_columns)
        self.compression = compression if compression is not None or format == "jsonl" else "zstd"
        self.count_by = count_by

    @property
    def extension(self) -> str:
        return extension(self.format, self.compression if self.format == "jsonl" else None)

    def file_name(self, task: DocumentBatch) -> str:
        """The deterministic file name of ``task``."""
        key = str(task.metadata.get(SHARD) or task.task_id or "")
        if not key:
            raise ValueError(
                f"stage {self.name!r}: cannot name the output of a batch with neither "
                "metadata['shard'] nor a task_id (set one when calling process() directly)"
            )
        return f"{self.prefix}-{_UNSAFE.sub('-', key)}{self.extension}"

    def process(self, task: DocumentBatch) -> FileGroupTask:
        table = task.to_pyarrow()
        drop = [name for name in self.drop_columns if name in table.column_names]
        if drop:
            table = table.drop_columns(drop)
        metadata: dict[str, Any] = dict(task.metadata)
        written: dict[str, Any] = {"rows": table.num_rows}
        if self.count_by and self.count_by in table.column_names:
            counts = Counter(table.column(self.count_by).to_pylist())
            written["by"] = {str(k): v for k, v in counts.items() if k is not None}
            if counts.get(None):
                written["by"]["unknown"] = counts[None]
        metadata[WRITTEN] = written
        if table.num_rows == 0:
            return FileGroupTask(data=[], dataset_name=task.dataset_name, metadata=metadata)
        out = location(self.output_dir)
        if isinstance(out, Path) and out.is_file():
            raise NotADirectoryError(
                f"stage {self.name!r}: output path {self.output_dir!r} is a file, expected a "
                "directory"
            )
        final = out / self.file_name(task)
        write_table(table, final, self.format, self.compression)
        return FileGroupTask(data=[str(final)], dataset_name=task.dataset_name, metadata=metadata)


def write_table(table: Any, final: StoragePath, fmt: Format, compression: str | None) -> None:
    """Write ``table`` to ``final`` atomically, as Parquet (``compression`` its codec) or JSONL
    (``compression`` None, gzip or zstd)."""
    with atomic_write(final) as stream:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, stream, compression=compression or "zstd")
        else:
            write_jsonl(table, stream, compression)


def _move(source: StoragePath, target: StoragePath) -> None:
    if isinstance(source, Path):
        assert isinstance(target, Path)
        os.replace(source, target)
        return
    assert isinstance(target, ObjectPath)
    fs, source_key = source.filesystem()
    _, target_key = target.filesystem()
    fs.mv(source_key, target_key)


def _files(folder: StoragePath, pattern: re.Pattern[str]) -> list[StoragePath]:
    if isinstance(folder, Path):
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if pattern.fullmatch(p.name) and p.is_file())
    return [p for p in folder.iterdir() if pattern.fullmatch(p.name)]


def published_pattern(prefix: str = "part") -> re.Pattern[str]:
    """What ``publish_shards`` names files: ``part-00000.parquet``, ``part-00012.jsonl``..."""
    return re.compile(rf"{re.escape(prefix)}-\d{{5,}}\.(parquet|jsonl(\.gz|\.zst)?)")


def publish_shards(
    staged: str | os.PathLike[str] | ObjectPath,
    output: str | os.PathLike[str] | ObjectPath,
    *,
    prefix: str = "part",
    unify_schemas: bool = True,
    executor: Executor | RayDataExecutor | None = None,
) -> list[str]:
    """Move the shards under ``staged`` (as ``ShardedWriter`` named them) into ``output`` as
    ``{prefix}-00000.ext``, ``{prefix}-00001.ext``, ... in name order, which is input order.

    Files an earlier run published there (``published_pattern``) are removed first, so the
    output holds exactly this run's shards. With ``unify_schemas``, ``unify_shards`` first.
    Returns the paths.
    """
    source, target = location(staged), location(output)
    shards = _staged(source, prefix)
    if unify_schemas:
        unify_shards(staged, prefix=prefix, executor=executor)
    target.mkdir(parents=True, exist_ok=True)
    for stale in _files(target, published_pattern(prefix)):
        stale.unlink()
    published = []
    for i, shard in enumerate(shards):
        suffix = shard.name[shard.name.index(".") :]
        final = target / f"{prefix}-{i:05d}{suffix}"
        _move(shard, final)
        published.append(str(final))
    return published


def unify_shards(
    staged: str | os.PathLike[str] | ObjectPath,
    *,
    prefix: str = "part",
    executor: Executor | RayDataExecutor | None = None,
) -> None:
    """Rewrite the shards under ``staged`` so that they read as one dataset: Parquet shards
    whose schemas differ (a column missing, or all null, in some) to one schema where Arrow
    can unify them, JSONL shards whose records lack a field others have, or have them in
    another order, to one field order (about 45 MB/s a core: past
    ``PARALLEL_REWRITE_BYTES``, on ``executor``'s workers when given). Each file is
    rewritten atomically, and doing it again changes nothing: a run may do it before it
    gives up what it needs to resume."""
    shards = _staged(location(staged), prefix)
    unify_parquet([p for p in shards if p.name.endswith(".parquet")])
    unify_jsonl([p for p in shards if ".jsonl" in p.name], executor=executor)


def _staged(folder: StoragePath, prefix: str) -> list[StoragePath]:
    staged_re = re.compile(rf"{re.escape(prefix)}-[0-9A-Za-z_-]+\.(parquet|jsonl(\.gz|\.zst)?)")
    return _files(folder, staged_re)


def unify_parquet(paths: Sequence[StoragePath]) -> int:
    """Rewrite the Parquet files of ``paths`` whose schema differs from the others to one
    unified schema (columns missing in a file become nulls; null-typed columns take the type
    the others have; integers widen), so that the folder reads as one dataset. A column
    Arrow cannot unify (numbers in one file, text or records in another) becomes JSON text
    in every file (``json_field``), said in the log. Returns how many were rewritten."""
    import pyarrow.parquet as pq

    if len(paths) < 2:
        return 0
    schemas = []
    for path in paths:
        with _open(path) as stream:
            schemas.append(pq.read_schema(stream))
    if all(s.equals(schemas[0]) for s in schemas[1:]):
        return 0
    unified = _castable(_unified(schemas), paths, schemas)
    rewritten = 0
    for path, schema in zip(paths, schemas, strict=True):
        if schema.remove_metadata().equals(unified, check_metadata=True):
            continue
        with _open(path) as stream:
            table = pq.read_table(stream)
        write_table(_conformed(table, unified), path, "parquet", "zstd")
        rewritten += 1
    return rewritten


def _unified(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema for all of ``schemas``, column by column in first-seen order: Arrow's
    promotion of its types where it has one, else (or where a part has it as JSON text
    already) JSON text."""
    import pyarrow as pa

    fields: dict[str, list[pa.Field]] = {}
    for schema in schemas:
        for field in schema:
            fields.setdefault(field.name, []).append(field)
    unified = []
    for name, found in fields.items():
        if not any(is_json(f) for f in found):
            try:
                merged = pa.unify_schemas(
                    [pa.schema([f.remove_metadata()]) for f in found],
                    promote_options="permissive",
                ).field(name)
                for f in found:  # a promotion Arrow cannot cast to fails here, not at writing
                    pa.array([], type=f.type).cast(merged.type)
                unified.append(merged)
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError):
                pass
        kinds = " and ".join(sorted({"mixed values" if is_json(f) else str(f.type) for f in found}))
        log.warning("column %r holds %s in different parts: JSON text in every part", name, kinds)
        unified.append(json_field(name))
    return pa.schema(unified)


#: below this many bytes of JSONL to rewrite (compressed parts counted as they read), this
#: process does it alone: starting workers (about half a second) costs more than it saves
PARALLEL_REWRITE_BYTES = 128 << 20


def unify_jsonl(
    paths: Sequence[StoragePath], *, executor: Executor | RayDataExecutor | None = None
) -> int:
    """Rewrite the JSONL files of ``paths`` whose records lack fields others have, or have
    them in another order, so that every record has every field in one order (null where it
    had none), as every row of a Parquet folder has every column. A file's records all have
    its table's columns, so its first record says its fields. Returns how many were
    rewritten.

    Parsing and writing JSON is about 45 MB/s on a core: with more than
    ``PARALLEL_REWRITE_BYTES`` to rewrite and an ``executor`` (the run's), the files are
    shared among its workers (``ReorderJsonl``), one file each at a time; a file that could
    not be rewritten is an ``OSError`` naming it (the parts are not published)."""
    if len(paths) < 2:
        return 0
    orders = [_first_keys(path) for path in paths]
    names = list(dict.fromkeys(name for keys in orders if keys for name in keys))
    todo = [p for p, keys in zip(paths, orders, strict=True) if keys is not None and keys != names]
    if not todo:
        return 0
    if executor is None or len(todo) < 2 or sum(map(_size, todo)) < PARALLEL_REWRITE_BYTES:
        for path in todo:
            try:
                _reorder_jsonl(path, names)
            except OSError:
                raise  # (a full disk keeps its errno)
            except Exception as exc:  # noqa: BLE001 - not JSON, cut short: not what we wrote
                raise OSError(
                    f"1 JSONL part(s) could not be rewritten to one field order, e.g. {path}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
    else:
        from conveyor.pipeline import Pipeline

        # a few long tasks: as many workers from the start (the autoscaler would add them
        # only once it had seen one finish)
        workers = min(len(todo), os.cpu_count() or 1)
        stage = ReorderJsonl(names).with_(num_workers=workers)
        result = Pipeline("jsonl-field-order", [stage]).run(
            executor, initial_tasks=[str(path) for path in todo]
        )
        if result.failures:
            first = result.failures[0]
            raise OSError(
                f"{len(result.failures)} JSONL part(s) could not be rewritten to one field "
                f"order, e.g. {first.task}: {first.error_type}: {first.message}"
            )
    log.info("%d of %d JSONL parts rewritten to one field order", len(todo), len(paths))
    return len(todo)


class ReorderJsonl(ProcessingStage[str, str]):
    """Rewrites the JSONL part at a path with each record's fields in ``names``' order
    (``unify_jsonl``'s work, shared among workers); passes the path on."""

    resources = Resources(cpus=1.0)

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def process(self, task: str) -> str:
        _reorder_jsonl(location(task), self.names)
        return task


def _size(path: StoragePath) -> int:
    """The bytes of JSON in ``path`` (a compressed part's as it reads, about)."""
    from conveyor.storage import size

    return size(path) * (COMPRESSION_RATIO if _jsonl_compression(path) else 1)


def _jsonl_compression(path: StoragePath) -> Compression:
    return {".gz": "gzip", ".zst": "zstd"}.get(Path(path.name).suffix)


@contextlib.contextmanager
def _jsonl_lines(path: StoragePath) -> Iterator[Iterator[bytes]]:
    """The lines of a JSONL file we wrote, decompressed (as the reader opens one)."""
    with _jsonl_stream(str(path), _jsonl_compression(path)) as (stream, _):
        yield iter(stream)


def _first_keys(path: StoragePath) -> list[str] | None:
    with _jsonl_lines(path) as lines:
        first = next(lines, None)
    if first is None or not first.strip():
        return None
    return list(json.loads(first.decode("utf-8", "surrogatepass")))


def _reorder_jsonl(path: StoragePath, names: list[str]) -> None:
    """``path`` rewritten with each record's fields in ``names``' order, missing ones null
    (values as they were: only the records' keys change)."""
    dumps = json.JSONEncoder(ensure_ascii=False).encode
    with (
        _jsonl_lines(path) as lines,
        atomic_write(path) as stream,
        _compressing(stream, _jsonl_compression(path)) as out,
    ):
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line.decode("utf-8", "surrogatepass"))
            row = {name: record.get(name) for name in names}
            out.write((dumps(row) + "\n").encode("utf-8", "surrogatepass"))


def _castable(
    unified: pa.Schema, paths: Sequence[StoragePath], schemas: list[pa.Schema]
) -> pa.Schema:
    """``unified`` with each column some part's values do not cast to (an integer beyond
    2**53 where another part has decimals: the run failed after all its work) as JSON text.
    Only the columns a part has with another type are read, one at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = list(unified)
    for i, field in enumerate(fields):
        if is_json(field):
            continue
        for path, schema in zip(paths, schemas, strict=True):
            if field.name not in schema.names or schema.field(field.name).type == field.type:
                continue
            with _open(path) as stream:
                column = pq.read_table(stream, columns=[field.name]).column(field.name)
            try:
                column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError) as exc:
                log.warning("column %r: %s: JSON text in every part", field.name, exc)
                fields[i] = json_field(field.name)
                break
    return pa.schema(fields)


def _conformed(table: pa.Table, unified: pa.Schema) -> pa.Table:
    """``table`` in the ``unified`` schema: missing columns as nulls, the others cast, or
    made JSON text where the unified column is (text already JSON stays as it is)."""
    import pyarrow as pa

    columns = []
    for field in unified:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, field.type))
        elif is_json(field) and not is_json(table.schema.field(field.name)):
            columns.append(json_text(table.column(field.name).to_pylist()))
        else:
            columns.append(table.column(field.name).cast(field.type))
    return pa.Table.from_arrays(columns, schema=unified)


@contextlib.contextmanager
def _open(path: StoragePath) -> Any:
    from conveyor.storage import open_input

    with open_input(path) as stream:
        yield stream
