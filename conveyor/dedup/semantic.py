"""Semantic deduplication of any Parquet of (id, embedding), as four passes on the engine.

``semantic_dedup`` marks an item as a duplicate when an item before it in the keep order
(``order_by`` columns, then input order: files as listed, rows as stored) has cosine
similarity at least ``threshold`` with it. Comparing every pair is quadratic, so, as in
SemDeDup, items are compared only within their k-means cluster; the pairs a cluster boundary
separates are the recall it costs (docs/dedup.md measures it against all pairs).

1. sample: each chunk of the input draws its share of a k-means sample; one worker trains
   the centroids with faiss and packs the clusters into buckets of ~``partition_rows``;
2. assign: each chunk's items go to their nearest centroid, spilled to their bucket's files;
3. compare: each task loads whole clusters (up to ``partition_rows`` items), or one part of a
   larger cluster, and finds every item's most similar earlier item;
4. write: the marks become ``OUTPUT/duplicates.parquet`` (``id``, ``duplicate_of``,
   ``similarity``: one row per removed item); ``OUTPUT/dedup.json`` has the counts and settings.

Each pass is an ordinary ``Pipeline`` run by ``executor`` (local or Ray, streaming or
batch); the driver only plans (lists files, reads Parquet footers, sums cluster sizes), and
every worker holds at most a chunk or a partition, never the whole input.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor.dedup.plan import (
    CHUNK_ROWS,
    PARTITION_ROWS,
    BadEmbeddings,
    Chunk,
    Columns,
    SemanticDedupError,
    chunks,
    compare_tasks,
    default_clusters,
    sample_size,
    scan,
)
from conveyor.executors.base import held
from conveyor.output_lock import locks_output
from conveyor.pipeline import Pipeline
from conveyor.storage import atomic_write, check_output_place, is_url, location, remove_tree

if TYPE_CHECKING:
    from conveyor.dedup.passes import Sampled
    from conveyor.executors.base import Executor
    from conveyor.result import RunResult

REPORT = "dedup.json"
DUPLICATES = "duplicates.parquet"
WORK = ".conveyor/semdedup"


class PassFailed(SemanticDedupError):
    """A task of a pass failed (its message says which and why)."""


@dataclass(frozen=True)
class SemanticDedupResult:
    """What ``semantic_dedup`` found and where it wrote it."""

    items: int
    duplicates: int
    clusters: int
    threshold: float
    #: rows with no usable embedding (null, empty, NaN or infinite): never compared or marked
    skipped: int
    duplicates_path: str
    report_path: str
    wall_s: float
    #: seconds of each pass
    passes: dict[str, float] = field(default_factory=dict)
    #: of the skipped rows, those whose embedding holds a NaN or an infinity
    nonfinite: int = 0


def _absolute(path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)  # "~/out" was a folder named "~" in the current one
    return text if is_url(text) else os.path.abspath(os.path.expanduser(text))


def _inputs(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[str]:
    if isinstance(inputs, (str, os.PathLike)):
        return [_absolute(inputs)]
    return [_absolute(i) for i in inputs]


def _check(
    threshold: float, n_clusters: int | None, partition_rows: int, chunk_rows: int, seed: int
) -> None:
    """Options a pass would fail on in a worker (``n_clusters=1.5``, ``seed=-1``), or run
    with silently (NaN rows per chunk), refused by name."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise ValueError(f"threshold must be a number, got {threshold!r}")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    whole = {
        "partition_rows": (partition_rows, 2),
        "chunk_rows": (chunk_rows, 1),
        "seed": (seed, 0),
    }
    if n_clusters is not None:
        whole["n_clusters"] = (n_clusters, 1)
    for name, (value, low) in whole.items():
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**31:
            raise ValueError(f"{name} must be a whole number in {low}..2**31-1, got {value!r}")


def run_pass(pipeline: Pipeline, executor: Executor | None, tasks: list[Any]) -> RunResult:
    """Run one pass to the end; ``SemanticDedupError`` with the first failure if any task
    failed (a dedup with a hole in it would keep duplicates silently)."""
    result = pipeline.run(executor, tasks)
    if result.failures:
        first = result.failures[0]
        if first.error_type == BadEmbeddings.__name__:  # the input's fault: said as such
            raise SemanticDedupError(first.message)
        more = f" (and {len(result.failures) - 1} more)" if len(result.failures) > 1 else ""
        raise PassFailed(f"semantic dedup {pipeline.name}: {first.message}{more}")
    if not result.completed:
        raise PassFailed(f"semantic dedup {pipeline.name} stopped before the end")
    return result


