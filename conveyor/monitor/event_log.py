"""``EventLog``: a run's history as JSON lines, the input of ``conveyor report``.

It writes what a person needs to understand a run afterwards: what ran where with which
settings, a snapshot of every stage about once a second and at each autoscaler decision,
workers starting, stopping and dying, failures with their tracebacks, and the totals at the
end. Lines are buffered and flushed about once a second (a killed run loses at most that),
and the log rotates into at most ``max_parts`` files of ``max_part_bytes`` each, so a run of
days cannot fill a disk: the oldest part goes, and a ``capped`` line says how much went.

Schema (``t``: seconds since the run started): ``run_start``, ``snapshot``, ``decision``,
``worker``, ``failure``, ``run_end``, ``capped``; see docs/observability.md. Snapshots also
carry what the machine's CPUs (and GPUs) did, measured by ``HostSampler``: what the workers
hold does not say whether the machine was full.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from conveyor.engine.events import (
    DecisionEvent,
    FailureEvent,
    RunEvent,
    RunSnapshot,
    RunStarted,
    WorkerEvent,
)
from conveyor.monitor.host_usage import HostSampler, HostTotals

if TYPE_CHECKING:
    from conveyor.result import RunResult

log = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"
#: how far the run's clock may run ahead of the wall clock (seconds, and a share of the
#: time so far) before its time counts as virtual (a simulator's) and the host is no longer
#: measured; behind it, where a snapshot handed over late also puts it, more is allowed
CLOCK_AHEAD = (0.5, 0.1)
CLOCK_BEHIND = (2.0, 0.5)


@dataclasses.dataclass(frozen=True, slots=True)
class InputFailure:
    """An input a pipeline found bad by itself (see ``EventLog.add_failures``): where it
    was found, which input, what kind of problem and the reason in words."""

    stage: str | None
    task: str
    error_type: str
    message: str


def part_path(run_dir: Path, index: int) -> Path:
    """``events.jsonl`` (the newest part, ``index`` 0), then ``events.1.jsonl``, ... (older)."""
    return run_dir / (EVENTS_FILE if index == 0 else f"events.{index}.jsonl")


class EventLog:
    """Monitor writing ``DIR/events.jsonl``; with ``report=True`` it also writes
    ``DIR/report.html`` when the run ends (failed or stopped runs included).

    ``settings`` are recorded with the run (a CLI passes its options). The first run this
    monitor sees replaces the folder's old log; the next ones (the passes of a job) are
    appended, each starting with its own ``run_start``. Snapshots are written every
    ``snapshot_interval_s`` seconds of run time and at each decision.

    ``measure_host`` adds the machine's CPU use, the run's own processes' and,
    where the cluster has GPUs, the GPUs' utilisation to the snapshots (``HostSampler``).
    A run whose clock parts from the wall clock (the simulator's virtual time) stops being
    measured at the first snapshot that shows it: the machine's use says nothing about it.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        report: bool = False,
        settings: dict[str, Any] | None = None,
        snapshot_interval_s: float = 1.0,
        max_part_bytes: int = 64 * 1024 * 1024,
        max_parts: int = 4,
        measure_host: bool = True,
    ) -> None:
        if snapshot_interval_s <= 0:
            raise ValueError(
                f"EventLog: snapshot_interval_s must be > 0, got {snapshot_interval_s}"
            )
        if max_part_bytes < 4096:
            raise ValueError(f"EventLog: max_part_bytes must be >= 4096, got {max_part_bytes}")
        if max_parts < 1:
            raise ValueError(f"EventLog: max_parts must be >= 1, got {max_parts}")
        self.run_dir = Path(run_dir)
        self.report = report
        self.settings = dict(settings or {})
        self.snapshot_interval_s = snapshot_interval_s
        self.max_part_bytes = max_part_bytes
        self.max_parts = max_parts
        self.measure_host = measure_host
        self.path = part_path(self.run_dir, 0)
        #: the report written at the end of the last run (``report=True``), else ``None``
        self.report_path: Path | None = None
        self._file: IO[str] | None = None
        self._opened = False
        self._part_bytes = 0
        self._part_lines = 0
        self._parts_lines: list[int] = []  # lines of the older parts, newest first
        self._run_start: str | None = None
        self._next_snapshot = 0.0
        self._force = False
        self._last_flush = float("-inf")
        self._prev: dict[str, tuple[float, float]] = {}  # stage -> (elapsed, busy_s)
        self._last_elapsed = 0.0
        self._host: HostSampler | None = None
        self._host_t0 = 0.0  # the run's time when the host's measures began

    # -- the Monitor protocol -------------------------------------------------------------
    def on_start(self, pipeline: str, stages: list[str]) -> None:
        self.close()
        if not self._opened:
            # the first run replaces the folder's old log; later runs of this monitor (the
            # passes of one job) follow it, each from its own run_start
            self._opened = True
            self.run_dir.mkdir(parents=True, exist_ok=True)
            for index in range(self.max_parts + 8):
                part_path(self.run_dir, index).unlink(missing_ok=True)
            self._part_bytes = self._part_lines = 0
            self._parts_lines = []
        self._file = self.path.open("a", encoding="utf-8")
        self._run_start = None
        self._next_snapshot = 0.0
        self._force = False
        self._prev = {}
        self._last_elapsed = 0.0
        self.report_path = None
        self._stop_host()

    def on_event(self, event: RunEvent) -> None:
        if isinstance(event, RunStarted):
            self._start_host(event)
            record = self._started(event)
            self._run_start = json.dumps(record, default=str)
            self._write_line(self._run_start)
            return
        if isinstance(event, WorkerEvent):
            record = {"type": "worker", "t": round(event.t, 4), "event": event.kind}
            record.update(
                stage=event.stage,
                worker=event.worker,
                node=event.node,
                reason=event.reason,
                setup_s=event.setup_s,
            )
        elif isinstance(event, FailureEvent):
            failure = event.record
            record = {
                "type": "failure",
                "t": round(event.t, 4),
                "stage": failure.stage,
                "task": failure.task,
                "error_type": failure.error_type,
                "message": failure.message,
                "traceback": failure.traceback,
                "attempts": failure.attempts,
            }
        elif isinstance(event, DecisionEvent):
            record = {
                "type": "decision",
                "t": round(event.t, 4),
                "changes": [dataclasses.asdict(change) for change in event.changes],
            }
            self._force = True  # the next snapshot shows the state the decision was made in
        else:
            return
        self._write(record)

    def on_tick(self, snapshot: RunSnapshot) -> None:
        if self._file is None:
            return
        self._last_elapsed = snapshot.elapsed_s
        if snapshot.elapsed_s >= self._next_snapshot or self._force:
            self._force = False
            self._next_snapshot = snapshot.elapsed_s + self.snapshot_interval_s
            self._write(self._snapshot(snapshot))
        now = time.monotonic()
        if now - self._last_flush >= 1.0:
            self._last_flush = now
            self._file.flush()

    def on_end(self, result: RunResult) -> None:
        if self._file is None:
            return
        self._write(
            {
                "type": "run_end",
                "t": round(result.wall_s, 4),
                "completed": result.completed,
                "wall_s": result.wall_s,
                "startup_s": result.startup_s,
                "first_output_s": result.first_output_s,
                "counts": dict(result.counts),
                "stages": {name: stats.as_dict() for name, stats in result.stats.items()},
                **self._host_fields(result.wall_s),
            }
        )
        self._stop_host()
        self.close()
        self._write_report()

    def add_failures(self, failures: Sequence[InputFailure]) -> None:
        """Add failures the engine never saw to the last run's log, and write the report
        again when there is one.

        A pipeline that treats bad data as data (a video that cannot be decoded travels to
        the writer as a failed video, it is not an exception) knows its failures only once
        the run is over; this puts them where a person looks for failures, next to the
        engine's, marked ``"kind": "input"``.
        """
        if not failures or not self._opened or self._file is not None:
            return  # nothing to add, no run logged yet, or a run still going (its own end)
        self._file = self.path.open("a", encoding="utf-8")
        try:
            for failure in failures:
                self._write(
                    {
                        "type": "failure",
                        "t": round(self._last_elapsed, 4),
                        "kind": "input",
                        "stage": failure.stage,
                        "task": failure.task,
                        "error_type": failure.error_type,
                        "message": failure.message,
                        "traceback": "",
                        "attempts": None,
                    }
                )
        finally:
            self.close()
        self._write_report()

    def _write_report(self) -> None:
        if not self.report:
            return
        from conveyor.report import ReportError, write_report

        try:
            self.report_path = write_report(self.run_dir)
        except (ReportError, OSError) as exc:  # the run's own result matters more
            log.warning("could not write the run report in %s: %s", self.run_dir, exc)

    def close(self) -> None:
        self._stop_host()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- records --------------------------------------------------------------------------
    def _started(self, event: RunStarted) -> dict[str, Any]:
        nodes = [dict(node) for node in event.nodes]
        return {
            "type": "run_start",
            "t": round(event.t, 4),
            "time": time.time(),
            "pipeline": event.pipeline,
            "description": event.description,
            "executor": event.executor,
            "backend": event.backend,
            "settings": {**event.settings, **self.settings},
            "stages": list(event.stages),
            "cluster": {
                "nodes": nodes,
                "cpus": sum(float(n["cpus"]) for n in nodes),
                "gpus": sum(float(n["gpus"] or 0) for n in nodes),
            },
            "host": {
                "hostname": socket.gethostname(),
                "platform": platform.platform(),
                "python": sys.version.split()[0],
                "conveyor": _version(),
                **self._host_start_fields(),
            },
        }

    def _snapshot(self, snap: RunSnapshot) -> dict[str, Any]:
        stages = []
        for stage in snap.stages:
            then, busy_then = self._prev.get(stage.name, (0.0, 0.0))
            span = snap.elapsed_s - then
            worked = stage.occupied_s  # a long batch counts as it goes, not when it ends
            busy = 0.0
            if span > 0 and stage.workers_ready:
                busy = min(1.0, max(0.0, (worked - busy_then) / (span * stage.workers_ready)))
            self._prev[stage.name] = (snap.elapsed_s, worked)
            stages.append(
                {
                    "name": stage.name,
                    "ready": stage.workers_ready,
                    "starting": stage.workers_starting,
                    "target": stage.target,
                    "queued": stage.queued,
                    "queued_bytes": stage.queued_bytes,
                    "in_flight": stage.in_flight,
                    "tasks_in": stage.tasks_in,
                    "tasks_out": stage.tasks_out,
                    "filtered": stage.filtered,
                    "failed": stage.failed,
                    "retried": stage.retried,
                    "busy": round(busy, 4),
                    "task_time_s": stage.task_time_s,
                    "done": stage.done,
                }
            )
        return {
            "type": "snapshot",
            "t": round(snap.elapsed_s, 4),
            "inputs": snap.inputs_admitted,
            "outputs": snap.outputs,
            "source_exhausted": snap.source_exhausted,
            "cpus_reserved": round(snap.cpus_reserved, 4),
            "gpus_reserved": round(snap.gpus_reserved, 4),
            **self._host_fields(snap.elapsed_s),
            "stages": stages,
        }

    # -- the machine's use ----------------------------------------------------------------
    def _start_host(self, event: RunStarted) -> None:
        self._stop_host()
        if not self.measure_host:
            return
        gpus = any(float(node.get("gpus") or 0) > 0 for node in event.nodes)
        self._host = HostSampler(gpus=gpus)
        self._host_t0 = event.t

    def _stop_host(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None

    def _host_start_fields(self) -> dict[str, Any]:
        """What the host measurements cover: the CPUs watched, the GPUs measured."""
        if self._host is None:
            return {}
        return {"cpus": len(self._host.cpus), "gpus": self._host.gpu_count}

    def _host_fields(self, run_t: float) -> dict[str, Any]:
        """The host's counters now (``run_t``: the run's time now), or nothing where the
        host is not measured or the run's clock turns out not to be the wall clock."""
        if self._host is None:
            return {}
        totals = self._host.sample()
        run_s, wall_s = run_t - self._host_t0, totals.wall_s
        ahead = run_s - wall_s > CLOCK_AHEAD[0] + CLOCK_AHEAD[1] * wall_s
        behind = wall_s - run_s > CLOCK_BEHIND[0] + CLOCK_BEHIND[1] * run_s
        if ahead or behind:
            self._stop_host()
            return {}
        return _totals_record(totals)

    # -- writing, rotation ----------------------------------------------------------------
    def _write(self, record: dict[str, Any]) -> None:
        self._write_line(json.dumps(record, default=str))

    def _write_line(self, line: str) -> None:
        if self._file is None:
            return
        size = len(line) + 1
        if self._part_bytes + size > self.max_part_bytes and self._part_lines:
            self._rotate()
        self._file.write(line)
        self._file.write("\n")
        self._part_bytes += size
        self._part_lines += 1

    def _rotate(self) -> None:
        """The current part becomes ``events.1.jsonl`` (older ones shift up); the oldest
        beyond ``max_parts`` is dropped, which the new part's first lines say."""
        assert self._file is not None
        self._file.close()
        self._parts_lines.insert(0, self._part_lines)
        for index in range(len(self._parts_lines), 0, -1):  # each part one place older
            source = part_path(self.run_dir, index - 1)
            if source.exists():
                os.replace(source, part_path(self.run_dir, index))
        dropped = 0
        while len(self._parts_lines) > self.max_parts - 1:
            dropped += self._parts_lines.pop()
            part_path(self.run_dir, len(self._parts_lines) + 1).unlink(missing_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        self._part_bytes = self._part_lines = 0
        if self._run_start is not None:  # every part can be read on its own
            self._write_line(self._run_start)
        if dropped:
            t = round(self._last_elapsed, 4)
            self._write({"type": "capped", "t": t, "dropped": dropped})


def _totals_record(totals: HostTotals) -> dict[str, Any]:
    record = {
        "host_cpu_s": round(totals.host_cpu_s, 3),
        "run_cpu_s": round(totals.run_cpu_s, 3),
    }
    if totals.gpu_s is not None:
        record["host_gpu_s"] = round(totals.gpu_s, 3)
    return record


def _version() -> str:
    from conveyor import __version__

    return __version__
