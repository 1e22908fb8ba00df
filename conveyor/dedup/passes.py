"""The semantic dedup's passes, each an ordinary ``ProcessingStage``.

::

    WORK/sample/chunk-000000.npy             pass 1: each chunk's sampled embeddings
    WORK/centroids.npy, WORK/buckets.npy     pass 1: k-means centroids, each cluster's bucket
    WORK/assign/bucket-00000/chunk-000000.parquet
                                             pass 2: a chunk's items of one bucket (id,
                                             order0..., pos, cluster, unit embedding)
    WORK/marks/task-000000.parquet           pass 3: duplicates found by one task
    OUTPUT/duplicates.parquet                pass 4: id, duplicate_of, similarity

Every file is written atomically (``conveyor.storage``), so a retried task rewrites its own
files and WORK may be a bucket URL as well as a folder. An item's ``pos`` is its place in the
input (file index, row): the keep order's last key, and how a task finds an item again.
The user's columns are renamed as they are spilled (``id``, ``order0``, ``order1``...), so no
name of theirs can clash with ``pos``, ``cluster`` or ``embedding``.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from conveyor.dedup.plan import (
    BadEmbeddings,
    Chunk,
    Columns,
    CompareTask,
    SemanticDedupError,
    buckets,
)
from conveyor.dedup.similarity import BestEarlier, best_earlier_within, normalise
from conveyor.errors import PermanentError
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.storage import StoragePath, atomic_write, location

#: faiss k-means iterations (its default is 25; 20 moves the centroids well under 1%)
KMEANS_ITERATIONS = 20
#: the id's name in the spilled files
ID = "id"
#: centroids nearer each other than this (1 - cosine, through a chain of such neighbours) are
#: one. k-means fills an empty cluster with a copy of a full one's centroid 1/1024 apart, so
#: on many copies of one item (or items closer than this) it returns a family of centroids
#: that all coincide with it (1 - cosine up to 1.5e-4 among 500 on one point); the copies
#: then went to one or another on a rounding error and were never compared. Items near two
#: such centroids are near-duplicates at any threshold up to 0.9998: keeping them apart only
#: loses pairs. Distinct clusters sit much farther apart (0.008 between the nearest two of 50
#: on 64-d topics with noise).
COINCIDE = 1e-4
#: centroids faiss proposes for each item (its float32 scores decide alone where the best is
#: clear); where more than one is within rounding of the best, exact scores decide
CANDIDATES = 8
#: float64 entries of one block of exact scores (32 MB)
EXACT_ENTRIES = 1 << 22


@dataclass(frozen=True)
class Sampled:
    chunk: int
    items: int
    sampled: int
    #: rows with no usable embedding (null, empty, NaN or infinite): never compared or marked
    skipped: int
    #: of those, the rows whose embedding holds a NaN or an infinity
    nonfinite: int = 0
    #: the length of the chunk's embeddings (0: it has none)
    dim: int = 0


@dataclass(frozen=True)
class Trained:
    clusters: int
    dim: int
    sample: int
    seconds: float


@dataclass(frozen=True)
class Assigned:
    chunk: int
    #: items per cluster
    counts: np.ndarray


@dataclass(frozen=True)
class Compared:
    task: int
    items: int
    duplicates: int


# -- reading and writing -----------------------------------------------------------------------
def order_keys(columns: Columns) -> list[str]:
    """Each keep order column's name in the spilled files (the id's, where it is the id)."""
    return [ID if name == columns.id else f"order{i}" for i, name in enumerate(columns.order_by)]


def spilled(table: Any, columns: Columns) -> dict[str, Any]:
    """The id and keep order columns of ``table`` under their spilled names, each once."""
    out = {ID: table.column(columns.id)}
    for key, name in zip(order_keys(columns), columns.order_by, strict=True):
        out.setdefault(key, table.column(name))
    return out


def read_chunk(chunk: Chunk, names: list[str]) -> Any:
    import pyarrow.parquet as pq

    from conveyor.storage import open_input

    with open_input(chunk.path) as raw:
        return pq.ParquetFile(raw).read_row_groups(list(chunk.row_groups), columns=names)


class Embeddings(NamedTuple):
    vectors: np.ndarray
    #: the table's rows they are
    rows: np.ndarray
    #: rows left out for a NaN or an infinity
    nonfinite: int


def embeddings(table: Any, column: str, where: str, first_row: int = 0) -> Embeddings:
    """The table's embeddings as float32 rows, and which rows they are. Rows whose embedding
    is null, empty, or holds a NaN or an infinity (nothing it is compared with would mean
    anything) are left out; a length unlike the others' is ``BadEmbeddings`` naming ``where``
    and the row (counted from ``first_row``, the table's first row's number in its file)."""
    import pyarrow as pa

    array = table.column(column).combine_chunks()
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    valid = ~np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_fixed_size_list(array.type):
        dim = array.type.list_size
        start = array.offset * dim
        flat = array.values.slice(start, len(array) * dim).to_numpy(zero_copy_only=False)
        with np.errstate(over="ignore"):  # a float64 beyond float32's range: left out below
            matrix = np.asarray(flat, dtype=np.float32).reshape(len(array), dim)
        keep = np.flatnonzero(valid) if dim else np.zeros(0, np.int64)
        return _finite(matrix[keep], keep)
    offsets = array.offsets.to_numpy()
    lengths = np.diff(offsets)
    keep = np.flatnonzero(valid & (lengths > 0))
    if not len(keep):
        return Embeddings(np.zeros((0, 0), np.float32), keep, 0)
    dim = int(lengths[keep[0]])
    odd = keep[lengths[keep] != dim]
    if len(odd):
        raise BadEmbeddings(
            f"{where}: column {column!r} holds embeddings of {dim} and of "
            f"{int(lengths[odd[0]])} numbers (row {first_row + int(odd[0])}); they must all "
            "have one length"
        )
    values = array.values.to_numpy(zero_copy_only=False)
    take = (offsets[keep][:, None] + np.arange(dim)[None, :]).reshape(-1)
    with np.errstate(over="ignore"):
        vectors = np.asarray(values[take], dtype=np.float32).reshape(len(keep), dim)
    return _finite(vectors, keep)


def _finite(vectors: np.ndarray, rows: np.ndarray) -> Embeddings:
    """Without the rows that hold a NaN or an infinity (also a float64 too large for float32):
    they would make k-means fail and match nothing."""
    finite = np.isfinite(vectors).all(axis=1)
    if finite.all():
        return Embeddings(vectors, rows, 0)
    return Embeddings(vectors[finite], rows[finite], int(len(rows) - finite.sum()))


def _save_npy(path: StoragePath, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array)
    with atomic_write(path) as out:
        out.write(buffer.getvalue())


def _load_npy(path: StoragePath) -> np.ndarray:
    return np.load(io.BytesIO(path.read_bytes()))


def _write_table(path: StoragePath, table: Any) -> None:
    import pyarrow.parquet as pq

    with atomic_write(path) as out:
        pq.write_table(table, out, compression="none")


def _read_table(path: StoragePath, columns: list[str] | None = None) -> Any:
    import pyarrow.parquet as pq

    with path.open("rb") as raw:
        return pq.read_table(raw, columns=columns)


def _files(folder: StoragePath, pattern: str) -> list[StoragePath]:
    return sorted(folder.glob(pattern)) if folder.exists() else []


def _faiss(threads: int) -> Any:
    try:
        import faiss
    except ImportError:
        raise SemanticDedupError(
            "semantic dedup needs faiss: pip install faiss-cpu (or conveyor[dedup])"
        ) from None

    faiss.omp_set_num_threads(max(1, threads))
    return faiss


# -- centroids -----------------------------------------------------------------------------------
def distinct_centroids(centroids: np.ndarray) -> np.ndarray:
    """The centroids less those that coincide with an earlier one (1 - cosine below
    ``COINCIDE``, directly or through a chain of such neighbours): of each such group the
    first is kept. Compared in blocks of rows, never k x k at once."""
    k = len(centroids)
    first, second = [], []
    step = max(1, EXACT_ENTRIES // max(1, k))
    for a in range(0, k, step):
        close = centroids[a : a + step] @ centroids.T >= np.float32(1 - COINCIDE)
        i, j = np.nonzero(close)
        first.append(a + i)
        second.append(j)
    i, j = np.concatenate(first), np.concatenate(second)
    label = np.arange(k)
    while True:  # each centroid's label: the smallest index of its group
        lower = label.copy()
        np.minimum.at(lower, i, label[j])
        lower = lower[lower]
        if np.array_equal(lower, label):
            break
        label = lower
    return centroids[np.unique(label)]


def nearest_centroid(index: Any, centroids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Each unit row's nearest centroid, as a function of the row alone: the same row gets
    the same cluster whatever chunk, batch or place in it it comes in.

    faiss's float32 scores are not that: BLAS blocks (and faiss's own kernel under 20 rows)
    round a row's scores differently by where it sits, by up to ``dim * 2**-24`` for unit
    vectors. Where the best is clear by twice that, it is the nearest; else every centroid
    that close is scored exactly (float32 products are exact in float64, summed in one order
    per row), and the highest wins, ties to the smaller index. Those rows are few (items near
    a boundary), so the pass costs what a plain search does."""
    k, dim = centroids.shape
    if k == 1:
        return np.zeros(len(vectors), np.int32)
    wanted = min(CANDIDATES, k)
    scores, candidates = index.search(vectors, wanted)
    cluster = candidates[:, 0].astype(np.int32)
    slack = np.float32(2.5 * dim * 2.0**-24)  # twice the bound on faiss's error, and some
    unclear = np.flatnonzero(scores[:, 1] >= scores[:, 0] - slack)
    if not len(unclear):
        return cluster
    # more than `wanted` within the slack: every centroid is scored
    every = np.zeros(len(unclear), bool)
    if wanted < k:
        every = scores[unclear, -1] >= scores[unclear, 0] - slack
    some, rest = unclear[~every], unclear[every]
    cluster[some] = _exact_nearest(vectors[some], centroids, candidates[some])
    zero = ~vectors[rest].any(axis=1)  # every score 0: the exact choice is the first
    cluster[rest[zero]] = 0
    rest = rest[~zero]
    if len(rest):
        all_of_them = np.broadcast_to(np.arange(k), (len(rest), k))
        cluster[rest] = _exact_nearest(vectors[rest], centroids, all_of_them)
    return cluster


