"""What the controller tells monitors: a snapshot per tick, the run's start and end, and (to
monitors that define ``on_event``) what happened between ticks: workers coming and going,
failures, and the autoscaler's decisions with their reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from conveyor.result import FailureRecord, RunResult

#: upper bounds (seconds) of the service-time histogram kept per stage: one observation per
#: batch, from half a millisecond (a trivial map) to ten minutes (a model over a large input)
SERVICE_TIME_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
)  # fmt: skip


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
    retried: int = 0
    #: cumulative seconds the stage's workers spent on batches (busy fraction = its growth
    #: over wall time and ready workers)
    busy_s: float = 0.0
    worker_deaths: int = 0
    timeouts: int = 0
    #: batches per ``SERVICE_TIME_BUCKETS_S`` bucket (not cumulative; the last entry counts
    #: those slower than every bound), and the sum of their service times
    service_counts: tuple[int, ...] = ()
    service_sum_s: float = 0.0
    #: cumulative seconds its workers have held work (``Pool.occupied_s``): it grows while
    #: a batch runs, where ``busy_s`` grows when one ends, so a busy fraction over a window
    #: shorter than a batch is its growth
    occupied_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    pipeline: str
    elapsed_s: float
    inputs_admitted: int
    outputs: int
    stages: tuple[StageSnapshot, ...]
    source_exhausted: bool
    #: the cluster now, and what the run's workers hold of it
    cpus: float = 0.0
    gpus: float = 0.0
    cpus_reserved: float = 0.0
    gpus_reserved: float = 0.0
    startup_s: float | None = None
    first_output_s: float | None = None


@dataclass(frozen=True, slots=True)
class RunStarted:
    """Sent once, before the first worker starts: what runs, where, with which settings."""

    t: float
    pipeline: str
    description: str
    executor: str
    backend: str
    #: per stage: name, cpus, gpus, gpu_memory_gb, batch_size, batch_wait_s, num_workers,
    #: timeout_s
    stages: tuple[dict[str, Any], ...]
    #: node_id, cpus, gpus, gpu_memory_gb per node
    nodes: tuple[dict[str, Any], ...]
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkerEvent:
    """A worker started (asked for), became ready, was stopped, died or was timed out."""

    t: float
    kind: str  # "start" | "ready" | "stop" | "died" | "timeout"
    stage: str
    worker: str
    node: str | None = None
    reason: str | None = None
    setup_s: float | None = None


@dataclass(frozen=True, slots=True)
class FailureEvent:
    """An input failed for good (after its attempts)."""

    t: float
    record: FailureRecord


@dataclass(frozen=True, slots=True)
class TargetChange:
    stage: str
    before: int
    after: int
    reason: str


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    """The autoscaler changed at least one stage's worker target."""

    t: float
    changes: tuple[TargetChange, ...]


RunEvent = RunStarted | WorkerEvent | FailureEvent | DecisionEvent


class Monitor(Protocol):
    """Receives snapshots; must be cheap (it runs on the controller's loop). A monitor may
    also define ``on_event(event: RunEvent)``: the controller builds events only when one
    does."""

    def on_start(self, pipeline: str, stages: list[str]) -> None: ...

    def on_tick(self, snapshot: RunSnapshot) -> None: ...

    def on_end(self, result: RunResult) -> None: ...
