"""The controller's logic, deterministic on a virtual clock (real stage code, virtual time)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from conveyor import Pipeline, ProcessingStage, Resources
from conveyor.engine import controller as controller_module
from conveyor.engine.events import RunSnapshot
from conveyor.engine.policies.autoscale import AutoscaleConfig
from conveyor.errors import BackendError
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.result import RunResult
from tests.backends.ray_stages import BatchSizes
from tests.engine.virtual_backend import VirtualBackend


class Pass(ProcessingStage[Any, Any]):
    resources = Resources(cpus=1)

    def __init__(self, name: str, fanout: int = 1, size: int = 0) -> None:
        self.name = name
        self.fanout = fanout
        self.size = size

    def process(self, task: Any) -> Any:
        if self.fanout == 1 and not self.size:
            return task
        return [b"x" * self.size] * self.fanout


class Snapshots:
    def __init__(self) -> None:
        self.ticks: list[RunSnapshot] = []

    def on_start(self, pipeline: str, stages: list[str]) -> None:
        pass

    def on_tick(self, snapshot: RunSnapshot) -> None:
        self.ticks.append(snapshot)

    def on_end(self, result: RunResult) -> None:
        pass


def three_stage() -> Pipeline:
    return Pipeline("docs-example", [Pass("fast"), Pass("slow"), Pass("medium")])


@pytest.mark.parametrize("share_cpus", [False, True])
def test_autoscaler_finds_the_balanced_allocation_quickly(share_cpus: bool) -> None:
    backend = VirtualBackend(cpus=7, service_s={"fast": 0.25, "slow": 1.0, "medium": 0.5})
    monitor = Snapshots()
    executor = StreamingExecutor(
        backend, monitors=[monitor], autoscale=AutoscaleConfig(share_cpus=share_cpus)
    )
    result = three_stage().run(executor, initial_tasks=range(400))
    assert len(result.outputs) == 400
    steady = [t for t in monitor.ticks if 20 < t.elapsed_s < 80]
    assert steady
    for tick in steady:
        targets = [s.target for s in tick.stages]
        if share_cpus:
            # CPUs shared by time reach the same pace; the cheap stage may keep a spare
            # worker from the cold start (its load is exactly one worker, plus the margin)
            assert targets[1:] == [4, 2] and targets[0] in (1, 2)
        else:
            assert targets == [1, 4, 2]
    # 400 tasks at the ideal 4 tasks/s take 100 s; allow the warm-up and the drain
    assert result.wall_s < 100 * 1.08
    first_slow_scale = min(t for t, name in backend.starts[3:] if name == "slow")
    assert first_slow_scale < 3.0  # within seconds of the first measurements


def test_stage_with_work_always_keeps_a_worker() -> None:
    backend = VirtualBackend(cpus=3, service_s={"fast": 0.01, "slow": 0.5, "medium": 0.2})
    monitor = Snapshots()
    three_stage().run(StreamingExecutor(backend, monitors=[monitor]), initial_tasks=range(60))
    for tick in monitor.ticks:
        for stage in tick.stages:
            if stage.queued and not stage.done:
                assert stage.workers_ready + stage.workers_starting >= 1, (tick.elapsed_s, stage)


def test_autoscale_interval_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    real_plan = controller_module.plan

    def counting_plan(*args: Any, **kwargs: Any) -> list[int]:
        calls.append(args[3])
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(controller_module, "plan", counting_plan)
    counts = {}
    for interval in (0.5, 5.0):
        calls.clear()
        backend = VirtualBackend(cpus=4, service_s={"fast": 0.1, "slow": 0.2, "medium": 0.1})
        three_stage().run(StreamingExecutor(backend, autoscale_interval_s=interval), range(200))
        counts[interval] = len(calls)
    assert counts[0.5] > 3 * counts[5.0]


def test_fan_out_is_bounded_by_bytes_not_parent_tasks() -> None:
    def hwm(inputs: int) -> int:
        backend = VirtualBackend(cpus=4, service_s={"explode": 0.01, "sink": 0.01})
        pipeline = Pipeline("p", [Pass("explode", fanout=50, size=10_000), Pass("sink")])
        result = pipeline.run(
            StreamingExecutor(backend, edge_max_bytes=100_000), initial_tasks=range(inputs)
        )
        assert len(result.outputs) == inputs * 50
        return result.stats["sink"].queue_hwm_bytes

    small, large = hwm(10), hwm(100)
    assert small == large  # memory does not grow with the dataset
    assert large <= 100_000 + 2 * 50 * 10_100  # the budget plus what was already in flight


def test_batch_executor_runs_stage_after_stage_with_the_whole_budget() -> None:
    backend = VirtualBackend(cpus=4, service_s={"fast": 0.1, "slow": 0.1, "medium": 0.1})
    result = three_stage().run(BatchExecutor(backend), initial_tasks=range(40))
    assert len(result.outputs) == 40
    assert all(s.peak_workers == 4 for s in result.stats.values())
    first_start = {}
    for when, name in backend.starts:
        first_start.setdefault(name, when)
    assert first_start["fast"] < first_start["slow"] < first_start["medium"]


def test_expensive_setup_stage_is_not_shrunk_on_a_transient_starvation() -> None:
    # the feed stalls between t=200 and t=230 (one 30 s task): for a while the model stage
    # has nothing to do, and the feed looks like the bottleneck
    def feed(now: float) -> float:
        return 30.0 if 200 <= now < 230 else 0.05

    backend = VirtualBackend(cpus=6, service_s={"feed": feed, "model": 0.2}, setup_s=90)
    pipeline = Pipeline("p", [Pass("feed"), Pass("model")])
    monitor = Snapshots()
    result = pipeline.run(
        StreamingExecutor(backend, edge_max_tasks=16, monitors=[monitor]),
        initial_tasks=range(5000),
    )
    assert len(result.outputs) == 5000
    starved = [t for t in monitor.ticks if 200 < t.elapsed_s < 240 and t.stages[1].queued == 0]
    assert starved, "the scenario must really starve the model stage"
    tail = min(t.elapsed_s for t in monitor.ticks if t.source_exhausted)
    model_stops = [t for t, worker in backend.stops if worker.startswith("model") and t < tail]
    assert model_stops == []


def test_cheap_stages_do_shrink_after_the_delay() -> None:
    def upstream(now: float) -> float:
        return 0.05 if now < 30 else 0.5  # feed becomes the bottleneck at t=30

    backend = VirtualBackend(cpus=6, service_s={"feed": upstream, "model": 0.2}, setup_s=0.1)
    pipeline = Pipeline("p", [Pass("feed"), Pass("model")])
    pipeline.run(StreamingExecutor(backend), initial_tasks=range(800))
    assert any(worker.startswith("model") for _, worker in backend.stops)


def test_tasks_of_a_dead_worker_are_retried_alone() -> None:
    backend = VirtualBackend(cpus=2, service_s={"work": 0.01})
    pipeline = Pipeline("p", [Pass("work").with_(batch_size=4, num_workers=2)])
    run = pipeline.stream(StreamingExecutor(backend), initial_tasks=range(100))
    seen = [next(run)]
    victim = next(iter(backend.runners))
    backend.kill(victim)
    seen.extend(run)
    assert sorted(seen) == list(range(100))
    assert run.result.failures == []
    sizes = [sizes for name, sizes in backend.submitted]
    assert [1] in sizes  # suspects travel alone
    assert run.result.stats["work"].worker_deaths == 1


class Sizes(ProcessingStage[Any, Any]):
    resources = Resources(cpus=1)

    def __init__(self, name: str, batch_size: int) -> None:
        self.name = name
        self.batch_size = batch_size

    def process_batch(self, tasks: list[Any]) -> list[Any]:
        return [len(tasks)]


def test_batches_stay_exact_when_many_travel_in_one_message() -> None:
    # bursts of 12 into a very fast consumer of 5: messages carry several batches, and the
    # 2 left over from each burst must wait for the next one
    backend = VirtualBackend(cpus=4, service_s={"feed": 0.01, "gather": 1e-6})
    pipeline = Pipeline("p", [Pass("feed", fanout=12, size=1), Sizes("gather", batch_size=5)])
    result = pipeline.run(StreamingExecutor(backend), initial_tasks=range(101))
    assert any(len(sizes) > 1 for name, sizes in backend.submitted if name == "gather")
    sizes = sorted(result.outputs)
    assert sizes[1:] == [5] * 242 and sizes[0] == 2


def test_suspects_are_retried_while_fresh_work_keeps_coming() -> None:
    class FailOnce(ProcessingStage[int, int]):
        resources = Resources(cpus=1)
        seen: set[int] = set()

        def process(self, task: int) -> int:
            if task == 3 and task not in self.seen:
                self.seen.add(task)
                raise RuntimeError("transient")
            return task

    backend = VirtualBackend(cpus=2, service_s={"FailOnce": 0.01})
    run = Pipeline("p", [FailOnce().with_(num_workers=2)]).stream(
        StreamingExecutor(backend), initial_tasks=range(2000)
    )
    order = list(run)
    assert sorted(order) == list(range(2000))
    assert order.index(3) < 100  # retried soon, not after the other 1,997 inputs


def test_a_worker_that_dies_during_setup_is_replaced_a_few_times() -> None:
    from conveyor.engine.messages import ErrorInfo, WorkerSetupFailed
    from conveyor.errors import StageSetupError

    class DiesInSetup(VirtualBackend):
        def __init__(self, deaths: int) -> None:
            super().__init__(cpus=2, service_s={"work": 0.01})
            self.deaths = deaths

        def start_worker(self, worker_id: str, stage: Any, placement: Any) -> None:
            if self.deaths:
                self.deaths -= 1
                error = ErrorInfo("WorkerDied", "its node was lost during setup")
                self._at(self.clock, WorkerSetupFailed(worker_id, error))
                return
            super().start_worker(worker_id, stage, placement)

    pipeline = Pipeline("p", [Pass("work").with_(num_workers=1)])
    result = pipeline.run(StreamingExecutor(DiesInSetup(deaths=2)), initial_tasks=range(5))
    assert sorted(result.outputs) == list(range(5))
    with pytest.raises(StageSetupError, match="node was lost"):
        pipeline.run(StreamingExecutor(DiesInSetup(deaths=3)), initial_tasks=range(5))


def test_stages_are_sized_by_how_long_a_call_holds_a_worker() -> None:
    """A per-call cost the worker's clock does not see (Ray's actor calls) still costs capacity.

    ``a`` reports 0.1 s per task but each call holds its worker 0.18 s; ``b`` takes 0.12 s.
    Sized by busy time alone, 5 workers would go 2/3 (really 11 tasks/s); sized by the held
    time they go 3/2 (16.7 tasks/s).
    """
    backend = VirtualBackend(
        cpus=5, service_s={"a": 0.1, "b": 0.12}, call_overhead_s={"a": 0.08}, setup_s=0.1
    )
    monitor = Snapshots()
    with pytest.MonkeyPatch.context() as mp:
        # one batch per message, as where a deep queue cannot spread the call's cost
        mp.setattr(controller_module, "MESSAGE_OVERHEAD_FACTOR", 0.0)
        result = Pipeline("p", [Pass("a"), Pass("b")]).run(
            StreamingExecutor(backend, monitors=[monitor]), initial_tasks=range(400)
        )
    assert len(result.outputs) == 400
    steady = [t for t in monitor.ticks if 5 < t.elapsed_s < 20]
    assert steady and all([s.target for s in t.stages] == [3, 2] for t in steady)
    a = steady[-1].stages[0]
    assert a.task_time_s == pytest.approx(0.18, rel=0.05)
    assert result.stats["a"].mean_service_s == pytest.approx(0.1)  # what the stage reported
    assert result.wall_s < 400 / 16.7 * 1.15


@pytest.mark.parametrize("reported", [True, False])
def test_time_spent_waiting_for_a_core_does_not_size_a_stage(reported: bool) -> None:
    """On a machine whose cores are all busy, ``a``'s tasks wait 0.1 s for a core on top of
    their 0.1 s of work. More workers of ``a`` would only wait longer, so it is sized by its
    work, as ``b`` is: 3 and 3 of 6 CPUs. Where the wait is not reported apart (a backend
    that cannot measure it) it counts as work, and ``a`` takes twice ``b``'s workers."""
    backend = VirtualBackend(
        cpus=6, service_s={"a": 0.1, "b": 0.1}, queued_s={"a": 0.1}, queued_reported=reported
    )
    monitor = Snapshots()
    result = Pipeline("p", [Pass("a"), Pass("b")]).run(
        StreamingExecutor(backend, monitors=[monitor]), initial_tasks=range(600)
    )
    assert len(result.outputs) == 600
    steady = [t for t in monitor.ticks if 5 < t.elapsed_s < 15]
    a = steady[-1].stages[0]
    assert result.stats["a"].mean_service_s == pytest.approx(0.2)  # the wall time, as seen
    expected = [3, 3] if reported else [4, 2]
    assert steady and all([s.target for s in t.stages] == expected for t in steady)
    assert a.task_time_s == pytest.approx(0.1 if reported else 0.2, rel=0.05)


