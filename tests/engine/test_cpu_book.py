"""The CPU book: CPUs held per node and stage while workers hold a message, and the two rules
that read it (which batch may start while a run fills; threads for a batch on idle cores)."""

from __future__ import annotations

from conveyor.cluster import NodeInfo
from conveyor.engine.cpu_book import QUICK_BATCH_S, CpuBook
from conveyor.engine.messages import Handle
from conveyor.engine.policies.placement import Ledger
from conveyor.engine.pool import Worker
from conveyor.engine.queues import Entry
from conveyor.engine.spec import StageSpec
from conveyor.engine.state import StageState
from conveyor.resources import Resources
from conveyor.result import StageStats


def stage(index: int, cpus: float, max_threads: int | None = None, batch: int = 1) -> StageState:
    spec = StageSpec(index, f"s{index}", Resources(cpus=cpus), batch, None, None)
    spec.max_threads = max_threads
    return StageState(spec, StageStats(spec.name))


def book(*stages: StageState, cpus: float = 4, **settings: bool) -> CpuBook:
    ledger = Ledger.of([NodeInfo("n", cpus)])
    return CpuBook(list(stages), ledger, **settings)


def worker(index: int, name: str = "w", node: str = "n") -> Worker:
    return Worker(f"{name}{index}", index, node=node)


def test_held_cpus_add_up_per_node_from_a_stage_on_and_go_when_released() -> None:
    cpus = book(stage(0, 1.0), stage(1, 0.5), stage(2, 2.0))
    workers = [worker(0), worker(1), worker(2), worker(2, "x", node="m")]
    for w in workers:
        assert cpus.grant(w, cpus._stages[w.stage].spec, filling=False, draining=False) is None
    assert cpus.cpus_from("n", 0) == 3.5 and cpus.cpus_from("n", 1) == 2.5
    assert cpus.cpus_from("m", 0) == 2.0 and cpus.cpus_from("elsewhere", 0) == 0.0
    cpus.release(workers[2])
    cpus.release(workers[2])  # once only
    assert cpus.cpus_from("n", 0) == 1.5 and workers[2].held_cpus == 0.0


def test_idle_cores_go_to_a_batch_only_while_the_run_fills_or_its_stage_drains() -> None:
    stages = (stage(0, 1.0, max_threads=4),)
    cpus = book(*stages, cpus=4, first_output_first=False)
    spec = stages[0].spec
    assert cpus.grant(worker(0, "a"), spec, filling=False, draining=False) is None
    assert cpus.cpus_from("n", 0) == 1.0
    # draining: 3 cores idle besides the first worker's one
    assert cpus.grant(worker(0, "b"), spec, filling=False, draining=True) == 3
    assert cpus.cpus_from("n", 0) == 4.0
    no_threads = book(*stages, cpus=4, elastic_threads=False)
    assert no_threads.grant(worker(0), spec, filling=True, draining=True) is None


def test_while_filling_a_batch_waits_for_the_later_stages_to_leave_it_room() -> None:
    first, last = stage(0, 2.0), stage(1, 2.0)
    cpus = book(first, last, cpus=2)
    busy = worker(1, "late")
    cpus.grant(busy, last.spec, filling=True, draining=False)
    early = worker(0)
    assert not cpus.may_start(early, first.spec, filling=True)  # the last stage holds both
    assert cpus.may_start(early, first.spec, filling=False)  # once an output came through
    cpus.release(busy)
    assert cpus.may_start(early, first.spec, filling=True)
    relaxed = book(first, last, cpus=2, first_output_first=False)
    relaxed.grant(worker(1), last.spec, filling=True, draining=False)
    assert relaxed.may_start(early, first.spec, filling=True)


def test_work_on_its_way_to_the_end_counts_unless_the_stage_is_quick() -> None:
    first, last = stage(0, 1.0), stage(1, 1.0, max_threads=4)
    cpus = book(first, last, cpus=4)
    ready = worker(1, "r")
    last.pool.add(ready)
    last.pool.mark_ready(ready)
    last.queue.push(Entry(Handle(None, 8, "0")))  # a full batch ready for the last stage
    # nothing held, but the last stage's batch may take the node's 4 cores: the first waits
    held = worker(0, "h")
    cpus.grant(held, first.spec, filling=True, draining=False)
    assert cpus._ahead(worker(0), 0) == 1.0 + 4.0
    assert not cpus.may_start(worker(0), first.spec, filling=True)
    first.meter.busy_time.value = QUICK_BATCH_S / 10  # a quick stage only waits for what is held
    assert cpus._ahead(worker(0), 0) == 1.0
    assert cpus.may_start(worker(0), first.spec, filling=True)


def test_a_batch_uses_at_most_its_threads_and_the_node() -> None:
    cpus = book(stage(0, 0.5))
    assert cpus.batch_cpus(stage(0, 0.5, max_threads=8).spec, 4) == 4
    assert cpus.batch_cpus(stage(0, 0.5, max_threads=2).spec, 4) == 2
    assert cpus.batch_cpus(stage(0, 0.5).spec, 4) == 0.5
