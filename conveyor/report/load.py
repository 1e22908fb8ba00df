"""Reading ``events.jsonl`` (and its rotated parts) into per-run columns.

The log is forgiving to read: a torn last line (a killed run), lines that are not JSON, event
types and keys this version does not know are skipped; what cannot be read at all (no file,
an empty file, a file without a single Conveyor event) is a ``ReportError`` naming the file.
Snapshots are kept as numpy columns, not dicts, so a log of many hours fits in memory.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

EVENTS_FILE = "events.jsonl"
KNOWN_TYPES = frozenset(
    {"run_start", "snapshot", "decision", "worker", "failure", "run_end", "capped"}
)

#: per-stage snapshot fields kept as columns (missing values become NaN)
STAGE_FIELDS = (
    "ready",
    "starting",
    "target",
    "queued",
    "queued_bytes",
    "in_flight",
    "tasks_in",
    "tasks_out",
    "filtered",
    "failed",
    "retried",
    "busy",
    "task_time_s",
    "done",
)
#: run-wide snapshot fields; ``host_cpu_s``, ``run_cpu_s`` and ``host_gpu_s`` are counters
#: of the machine's use since the run started (NaN in logs written before they were)
RUN_FIELDS = (
    "inputs",
    "outputs",
    "source_exhausted",
    "cpus_reserved",
    "gpus_reserved",
    "host_cpu_s",
    "run_cpu_s",
    "host_gpu_s",
)


class ReportError(Exception):
    """An event log that cannot be read or turned into a report (the message names the file)."""


@dataclass
class StageSeries:
    """One stage's snapshot columns (``values[field]``, aligned with ``RunLog.times``)."""

    name: str
    values: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.values[key]


@dataclass
class RunLog:
    """One run (one ``run_start`` ... ``run_end``) of a log; a job's passes are several runs."""

    start: dict[str, Any]
    times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    run_values: dict[str, np.ndarray] = field(default_factory=dict)
    stages: dict[str, StageSeries] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    #: lines the writer dropped when its log hit its size cap (``capped`` events)
    dropped: int = 0

    @property
    def pipeline(self) -> str:
        return str(self.start.get("pipeline") or "pipeline")

    @property
    def stage_names(self) -> list[str]:
        return list(self.stages)

    @property
    def completed(self) -> bool:
        return bool(self.end and self.end.get("completed"))

    @property
    def duration_s(self) -> float:
        """Seconds the log covers: the end's wall time, else the last event's ``t``."""
        last = float(self.times[-1]) if len(self.times) else 0.0
        for group in (self.decisions, self.workers, self.failures):
            if group:
                last = max(last, _num(group[-1].get("t")))
        if self.end is not None:
            last = max(last, _num(self.end.get("wall_s")), _num(self.end.get("t")))
        return last


@dataclass
class RunEvents:
    """What ``load_events`` read: the runs of the log, oldest first, and how it went."""

    path: Path
    files: list[Path]
    runs: list[RunLog]
    #: lines that were not JSON objects (a torn last line of a killed run, most often)
    skipped_lines: int = 0
    #: events of types this version does not know (ignored)
    unknown_events: int = 0

    @property
    def run(self) -> RunLog:
        """The last run of the log (the only one unless a job ran several passes)."""
        return self.runs[-1]

    @property
    def dropped(self) -> int:
        return sum(run.dropped for run in self.runs)


def log_parts(path: Path) -> list[Path]:
    """``path`` and its rotated parts (``events.1.jsonl`` ...), oldest first."""
    pattern = re.compile(re.escape(path.stem) + r"\.(\d+)" + re.escape(path.suffix) + "$")
    older: list[tuple[int, Path]] = []
    if path.parent.is_dir():
        for candidate in path.parent.iterdir():
            match = pattern.match(candidate.name)
            if match and candidate.is_file():
                older.append((int(match.group(1)), candidate))
    parts = [p for _, p in sorted(older, reverse=True)]
    if path.is_file():
        parts.append(path)
    return parts