def test_messages_grow_to_spread_a_per_call_cost() -> None:
    """10 ms tasks behind a 20 ms per-call cost: one task per message would give 33 tasks/s;
    messages carrying four round trips' worth of work give about 80."""
    backend = VirtualBackend(
        cpus=1, service_s={"only": 0.01}, call_overhead_s={"only": 0.02}, setup_s=0.1
    )
    result = Pipeline("p", [Pass("only")]).run(StreamingExecutor(backend), initial_tasks=range(400))
    assert len(result.outputs) == 400
    sizes = [len(batches) for name, batches in backend.submitted]
    assert max(sizes) >= 6
    assert result.wall_s < 400 / 60


def test_message_size_is_capped_by_the_next_edges_bytes() -> None:
    """Big outputs: a message makes at most 1/32 of the next edge's byte budget, however
    cheap its tasks, so that what is in flight stays small next to what may queue."""
    backend = VirtualBackend(
        cpus=2,
        service_s={"big": 0.001, "sink": 0.001},
        call_overhead_s={"big": 0.02},
        memory_budget_bytes=64 << 20,  # 32 MiB per edge: 1 MiB per message
    )
    stages = [Pass("big", size=256 << 10), Pass("sink")]
    result = Pipeline("p", stages).run(StreamingExecutor(backend), initial_tasks=range(200))
    assert len(result.outputs) == 200
    big = [len(batches) for name, batches in backend.submitted if name == "big"]
    assert max(big) <= 4  # 4 x 256 KiB


