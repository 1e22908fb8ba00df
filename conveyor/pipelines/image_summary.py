"""``summary.json`` of an image run, and its human form for the terminal.

The summary covers every listed part, this run's and earlier runs' alike, from their records:
``ImageTally`` folds in the records of the parts complete before the run (read anyway, to
decide what to resume) and each record the writer hands on, so none is read again at the
end. A part without a record is *incomplete*, with the engine's reason where a task failed.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from conveyor.monitor.event_log import InputFailure
    from conveyor.pipeline import Pipeline
    from conveyor.pipelines.image_config import ImageConfig
    from conveyor.result import FailureRecord, RunResult
    from conveyor.stages.image.dedup import ImageDedupResult
    from conveyor.stages.image.shards import PackResult
    from conveyor.stages.image.sources import ImageSources, PartInfo
    from conveyor.tasks.image import ImageBatch, ImagePart

#: failures listed in ``summary.json`` (all are in the metadata: ``failed_stage``, ``error``)
FAILURES_LISTED = 10_000


@dataclass(frozen=True, slots=True)
class PartTotals:
    """What the summary takes from a part's record.

    Attributes:
        digest: what the part held (its key's last element).
        images, kept: its images, and those no filter dropped.
        filtered: (filter, images) in the record's order.
        failures: (image key, stage, reason) of its images that failed.
        read_again: how many of them could not be read for now (the next run does the
            part again).
    """

    digest: str
    images: int
    kept: int
    filtered: tuple[tuple[str, int], ...]
    failures: tuple[tuple[str, str, str], ...]
    read_again: int = 0

    @classmethod
    def of(cls, record: dict[str, Any]) -> PartTotals:
        return cls(
            digest=str(record["key"][2]),
            images=int(record["images"]),
            kept=int(record["kept"]),
            filtered=tuple(record["filtered"].items()),
            failures=tuple((f["key"], f["stage"], f["reason"]) for f in record["failures"]),
            read_again=int(record.get("read_again", 0)),
        )


class ImageTally:
    """The records of a run's parts, folded in as they come (``PartTotals`` each)."""

    def __init__(self) -> None:
        self.parts: dict[int, PartTotals] = {}
        #: parts finished by this run
        self.now: set[int] = set()

    def add_complete(self, part: ImagePart, record: dict[str, Any]) -> None:
        """A part complete before the run (``ImageSources``' ``on_complete``)."""
        self.parts[part.index] = PartTotals.of(record)

    def add_output(self, task: ImageBatch) -> None:
        """A last-stage output: the record of the part the writer just finished."""
        if task.record is not None:
            self.parts[int(task.record["part"])] = PartTotals.of(task.record)
            self.now.add(int(task.record["part"]))

    def complete_parts(self) -> list[tuple[int, str]]:
        """(index, digest) of every complete part, in input order."""
        return [(index, self.parts[index].digest) for index in sorted(self.parts)]


def _engine_failures(
    records: list[FailureRecord], pending: list[PartInfo]
) -> dict[int, list[dict[str, Any]]]:
    """Failures the engine recorded (a stage raised on every attempt), by part: each part
    is a source task of the run, labelled after its journal key."""
    from conveyor.engine.journal import key_label, source_key
    from conveyor.engine.lineage import root_label

    by_label = {key_label(source_key(info)): info.index for info in pending}
    found: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        root = root_label(record.task)
        index = by_label.get(root)
        if index is None and root.isdigit() and int(root) < len(pending):
            index = pending[int(root)].index  # a run without a journal labels by position
        reason = {"stage": record.stage, "reason": f"{record.error_type}: {record.message}"}
        found.setdefault(-1 if index is None else index, []).append(reason)
    return found


def build_summary(
    config: ImageConfig,
    sources: ImageSources,
    tally: ImageTally,
    result: RunResult,
    dedup: ImageDedupResult | None,
    shards: PackResult | None,
    wall_s: float,
    pipeline: Pipeline,
) -> dict[str, Any]:
    """Totals over every listed part's record (this run's and earlier runs')."""
    from conveyor.pipelines.video_summary import engine_summary

    engine = _engine_failures(result.failures, sources.to_do)
    images: Counter[str] = Counter()
    filtered: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    for totals in tally.parts.values():
        images["in"] += totals.images
        images["kept"] += totals.kept
        for name, count in totals.filtered:
            filtered[name] += count
        images["failed"] += len(totals.failures)
        images["read_again"] += totals.read_again
        failures += [
            {"key": key, "stage": stage, "reason": reason, "kind": "input"}
            for key, stage, reason in totals.failures
        ]
    incomplete = [info for info in sources.to_do if info.index not in tally.parts]
    for info in incomplete:
        images["in"] += info.count
        images["incomplete"] += info.count
        reasons = engine.get(info.index) or [
            {"stage": None, "reason": "not finished (the run was stopped before it)"}
        ]
        kind = "engine" if info.index in engine else "incomplete"
        failures += [{"part": info.index, "key": info.where, **r, "kind": kind} for r in reasons]
    failures += [{"key": None, **r, "kind": "engine"} for r in engine.get(-1, [])]
    failures.sort(key=lambda f: (f["kind"] != "input", str(f["key"])))
    now = sum(tally.parts[i].images for i in tally.now)
    return {
        "command": "image",  # whose output this is (conveyor.pipelines.owner)
        "pipeline": pipeline.description or "",
        "input": config.input if isinstance(config.input, str) else list(config.input),
        "output": config.output,
        "options": config.fingerprint(),
        "parts": {
            "in": sources.found,
            "complete": len(tally.parts),
            "incomplete": len(incomplete),
            "done_this_run": len(tally.now),
            "skipped_as_complete": sources.complete,
        },
        "images": {
            "in": images["in"],
            "kept": images["kept"],
            "filtered": dict(sorted(filtered.items())),
            "failed": images["failed"],
            # of the failed: could not be read for now (permission, I/O): read next run
            "read_again": images["read_again"],
            "incomplete": images["incomplete"],
            "duplicates": None if dedup is None else dedup.duplicates,
            "in_shards": None if shards is None else shards.samples,
        },
        "dedup": None
        if dedup is None
        else {"mode": dedup.mode, "compared": dedup.images, "wall_s": round(dedup.wall_s, 3)},
        "shards": None
        if shards is None
        else {"count": shards.shards, "samples": shards.samples, "added": shards.added},
        "failures": failures[:FAILURES_LISTED],
        "failures_not_listed": max(0, len(failures) - FAILURES_LISTED),
        "wall_s": round(wall_s, 3),
        "images_this_run": now,
        "images_per_s": round(now / wall_s, 2) if wall_s > 0 else None,
        "completed": result.completed,
        "engine": engine_summary(result),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def input_failures(summary: dict[str, Any]) -> list[InputFailure]:
    """The images the pipeline found bad (for the run report: the engine never saw them as
    failures)."""
    from conveyor.monitor.event_log import InputFailure

    return [
        InputFailure(stage=f["stage"], task=f["key"], error_type="bad image", message=f["reason"])
        for f in summary["failures"]
        if f["kind"] == "input"
    ]


def print_summary(summary: dict[str, Any], console: Console, max_failures: int = 20) -> None:
    """The run's summary as a few lines and a table."""
    from rich import box
    from rich.table import Table

    images, parts = summary["images"], summary["parts"]
    console.print(
        f"[bold]images[/]: {images['in']:,} in, {images['kept']:,} kept, "
        f"{images['failed']:,} failed"
        + (f", {images['incomplete']:,} incomplete" if images["incomplete"] else "")
        + (
            f" ({parts['skipped_as_complete']:,} part(s) complete before, skipped)"
            if parts["skipped_as_complete"]
            else ""
        )
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("images", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_row("kept", f"{images['kept']:,}")
    for name, count in images["filtered"].items():
        table.add_row(f"filtered by {name}", f"{count:,}")
    if images["failed"]:
        table.add_row("failed", f"[red]{images['failed']:,}[/]")
    if images["duplicates"] is not None:
        table.add_row(f"duplicates ({summary['dedup']['mode']})", f"{images['duplicates']:,}")
    if images["in_shards"] is not None:
        shards = summary["shards"]
        table.add_row(f"in {shards['count']:,} shard(s)", f"{images['in_shards']:,}")
    console.print(table)
    failures = summary["failures"]
    if failures:
        total = len(failures) + summary["failures_not_listed"]
        console.print(f"[bold red]{total:,} failure(s)[/]:")
        for failure in failures[:max_failures]:
            stage = f" [{failure['stage']}]" if failure.get("stage") else ""
            console.print(f"  {failure['key']}{stage}: {failure['reason']}", markup=False)
        if total > max_failures:
            console.print(f"  ... and {total - max_failures:,} more (summary.json, metadata/)")
    rate = summary["images_per_s"]
    console.print(
        f"wall {summary['wall_s']:.1f} s for {summary['images_this_run']:,} images this run"
        + (f": {rate:,.1f} images/s" if rate else "")
    )
