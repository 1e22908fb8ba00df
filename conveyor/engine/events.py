"""What the controller tells monitors: a snapshot per tick, and the run's start and end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from conveyor.result import RunResult


@dataclass(frozen=True, slots=True)
class StageSnapshot:
    name: str
    workers_ready: int
    workers_starting: int
    target: int
    queued: int
    queued_bytes: int
    in_flight: int
    tasks_in: int  # inputs completed
    tasks_out: int
    filtered: int
    failed: int
    task_time_s: float | None
    done: bool


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    pipeline: str
    elapsed_s: float
    inputs_admitted: int
    outputs: int
    stages: tuple[StageSnapshot, ...]
    source_exhausted: bool


class Monitor(Protocol):
    """Receives snapshots; must be cheap (it runs on the controller's loop)."""

    def on_start(self, pipeline: str, stages: list[str]) -> None: ...

    def on_tick(self, snapshot: RunSnapshot) -> None: ...

    def on_end(self, result: RunResult) -> None: ...