def test_a_slow_round_trip_is_hidden_by_a_second_message_in_flight() -> None:
    """20 ms each way on 100 ms tasks: without a message waiting at the worker it would idle
    28 % of the time; once the round trip is measured the controller keeps one queued."""
    backend = VirtualBackend(cpus=1, service_s={"only": 0.1}, latency_s=0.02, setup_s=0.1)
    result = Pipeline("p", [Pass("only")]).run(StreamingExecutor(backend), initial_tasks=range(100))
    assert len(result.outputs) == 100
    assert result.wall_s < 0.1 * 100 + 1.0  # one worker, fed without gaps after the first
    # and with no measurable round trip, one message at a time (the default)
    quiet = VirtualBackend(cpus=1, service_s={"only": 0.1}, setup_s=0.1)
    controller_module_depths: list[int] = []
    real = controller_module.Controller._depth

    def spy(stage: Any) -> int:
        depth = real(stage)
        controller_module_depths.append(depth)
        return depth

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(controller_module.Controller, "_depth", staticmethod(spy))
        Pipeline("p", [Pass("only")]).run(StreamingExecutor(quiet), initial_tasks=range(20))
    assert set(controller_module_depths) == {1}


def test_a_stalled_engine_stops_with_its_state_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A defect that leaves work at idle workers (here: the second stage is never fed) ends
    the run with a message that says what each stage holds; a long, busy run does not."""
    original = controller_module.Controller._dispatch_stage

    def never_feeds_slow(self: Any, index: int, stage: Any) -> None:
        if stage.spec.name != "slow":
            original(self, index, stage)

    monkeypatch.setattr(controller_module.Controller, "_dispatch_stage", never_feeds_slow)
    backend = VirtualBackend(cpus=3)
    with pytest.raises(controller_module.EngineStalled) as info:
        three_stage().run(StreamingExecutor(backend), initial_tasks=range(20))
    message = str(info.value)
    assert "made no progress for" in message
    assert "slow: 20 queued, 0 to run alone, 0 in flight" in message
    assert "fast: 0 queued" in message and "done=True" in message
    assert backend.now() < controller_module.STALL_S + 30  # stopped soon after the limit


def test_a_long_run_with_slow_tasks_is_not_a_stall() -> None:
    backend = VirtualBackend(cpus=3, service_s={"fast": 0.01, "slow": 90.0, "medium": 0.01})
    result = three_stage().run(StreamingExecutor(backend), initial_tasks=range(3))
    assert sorted(result.outputs) == [0, 1, 2]
    assert backend.now() > 90


class Outage(VirtualBackend):
    """No node from ``lo`` to ``hi`` virtual seconds: every worker dies at ``lo``."""

    def __init__(self, lo: float, hi: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.lo, self.hi = lo, hi
        self.struck = False

    def nodes(self) -> list[Any]:
        return [] if self.lo <= self.clock < self.hi else super().nodes()

    def poll(self, timeout: float) -> list[Any]:
        if not self.struck and self.clock + timeout >= self.lo:
            self.clock = self.lo
            self.struck = True
            for worker_id in self.runners:
                if worker_id not in self.dead:
                    self.kill(worker_id)
        return super().poll(timeout)


def test_a_stage_without_room_waits_for_a_node_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = Outage(lo=1.0, hi=200.0, cpus=3, service_s={"slow": 0.5})
    with caplog.at_level("WARNING", logger="conveyor.engine.controller"):
        result = three_stage().run(StreamingExecutor(backend), initial_tasks=range(20))
    assert sorted(result.outputs) == list(range(20))  # nothing lost to the outage
    assert result.failures == []
    assert backend.now() > 200
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "s for room for a worker of" in warnings[0]
    assert "the cluster has 0 CPUs and 0 GPUs" in warnings[0]


class LastOutage(Outage):
    """An outage after which no node comes back, and the backend knows it."""

    def nodes_may_join(self) -> bool:
        return False


def test_a_stage_without_room_and_no_node_to_come_ends_the_run() -> None:
    """A simulated cluster whose nodes had all left waited for ever (its event log growing
    by megabytes a second): the backend knows no node will join."""
    backend = LastOutage(lo=1.0, hi=math.inf, cpus=3, service_s={"slow": 0.5})
    with pytest.raises(BackendError, match=r"cannot go on: .*no node will join"):
        three_stage().run(StreamingExecutor(backend), initial_tasks=range(20))
    assert backend.now() < 200  # a minute of waiting, as for a node that may come


def test_a_run_that_never_ends_with_nothing_left_to_do_is_a_stall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Everything went through but a defect keeps the stages from being seen done: the run
    stops with its state rather than wait forever."""
    monkeypatch.setattr(controller_module.Controller, "_update_done", lambda self: None)
    backend = VirtualBackend(cpus=3)
    with pytest.raises(controller_module.EngineStalled) as info:
        three_stage().run(StreamingExecutor(backend), initial_tasks=range(5))
    assert "nothing in flight and no worker starting" in str(info.value)
    assert "medium: 0 queued, 0 to run alone, 0 in flight" in str(info.value)


