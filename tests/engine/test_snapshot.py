"""A run seen from outside: stage and run snapshots, the RunStarted event, the result."""

from __future__ import annotations

from conveyor.cluster import NodeInfo
from conveyor.engine.messages import Handle
from conveyor.engine.policies.placement import Ledger
from conveyor.engine.pool import Worker
from conveyor.engine.queues import Entry
from conveyor.engine.snapshot import (
    Progress,
    fill_result,
    run_snapshot,
    run_started,
    stage_snapshot,
)
from conveyor.engine.spec import StageSpec
from conveyor.engine.state import StageState
from conveyor.resources import Resources
from conveyor.result import FailureRecord, RunResult, StageStats


def stage(index: int, name: str) -> StageState:
    spec = StageSpec(index, name, Resources(cpus=1.0, gpus=0.5), 4, None, None, timeout_s=9.0)
    return StageState(spec, StageStats(name))


def progress(**changes: object) -> Progress:
    values: dict[str, object] = {
        "pipeline": "p",
        "elapsed_s": 12.5,
        "admitted": 7,
        "outputs": 5,
        "skipped": 2,
        "source_done": True,
        "startup_s": 1.5,
        "first_output_s": 3.0,
    }
    values.update(changes)
    return Progress(**values)  # type: ignore[arg-type]


def test_a_stage_snapshot_counts_its_queue_workers_and_stats() -> None:
    s = stage(0, "decode")
    s.queue.push(Entry(Handle(None, 100, "0")))
    ready, starting = Worker("a", 0), Worker("b", 0)
    for w in (ready, starting):
        s.pool.add(w)
    s.pool.mark_ready(ready)
    s.target, s.in_flight_tasks = 3, 2
    s.stats.tasks_in, s.stats.failed = 10, 1
    s.pool.sent(ready, [1], alone=False, now=4.0)  # holds work from 4 s
    snap = stage_snapshot(s, 10.0)
    assert (snap.name, snap.workers_ready, snap.workers_starting, snap.target) == (
        "decode",
        1,
        1,
        3,
    )
    assert (snap.queued, snap.queued_bytes, snap.in_flight) == (1, 100, 2)
    assert (snap.tasks_in, snap.failed, snap.done) == (10, 1, False)
    assert len(snap.service_counts) == len(s.service_counts)
    assert snap.occupied_s == 6.0  # a batch counts while it runs, not when it ends


def test_a_run_snapshot_carries_the_progress_and_the_cluster() -> None:
    ledger = Ledger.of([NodeInfo("n", 8, 2)])
    snap = run_snapshot(progress(), [stage(0, "a"), stage(1, "b")], ledger, 12.5)
    assert (snap.pipeline, snap.elapsed_s, snap.inputs_admitted, snap.outputs) == ("p", 12.5, 7, 5)
    assert [s.name for s in snap.stages] == ["a", "b"] and snap.source_exhausted
    assert (snap.cpus, snap.gpus, snap.cpus_reserved) == (8.0, 2.0, 0.0)
    assert (snap.startup_s, snap.first_output_s) == (1.5, 3.0)


def test_run_started_says_what_was_asked_of_which_cluster() -> None:
    event = run_started(
        progress(elapsed_s=0.25),
        "two stages",
        "streaming",
        "SimulatedBackend",
        [stage(0, "a")],
        [NodeInfo("n", 8, 2, 80.0)],
        {"max_attempts": 3},
    )
    assert (event.t, event.pipeline, event.executor, event.backend) == (
        0.25,
        "p",
        "streaming",
        "SimulatedBackend",
    )
    assert event.stages[0]["name"] == "a" and event.stages[0]["timeout_s"] == 9.0
    assert event.nodes[0] == {
        "node_id": "n",
        "cpus": 8,
        "gpus": 2,
        "gpu_memory_gb": 80.0,
        "memory_bytes": None,
    }
    assert event.settings == {"max_attempts": 3}


def test_the_result_counts_every_input_and_keeps_the_queues_high_water_marks() -> None:
    stages = [stage(0, "a"), stage(1, "b")]
    stages[0].queue.push(Entry(Handle(None, 64, "0")))
    stages[0].queue.take(1)
    stages[1].stats.filtered = 1
    failure = FailureRecord("a", "3", "ValueError", "bad", "", 3)
    result = RunResult()
    fill_result(result, progress(startup_s=None), stages, [failure], completed=True)
    assert result.completed and result.failures == [failure]
    assert result.wall_s == result.startup_s == 12.5  # not started up: the whole run
    assert result.stats["a"].queue_hwm_tasks == 1 and result.stats["a"].queue_hwm_bytes == 64
    assert result.counts == {"inputs": 7, "outputs": 5, "filtered": 1, "failed": 1, "skipped": 2}
