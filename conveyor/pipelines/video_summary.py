"""``summary.json`` of a video run, and its human form for the terminal.

The summary covers every listed video, this run's and earlier runs' alike, from their
records. None is read again at the end: ``RunTally`` folds in the records of the videos
complete before the run (read anyway, to decide what to resume) and each record the writer
hands on as a video completes (``Video.record``), so finishing a run costs the same for ten
clips or ten million. Only a video no output told of (one the engine failed, or whose
output a later stage failed) is looked up on disk.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conveyor.stages.video.layout import OutputLayout

if TYPE_CHECKING:
    from rich.console import Console

    from conveyor.monitor.event_log import InputFailure
    from conveyor.pipelines.video import VideoConfig
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
        )


class RunTally:
    """The records of a run's videos, folded in as they come (``VideoTotals`` each)."""

    def __init__(self) -> None:
        self.videos: dict[str, VideoTotals] = {}
        #: looked up on disk and found without a record
        self._absent: set[str] = set()

    def add(self, relative_path: str, record: dict[str, Any]) -> None:
        self.videos[relative_path] = VideoTotals.of(record)
        self._absent.discard(relative_path)

    def add_complete(self, source: VideoSource, record: dict[str, Any]) -> None:
        """A video complete before the run, with the record just read to tell
        (``VideoSources``' ``on_complete``)."""
        self.add(source.relative_path, record)

    def add_output(self, task: VideoTask) -> None:
        """A last-stage output: the record it carries, if its video completed with it."""
        video = task.data
        if video.record is not None:
            self.add(video.relative_path, video.record)

    def read_missing(self, layout: OutputLayout, relative_paths: Sequence[str]) -> None:
        """Look up on disk the records of the videos no output told of."""
        missing = [r for r in relative_paths if r not in self.videos and r not in self._absent]
        for relative, record in layout.read_records(missing).items():
            if record is None:
                self._absent.add(relative)
            else:
                self.add(relative, record)

    def complete(self, relative_paths: Sequence[str]) -> list[str]:
        """Those of ``relative_paths`` whose video has a record."""
        return [r for r in relative_paths if r in self.videos]


def video_of_label(label: str, pending: Sequence[VideoSource]) -> str | None:
    """The video a task label descends from: each video is a source task of the run, the
    ``i``-th labelled ``i`` (``pending[i]``), or with a journal after its key."""
    from conveyor.engine.journal import key_label, source_key

    root = label.split(".", 1)[0].split("*", 1)[0]
    if root.startswith("k"):
        return next((s.relative_path for s in pending if key_label(source_key(s)) == root), None)
    if not root.isdigit():
        return None
    index = int(root)
    return pending[index].relative_path if index < len(pending) else None


def build_summary(
    config: VideoConfig,
    sources: Sequence[VideoSource],
    pending: Sequence[VideoSource],
    result: RunResult,
    wall_s: float,
    description: str,
    tally: RunTally | None = None,
) -> dict[str, Any]:
    """Totals over every listed video's record (this run's and earlier runs'): those in
    ``tally``, the others read from disk."""
    layout = OutputLayout(config.output)
    if tally is None:
        tally = RunTally()
    tally.read_missing(layout, [s.relative_path for s in sources])
    done_now = {s.relative_path for s in pending}
    engine_failures = _engine_failures(result.failures, pending)
    videos = Counter()
    clips = Counter()
    filtered: Counter[str] = Counter()
    seconds_in = seconds_now = kept_seconds = 0.0
    failures: list[dict[str, Any]] = []
    damaged: list[str] = []
    for source in sources:
        totals = tally.videos.get(source.relative_path)
        if totals is None:
            videos["incomplete"] += 1
            reasons = engine_failures.get(source.relative_path) or [
                {
                    "stage": None,
                    "reason": "not finished (the run was stopped before it)",
                    "kind": "incomplete",
                }
            ]
            failures += [{"video": source.relative_path, **r} for r in reasons]
            continue
        videos[totals.status] += 1
        videos["without_clips"] += totals.no_clips
        if totals.damaged:
            damaged.append(source.relative_path)
        seconds_in += totals.duration_s
        if source.relative_path in done_now:
            seconds_now += totals.duration_s
        clips["made"] += totals.made
        clips["kept"] += totals.kept
        kept_seconds += totals.kept_seconds
        for name, count in totals.filtered:
            filtered[name] += count
        for stage, reason in totals.errors:
            failures.append(
                {"video": source.relative_path, "stage": stage, "reason": reason, "kind": "input"}
            )
        for clip_id, stage, reason in totals.clip_errors:
            clips["failed"] += 1
            failures.append(
                {
                    "video": source.relative_path,
                    "clip_id": clip_id,
                    "stage": stage,
                    "reason": reason,
                    "kind": "input",
                }
            )
    duplicates = _duplicates(layout)
    return {
        "pipeline": description,
        "input": config.input if isinstance(config.input, str) else list(config.input),
        "output": str(config.output),
        "options": config.fingerprint(),
        "videos": {
            "in": len(sources),
            "ok": videos["ok"],
            "failed": videos["failed"],
            "incomplete": videos["incomplete"],
            "without_clips": videos["without_clips"],
            # whose clips were cut past damaged packets (each record says how many)
            "damaged": damaged,
            "done_this_run": len(done_now),
            "skipped_as_complete": len(sources) - len(pending),
        },
        "seconds_in": round(seconds_in, 3),
        "hours_in": round(seconds_in / 3600, 6),
        "clips": {
            "made": clips["made"],
            "kept": clips["kept"],
            "kept_seconds": round(kept_seconds, 3),
            "filtered": dict(sorted(filtered.items())),
            "failed": clips["failed"],
            "duplicates": duplicates,
        },
        "failures": failures,
        "wall_s": round(wall_s, 3),
        "seconds_this_run": round(seconds_now, 3),
        "video_hours_per_wall_hour": round(seconds_now / wall_s, 4) if wall_s > 0 else None,
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
    records: Sequence[FailureRecord], pending: Sequence[VideoSource]
) -> dict[str, list[dict[str, Any]]]:
    """Failures the engine recorded (a stage raised on every attempt), by video."""
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        video = video_of_label(record.task, pending) or f"(task {record.task})"
        found.setdefault(video, []).append(
            {
                "stage": record.stage,
                "reason": f"{record.error_type}: {record.message}",
                "kind": "engine",
            }
        )
    return found


def input_failures(summary: dict[str, Any], pending: Sequence[VideoSource]) -> list[InputFailure]:
    """The failures of this run's videos that the pipeline found in the data (a video that
    cannot be decoded, a clip a stage could not score), for the run report: the engine
    never saw them as failures."""
    from conveyor.monitor.event_log import InputFailure

    now = {s.relative_path for s in pending}
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