def test_work_sent_to_a_dead_worker_before_its_death_is_known_is_charged_to_no_one() -> None:
    # a worker killed while idle looks idle until its death is seen: what is sent to it then
    # never arrives, and even with one attempt its inputs must not fail
    backend = VirtualBackend(cpus=2, service_s={"slow": 0.1, "fast": 0.001})
    stages = [Pass("slow").with_(num_workers=1), Pass("fast").with_(num_workers=1)]
    run = Pipeline("p", stages).stream(
        StreamingExecutor(backend, max_attempts=1), initial_tasks=range(40)
    )
    seen = [next(run)]
    victim = next(w for w, r in backend.runners.items() if r.name == "fast")
    assert backend.busy_until[victim] <= backend.clock  # idle between two inputs
    backend.kill(victim, unseen_s=0.15)
    seen.extend(run)
    assert backend.undelivered[victim], "the test should send work to the dead worker"
    assert run.result.failures == []
    assert sorted(seen) == list(range(40))
    assert run.result.stats["fast"].worker_deaths == 1


class Threaded(ProcessingStage[Any, Any]):
    """A model stage that can use up to four threads; tells how many each task had."""

    resources = Resources(cpus=1)
    max_threads = 4

    def __init__(self, name: str) -> None:
        self.name = name

    def process(self, task: Any) -> Any:
        return (task, self.threads)


