"""``summary.json`` of a video run, and its human form for the terminal.

The summary covers every listed video, this run's and earlier runs' alike, from their
records. None is read again at the end: ``RunTally`` folds in the records of the videos
complete before the run (read anyway, to decide what to resume) and each record the writer
hands on as a video completes (``Video.record``), so finishing a run costs the same for ten
clips or ten million, and the driver keeps totals, not an entry per video. Only a video no
output told of (one the engine failed, or whose output a later stage failed) is looked up
on disk.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.engine.journal import key_label, source_key
from conveyor.engine.lineage import root_label
from conveyor.media.layout import OutputLayout

if TYPE_CHECKING:
    from rich.console import Console

    from conveyor.monitor.event_log import InputFailure
    from conveyor.pipelines.video_config import VideoConfig
    from conveyor.result import FailureRecord, RunResult
    from conveyor.stages.video.reader import VideoSource
    from conveyor.tasks.video import VideoTask


@dataclass(frozen=True, slots=True)
class VideoTotals:
    """What the summary takes from one video's record (the record itself holds every clip
    id: a run keeps these instead).

    Attributes:
        status: ``"ok"`` or ``"failed"``.
        no_clips: readable, but too short for any clip.
        damaged: its clips were cut past packets the decoder refused.
        duration_s: the source's length.
        made, kept, kept_seconds: its clips.
        filtered: (filter, clips) in the record's order.
        errors: (stage, reason) of the video's own failures.
        clip_errors: (clip id, stage, reason) of its clips' failures.
        resumed, resumed_seconds: its clips an interrupted run had finished, and their
            length (the run that completed the video did not make them).
    """

    status: str
    no_clips: bool
    damaged: bool
    duration_s: float
    made: int
    kept: int
    kept_seconds: float
    filtered: tuple[tuple[str, int], ...]
    errors: tuple[tuple[str, str], ...]
    clip_errors: tuple[tuple[str, str, str], ...]
    resumed: int = 0
    resumed_seconds: float = 0.0

    @classmethod
    def of(cls, record: dict[str, Any]) -> VideoTotals:
        meta = record.get("metadata") or {}
        return cls(
            status=record["status"],
            no_clips=bool(record.get("no_clips")),
            damaged=bool(record.get("damaged_packets")),
            duration_s=float(meta.get("duration_s") or 0.0),
            made=len(record["clips"]),
            kept=len(record["kept"]),
            kept_seconds=record.get("kept_seconds", 0.0),
            filtered=tuple((name, len(ids)) for name, ids in record["filtered"].items()),
            errors=tuple(record["errors"].items()),
            clip_errors=tuple(
                (e["clip_id"], e["stage"], e["reason"]) for e in record["clip_errors"]
            ),
            resumed=record.get("resumed_clips", 0),
            resumed_seconds=record.get("resumed_seconds", 0.0),
        )


#: records read from disk in one request batch (a store reads a batch concurrently)
READ_BATCH = 1000
NOT_FINISHED = {
    "stage": None,
    "reason": "not finished (the run was stopped before it)",
    "kind": "incomplete",
}


class RunTally:
    """The summary's totals, each video's record folded in as it comes: the records of the
    videos complete before the run (read anyway, to decide what to resume,
    ``add_complete``) and each record the writer hands on as a video completes
    (``Video.record``, ``add_output``).

    Nothing is kept per video but for the videos the run took and has not heard of yet
    (``open``: a window, like the engine's), the failures and the damaged videos, so the
    driver's memory stays flat from a thousand videos to millions. ``keep_complete`` also
    keeps every complete video's path (the shards' last pass looks each one up).
    """

    def __init__(self, keep_complete: bool = False) -> None:
        #: videos listed, complete before the run, and to do in this run
        self.listed = self.before = self.now = 0
        self.videos: Counter[str] = Counter()
        self.clips: Counter[str] = Counter()
        self.filtered: Counter[str] = Counter()
        self.seconds_in = self.seconds_now = self.kept_seconds = 0.0
        self.failures: list[dict[str, Any]] = []
        self.damaged: list[str] = []
        #: this run's videos with a failure found in the data (the run report's)
        self.failed_now: set[str] = set()
        #: taken by the run, no record yet: relative path -> (position among them, source)
        self.open: dict[str, tuple[int, VideoSource]] = {}
        self.complete_paths: list[str] | None = [] if keep_complete else None
        #: the run is over: a video listed now was never started
        self.stopped = False

    # -- what the listing tells ----------------------------------------------------------
    def add_complete(self, source: VideoSource, record: dict[str, Any]) -> None:
        """A video complete before the run, with the record just read to tell
        (``VideoSources``' ``on_complete``)."""
        self.listed += 1
        self.before += 1
        self._fold(source.relative_path, record, now=False)

    def add_pending(self, source: VideoSource) -> None:
        """A video the run is to do, as it is handed to the engine (``on_pending``)."""
        self.listed += 1
        if self.stopped:
            self._incomplete(source.relative_path, None)
        else:
            self.open[source.relative_path] = (self.now, source)
        self.now += 1

    # -- what the run tells --------------------------------------------------------------
    def add_output(self, task: VideoTask) -> None:
        """A last-stage output: the record it carries, if its video completed with it."""
        video = task.data
        if video.record is not None and self.open.pop(video.relative_path, None) is not None:
            self._fold(video.relative_path, video.record, now=True)

    def finish(self, layout: OutputLayout, failures: Sequence[FailureRecord] = ()) -> None:
        """After the run: each video taken but never told of is looked up on disk (a later
        stage failed its output after its record was written), or is incomplete, with the
        engine's ``failures`` where they name it."""
        if not self.open:
            return
        labels: dict[str, str] = {}
        for relative, (position, source) in self.open.items():
            labels[str(position)] = labels[key_label(source_key(source))] = relative
        engine = _engine_failures(failures, lambda label: labels.get(root_label(label)))
        waiting = list(self.open)
        for start in range(0, len(waiting), READ_BATCH):
            chunk = waiting[start : start + READ_BATCH]
            for relative, record in layout.read_records(chunk).items():
                del self.open[relative]
                if record is None:
                    self._incomplete(relative, engine.get(relative))
                else:
                    self._fold(relative, record, now=True)

    @classmethod
    def from_disk(
        cls,
        layout: OutputLayout,
        sources: Sequence[VideoSource],
        pending: Sequence[VideoSource],
        failures: Sequence[FailureRecord] = (),
    ) -> RunTally:
        """The tally of ``sources`` read from their records (``pending``: those this run
        was to do), as a run adds it up."""
        tally = cls()
        now = {s.relative_path for s in pending}
        tally.listed, tally.now = len(sources), len(pending)
        tally.before = len(sources) - len(pending)
        engine = _engine_failures(failures, lambda label: video_of_label(label, pending))
        for start in range(0, len(sources), READ_BATCH):
            chunk = [s.relative_path for s in sources[start : start + READ_BATCH]]
            for relative, record in layout.read_records(chunk).items():
                if record is None:
                    tally._incomplete(relative, engine.get(relative))
                else:
                    tally._fold(relative, record, now=relative in now)
        return tally

    # -- folding -------------------------------------------------------------------------
    def _fold(self, relative: str, record: dict[str, Any], now: bool) -> None:
        totals = VideoTotals.of(record)
        self.videos[totals.status] += 1
        self.videos["without_clips"] += totals.no_clips
        if totals.damaged:
            self.damaged.append(relative)
        self.seconds_in += totals.duration_s
        if now:  # of a video resumed part way, what this run did
            self.seconds_now += max(0.0, totals.duration_s - totals.resumed_seconds)
            self.clips["resumed"] += totals.resumed
        self.clips["made"] += totals.made
        self.clips["kept"] += totals.kept
        self.kept_seconds += totals.kept_seconds
        for name, count in totals.filtered:
            self.filtered[name] += count
        for stage, reason in totals.errors:
            self.failures.append(
                {"video": relative, "stage": stage, "reason": reason, "kind": "input"}
            )
        for clip_id, stage, reason in totals.clip_errors:
            self.clips["failed"] += 1
            self.failures.append(
                {
                    "video": relative,
                    "clip_id": clip_id,
                    "stage": stage,
                    "reason": reason,
                    "kind": "input",
                }
            )
        if now and (totals.errors or totals.clip_errors):
            self.failed_now.add(relative)
        if self.complete_paths is not None:
            self.complete_paths.append(relative)

    def _incomplete(self, relative: str, reasons: list[dict[str, Any]] | None) -> None:
        self.videos["incomplete"] += 1
        self.failures += [{"video": relative, **r} for r in reasons or [NOT_FINISHED]]


def video_of_label(label: str, pending: Sequence[VideoSource]) -> str | None:
    """The video a task label descends from: each video is a source task of the run, the
    ``i``-th labelled ``i`` (``pending[i]``), or with a journal after its key."""
    root = root_label(label)
    if root.startswith("k"):
        return next((s.relative_path for s in pending if key_label(source_key(s)) == root), None)
    if not root.isdigit():
        return None
    index = int(root)
    return pending[index].relative_path if index < len(pending) else None


def build_summary(
    config: VideoConfig,
    tally: RunTally,
    result: RunResult,
    wall_s: float,
    description: str,
) -> dict[str, Any]:
    """Totals over every listed video (this run's and earlier runs'), from ``tally``; the
    failures and damaged videos in the listing's order (by relative path)."""
    layout = OutputLayout(config.output)
    videos, clips = tally.videos, tally.clips
    return {
        "command": "video",  # whose output this is (conveyor.pipelines.owner)
        "pipeline": description,
        "input": config.input if isinstance(config.input, str) else list(config.input),
        "output": str(config.output),
        "options": config.fingerprint(),
        "videos": {
            "in": tally.listed,
            "ok": videos["ok"],
            "failed": videos["failed"],
            "incomplete": videos["incomplete"],
            "without_clips": videos["without_clips"],
            # whose clips were cut past damaged packets (each record says how many)
            "damaged": sorted(tally.damaged),
            "done_this_run": tally.now,
            "skipped_as_complete": tally.before,
        },
        "seconds_in": round(tally.seconds_in, 3),
        "hours_in": round(tally.seconds_in / 3600, 6),
        "clips": {
            "made": clips["made"],
            "kept": clips["kept"],
            "kept_seconds": round(tally.kept_seconds, 3),
            "filtered": dict(sorted(tally.filtered.items())),
            "failed": clips["failed"],
            # made by an interrupted run of a video this run completed, and kept as they were
            "resumed": clips["resumed"],
            # this run's dedup only: a ``conveyor dedup`` into the output writes the same
            # report, which the clips' tables do not reflect
            "duplicates": _duplicates(layout) if config.dedup else None,
        },
        "failures": sorted(tally.failures, key=lambda f: f["video"]),
        "wall_s": round(wall_s, 3),
        "seconds_this_run": round(tally.seconds_now, 3),
        "video_hours_per_wall_hour": (round(tally.seconds_now / wall_s, 4) if wall_s > 0 else None),
        "completed": result.completed,
        "engine": engine_summary(result),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def engine_summary(result: RunResult) -> dict[str, Any]:
    """What a summary says of the engine's run: first output, start-up, each stage."""
    return {
        "first_output_s": result.first_output_s,
        "startup_s": round(result.startup_s, 3),
        "stages": {name: s.as_dict() for name, s in result.stats.items()},
    }


def _engine_failures(
    records: Sequence[FailureRecord], video_of: Callable[[str], str | None]
) -> dict[str, list[dict[str, Any]]]:
    """Failures the engine recorded (a stage raised on every attempt), by video
    (``video_of(label)``)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        video = video_of(record.task) or f"(task {record.task})"
        found.setdefault(video, []).append(
            {
                "stage": record.stage,
                "reason": f"{record.error_type}: {record.message}",
                "kind": "engine",
            }
        )
    return found


def input_failures(summary: dict[str, Any], now: Container[str]) -> list[InputFailure]:
    """The failures of this run's videos (``now``: their relative paths, or those of them
    that failed, ``RunTally.failed_now``) that the pipeline found in the data (a video that
    cannot be decoded, a clip a stage could not score), for the run report: the engine
    never saw them as failures."""
    from conveyor.monitor.event_log import InputFailure

    return [
        InputFailure(
            stage=f.get("stage"),
            task=f["video"] + (f" clip {f['clip_id']}" if "clip_id" in f else ""),
            error_type="bad clip" if "clip_id" in f else "bad video",
            message=f["reason"],
        )
        for f in summary["failures"]
        if f.get("kind") == "input" and f["video"] in now
    ]


def _duplicates(layout: OutputLayout) -> int | None:
    from conveyor.stages.video.dedup import read_dedup_report

    report = read_dedup_report(layout)
    return None if report is None else report["duplicates"]


def format_hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def print_summary(summary: dict[str, Any], console: Console, max_failures: int = 20) -> None:
    """The run's summary as a few lines and tables."""
    from rich import box
    from rich.table import Table

    videos, clips = summary["videos"], summary["clips"]
    console.print(
        f"[bold]videos[/]: {videos['in']} in, {videos['ok']} ok, {videos['failed']} failed"
        + (f", {videos['incomplete']} incomplete" if videos["incomplete"] else "")
        + (
            f", {videos['without_clips']} too short for any clip"
            if videos.get("without_clips")
            else ""
        )
        + (
            f" ({videos['skipped_as_complete']} already complete, skipped)"
            if videos["skipped_as_complete"]
            else ""
        )
        + f"; {format_hours(summary['seconds_in'])} of video"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("clips", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_row("made", f"{clips['made']:,}")
    table.add_row("kept", f"{clips['kept']:,} ({format_hours(clips['kept_seconds'])})")
    for name, count in clips["filtered"].items():
        table.add_row(f"filtered by {name}", f"{count:,}")
    if clips["failed"]:
        table.add_row("failed", f"[red]{clips['failed']:,}[/]")
    if clips["duplicates"] is not None:
        table.add_row("near-duplicates (marked)", f"{clips['duplicates']:,}")
    if clips.get("resumed"):
        table.add_row("of them resumed (made before a stop)", f"{clips['resumed']:,}")
    console.print(table)
    damaged = videos.get("damaged") or []
    if damaged:
        from rich.markup import escape

        names = ", ".join(damaged[:5]) + (
            f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
        )
        console.print(
            f"[yellow]{len(damaged)} video(s) with damaged stretches[/] (clips cut past "
            f"packets the decoder refused; damaged_packets in their records): {escape(names)}"
        )
    failures = summary["failures"]
    if failures:
        console.print(f"[bold red]{len(failures)} failure(s)[/]:")
        for failure in failures[:max_failures]:
            where = failure["video"] + (
                f" clip {failure['clip_id']}" if "clip_id" in failure else ""
            )
            stage = f" [{failure['stage']}]" if failure.get("stage") else ""
            console.print(f"  {where}{stage}: {failure['reason']}", markup=False)
        if len(failures) > max_failures:
            console.print(f"  ... and {len(failures) - max_failures} more (summary.json)")
    rate = summary["video_hours_per_wall_hour"]
    console.print(
        f"wall {summary['wall_s']:.1f} s for {format_hours(summary['seconds_this_run'])} of video "
        f"this run" + (f": {rate:.2f} video-hours per wall hour" if rate is not None else "")
    )