class _Builder:
    """Collects one run's events; snapshot rows are tuples until ``finish`` makes columns."""

    def __init__(self, start: dict[str, Any]) -> None:
        self.start = start
        self.run = RunLog(start=start)
        self.times: list[float] = []
        self.run_rows: list[tuple[Any, ...]] = []
        self.stage_rows: dict[str, list[tuple[Any, ...]]] = {}
        for stage in start.get("stages") or []:
            if isinstance(stage, dict) and stage.get("name") is not None:
                self._stage(str(stage["name"]))

    def _stage(self, name: str) -> list[tuple[Any, ...]]:
        rows = self.stage_rows.get(name)
        if rows is None:
            rows = [_MISSING] * len(self.times)
            self.stage_rows[name] = rows
        return rows

    def snapshot(self, event: dict[str, Any]) -> None:
        stages = event.get("stages")
        t = event.get("t")
        if not isinstance(stages, list) or not isinstance(t, (int, float)):
            return
        if self.times and t < self.times[-1]:  # out of order: keep the columns monotonic
            return
        self.times.append(float(t))
        self.run_rows.append(tuple(map(event.get, RUN_FIELDS)))
        count = len(self.times)
        for stage in stages:
            if not isinstance(stage, dict) or stage.get("name") is None:
                continue
            rows = self._stage(str(stage["name"]))
            if len(rows) < count:  # the first entry of a name in this snapshot wins
                rows.append(tuple(map(stage.get, STAGE_FIELDS)))
        for rows in self.stage_rows.values():
            if len(rows) < count:
                rows.append(_MISSING)

    def finish(self) -> RunLog:
        run = self.run
        run.times = np.asarray(self.times, dtype=float)
        run.run_values = dict(zip(RUN_FIELDS, _columns(self.run_rows, len(RUN_FIELDS)),
                                  strict=True))  # fmt: skip
        # stages named only by events (no snapshot, no run_start entry) still get a row
        for group in (run.decisions, run.workers, run.failures):
            for event in group:
                for name in _stages_of(event):
                    self._stage(name)
        run.stages = {
            name: StageSeries(
                name, dict(zip(STAGE_FIELDS, _columns(rows, len(STAGE_FIELDS)), strict=True))
            )
            for name, rows in self.stage_rows.items()
        }
        return run


_MISSING = (None,) * len(STAGE_FIELDS)


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[np.ndarray]:
    """Rows of JSON values as float columns: numbers and booleans as they are, anything
    else (null, missing, text) NaN."""
    if not rows:
        return [np.zeros(0) for _ in range(width)]
    try:
        table = np.array(rows, dtype=float).reshape(len(rows), width)
    except (TypeError, ValueError):  # a value that is not a number: the slow way
        table = np.array([[_num(v) for v in row] for row in rows], dtype=float)
    return [table[:, i].copy() for i in range(width)]


def _stages_of(event: dict[str, Any]) -> list[str]:
    if event.get("type") == "decision":
        return [str(c["stage"]) for c in event.get("changes") or [] if c.get("stage") is not None]
    stage = event.get("stage")
    return [] if stage is None else [str(stage)]


def _num(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return math.nan


def load_events(path: str | Path) -> RunEvents:
    """Read a run's event log: ``path`` is ``events.jsonl`` or the folder holding it.

    Rotated parts next to it (``events.N.jsonl``, higher is older) are read first, oldest
    first. A part repeats its run's ``run_start`` at its head; that repetition continues the
    run, while a different ``run_start`` (the next pass of a job) begins a new one.
    Raises ``ReportError`` when there is no log, it is empty, or it holds no Conveyor events.
    """
    path = Path(path)
    if path.is_dir():
        path = path / EVENTS_FILE
    parts = log_parts(path)
    if not parts:
        raise ReportError(f"{path}: no event log found (is this a run's output folder?)")
    builders: list[_Builder] = []
    skipped = unknown = known = 0
    current: _Builder | None = None
    for part in parts:
        try:
            handle = part.open("rb")
        except OSError as exc:
            raise ReportError(f"{part}: cannot read the event log ({exc.strerror})") from None
        with handle:
            for raw in handle:
                line = raw.strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    skipped += 1
                    continue
                if not isinstance(event, dict):
                    skipped += 1
                    continue
                kind = event.get("type")
                if kind not in KNOWN_TYPES:
                    unknown += 1
                    continue
                known += 1
                if kind == "run_start":
                    if current is not None and _same_run(current.start, event):
                        continue  # the head of a rotated part
                    current = _Builder(event)
                    builders.append(current)
                    continue
                if current is None:  # events before any run_start: a run we know little of
                    current = _Builder({"type": "run_start", "t": 0.0})
                    builders.append(current)
                _add(current, kind, event)
    if not known:
        if all(p.stat().st_size == 0 for p in parts):
            raise ReportError(f"{path}: the event log is empty")
        raise ReportError(f"{path}: not a Conveyor event log (no known event on any line)")
    return RunEvents(
        path=path,
        files=parts,
        runs=[b.finish() for b in builders],
        skipped_lines=skipped,
        unknown_events=unknown,
    )


def _same_run(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("time", "pipeline", "stages")
    return all(a.get(k) == b.get(k) for k in keys)


def _add(builder: _Builder, kind: str, event: dict[str, Any]) -> None:
    run = builder.run
    if kind == "snapshot":
        builder.snapshot(event)
    elif kind == "decision":
        changes = [c for c in event.get("changes") or [] if isinstance(c, dict)]
        if changes:
            run.decisions.append({**event, "changes": changes})
    elif kind == "worker":
        run.workers.append(event)
    elif kind == "failure":
        run.failures.append(event)
    elif kind == "run_end":
        run.end = event
    elif kind == "capped":
        dropped = event.get("dropped")
        run.dropped += int(dropped) if isinstance(dropped, (int, float)) else 0