def _threads_run(
    tasks: int, cpus: float, elastic: bool = True
) -> tuple[RunResult, VirtualBackend, Snapshots]:
    backend = VirtualBackend(cpus=cpus, service_s={"feed": 0.01, "model": 1.0})
    monitor = Snapshots()
    executor = StreamingExecutor(backend, monitors=[monitor], elastic_threads=elastic)
    result = Pipeline("p", [Pass("feed"), Threaded("model")]).run(executor, range(tasks))
    return result, backend, monitor


def test_a_batch_sent_while_cores_idle_gets_them() -> None:
    result, backend, _ = _threads_run(1, cpus=3)
    # the feeder is done when the model's batch goes: both other cores are idle
    assert result.outputs == [(0, 3)]
    assert [t for _, name, t in backend.threads_sent if name == "model"] == [3]
    assert [t for _, name, t in backend.threads_sent if name == "feed"] == [None]  # can't use


def test_elastic_threads_can_be_turned_off() -> None:
    result, backend, _ = _threads_run(1, cpus=3, elastic=False)
    assert result.outputs == [(0, 1)]
    assert all(t is None for _, _, t in backend.threads_sent)


def test_cores_are_given_while_the_run_fills_and_drains_and_measured_as_one_thread() -> None:
    result, backend, monitor = _threads_run(40, cpus=3)
    assert sorted(task for task, _ in result.outputs) == list(range(40))
    fed = max(at for at, name, _ in backend.threads_sent if name == "feed")
    model = [(at, t) for at, name, t in backend.threads_sent if name == "model"]
    assert model[0][1] == 3  # the first batch had the machine to itself
    # in between, a core idle for a moment is soon another stage's: one thread each
    assert all(t is None for at, t in model[1:] if at <= fed)
    # once the feeder is done, the model stage's last batches may take what it left idle
    assert any(t for at, t in model if at > fed)
    # a boosted batch ran 3x quicker in the same CPU time: measured as one thread's time
    times = [s.task_time_s for t in monitor.ticks for s in t.stages if s.name == "model"]
    assert [x for x in times if x is not None] and all(
        x == pytest.approx(1.0, rel=0.05) for x in times if x is not None
    )


