"""What a run returns: outputs, failure records, counts and per-stage statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FailureRecord:
    """One input that could not be processed after every attempt."""

    stage: str
    task: str
    error_type: str
    message: str
    traceback: str
    attempts: int
    #: only a later run can help (``DeferredError``: NeMo Curator's ``TransientDrop``)
    deferred: bool = False

    def __str__(self) -> str:
        return (
            f"stage {self.stage!r}, task {self.task}: {self.error_type}: {self.message} "
            f"(after {self.attempts} attempt{'s' if self.attempts != 1 else ''})"
        )


@dataclass
class StageStats:
    """Per-stage measurements of a run."""

    name: str
    #: inputs of the batches that ran to the end (an attempt that raised is in ``retried``
    #: or ``failed``): ``busy_s / tasks_in`` is the stage's time per input
    tasks_in: int = 0
    tasks_out: int = 0
    filtered: int = 0
    failed: int = 0
    retried: int = 0
    #: inputs whose stored payload was lost (with a node) and that were made again from
    #: their source task (the upstream stages' work for it shows in their tasks_in)
    recovered: int = 0
    busy_s: float = 0.0
    #: CPU seconds the stage's workers spent on its batches (every thread of the worker
    #: process; 0 where a backend cannot tell, such as in a simulation)
    cpu_s: float = 0.0
    peak_workers: int = 0
    final_workers: int = 0
    worker_deaths: int = 0
    #: batches that ran past the stage's ``timeout_s`` (their workers were killed)
    timeouts: int = 0
    queue_hwm_tasks: int = 0
    queue_hwm_bytes: int = 0
    #: the largest peak memory footprint one of its workers reported, in bytes (what it
    #: holds alone, not the libraries it shares; 0 where the backend does not measure it)
    worker_memory_bytes: int = 0

    @property
    def mean_service_s(self) -> float:
        """Busy seconds per input task (0 when the stage processed nothing)."""
        return self.busy_s / self.tasks_in if self.tasks_in else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tasks_in": self.tasks_in,
            "tasks_out": self.tasks_out,
            "filtered": self.filtered,
            "failed": self.failed,
            "retried": self.retried,
            "recovered": self.recovered,
            "busy_s": round(self.busy_s, 6),
            "cpu_s": round(self.cpu_s, 6),
            "mean_service_s": round(self.mean_service_s, 6),
            "peak_workers": self.peak_workers,
            "final_workers": self.final_workers,
            "worker_deaths": self.worker_deaths,
            "timeouts": self.timeouts,
            "queue_hwm_tasks": self.queue_hwm_tasks,
            "queue_hwm_bytes": self.queue_hwm_bytes,
            "worker_memory_bytes": self.worker_memory_bytes,
        }


@dataclass
class RunResult:
    """Everything a finished run reports. ``outputs`` holds last-stage outputs (``run()`` only)."""

    outputs: list[Any] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    stats: dict[str, StageStats] = field(default_factory=dict)
    wall_s: float = 0.0
    startup_s: float = 0.0
    first_output_s: float | None = None
    #: False when the run was stopped early (``close()``, Ctrl-C) or failed
    completed: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        c = self.counts
        lines = [
            f"{c.get('inputs', 0)} inputs -> {c.get('outputs', 0)} outputs, "
            f"{c.get('filtered', 0)} filtered, {c.get('failed', 0)} failed in {self.wall_s:.2f}s"
        ]
        for s in self.stats.values():
            lines.append(
                f"  {s.name}: in={s.tasks_in} out={s.tasks_out} filtered={s.filtered} "
                f"failed={s.failed} busy={s.busy_s:.2f}s workers(peak={s.peak_workers}) "
                f"queue_hwm={s.queue_hwm_tasks}"
            )
        return "\n".join(lines)
