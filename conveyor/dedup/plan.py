"""The semantic dedup's plan: what to read, in what pieces, and how many clusters.

Only this runs on the driver, and of the embeddings it reads each file's first page (their
length): the inputs' listing and their Parquet footers (row counts, schema, null counts), from
which it cuts the input into chunks of row groups (pass 1 and 2 tasks), and, once pass 2 has
counted each cluster, the pass 3 tasks: whole clusters packed up to ``partition_rows`` per
task, a cluster larger than that split by its items into as many tasks as it needs. Every
worker's memory is bounded by those sizes, never by the number of items.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConveyorError, PermanentError

#: rows of one pass 1/2 task (a chunk of whole row groups; a larger row group is one chunk)
CHUNK_ROWS = 65_536
#: rows one pass 3 task holds at once (50,000 x 1,280 float32 = 256 MB)
PARTITION_ROWS = 50_000
#: items per cluster when ``n_clusters`` is not given (see docs/dedup.md for recall vs k)
ITEMS_PER_CLUSTER = 10_000
#: k-means sample: this many items per centroid (faiss warns under 39), at least MIN_SAMPLE
SAMPLE_PER_CLUSTER = 64
MIN_SAMPLE = 20_000


class SemanticDedupError(ConveyorError):
    """A semantic dedup input or option that cannot be used, or a pass that failed."""


class BadEmbeddings(SemanticDedupError, PermanentError):
    """An input's embeddings that no pass can use (lengths that differ), found while a pass
    reads them: the input is at fault, not the run, so it is not tried again and the run
    ends as for a bad input (``run_pass``)."""


class MissingColumns(SemanticDedupError):
    """An input without a column it was told to read. ``explain(hint)`` says how to name
    yours: the API's message names its keywords, the CLI's its flags."""

    HINT = "name yours with id_column=, embedding_column=, order_by="

    def __init__(
        self, path: str, missing: Sequence[str], names: Sequence[str], note: str = ""
    ) -> None:
        self.path, self.missing, self.names, self.note = path, list(missing), list(names), note
        super().__init__(self.explain(self.HINT))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.missing, self.names, self.note)

    def explain(self, hint: str) -> str:
        note = f"{self.note}; " if self.note else ""
        return (
            f"INPUT {self.path!r} has no column {', '.join(map(repr, self.missing))} (it has "
            f"{', '.join(self.names)}); {note}{hint}"
        )

    @classmethod
    @contextlib.contextmanager
    def explained(cls, hint: str) -> Iterator[None]:
        """Within it, a missing column is a ``SemanticDedupError`` saying ``hint`` (a
        command's own tables, written by an earlier version without a keep rule's column)."""
        try:
            yield
        except cls as exc:
            raise SemanticDedupError(exc.explain(hint)) from None


@dataclass(frozen=True)
class InputFile:
    """One Parquet input: its place in the listing (the default keep order) and row groups."""

    path: str
    index: int
    row_groups: tuple[int, ...]
    #: the arrow type of its id column
    id_type: Any = None

    @property
    def rows(self) -> int:
        return sum(self.row_groups)


@dataclass(frozen=True)
class Chunk:
    """Consecutive row groups of one input file: the unit of passes 1 and 2."""

    index: int
    path: str
    file_index: int
    #: indices of the file's row groups
    row_groups: tuple[int, ...]
    #: the file's row number of the chunk's first row
    first_row: int
    rows: int


@dataclass(frozen=True)
class CompareTask:
    """Pass 3's unit: clusters of one bucket, or one part (``part`` of ``parts``) of a big
    cluster's items."""

    index: int
    bucket: int
    clusters: tuple[int, ...]
    rows: int
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class Columns:
    """The input's column names: the id, the embedding and the keep order's (each sorted
    smallest first, or largest first where ``descending`` says so)."""

    id: str
    embedding: str
    order_by: tuple[str, ...] = ()
    descending: tuple[bool, ...] = ()

    @classmethod
    def of(cls, id: str, embedding: str, order_by: Sequence[str]) -> Columns:
        """Columns whose keep order ``order_by`` names columns, each with a leading ``-``
        for largest first (Django's convention: ``"-score"``)."""
        names = tuple(name[1:] if name.startswith("-") else name for name in order_by)
        for given, name in zip(order_by, names, strict=True):
            if not name:
                raise ValueError(f"order_by {given!r} names no column")
        return cls(id, embedding, names, tuple(name.startswith("-") for name in order_by))

    @property
    def read(self) -> list[str]:
        return list(dict.fromkeys((self.id, self.embedding, *self.order_by)))


@dataclass(frozen=True)
class _Footer:
    """What the plan reads of one input: its row groups and schema, and the two things a pass
    would only find too late (its first embedding's length and its first null id's row)."""

    row_groups: tuple[int, ...]
    schema: Any
    dim: int | None
    null_id: int | None