def _fill_run(first_output_first: bool) -> tuple[VirtualBackend, float, int | None, float]:
    """A quick feeder (its worker prefetches), a decoder on two workers, a model stage that
    can take every core, then a sink, on 2 CPUs: the backend, when the model's first batch
    was sent and with how many threads, and when the sink's first was."""
    service = {"feed": 0.04, "decode": 1.0, "model": 2.0, "sink": 0.01}
    backend = VirtualBackend(cpus=2, service_s=service)
    executor = StreamingExecutor(backend, first_output_first=first_output_first)
    stages = [Pass("feed"), Pass("decode").with_(num_workers=2), Threaded("model"), Pass("sink")]
    result = Pipeline("p", stages).run(executor, range(12))
    assert sorted(task for task, _ in result.outputs) == list(range(12))
    sends = backend.threads_sent
    first_model, _, threads = next(s for s in sends if s[1] == "model")
    first_sink = next(at for at, name, _ in sends if name == "sink")
    return backend, first_model, threads, first_sink


def _sent_between(
    backend: VirtualBackend, stages: set[str], start: float, end: float
) -> list[tuple[float, str]]:
    """Messages sent to workers of ``stages`` strictly between ``start`` and ``end``."""
    sends = backend.threads_sent
    return [(at, name) for at, name, _ in sends if name in stages and start < at < end]


def test_until_the_first_output_later_stages_get_the_cores_first() -> None:
    backend, first_model, threads, first_sink = _fill_run(first_output_first=True)
    # the model's first batch got both cores though a decoder's batch still ran (it ends
    # soon: the stages before the model get no new batch while it holds the cores) ...
    assert threads == 2
    sends = backend.threads_sent
    decoding = [at for at, name, _ in sends if name == "decode" and at < first_model]
    assert len(decoding) == 2 and decoding[-1] + 1.0 > first_model
    # ... neither the feeder, though its worker prefetches, nor the decoders
    assert not _sent_between(backend, {"feed", "decode"}, first_model, first_sink)
    # once the first output is through, every stage runs as sized again
    assert _sent_between(backend, {"feed"}, first_sink, math.inf)


