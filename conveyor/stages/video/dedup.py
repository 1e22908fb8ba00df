"""Semantic deduplication of a video output's kept clips, on the engine.

``deduplicate`` runs ``conveyor.dedup.semantic_dedup`` over ``OUTPUT/embeddings`` (clip id,
embedding, source video, start): a clip is a duplicate when an earlier clip (by source video,
then start time) has cosine similarity at least ``threshold`` with it. Nothing is deleted:
``OUTPUT/duplicates.parquet`` lists every duplicate with the clip it duplicates, and a pass of
``MarkDuplicates`` tasks (groups of videos) writes ``duplicate_of`` into each clip's meta and
its video's row of the clip table, clearing the marks an earlier run left that no longer
hold. ``OUTPUT/dedup.json`` has the counts and, up to ``GROUPS_LISTED`` duplicates, the
groups (each kept clip followed by the clips that duplicate it, directly or through another
duplicate). A later run over the same output recomputes it for every clip, old and new.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.media.layout import OutputLayout
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.storage import ObjectPath

if TYPE_CHECKING:
    from conveyor.executors.base import Executor

REPORT = "dedup.json"
DUPLICATES = "duplicates.parquet"
#: dedup.json lists the groups up to this many duplicates (beyond: duplicates.parquet)
GROUPS_LISTED = 10_000
#: videos per MarkDuplicates task
VIDEOS_PER_TASK = 64


@dataclass
class DedupResult:
    clips: int
    duplicates: int
    #: ``None`` when there are more than ``GROUPS_LISTED`` duplicates
    groups: list[list[str]] | None


def _marks(path: Any) -> dict[str, str]:
    """``id -> duplicate_of`` of a duplicates table (empty when there is none)."""
    import pyarrow.parquet as pq

    try:
        with path.open("rb") as raw:
            table = pq.read_table(raw, columns=["id", "duplicate_of"])
    except (OSError, ValueError):
        return {}
    ids = table.column("id").to_pylist()
    return dict(zip(ids, table.column("duplicate_of").to_pylist(), strict=True))


class MarkDuplicates(ProcessingStage[list[str], int]):
    """Writes ``duplicate_of`` into the metas and clip-table rows of a group of videos (by
    video id) where it changed: set for the new duplicates, cleared for clips an earlier run
    marked. Each worker loads the two marks tables once (a few dozen bytes per duplicate)."""

    resources = Resources(cpus=0.5)

    def __init__(self, output: str, previous: str | None) -> None:
        self.output = output
        self.previous = previous
        self._new: dict[str, str] | None = None
        self._old: dict[str, str] = {}

    def setup(self, worker: Any) -> None:
        layout = OutputLayout(self.output)
        self._new = _marks(layout.root / DUPLICATES)
        self._old = _marks(layout.internal / self.previous) if self.previous else {}

    def process(self, videos: list[str]) -> int:
        if self._new is None:
            self.setup(None)
        assert self._new is not None
        layout = OutputLayout(self.output)
        changed = 0
        for vid in videos:
            table = layout.read_table(layout.embedding_path(vid), columns=["clip_id"])
            clips = [
                c for c in table.column("clip_id").to_pylist() if c in self._new or c in self._old
            ]
            if not clips:
                continue
            changed += self._metas(layout, clips)
            self._table(layout, vid)
        return changed

    def _metas(self, layout: OutputLayout, clips: list[str]) -> int:
        changed = 0
        for clip in clips:
            path = layout.meta_path(clip)
            try:
                meta = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # no metas (--no-meta-json), or a clip redone since
            if meta.get("duplicate_of") != self._new.get(clip):  # type: ignore[union-attr]
                meta["duplicate_of"] = self._new.get(clip)  # type: ignore[union-attr]
                layout.write_json(path, meta)
                changed += 1
        return changed

    def _table(self, layout: OutputLayout, vid: str) -> None:
        import pyarrow as pa

        path = layout.clip_table_path(vid)
        try:
            table = layout.read_table(path)
        except (OSError, ValueError):
            return
        if "duplicate_of" not in table.column_names:
            return
        marks = [self._new.get(c) for c in table.column("clip_id").to_pylist()]  # type: ignore[union-attr]
        if marks == table.column("duplicate_of").to_pylist():
            return
        index = table.column_names.index("duplicate_of")
        column = pa.array(marks, table.schema.field(index).type)
        layout.write_parquet(path, table.set_column(index, "duplicate_of", column))


def _groups(marks: dict[str, str]) -> list[list[str]]:
    """Each kept clip followed by the clips whose ``duplicate_of`` chain ends at it (sorted)."""

    def root(clip: str) -> str:
        while clip in marks:
            clip = marks[clip]
        return clip

    groups: dict[str, list[str]] = {}
    for clip in marks:
        groups.setdefault(root(clip), []).append(clip)
    return [[kept, *sorted(members)] for kept, members in sorted(groups.items())]


#: which clip of a near-duplicate set is kept (``conveyor video --dedup-keep``) -> the
#: embeddings' columns that order them (``semantic_dedup``'s ``order_by``): the earliest
#: of the earliest video, or the longest, sharpest or best-looking (ties: the earliest)
DEDUP_KEEP: dict[str, tuple[str, ...]] = {
    "first": ("source_video", "start_s"),
    "longest": ("-duration_s", "source_video", "start_s"),
    "sharpest": ("-score_quality_sharpness", "source_video", "start_s"),
    "aesthetic": ("-score_aesthetic", "source_video", "start_s"),
}


def deduplicate(
    output: str | os.PathLike[str] | ObjectPath,
    threshold: float = 0.95,
    *,
    keep: str = "first",
    n_clusters: int | None = None,
    executor: Executor | None = None,
) -> DedupResult:
    """Mark near-duplicate kept clips under ``output``; returns the counts and groups.

    ``keep`` says which clip of a set stays unmarked (``DEDUP_KEEP``); clips without the
    score it reads come after those with one. ``executor`` runs the passes (default:
    streaming on the local backend)."""
    from conveyor.dedup.plan import MissingColumns
    from conveyor.dedup.semantic import run_pass, semantic_dedup
    from conveyor.pipeline import Pipeline
    from conveyor.storage import atomic_write

    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if keep not in DEDUP_KEEP:
        raise ValueError(f"keep must be one of {', '.join(DEDUP_KEEP)}, got {keep!r}")
    layout = OutputLayout(output)
    layout.internal.mkdir(parents=True, exist_ok=True)
    previous = None
    if (layout.root / DUPLICATES).exists():  # the marks to clear where they no longer hold
        previous = "previous-duplicates.parquet"
        with atomic_write(layout.internal / previous) as out:
            out.write((layout.root / DUPLICATES).read_bytes())
    videos = sorted(p.name[: -len(".parquet")] for p in layout.embeddings.glob("*.parquet"))
    if videos:
        older = f"an earlier version wrote it, and keeping the {keep} clip reads them: run "
        with MissingColumns.explained(older + "its video again (--overwrite), or keep the first"):
            result = semantic_dedup(
                str(layout.embeddings),
                str(layout.root),
                id_column="clip_id",
                order_by=DEDUP_KEEP[keep],
                threshold=threshold,
                n_clusters=n_clusters,
                executor=executor,
            )
        clips, duplicates = result.items, result.duplicates
        tasks = [videos[i : i + VIDEOS_PER_TASK] for i in range(0, len(videos), VIDEOS_PER_TASK)]
        marking = Pipeline("dedup-marks", [MarkDuplicates(str(layout.root), previous)])
        run_pass(marking, executor, tasks)
        report = json.loads((layout.root / REPORT).read_text())
    else:
        (layout.root / DUPLICATES).unlink(missing_ok=True)
        clips, duplicates, report = 0, 0, {}
    groups = _groups(_marks(layout.root / DUPLICATES)) if duplicates <= GROUPS_LISTED else None
    report.update(threshold=threshold, keep=keep, clips=clips, duplicates=duplicates, groups=groups)
    layout.write_json(layout.root / REPORT, report)
    if previous:
        (layout.internal / previous).unlink(missing_ok=True)
    return DedupResult(clips, duplicates, groups)


def read_dedup_report(layout: OutputLayout) -> dict[str, Any] | None:
    """The last deduplication's report, if one ran on this output."""
    try:
        return json.loads((layout.root / REPORT).read_text())
    except (OSError, ValueError):
        return None