def _inspect(path: str, columns: Columns) -> _Footer:
    """``path``'s footer, checked (``check_schema``), then its first embedding's length and
    first null id: a page of embeddings, and ids only where the footer does not count 0 nulls."""
    import pyarrow.parquet as pq

    from conveyor.storage import open_input

    try:
        with open_input(path) as raw:
            # buffered and not pre-buffered: a page is read, not the whole column chunk (a row
            # group's embeddings, 100 MB a file, 16 files at once in the driver)
            parquet = pq.ParquetFile(raw, buffer_size=1 << 20, pre_buffer=False)
            meta = parquet.metadata
            schema = meta.schema.to_arrow_schema()
            check_schema(path, schema, columns)
            dim = _first_length(parquet, schema, columns.embedding)
            null_id = _first_null(parquet, columns.id)
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        reason = f"INPUT {path!r} is not a readable Parquet file: {error}"
        raise SemanticDedupError(reason) from None
    groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    return _Footer(groups, schema, dim, null_id)


def _first_length(parquet: Any, schema: Any, column: str) -> int | None:
    """The length of the file's first embedding that is neither null nor empty (None: it has
    none): files of two lengths stop the plan, where pass 1 would find them after a read."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = schema.field(column).type
    if pa.types.is_fixed_size_list(kind):
        return kind.list_size or None
    for batch in parquet.iter_batches(batch_size=1024, columns=[column], use_threads=False):
        lengths = pc.fill_null(pc.list_value_length(batch.column(0)), 0)
        found = pc.filter(lengths, pc.greater(lengths, 0))
        if len(found):
            return int(found[0].as_py())
    return None


def _first_null(parquet: Any, column: str) -> int | None:
    """The file's row number (from 0) of its first null id, or None. A row group whose footer
    counts no null is not read; one without that count is."""
    import pyarrow.compute as pc

    meta = parquet.metadata
    leaves = [j for j in range(meta.num_columns) if meta.schema.column(j).path == column]
    start = 0
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(leaves[0]).statistics if leaves else None
        if stats is None or not stats.has_null_count or stats.null_count:
            nulls = parquet.read_row_group(group, columns=[column]).column(0).is_null()
            if pc.any(nulls).as_py():
                return start + int(pc.index(nulls, True).as_py())
        start += meta.row_group(group).num_rows
    return None


def _is_id(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_orderable(kind: Any) -> bool:
    import pyarrow as pa

    t = pa.types
    return (
        _is_id(kind)
        or t.is_floating(kind)
        or t.is_decimal(kind)
        or t.is_timestamp(kind)
        or t.is_date(kind)
    )


def check_schema(path: str, schema: Any, columns: Columns) -> None:
    """``SemanticDedupError`` naming ``path`` unless it has the columns, each used for one
    role, with an embedding column that is a list of numbers, integer or string ids, and keep
    order columns that sort (numbers, strings, timestamps, dates)."""
    import pyarrow as pa

    missing = [c for c in columns.read if c not in schema.names]
    if missing:
        # a column named with a leading dash reads as another's descending order
        dashed = [
            name
            for name, down in zip(columns.order_by, columns.descending, strict=False)
            if down and name in missing and f"-{name}" in schema.names
        ]
        note = (
            f"a leading '-' asks for the largest first ({', '.join(repr(f'-{n}') for n in dashed)} "
            f"is {', '.join(map(repr, dashed))} descending): rename a column whose name "
            "starts with '-' to order by it"
            if dashed
            else ""
        )
        raise MissingColumns(path, missing, schema.names, note)
    if columns.embedding in (columns.id, *columns.order_by):
        role = "id" if columns.embedding == columns.id else "keep order"
        raise SemanticDedupError(
            f"INPUT {path!r}: column {columns.embedding!r} is both the embedding and the "
            f"{role} column; they must be two columns"
        )
    kind = schema.field(columns.embedding).type
    listy = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if not (listy or pa.types.is_fixed_size_list(kind)) or not (
        pa.types.is_floating(kind.value_type) or pa.types.is_integer(kind.value_type)
    ):
        raise SemanticDedupError(
            f"INPUT {path!r}: column {columns.embedding!r} is {kind}, expected a list of numbers"
        )
    kind = schema.field(columns.id).type
    if not _is_id(kind):
        raise SemanticDedupError(
            f"INPUT {path!r}: column {columns.id!r} is {kind}; ids must be integers or strings"
        )
    for name in columns.order_by:
        kind = schema.field(name).type
        if not _is_orderable(kind):
            raise SemanticDedupError(
                f"INPUT {path!r}: column {name!r} is {kind}; the keep order needs a number, "
                "string, timestamp or date column"
            )


def scan(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    columns: Columns,
    exclude: Sequence[str] = (),
    threads: int = 16,
) -> list[InputFile]:
    """The Parquet files of ``inputs`` (files, folders, globs, URLs; a folder's other files
    are left out) with their row groups, every one checked for the columns (footers read by
    ``threads`` threads: on a bucket the plan waits on requests, not on a CPU)."""
    from conveyor.stages.text.readers import InputError, list_inputs

    paths: list[str] = []
    taken: set[str] = set()
    for one in [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs:
        try:
            # embeddings of earlier runs' outputs (``videos/run1/embeddings``) are its inputs
            listing = list_inputs(one, exclude=exclude, skip_outputs=False)
        except InputError as error:
            if os.path.isdir(one):  # the text readers' message lists their JSONL suffixes too
                raise SemanticDedupError(f"INPUT {os.fspath(one)!r} has no Parquet file") from None
            raise SemanticDedupError(str(error)) from None
        found = [f.path for f in listing.files if f.kind == "parquet"]
        named = [f.path for f in listing.files if f.path == os.fspath(one)]
        if named and not found:
            raise SemanticDedupError(
                f"INPUT {named[0]!r} is not Parquet (semantic dedup reads Parquet files of "
                f"({columns.id}, {columns.embedding}))"
            )
        if not found:
            raise SemanticDedupError(f"INPUT {os.fspath(one)!r} has no Parquet file")
        # a folder's other files (notes, a recipe) are not the data: left out; a file given
        # twice (a folder and a glob in it) is read once, as the text command reads it
        for f in listing.files:
            if f.kind == "parquet" and f.size > 0 and f.path not in taken:
                taken.add(f.path)
                paths.append(f.path)
    with ThreadPoolExecutor(max(1, min(threads, len(paths)))) as pool:
        footers = list(pool.map(lambda path: _inspect(path, columns), paths))
    files: list[InputFile] = []
    first_dim: tuple[str, int] | None = None  # the first file with an embedding, its length
    for index, (path, footer) in enumerate(zip(paths, footers, strict=True)):
        id_type = footer.schema.field(columns.id).type
        if files and id_type != files[0].id_type:
            raise SemanticDedupError(
                f"INPUT {path!r}: column {columns.id!r} is {id_type}, in {files[0].path!r} "
                f"it is {files[0].id_type}; the ids must have one type"
            )
        if footer.null_id is not None:
            raise SemanticDedupError(
                f"INPUT {path!r}: column {columns.id!r} is null on row {footer.null_id} (counted "
                "from 0); every item needs an id, the one duplicates.parquet names it by"
            )
        if footer.dim is not None and first_dim is not None and footer.dim != first_dim[1]:
            raise SemanticDedupError(
                f"INPUT {path!r}: column {columns.embedding!r} holds embeddings of {footer.dim} "
                f"numbers, {first_dim[0]!r} of {first_dim[1]}; they must all have one length"
            )
        if footer.dim is not None and first_dim is None:
            first_dim = (path, footer.dim)
        files.append(InputFile(path, index, footer.row_groups, id_type))
    return files


def chunks(files: Sequence[InputFile], chunk_rows: int = CHUNK_ROWS) -> list[Chunk]:
    """Whole row groups packed up to ``chunk_rows`` per chunk, never across files."""
    out: list[Chunk] = []
    for f in files:
        groups: list[int] = []
        start = held = 0
        for group, rows in enumerate(f.row_groups):
            if groups and held + rows > chunk_rows:
                out.append(Chunk(len(out), f.path, f.index, tuple(groups), start, held))
                start, held, groups = start + held, 0, []
            groups.append(group)
            held += rows
        if held:
            out.append(Chunk(len(out), f.path, f.index, tuple(groups), start, held))
    return out


def default_clusters(items: int) -> int:
    return max(1, math.ceil(items / ITEMS_PER_CLUSTER))


def sample_size(items: int, clusters: int) -> int:
    return min(items, max(SAMPLE_PER_CLUSTER * clusters, MIN_SAMPLE))


def buckets(estimated: Sequence[float], partition_rows: int) -> list[int]:
    """Each cluster's bucket: clusters packed in order up to ``partition_rows`` estimated
    items per bucket (one cluster larger than that has a bucket of its own)."""
    out: list[int] = []
    bucket, held = 0, 0.0
    for size in estimated:
        if held and held + size > partition_rows:
            bucket, held = bucket + 1, 0.0
        out.append(bucket)
        held += size
    return out


def compare_tasks(
    counts: Sequence[int], bucket_of: Sequence[int], partition_rows: int
) -> list[CompareTask]:
    """Pass 3's tasks from the clusters' real sizes: each bucket's clusters packed up to
    ``partition_rows`` (the buckets were packed by estimates), a bigger cluster in parts."""
    by_bucket: dict[int, list[int]] = {}
    for cluster, bucket in enumerate(bucket_of):
        if counts[cluster] > 1:  # a cluster of one item has no pair
            by_bucket.setdefault(bucket, []).append(cluster)
    tasks: list[CompareTask] = []

    def add(bucket: int, clusters: list[int], rows: int, part: int = 0, parts: int = 1) -> None:
        tasks.append(CompareTask(len(tasks), bucket, tuple(clusters), rows, part, parts))

    for bucket, clusters in sorted(by_bucket.items()):
        packed: list[int] = []
        held = 0
        for cluster in clusters:
            size = counts[cluster]
            if size > partition_rows:
                parts = math.ceil(size / partition_rows)
                for part in range(parts):
                    add(bucket, [cluster], size, part, parts)
                continue
            if packed and held + size > partition_rows:
                add(bucket, packed, held)
                packed, held = [], 0
            packed.append(cluster)
            held += size
        if packed:
            add(bucket, packed, held)
    return tasks