def test_until_the_first_output_a_quick_hop_does_not_open_the_cores_to_upstream() -> None:
    # a decoder (1 CPU), a filter that takes a moment (a quarter of a CPU), a model that
    # can use both cores, then a sink: while the first item is in the filter, the cores it
    # is about to need in the model are not given to the decoder's next batch
    service = {"feed": 0.01, "decode": 1.0, "hop": 0.01, "model": 1.0, "sink": 0.01}
    backend = VirtualBackend(cpus=2, service_s=service)
    stages = [Pass("feed"), Pass("decode"), Pass("hop"), Threaded("model"), Pass("sink")]
    stages[2] = stages[2].with_(resources=Resources(cpus=0.25))
    result = Pipeline("p", stages).run(StreamingExecutor(backend), range(8))
    assert len(result.outputs) == 8
    sends = backend.threads_sent
    first_hop = next(at for at, name, _ in sends if name == "hop")
    first_sink = next(at for at, name, _ in sends if name == "sink")
    assert not _sent_between(backend, {"decode"}, first_hop - 1e-9, first_sink)
    assert next(t for at, name, t in sends if name == "model") == 2
    # the quick feeder is held back only by what is held, never by the way ahead
    assert _sent_between(backend, {"feed"}, 0.0, first_hop)


def test_without_first_output_first_upstream_stages_keep_taking_work() -> None:
    backend, first_model, threads, first_sink = _fill_run(first_output_first=False)
    assert threads is None  # a decoder's batch held the other core when it was sent
    assert _sent_between(backend, {"feed", "decode"}, first_model, first_sink)


def _trickle(batch_wait_s: float | None) -> list[tuple[str, list[int]]]:
    # one input every 0.1 s into a consumer of 8 that costs nothing
    backend = VirtualBackend(cpus=4, service_s={"feed": 0.1, "BatchSizes": 1e-6})
    pipeline = Pipeline("p", [Pass("feed").with_(num_workers=1), BatchSizes(batch_wait_s)])
    result = pipeline.run(StreamingExecutor(backend), initial_tasks=range(60))
    assert sum(result.outputs) == 60
    return [sizes for name, sizes in backend.submitted if name == "BatchSizes"]


def test_a_partial_batch_goes_once_its_oldest_task_waited_batch_wait_s() -> None:
    waited = [n for sizes in _trickle(0.35) for n in sizes]
    # the run's first output waits for nothing: the first input goes alone
    assert waited[0] == 1
    # then each batch holds what came within 0.35 s (an input every 0.1 s): 3 or 4, not 8
    assert all(3 <= n <= 4 for n in waited[1:-1]), waited
    # without a wait every batch is full but the last
    full = [n for sizes in _trickle(None) for n in sizes]
    assert full[:-1] == [8] * (len(full) - 1) and sum(full) == 60


def test_batch_wait_s_zero_sends_what_is_there() -> None:
    sizes = [n for s in _trickle(0.0) for n in s]
    assert sizes == [1] * 60


def test_batch_wait_s_is_validated_and_set_by_with_() -> None:
    stage = BatchSizes(None).with_(batch_wait_s=0.5)
    assert stage.batch_wait_s == 0.5
    assert Pipeline("p", [stage]).build()[0].batch_wait_s == 0.5
    assert "batch_size: 8 (or what came within 0.5 s)" in Pipeline("p", [stage]).describe()
    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(ValueError, match="batch_wait_s"):
            BatchSizes(None).with_(batch_wait_s=bad)


class Named(ProcessingStage[int, int]):
    def __init__(self, name: str) -> None:
        self.name = name

    def process(self, task: int) -> int:
        return task


def test_inputs_waiting_on_a_setup_that_does_not_return_are_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A setup that never returned hung the run without a word (its stall check waits while
    a worker starts, as a model may load for minutes)."""
    backend = VirtualBackend(cpus=2, service_s={"slow_setup": 0.01}, setup_s=200.0)
    with caplog.at_level("WARNING", logger="conveyor.engine.controller"):
        result = Pipeline("p", [Named("slow_setup")]).run(StreamingExecutor(backend), range(5))
    assert sorted(result.outputs) == list(range(5))
    said = [r.getMessage() for r in caplog.records if "setup() has not returned" in r.getMessage()]
    assert len(said) == 1
    assert (
        "5 input(s) of stage 'slow_setup' wait for a worker whose setup() has not returned"
        in (said[0])
    )
