"""Semantic deduplication of kept clips: near-duplicates by cosine similarity of embeddings.

Runs over everything in ``OUTPUT/embeddings`` once the clips are written (it needs all of
them, so it is a step after the streaming run, or a one-worker stage in a pipeline of its
own). Clips whose embeddings are at least ``threshold`` similar are grouped (transitively);
in each group the first clip (by source video and start time) is the one to keep, and every
other one is marked ``duplicate_of`` it in its meta. Nothing is deleted: the marks let a user
drop duplicates when reading the output. Up to ``exact_limit`` clips every pair is compared;
above it, clips are first clustered with k-means and compared within clusters (pairs that
land in different clusters are missed, as in SemDeDup).

The result is also written to ``OUTPUT/dedup.json`` (threshold, counts, groups), and a later
run over the same output recomputes it for all clips, old and new, clearing marks that no
longer hold.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.video.layout import OutputLayout
from conveyor.storage import ObjectPath

REPORT = "dedup.json"


@dataclass
class DedupResult:
    clips: int
    duplicates: int
    groups: list[list[str]]


def _load(layout: OutputLayout) -> tuple[list[str], np.ndarray]:
    ids: list[str] = []
    vectors: list[np.ndarray] = []
    for path in sorted(layout.embeddings.glob("*.parquet")):
        table = layout.read_table(path, columns=["clip_id", "embedding"])
        if not table.num_rows:
            continue
        ids += table.column("clip_id").to_pylist()
        flat = table.column("embedding").combine_chunks().flatten().to_numpy()
        vectors.append(flat.reshape(table.num_rows, -1).astype(np.float32))
    if not ids:
        return [], np.zeros((0, 0), np.float32)
    matrix = np.concatenate(vectors)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    return ids, matrix


def similar_pairs(matrix: np.ndarray, threshold: float, block: int = 2048) -> list[tuple[int, int]]:
    """Index pairs ``i < j`` with cosine similarity >= ``threshold`` (rows L2-normalised)."""
    pairs: list[tuple[int, int]] = []
    n = len(matrix)
    for start in range(0, n, block):
        sims = matrix[start : start + block] @ matrix.T
        rows, cols = np.nonzero(sims >= threshold)
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
            i = start + r
            if i < c:
                pairs.append((i, c))
    return pairs


def _clusters(matrix: np.ndarray, size: int, seed: int = 0) -> list[np.ndarray]:
    from sklearn.cluster import MiniBatchKMeans

    k = max(2, len(matrix) // size)
    labels = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=3).fit_predict(matrix)
    return [np.flatnonzero(labels == c) for c in range(k)]


def find_duplicate_groups(
    ids: list[str], matrix: np.ndarray, threshold: float, exact_limit: int = 20_000
) -> list[list[int]]:
    """Groups (index lists, two or more) of transitively similar rows, each sorted."""
    parent = list(range(len(ids)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    if len(ids) <= exact_limit:
        candidates = [similar_pairs(matrix, threshold)]
    else:
        candidates = []
        for members in _clusters(matrix, max(1, exact_limit // 4)):
            local = similar_pairs(matrix[members], threshold)
            candidates.append([(int(members[a]), int(members[b])) for a, b in local])
    for pairs in candidates:
        for a, b in pairs:
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for i in range(len(ids)):
        groups.setdefault(root(i), []).append(i)
    return [sorted(g) for g in groups.values() if len(g) > 1]


def _order_key(meta: dict[str, Any] | None, clip: str) -> tuple[str, float, str]:
    if meta is None:
        return ("~", 0.0, clip)
    return (meta["source_video"], float(meta["span"][0]), clip)


def deduplicate(
    output: str | os.PathLike[str] | ObjectPath, threshold: float = 0.95, exact_limit: int = 20_000
) -> DedupResult:
    """Mark near-duplicate kept clips under ``output``; returns the counts and groups."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if exact_limit < 1:
        raise ValueError(f"exact_limit must be >= 1, got {exact_limit}")
    layout = OutputLayout(output)
    ids, matrix = _load(layout)
    metas = {cid: _read_meta(layout, cid) for cid in ids}
    groups = []
    marks: dict[str, str] = {}
    for group in find_duplicate_groups(ids, matrix, threshold, exact_limit):
        members = sorted((ids[i] for i in group), key=lambda c: _order_key(metas[c], c))
        groups.append(members)
        for other in members[1:]:
            marks[other] = members[0]
    for cid, meta in metas.items():
        if meta is not None and meta.get("duplicate_of") != marks.get(cid):
            meta["duplicate_of"] = marks.get(cid)
            layout.write_json(layout.meta_path(cid), meta)
    result = DedupResult(len(ids), len(marks), groups)
    layout.write_json(
        layout.root / REPORT,
        {
            "threshold": threshold,
            "clips": result.clips,
            "duplicates": result.duplicates,
            "groups": groups,
        },
    )
    return result


def _read_meta(layout: OutputLayout, clip: str) -> dict[str, Any] | None:
    try:
        return json.loads(layout.meta_path(clip).read_text())
    except (OSError, ValueError):
        return None


def read_dedup_report(layout: OutputLayout) -> dict[str, Any] | None:
    """The last deduplication's report, if one ran on this output."""
    try:
        return json.loads((layout.root / REPORT).read_text())
    except (OSError, ValueError):
        return None


class SemanticDedup(ProcessingStage[Any, Any]):
    """``deduplicate`` as a one-worker stage, for a pipeline of its own after the writer's
    (seed it with no tasks: it runs once on the run's seed task)."""

    resources = Resources(cpus=1)
    num_workers = 1

    def __init__(
        self, output: str | os.PathLike[str] | ObjectPath, threshold: float = 0.95
    ) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.output = str(output)
        self.threshold = threshold

    def process(self, task: Any) -> DedupResult:
        return deduplicate(self.output, self.threshold)
