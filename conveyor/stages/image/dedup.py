"""Deduplication of an image run's kept images, after the stream, in the keep order.

An image is a duplicate when an image before it in the keep order is the same. The keep
order (``keep``, ``DEDUP_KEEP``) is input order (``order``: its part, then its place in
the part) for ``first``; the most pixels first for ``largest`` (a thumbnail or a scaled
copy gives way to its original), the highest aesthetic score for ``aesthetic``, each then
in input order. Same is:

- ``exact``: the same bytes (``content_hash``); it duplicates the first of them (copies of
  the same bytes are as large and score the same: only ``first`` applies);
- ``phash``: perceptual hashes at most ``max_distance`` bits apart (identical bytes give
  identical hashes); it duplicates the nearest earlier one. Pairs are found by the
  pigeonhole rule of multi-index hashing: two 64-bit hashes that differ in at most ``d``
  bits agree exactly on at least one of ``d + 1`` blocks of bits, so only images sharing a
  block are compared;
- ``semantic``: ``conveyor.dedup.semantic_dedup`` over the written embeddings, its passes
  on the run's executor (k-means, then every pair within a cluster), cosine similarity at
  least ``threshold``; it duplicates the most similar earlier one.

An image the shards already hold (packed by an earlier run) is never marked: a shard cannot
give it back (``keep_packed``).

Exact and perceptual deduplication read two columns of the metadata on the driver (a few
dozen bytes per image). The result is ``OUTPUT/duplicates.parquet`` (``id``,
``duplicate_of`` and ``distance`` or ``similarity``), ``OUTPUT/dedup.json``, and
``duplicate_of`` in the metadata (set where it changed, cleared where an earlier run's mark
no longer holds). Duplicates are left out of the shards. Recomputed over every complete part
at the end of each run, it gives the same marks for the same input.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from conveyor.stages.image.layout import ImageLayout
from conveyor.stages.image.shards import packed_ids

if TYPE_CHECKING:
    from conveyor.executors.base import Executor

DedupMode = Literal["none", "exact", "phash", "semantic"]
DEDUP_MODES: tuple[str, ...] = ("none", "exact", "phash", "semantic")
#: ``phash``: the most bits two perceptual hashes may differ in (of 64)
PHASH_DISTANCE = 4
#: ``semantic``: the least cosine similarity of two embeddings
SEMANTIC_THRESHOLD = 0.95
#: images compared at once within one block value (``phash``): bounds the pair matrix
PAIR_CHUNK = 2048
#: why only ``first`` applies to exact copies
KEEP_EXACT = "copies of the same bytes are as large and score the same"
#: which image of a duplicate set is kept (``conveyor image --dedup-keep``) -> the columns
#: that order them (``semantic_dedup``'s ``order_by``, read from the embeddings; the
#: metadata's for ``phash``): the first in input order, the largest (most pixels), or the
#: best-looking (the aesthetic model's score); ties, and images without the score after
#: those with one, in input order
DEDUP_KEEP: dict[str, tuple[str, ...]] = {
    "first": ("order",),
    "largest": ("-pixels", "order"),
    "aesthetic": ("-aesthetic", "order"),
}


@dataclass(frozen=True)
class ImageDedupResult:
    """What deduplication compared and found."""

    mode: str
    images: int
    duplicates: int
    #: id -> the id it duplicates
    marks: dict[str, str]
    wall_s: float


def _kept_hashes(
    layout: ImageLayout, parts: Sequence[int], column: str, keep: str = "first"
) -> Any:
    """id and ``column`` of the kept images of ``parts``, in the keep order (``keep``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from conveyor.dedup.passes import sort_keys
    from conveyor.dedup.plan import Columns

    tables = []
    read = ["id", "order", column, "filtered_by", "width", "height", "aesthetic"]
    for index in parts:
        # (the layout opens the file: pyarrow refuses a path that is not UTF-8)
        table = layout.read_table(layout.metadata_path(index), columns=read)
        tables.append(table.filter(pc.is_null(table.column("filtered_by"))))
    if not tables:
        return None
    table = pa.concat_tables(tables)
    pixels = pc.multiply(table.column("width").cast(pa.int64()), table.column("height"))
    table = table.append_column("pixels", pixels)
    order = Columns.of("id", column, DEDUP_KEEP[keep])
    keys = sort_keys(order.order_by, order.descending)
    return table.take(pc.sort_indices(table, sort_keys=keys)).select(["id", column])


def exact_duplicates(ids: Sequence[str], hashes: Sequence[str]) -> dict[str, tuple[str, float]]:
    """``id -> (first id with the same hash, 0)`` for every later copy (in the given order)."""
    first: dict[str, str] = {}
    marks: dict[str, tuple[str, float]] = {}
    for image, digest in zip(ids, hashes, strict=True):
        kept = first.setdefault(digest, image)
        if kept != image:
            marks[image] = (kept, 0.0)
    return marks


def phash_duplicates(
    ids: Sequence[str], hashes: np.ndarray, max_distance: int
) -> dict[str, tuple[str, float]]:
    """``id -> (nearest earlier id, bits apart)`` for every image with an earlier one at
    most ``max_distance`` bits away (``hashes``: uint64, in the order of ``ids``)."""
    count = len(ids)
    best = np.full(count, 65, np.int64)  # distance to the nearest earlier image so far
    partner = np.full(count, -1, np.int64)
    blocks = max_distance + 1
    edges = np.linspace(0, 64, blocks + 1).astype(int)
    for low, high in itertools.pairwise(edges):
        mask = np.uint64((1 << (high - low)) - 1)
        values = (hashes >> np.uint64(low)) & mask
        order = np.lexsort((np.arange(count), values))
        starts = np.flatnonzero(np.r_[True, values[order][1:] != values[order][:-1]])
        sizes = np.diff(np.r_[starts, count])
        for start, size in zip(starts[sizes > 1], sizes[sizes > 1], strict=True):
            _compare_group(order[start : start + size], hashes, max_distance, best, partner)
    return {ids[j]: (ids[int(partner[j])], float(best[j])) for j in np.flatnonzero(partner >= 0)}


def _compare_group(
    members: np.ndarray, hashes: np.ndarray, max_distance: int, best: np.ndarray, partner: Any
) -> None:
    """Every later member of a group against every earlier one (members in input order)."""
    for start in range(0, len(members), PAIR_CHUNK):
        later = members[start : start + PAIR_CHUNK]
        earlier = members[: start + len(later)]
        distance = np.bitwise_count(hashes[later][:, None] ^ hashes[earlier][None, :])
        distance = distance.astype(np.int64)
        distance[later[:, None] <= earlier[None, :]] = 65  # only earlier images count
        nearest = distance.argmin(axis=1)  # the first of equals: the earliest
        near = distance[np.arange(len(later)), nearest]
        for row in np.flatnonzero(near <= max_distance):
            j, i, d = later[row], earlier[nearest[row]], near[row]
            if d < best[j] or (d == best[j] and i < partner[j]):
                best[j], partner[j] = d, i


def _write_marks(layout: ImageLayout, marks: dict[str, tuple[str, float]], measure: str) -> None:
    """``duplicates.parquet``: a ``distance`` is a count of bits (int32), a ``similarity``
    a cosine (float32, as ``conveyor dedup`` writes it)."""
    import pyarrow as pa

    values = [m[1] for m in marks.values()]
    table = pa.table(
        {
            "id": pa.array(list(marks), pa.string()),
            "duplicate_of": pa.array([m[0] for m in marks.values()], pa.string()),
            measure: pa.array(
                [round(v) for v in values] if measure == "distance" else values,
                pa.int32() if measure == "distance" else pa.float32(),
            ),
        }
    )
    layout.write_parquet(layout.duplicates, table)


def _read_marks(layout: ImageLayout) -> dict[str, tuple[str, float]]:
    table = layout.read_table(layout.duplicates, columns=["id", "duplicate_of", "similarity"])
    columns = (table.column(name).to_pylist() for name in ("id", "duplicate_of", "similarity"))
    return {image: (partner, value) for image, partner, value in zip(*columns, strict=True)}


def keep_packed(
    marks: dict[str, tuple[str, float]], packed: set[str]
) -> tuple[dict[str, tuple[str, float]], int]:
    """``marks`` with no image the shards hold marked, and how many were unmarked.

    A shard cannot give an image back, so one packed by an earlier run stays kept when the
    marks move past it (a larger copy added to the input with ``largest``, a part before it
    done at last, other k-means clusters): the copy it was marked against is marked its
    duplicate instead, unless that one is marked already or packed too (both stay)."""
    marks = dict(marks)
    unmarked = 0
    for image in sorted(packed.intersection(marks)):
        partner, value = marks.pop(image)
        unmarked += 1
        if partner not in packed and partner not in marks:
            marks[partner] = (image, value)
    return marks, unmarked


def _semantic(
    layout: ImageLayout,
    files: list[str],
    threshold: float,
    clusters: int | None,
    executor: Executor | None,
    keep: str,
) -> tuple[int, dict[str, tuple[str, float]]]:
    from conveyor.dedup.plan import MissingColumns
    from conveyor.dedup.semantic import semantic_dedup

    older = f"an earlier version wrote it, and keeping the {keep} image reads them: write to "
    with MissingColumns.explained(older + "a new OUTPUT, or pass --overwrite"):
        result = semantic_dedup(
            files,
            str(layout.local),
            id_column="id",
            order_by=DEDUP_KEEP[keep],
            threshold=threshold,
            n_clusters=clusters,
            executor=executor,
        )
    return result.items, _read_marks(layout)


def deduplicate(
    layout: ImageLayout,
    parts: Sequence[int],
    mode: DedupMode,
    *,
    max_distance: int = PHASH_DISTANCE,
    threshold: float = SEMANTIC_THRESHOLD,
    clusters: int | None = None,
    executor: Executor | None = None,
    keep: str = "first",
) -> ImageDedupResult:
    """Find the duplicates among the kept images of the complete ``parts`` and mark them
    (see the module doc); ``keep``: which image of a set stays (``DEDUP_KEEP``)."""
    if keep not in DEDUP_KEEP:
        raise ValueError(f"keep must be one of {', '.join(DEDUP_KEEP)}, got {keep!r}")
    if mode == "exact" and keep != "first":
        raise ValueError(f"keep {keep!r} needs phash or semantic dedup: {KEEP_EXACT}")
    started = time.perf_counter()
    report: dict[str, Any] = {"mode": mode}
    measure = "similarity" if mode == "semantic" else "distance"
    if mode == "semantic":
        files = [str(p) for p in map(layout.part_embeddings, parts) if p.exists()]
        images, marks = 0, {}
        if files:  # (else no kept image has a vector: nothing to compare)
            images, marks = _semantic(layout, files, threshold, clusters, executor, keep)
            report.update(json.loads(layout.dedup_report.read_text()))
    else:
        column = "content_hash" if mode == "exact" else "phash"
        table = _kept_hashes(layout, parts, column, keep)
        ids = [] if table is None else table.column("id").to_pylist()
        values = [] if table is None else table.column(column).to_pylist()
        ids = [i for i, v in zip(ids, values, strict=True) if v is not None]
        values = [v for v in values if v is not None]
        if mode == "exact":
            marks = exact_duplicates(ids, values)
        else:
            hashes = np.asarray([int(h, 16) for h in values], dtype=np.uint64)
            marks = phash_duplicates(ids, hashes, max_distance)
            report["max_distance"] = max_distance
        images = len(ids)
    marks, report["kept_in_shards"] = keep_packed(marks, packed_ids(layout))
    _write_marks(layout, marks, measure)
    found = {image: partner for image, (partner, _) in marks.items()}
    mark_metadata(layout, parts, found)
    wall = time.perf_counter() - started
    report.update(mode=mode, keep=keep, images=images, duplicates=len(found), wall_s=round(wall, 3))
    layout.write_json(layout.dedup_report, report)
    return ImageDedupResult(mode, images, len(found), found, wall)


def mark_metadata(layout: ImageLayout, parts: Sequence[int], marks: dict[str, str]) -> int:
    """Write ``duplicate_of`` into the metadata of ``parts`` where it changed; returns the
    parts rewritten."""
    import pyarrow as pa

    rewritten = 0
    for index in parts:
        path = layout.metadata_path(index)
        table = layout.read_table(path)
        now = [marks.get(i) for i in table.column("id").to_pylist()]
        if now == table.column("duplicate_of").to_pylist():
            continue
        position = table.schema.get_field_index("duplicate_of")
        column = pa.array(now, pa.string())
        layout.write_parquet(path, table.set_column(position, "duplicate_of", column))
        rewritten += 1
    return rewritten