@locks_output(lambda inputs, output, *_, **__: output)
def semantic_dedup(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    id_column: str = "id",
    embedding_column: str = "embedding",
    threshold: float = 0.95,
    n_clusters: int | None = None,
    executor: Executor | None = None,
    order_by: str | Sequence[str] = (),
    partition_rows: int = PARTITION_ROWS,
    chunk_rows: int = CHUNK_ROWS,
    seed: int = 0,
) -> SemanticDedupResult:
    """Find the near-duplicates among the (id, embedding) rows of ``inputs`` (Parquet files,
    folders, globs or URLs) and write ``output/duplicates.parquet`` and ``output/dedup.json``.

    ``n_clusters`` defaults to one cluster per 10,000 items; fewer clusters find more pairs
    and cost more. ``order_by`` names columns that decide which item of a near-duplicate set
    is kept: the first in their order, smallest first, or largest first for a name given with
    a leading ``-`` (``"-score"``); items without a value come last; ties and the default:
    input order.
    ``executor`` runs the four passes (default: the streaming executor, local backend).

    Only one run at a time writes an output folder: another one raises ``OutputInUse``
    (``conveyor.output_lock``).
    """
    import pyarrow as pa

    started = time.perf_counter()
    _check(threshold, n_clusters, partition_rows, chunk_rows, seed)
    given = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not given or not all(os.fspath(i) for i in given):
        raise ValueError("inputs must name at least one file, folder, glob or URL, none empty")
    if not os.fspath(output):
        raise ValueError("output must not be empty")
    try:
        check_output_place(output)
    except ValueError as exc:
        raise SemanticDedupError(str(exc)) from None
    from conveyor.pipelines.places import source_problems

    # the dedup's files beside the inputs made their folder unreadable as one dataset
    problems = source_problems(_inputs(inputs), output, (".conveyor", DUPLICATES, REPORT))
    if problems:
        raise SemanticDedupError(problems[0])
    order = (order_by,) if isinstance(order_by, str) else tuple(order_by)
    try:
        columns = Columns.of(id_column, embedding_column, order)
    except ValueError as exc:
        raise SemanticDedupError(str(exc)) from None
    out = _absolute(output)
    root = location(out)
    work = str(root / WORK)
    remove_tree(work)
    made = not is_url(out) and not os.path.isdir(os.path.dirname(work))
    # the output may hold the input (a video output's embeddings/): only what the dedup
    # writes is left out (its work folder is hidden, which a listing skips)
    files = scan(_inputs(inputs), columns, exclude=[str(root / DUPLICATES)])
    plan = chunks(files, chunk_rows)
    items = sum(c.rows for c in plan)
    clusters = n_clusters or default_clusters(items)
    id_type = files[0].id_type if files else pa.string()
    passes: dict[str, float] = {}
    skipped = nonfinite = duplicates = 0
    trained_clusters = 0
    with held(executor):  # one private Ray cluster for the four passes
        if items:
            from conveyor.dedup.passes import (
                AssignClusters,
                CompareClusters,
                SampleEmbeddings,
                TrainCentroids,
            )

            t0 = time.perf_counter()
            fraction = sample_size(items, clusters) / items
            sampled = run_pass(
                Pipeline("semdedup-sample", [SampleEmbeddings(work, columns, fraction, seed)]),
                executor,
                plan,
            ).outputs
            _one_length(sampled, plan, embedding_column)
            skipped = sum(s.skipped for s in sampled)
            nonfinite = sum(s.nonfinite for s in sampled)
            if items - skipped:
                trained = run_pass(
                    Pipeline(
                        "semdedup-train",
                        [TrainCentroids(work, clusters, items - skipped, partition_rows, seed)],
                    ),
                    executor,
                    ["train"],
                ).outputs[0]
                trained_clusters = trained.clusters
                passes["train"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                assigned = run_pass(
                    Pipeline("semdedup-assign", [AssignClusters(work, columns)]), executor, plan
                ).outputs
                counts = np.sum([a.counts for a in assigned], axis=0)
                passes["assign"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                bucket_of = np.load(_local_copy(root / WORK / "buckets.npy"))
                tasks = compare_tasks(counts.tolist(), bucket_of.tolist(), partition_rows)
                compared = run_pass(
                    Pipeline("semdedup-compare", [CompareClusters(work, columns, threshold)]),
                    executor,
                    tasks,
                ).outputs
                duplicates = sum(c.duplicates for c in compared)
                passes["compare"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        from conveyor.dedup.passes import WriteDuplicates

        run_pass(
            Pipeline("semdedup-write", [WriteDuplicates(work, out, id_type)]), executor, ["write"]
        )
        passes["write"] = time.perf_counter() - t0
    result = SemanticDedupResult(
        items=items - skipped,
        duplicates=duplicates,
        clusters=trained_clusters,
        threshold=threshold,
        skipped=skipped,
        duplicates_path=str(root / DUPLICATES),
        report_path=str(root / REPORT),
        wall_s=time.perf_counter() - started,
        passes={k: round(v, 3) for k, v in passes.items()},
        nonfinite=nonfinite,
    )
    report = {
        **asdict(result),
        "inputs": len(files),
        "id_column": id_column,
        "embedding_column": embedding_column,
        "order_by": list(order),
        "n_clusters": n_clusters,
        "partition_rows": partition_rows,
        "chunk_rows": chunk_rows,
        "seed": seed,
    }
    with atomic_write(root / REPORT) as f:
        f.write((json.dumps(report, indent=1) + "\n").encode())
    remove_tree(work)
    if made:  # .conveyor/ held only the work: an empty folder left behind would say otherwise
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(work))
    return result


def _one_length(sampled: list[Sampled], plan: list[Chunk], column: str) -> None:
    """``SemanticDedupError`` naming two files whose embeddings differ in length: the plan
    read each file's first embedding only, so a file's later row groups are checked here,
    before k-means would fail naming none."""
    first: dict[int, str] = {}
    for s in sorted(sampled, key=lambda s: s.chunk):
        if s.dim:
            first.setdefault(s.dim, plan[s.chunk].path)
    if len(first) > 1:
        (dim, path), (other, where) = list(first.items())[:2]
        if where == path:  # row groups of one file
            lengths = f"of {dim} and of {other} numbers"
        else:
            lengths = f"of {other} numbers, {path!r} of {dim}"
        raise SemanticDedupError(
            f"INPUT {where!r}: column {column!r} holds embeddings {lengths}; they must all "
            "have one length"
        )


def _local_copy(path: Any) -> Any:
    import io

    return io.BytesIO(path.read_bytes())