def _exact_nearest(
    vectors: np.ndarray, centroids: np.ndarray, candidates: np.ndarray
) -> np.ndarray:
    """Of each row's candidate centroids, the one of the highest float64 score (ties: the
    smallest index). A product of two float32 is exact in float64, and numpy sums each row's
    products in an order set by the length alone, so a row's scores do not depend on the
    rows around it."""
    out = np.empty(len(vectors), np.int32)
    width, dim = candidates.shape[1], vectors.shape[1]
    step = max(1, EXACT_ENTRIES // (width * dim))
    for a in range(0, len(vectors), step):
        b = min(a + step, len(vectors))
        chosen = np.asarray(candidates[a:b])
        products = centroids[chosen].astype(np.float64)
        products *= vectors[a:b, None, :]
        scores = products.sum(axis=2)
        top = scores.max(axis=1, keepdims=True)
        out[a:b] = np.where(scores == top, chosen, len(centroids)).min(axis=1)
    return out


# -- pass 1: sample and train ------------------------------------------------------------------
class SampleEmbeddings(ProcessingStage[Chunk, Sampled]):
    """Each chunk's share of the k-means sample (a fixed fraction, drawn with a seed per chunk,
    so a retry draws the same rows)."""

    resources = Resources(cpus=1.0)
    preload_modules = ("pyarrow.parquet",)

    def __init__(self, work: str, columns: Columns, fraction: float, seed: int) -> None:
        self.work = work
        self.columns = columns
        self.fraction = fraction
        self.seed = seed

    def process(self, chunk: Chunk) -> Sampled:
        table = read_chunk(chunk, [self.columns.embedding])
        vectors, kept, nonfinite = embeddings(
            table, self.columns.embedding, chunk.path, chunk.first_row
        )
        draw = np.random.default_rng([self.seed, chunk.index]).random(len(vectors))
        sample = normalise(vectors[draw < self.fraction])
        _save_npy(location(self.work) / "sample" / f"chunk-{chunk.index:06d}.npy", sample)
        skipped = chunk.rows - len(kept)
        return Sampled(chunk.index, len(kept), len(sample), skipped, nonfinite, vectors.shape[1])


class TrainCentroids(ProcessingStage[Any, Trained]):
    """k-means (faiss, spherical) on the sample; each cluster's size estimated from it, and
    the clusters packed into buckets of about ``partition_rows`` items for pass 2's files.

    One worker, and every core the run can spare for it (it is the only stage running)."""

    resources = Resources(cpus=1.0)
    num_workers = 1
    max_threads = 256
    preload_modules = ("faiss",)

    def __init__(
        self, work: str, clusters: int, items: int, partition_rows: int, seed: int
    ) -> None:
        self.work = work
        self.clusters = clusters
        self.items = items
        self.partition_rows = partition_rows
        self.seed = seed

    def process(self, task: Any) -> Trained:
        started = time.perf_counter()
        work = location(self.work)
        parts = [_load_npy(p) for p in _files(work / "sample", "chunk-*.npy")]
        parts = [p for p in parts if p.size]
        if not parts:
            raise SemanticDedupError("no item has an embedding: nothing to cluster")
        dims = {p.shape[1] for p in parts}
        if len(dims) > 1:
            raise BadEmbeddings(
                f"the inputs' embeddings have different lengths ({sorted(dims)}); they must "
                "all have one"
            )
        sample = np.concatenate(parts)
        clusters = max(1, min(self.clusters, len(sample)))
        dim = sample.shape[1]
        faiss = _faiss(self.threads)
        if clusters == 1:
            centroids = normalise(sample.mean(axis=0, keepdims=True))
        else:
            kmeans = faiss.Kmeans(
                dim,
                clusters,
                niter=KMEANS_ITERATIONS,
                seed=self.seed,
                spherical=True,
                max_points_per_centroid=max(256, len(sample) // clusters + 1),
                # faiss-gpu's k-means where this worker sees a GPU (faiss-cpu has none)
                gpu=getattr(faiss, "get_num_gpus", lambda: 0)() > 0,
            )
            kmeans.train(sample)
            centroids = distinct_centroids(normalise(kmeans.centroids))
            clusters = len(centroids)
        index = faiss.IndexFlatIP(dim)
        index.add(centroids)
        nearest = nearest_centroid(index, centroids, sample)
        estimated = np.bincount(nearest, minlength=clusters) * (self.items / len(sample))
        _save_npy(work / "centroids.npy", centroids)
        bucket_of = np.asarray(buckets(estimated.tolist(), self.partition_rows), np.int32)
        _save_npy(work / "buckets.npy", bucket_of)
        return Trained(clusters, dim, len(sample), time.perf_counter() - started)


# -- pass 2: assign ----------------------------------------------------------------------------
class AssignClusters(ProcessingStage[Chunk, Assigned]):
    """Every item of a chunk to its nearest centroid, written to its cluster's bucket (one
    file per bucket the chunk has items of, sorted by cluster), with its unit embedding."""

    resources = Resources(cpus=1.0)
    preload_modules = ("pyarrow.parquet", "faiss")

    def __init__(self, work: str, columns: Columns) -> None:
        self.work = work
        self.columns = columns
        self._index: Any = None
        self._centroids: np.ndarray | None = None
        self._buckets: np.ndarray | None = None

    def setup(self, worker: Any) -> None:
        work = location(self.work)
        self._centroids = _load_npy(work / "centroids.npy")
        self._buckets = _load_npy(work / "buckets.npy")
        faiss = _faiss(1)
        self._index = faiss.IndexFlatIP(self._centroids.shape[1])
        self._index.add(self._centroids)

    def process(self, chunk: Chunk) -> Assigned:
        import pyarrow as pa

        if self._index is None:
            self.setup(None)
        assert self._buckets is not None and self._centroids is not None
        table = read_chunk(chunk, self.columns.read)
        vectors, kept, _ = embeddings(table, self.columns.embedding, chunk.path, chunk.first_row)
        clusters = len(self._buckets)
        if not len(kept):
            return Assigned(chunk.index, np.zeros(clusters, np.int64))
        if vectors.shape[1] != self._index.d:
            raise BadEmbeddings(
                f"{chunk.path}: embeddings of {vectors.shape[1]} numbers, the others' have "
                f"{self._index.d}"
            )
        _faiss(self.threads)
        vectors = normalise(vectors)
        cluster = nearest_centroid(self._index, self._centroids, vectors)
        order = np.argsort(cluster, kind="stable")
        cluster, rows = cluster[order], kept[order]
        dim = vectors.shape[1]
        out = pa.table(spilled(table.take(pa.array(rows)), self.columns))
        out = out.append_column("pos", pa.array((chunk.file_index << 32) + chunk.first_row + rows))
        out = out.append_column("cluster", pa.array(cluster))
        flat = pa.array(vectors[order].reshape(-1))
        out = out.append_column("embedding", pa.FixedSizeListArray.from_arrays(flat, dim))
        bucket = self._buckets[cluster]
        edges = np.flatnonzero(np.diff(bucket)) + 1
        work = location(self.work) / "assign"
        for a, b in zip(np.r_[0, edges], np.r_[edges, len(bucket)], strict=True):
            name = f"bucket-{int(bucket[a]):05d}/chunk-{chunk.index:06d}.parquet"
            _write_table(work / name, out.slice(int(a), int(b - a)))
        return Assigned(chunk.index, np.bincount(cluster, minlength=clusters).astype(np.int64))


# -- pass 3: compare ---------------------------------------------------------------------------
def sort_keys(order_by: Sequence[str], descending: Sequence[bool] = ()) -> list[tuple[str, ...]]:
    """pyarrow's sort keys for a keep order: ``order_by`` ascending, or descending where
    ``descending`` says so, nulls last either way."""
    flags = [*descending, *[False] * (len(order_by) - len(descending))]
    return [
        (name, "descending" if down else "ascending", "at_end")
        for name, down in zip(order_by, flags, strict=False)
    ]


def ranks(table: Any, order_by: Sequence[str], descending: Sequence[bool] = ()) -> np.ndarray:
    """Each row's place in the keep order: ``order_by`` (spilled names) ascending, or
    descending where ``descending`` says so (nulls last either way), then input position."""
    import pyarrow.compute as pc

    order = pc.sort_indices(table, sort_keys=sort_keys((*order_by, "pos"), descending))
    order = order.to_numpy()
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank


class CompareClusters(ProcessingStage[CompareTask, Compared]):
    """Pass 3: within each cluster of the task, every item against the items before it in
    the keep order; one marks file per task."""

    resources = Resources(cpus=1.0)
    preload_modules = ("pyarrow.parquet", "pyarrow.compute")

    def __init__(self, work: str, columns: Columns, threshold: float) -> None:
        self.work = work
        self.columns = columns
        self.threshold = threshold

    def process(self, task: CompareTask) -> Compared:
        from threadpoolctl import threadpool_limits

        files = _files(location(self.work) / "assign" / f"bucket-{task.bucket:05d}", "*.parquet")
        # BLAS would start a thread per core in every worker: workers side by side then
        # fight over the cores (busy-waiting), so each uses the threads the engine gave it
        with threadpool_limits(self.threads):
            if task.parts == 1:
                found, items = self._whole(files, task)
            else:
                found, items = self._part(files, task)
        marks = location(self.work) / "marks" / f"task-{task.index:06d}.parquet"
        _write_table(marks, found)
        return Compared(task.index, items, found.num_rows)

    def _read(self, files: list[StoragePath], clusters: tuple[int, ...], names: list[str]) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = pa.array(clusters, pa.int32())
        parts = []
        for path in files:
            table = _read_table(path, list(dict.fromkeys([*names, "cluster"])))
            parts.append(table.filter(pc.is_in(table.column("cluster"), value_set=wanted)))
        return pa.concat_tables(parts) if parts else None

    def _marks(self, ids: Any, matches: Any, similarity: np.ndarray) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        same = pc.equal(ids, matches)
        if len(same) and pc.any(same).as_py():
            twice = ids.filter(same)[0].as_py()
            raise PermanentError(
                f"id {twice!r} is on two rows that are near-duplicates of each other: the ids "
                f"({self.columns.id}) must be unique, else duplicates.parquet would remove both"
            )
        # a cosine of unit vectors is at most 1: a copy's rounds to 1.0000001 in float32
        similarity = np.minimum(similarity, np.float32(1))
        return pa.table(
            {"id": ids, "duplicate_of": matches, "similarity": pa.array(similarity, pa.float32())}
        )

    def _empty(self, id_type: Any) -> Any:
        import pyarrow as pa

        return self._marks(pa.array([], id_type), pa.array([], id_type), np.zeros(0, np.float32))

    def _whole(self, files: list[StoragePath], task: CompareTask) -> tuple[Any, int]:
        import pyarrow as pa

        keys = order_keys(self.columns)
        table = self._read(files, task.clusters, [ID, *keys, "pos", "embedding"])
        if table is None or not table.num_rows:
            raise SemanticDedupError(f"pass 3 task {task.index}: bucket {task.bucket} is empty")
        table = table.combine_chunks()
        clusters = table.column("cluster").to_numpy()
        found = []
        for cluster in task.clusters:
            rows = np.flatnonzero(clusters == cluster)
            if len(rows) < 2:
                continue
            part = table.take(pa.array(rows))
            dim = part.schema.field("embedding").type.list_size
            vectors = part.column("embedding").combine_chunks().values.to_numpy()
            vectors = vectors.reshape(len(rows), dim)
            rank = ranks(part, keys, self.columns.descending)
            q, m, s = best_earlier_within(vectors, rank, self.threshold)
            if len(q):
                ids = part.column(ID)
                found.append(self._marks(ids.take(pa.array(q)), ids.take(pa.array(m)), s))
        id_type = table.schema.field(ID).type
        return (pa.concat_tables(found) if found else self._empty(id_type)), table.num_rows

    def _part(self, files: list[StoragePath], task: CompareTask) -> tuple[Any, int]:
        """One part of a cluster too big for one task: its items whose rank is ``part`` modulo
        ``parts`` against every item of the cluster, read one file at a time."""
        import pyarrow as pa

        (cluster,) = task.clusters
        order = order_keys(self.columns)
        keys = self._read(files, task.clusters, [*order, "pos"])
        if keys is None or not keys.num_rows:
            raise SemanticDedupError(f"pass 3 task {task.index}: cluster {cluster} is empty")
        pos = keys.column("pos").to_numpy()
        rank = ranks(keys, order, self.columns.descending)
        by_pos = np.argsort(pos)
        sorted_pos, sorted_rank = pos[by_pos], rank[by_pos]
        del keys, pos, rank

        def rank_of(p: np.ndarray) -> np.ndarray:
            return sorted_rank[np.searchsorted(sorted_pos, p)]

        names = [ID, "pos", "embedding"]
        mine_ids, mine_vectors, mine_ranks = [], [], []
        id_type = None
        for path in files:
            table = self._read([path], task.clusters, names)
            id_type = table.schema.field(ID).type
            r = rank_of(table.column("pos").to_numpy())
            take = np.flatnonzero(r % task.parts == task.part)
            if len(take):
                part = table.take(pa.array(take))
                mine_ids.append(part.column(ID))
                mine_vectors.append(_unit_rows(part))
                mine_ranks.append(r[take])
        if not mine_ids:
            return self._empty(id_type), 0
        best = BestEarlier(np.concatenate(mine_vectors), np.concatenate(mine_ranks), self.threshold)
        other_ids = []
        for path in files:
            table = self._read([path], task.clusters, names)
            best.feed(_unit_rows(table), rank_of(table.column("pos").to_numpy()))
            other_ids.append(table.column(ID))
        q, m, s = best.duplicates()
        if not len(q):
            return self._empty(id_type), len(best.queries)
        mine = pa.chunked_array([c for ids in mine_ids for c in ids.chunks], id_type)
        others = pa.chunked_array([c for ids in other_ids for c in ids.chunks], id_type)
        return self._marks(mine.take(pa.array(q)), others.take(pa.array(m)), s), len(best.queries)


def _unit_rows(table: Any) -> np.ndarray:
    column = table.column("embedding").combine_chunks()
    dim = column.type.list_size
    return column.values.to_numpy().reshape(len(column), dim)


# -- pass 4: write -----------------------------------------------------------------------------
class WriteDuplicates(ProcessingStage[Any, int]):
    """Every task's marks into ``OUTPUT/duplicates.parquet``, one marks file at a time."""

    resources = Resources(cpus=1.0)
    num_workers = 1

    def __init__(self, work: str, output: str, id_type: Any) -> None:
        self.work = work
        self.output = output
        self.id_type = id_type

    def process(self, task: Any) -> int:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(
            [("id", self.id_type), ("duplicate_of", self.id_type), ("similarity", pa.float32())]
        )
        rows = 0
        with (
            atomic_write(location(self.output) / "duplicates.parquet") as out,
            pq.ParquetWriter(out, schema) as writer,
        ):
            for path in _files(location(self.work) / "marks", "task-*.parquet"):
                table = _read_table(path).cast(schema)
                if table.num_rows:
                    writer.write_table(table)
                    rows += table.num_rows
        return rows
