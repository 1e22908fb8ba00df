"""A run as seen from outside: the snapshot monitors get at every tick, the ``RunStarted``
event that opens a run's event log, and the ``RunResult`` filled when it ends.

All of it is read from the controller's records (``engine.state``) and the ledger, plus a
``Progress``: the run's own counts, handed over as one value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.cluster import NodeInfo
from conveyor.engine.events import RunSnapshot, RunStarted, StageSnapshot
from conveyor.engine.policies.placement import Ledger
from conveyor.engine.state import StageState
from conveyor.result import FailureRecord, RunResult


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands by its own counts.

    Attributes:
        pipeline: the pipeline's name.
        elapsed_s: seconds since the run began.
        admitted: source tasks taken in.
        outputs: last-stage outputs handed to the caller.
        skipped: source tasks a journal showed finished by an earlier run (or given twice).
        source_done: every source task has been taken in.
        startup_s: seconds until the first workers were all ready (``None``: not yet).
        first_output_s: seconds until the first output was handed out (``None``: not yet).
    """

    pipeline: str
    elapsed_s: float
    admitted: int
    outputs: int
    skipped: int
    source_done: bool
    startup_s: float | None
    first_output_s: float | None


def stage_snapshot(stage: StageState, now: float) -> StageSnapshot:
    """One stage as a monitor sees it at ``now`` (the backend's clock)."""
    pool, stats = stage.pool, stage.stats
    return StageSnapshot(
        name=stage.spec.name,
        workers_ready=pool.ready_count,
        workers_starting=pool.live_count - pool.ready_count,
        target=stage.target,
        queued=len(stage.queue),
        queued_bytes=stage.queue.bytes,
        in_flight=stage.in_flight_tasks,
        tasks_in=stats.tasks_in,
        tasks_out=stats.tasks_out,
        filtered=stats.filtered,
        failed=stats.failed,
        task_time_s=stage.meter.task_time.value,
        done=stage.done,
        retried=stats.retried,
        busy_s=stats.busy_s,
        worker_deaths=stats.worker_deaths,
        timeouts=stats.timeouts,
        service_counts=tuple(stage.service_counts),
        service_sum_s=stage.service_sum_s,
        occupied_s=stage.pool.occupied_s(now),
    )


def run_snapshot(
    progress: Progress, stages: Iterable[StageState], ledger: Ledger, now: float
) -> RunSnapshot:
    """The whole run as a monitor sees it at a tick (``now``: the backend's clock)."""
    cpus, gpus = ledger.totals()
    cpus_held, gpus_held = ledger.reserved()
    return RunSnapshot(
        progress.pipeline,
        progress.elapsed_s,
        progress.admitted,
        progress.outputs,
        tuple(stage_snapshot(stage, now) for stage in stages),
        progress.source_done,
        cpus=cpus,
        gpus=gpus,
        cpus_reserved=cpus_held,
        gpus_reserved=gpus_held,
        startup_s=progress.startup_s,
        first_output_s=progress.first_output_s,
    )


def run_started(
    progress: Progress,
    description: str,
    executor: str,
    backend: str,
    stages: Iterable[StageState],
    nodes: Iterable[NodeInfo],
    settings: Mapping[str, Any],
) -> RunStarted:
    """The event that opens a run: what was asked of which cluster, with which settings."""
    shapes = tuple(
        {
            "name": s.spec.name,
            "cpus": s.spec.resources.cpus,
            "gpus": s.spec.resources.gpus,
            "gpu_memory_gb": s.spec.resources.gpu_memory_gb,
            "memory_gb": s.spec.resources.memory_gb,
            "batch_size": s.spec.batch_size,
            "batch_wait_s": s.spec.batch_wait_s,
            "num_workers": s.spec.num_workers,
            "timeout_s": s.spec.timeout_s,
        }
        for s in stages
    )
    cluster = tuple(
        {
            "node_id": n.node_id,
            "cpus": n.cpus,
            "gpus": n.gpus,
            "gpu_memory_gb": n.gpu_memory_gb,
            "memory_bytes": n.memory_bytes,
        }
        for n in nodes
    )
    return RunStarted(
        t=progress.elapsed_s,
        pipeline=progress.pipeline,
        description=description,
        executor=executor,
        backend=backend,
        stages=shapes,
        nodes=cluster,
        settings=dict(settings),
    )


def fill_result(
    result: RunResult,
    progress: Progress,
    stages: Sequence[StageState],
    failures: list[FailureRecord],
    completed: bool,
) -> None:
    """What a run's result says once it ended (``completed``: it ran to the end)."""
    result.completed = completed
    result.failures = failures
    result.wall_s = progress.elapsed_s
    result.startup_s = progress.startup_s if progress.startup_s is not None else result.wall_s
    result.first_output_s = progress.first_output_s
    for stage in stages:
        stage.stats.queue_hwm_tasks = stage.queue.hwm_tasks
        stage.stats.queue_hwm_bytes = stage.queue.hwm_bytes
    result.stats = {s.spec.name: s.stats for s in stages}
    result.counts = {
        "inputs": progress.admitted,
        "outputs": progress.outputs,
        "filtered": sum(s.stats.filtered for s in stages),
        "failed": len(failures),
        "skipped": progress.skipped,
    }
