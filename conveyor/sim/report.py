"""Run a scenario on the simulated backend and report what the controller did.

The report is built from two records that the run keeps anyway: the controller's snapshots
(heard as a monitor, every 0.25 s of virtual time: targets, live workers, queues) and the
backend's ``Usage`` (busy and ready worker-seconds per bucket, worker starts and stops, the
most each node ever held). Everything but ``wall_s``/``cpu_s`` is a deterministic function of
the scenario and the seed.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from conveyor.backends.simulated import SimulatedBackend, VirtualClock
from conveyor.engine.events import Monitor, RunSnapshot
from conveyor.engine.messages import BackendEvent, WorkerDied, WorkerPlacement, WorkerStopped
from conveyor.engine.spec import StageSpec
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.executors.base import Executor
from conveyor.resources import Resources
from conveyor.result import RunResult
from conveyor.sim.scenario import Scenario, ScenarioError, SourceSpec, batch_problem

__all__ = ["Recorder", "SimReport", "SimRun", "StageReport", "format_report", "simulate"]


class TrackingBackend(SimulatedBackend):
    """A ``SimulatedBackend`` that also keeps what each node holds, per device.

    It only listens to the public protocol (``start_worker`` and the stop/death events that
    ``poll`` returns), so it sees exactly what the controller placed. The report uses it to say
    *why* a GPU stage was short of its target: no GPU left, GPUs left but fragmented, or GPUs
    free on a node whose CPUs were taken. Nodes are counted by state (free CPUs, free share of
    each device), so a check costs little more on 250 identical nodes than on one.
    """

    #: what the run's records call the backend (this class is the simulator's own business)
    label = "SimulatedBackend"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._capacity = {n.node_id: n for n in self.sim_nodes}
        self.held_cpus: dict[str, float] = {n.node_id: 0.0 for n in self.sim_nodes}
        self.held_gpus: dict[str, list[float]] = {n.node_id: [0.0] * n.gpus for n in self.sim_nodes}
        self._placed: dict[str, tuple[float, WorkerPlacement]] = {}
        self._state: dict[str, tuple[Any, ...]] = {}
        self._states: dict[tuple[Any, ...], set[str]] = {}
        for node in self.sim_nodes:
            self._restate(node.node_id)

    def _restate(self, node_id: str) -> None:
        old = self._state.get(node_id)
        if old is not None:
            group = self._states[old]
            group.discard(node_id)
            if not group:
                del self._states[old]
        node = self._capacity[node_id]
        free = tuple(sorted([round(1.0 - used, 6) for used in self.held_gpus[node_id]]))
        state = (round(node.cpus - self.held_cpus[node_id], 6), free, node.gpu_memory_gb)
        self._state[node_id] = state
        self._states.setdefault(state, set()).add(node_id)

    def start_worker(self, worker_id: str, stage: StageSpec, placement: WorkerPlacement) -> None:
        super().start_worker(worker_id, stage, placement)
        self._placed[worker_id] = (stage.resources.cpus, placement)
        self._apply(stage.resources.cpus, placement, +1)

    def _apply(self, cpus: float, placement: WorkerPlacement, sign: int) -> None:
        self.held_cpus[placement.node_id] += sign * cpus
        devices = self.held_gpus[placement.node_id]
        for device in placement.gpu_ids:
            devices[device] += sign * placement.gpu_fraction
        self._restate(placement.node_id)

    def poll(self, timeout: float) -> list[BackendEvent]:
        events = super().poll(timeout)
        for event in events:
            if isinstance(event, (WorkerStopped, WorkerDied)):
                placed = self._placed.pop(event.worker_id, None)
                if placed is not None:
                    self._apply(placed[0], placed[1], -1)
        return events

    def why_short(self, resources: Resources, gpu_cpu_reserve: float = 0.0) -> str:
        """Why one more worker of this shape cannot be placed now ("fits" if it can).

        "full": no node has the GPUs (or, for a CPU-only shape, the CPUs); "fragmented": the
        free GPU share would suffice but not on one device or node; "cpus": a node has the
        GPUs but not the CPUs; "reserved": a CPU-only worker would fit only in the CPUs kept
        for GPU workers (``gpu_cpu_reserve`` per free GPU, as the controller keeps them).
        """
        reserved = False
        here = self.present_ids()
        total_free = 0.0
        gpu_fits = False
        for (free_cpus, free, memory), members in self._states.items():
            present = len(members & here)
            if not present:
                continue
            total_free += sum(free) * present
            if resources.gpus >= 1:
                ok = sum(1 for f in free if f >= 1.0 - 1e-9) >= resources.whole_gpus
            elif resources.requires_gpu:
                share = resources.gpus
                if resources.gpu_memory_gb:
                    if not memory or resources.gpu_memory_gb > memory:
                        continue
                    share = resources.gpu_memory_gb / memory
                ok = bool(free) and free[-1] + 1e-9 >= share
            else:
                ok = True
            if ok:
                gpu_fits = True
                if free_cpus + 1e-9 >= resources.cpus:
                    if resources.requires_gpu:
                        return "fits"
                    if free_cpus - gpu_cpu_reserve * sum(free) + 1e-9 >= resources.cpus:
                        return "fits"
                    reserved = True
        if reserved:
            return "reserved"
        if gpu_fits:
            return "cpus" if resources.requires_gpu else "full"
        need = float(resources.whole_gpus) if resources.gpus >= 1 else resources.gpus
        return "fragmented" if resources.requires_gpu and total_free + 1e-9 >= need else "full"


class Recorder:
    """A monitor that keeps every snapshot, and why a GPU stage was ever short of its target."""

    def __init__(
        self,
        backend: TrackingBackend | None = None,
        shapes: dict[str, Resources] | None = None,
    ) -> None:
        self.ticks: list[RunSnapshot] = []
        self.result: RunResult | None = None
        self.backend = backend
        self.shapes = shapes or {}
        nodes = backend.sim_nodes if backend is not None else []
        self._gpu_memory = next((n.gpu_memory_gb for n in nodes if n.gpu_memory_gb), None)
        #: stage -> reason -> ticks ("cpus", "fragmented", "full", "reserved", "fits")
        self.short: dict[str, dict[str, int]] = {}

    def on_start(self, pipeline: str, stages: list[str]) -> None:
        self.ticks.clear()
        self.short = {name: {} for name in stages}

    def _reserve(self, snapshot: RunSnapshot) -> float:
        """CPUs per GPU the controller keeps free (its ``_cpus_per_gpu``): for the GPU
        stages that are short of their target."""
        ratios = [0.0]
        for stage in snapshot.stages:
            shape = self.shapes.get(stage.name)
            live = stage.workers_ready + stage.workers_starting
            if shape is None or stage.done or live >= stage.target:
                continue
            share = float(shape.whole_gpus) if shape.gpus >= 1 else shape.gpus
            if shape.gpu_memory_gb and self._gpu_memory:
                share = shape.gpu_memory_gb / self._gpu_memory
            if share > 0:
                ratios.append(shape.cpus / share)
        return max(ratios)

    def on_tick(self, snapshot: RunSnapshot) -> None:
        self.ticks.append(snapshot)
        if self.backend is None:
            return
        reserve = self._reserve(snapshot)
        for stage in snapshot.stages:
            if stage.done or stage.target <= stage.workers_ready + stage.workers_starting:
                continue
            shape = self.shapes.get(stage.name)
            if shape is None:
                continue
            reason = self.backend.why_short(shape, reserve)
            counts = self.short.setdefault(stage.name, {})
            counts[reason] = counts.get(reason, 0) + 1

    def on_end(self, result: RunResult) -> None:
        self.result = result


@dataclass
class StageReport:
    """One stage over the run; rates and fractions refer to the steady window."""

    name: str
    resources: str
    gpu_share: float  # GPUs one worker holds (a fraction, or a whole count)
    pinned: int | None
    #: mean ready workers per bucket (``bucket_s``), from the backend's usage
    workers: list[float]
    #: busy worker-seconds over ready worker-seconds per bucket (``None``: no worker ready)
    busy: list[float | None]
    #: (virtual second, workers starting or ready) each time the count changed
    live: list[tuple[float, int]]
    #: (virtual second, target) each time the autoscaler's target changed
    targets: list[tuple[float, int]]
    busy_after_warmup: float | None
    throughput: float | None  # inputs completed per second
    mean_workers: float | None
    peak_workers: int
    starts: int
    stops: int
    starts_in_window: int
    stops_in_window: int
    tasks_in: int
    tasks_out: int
    filtered: int
    failed: int
    #: batches killed for running past the stage's timeout_s
    timeouts: int
    queue_hwm_tasks: int
    #: snapshots where the stage had queued work but not one worker starting or ready
    ticks_with_work_and_no_worker: int
    #: snapshots where the stage had fewer workers than its target, by the reason one more
    #: could not be placed: "full" (no GPU/CPU left), "fragmented" (enough GPU in total but
    #: not on one device/node), "cpus" (GPUs free on a node whose CPUs were taken),
    #: "reserved" (a CPU-only worker would fit only in CPUs kept for GPU workers), "fits"
    #: (it would fit now: placement is retried at the next decision or release)
    short_ticks: dict[str, int] = field(default_factory=dict)


@dataclass
class SimReport:
    """What a scenario run produced; ``to_dict()`` is the JSON the CLI writes."""

    scenario: str
    executor: str
    seed: int
    gpus: int
    cpus: float
    virtual_s: float
    wall_s: float
    cpu_s: float
    window: tuple[float, float]
    bucket_s: float
    inputs: int
    outputs: int
    failed: int
    #: source tasks completed per second by the first stage within the window
    source_tasks_per_s: float | None
    #: busy over ready GPU-seconds of every GPU stage in the window, weighted by GPU share
    gpu_busy_fraction: float | None
    #: snapshots in which at least one stage's target differed from the previous snapshot
    target_changes: int
    worker_starts: int
    worker_stops: int
    worker_deaths: int
    #: the most any node held at once, relative to its capacity (1.0 = full, > 1 over-commit)
    max_node_cpu_load: float
    max_node_gpu_load: float
    #: placements of multi-GPU workers: (stage, node, GPU ids)
    multi_gpu: list[tuple[str, str, tuple[int, ...]]]
    stages: list[StageReport]
    notes: list[str] = field(default_factory=list)

    def stage(self, name: str) -> StageReport:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def deterministic_dict(self) -> dict[str, Any]:
        """Everything but the host's timings: equal for equal scenario and seed."""
        data = self.to_dict()
        data.pop("wall_s")
        data.pop("cpu_s")
        return data


@dataclass
class SimRun:
    """A finished simulation: the report and the raw records behind it (for tests)."""

    report: SimReport
    backend: SimulatedBackend
    ticks: list[RunSnapshot]
    result: RunResult
    scenario: Scenario


def _source(spec: SourceSpec, clock: VirtualClock) -> Iterator[int]:
    """Source tasks, admitted lazily; a duration-bound source stops at that virtual second."""
    i = 0
    while (spec.tasks is None or i < spec.tasks) and (
        spec.duration_s is None or clock.now < spec.duration_s
    ):
        yield i
        i += 1


def _executor(
    kind: str,
    scenario: Scenario,
    backend: SimulatedBackend,
    rec: Recorder,
    monitors: Sequence[Monitor] = (),
) -> Executor:
    e = scenario.executor
    cls = {"streaming": StreamingExecutor, "batch": BatchExecutor}.get(kind)
    if cls is None:
        raise ValueError(f"executor must be streaming or batch, got {kind!r}")
    return cls(
        backend,
        max_attempts=e.max_attempts,
        autoscale=scenario.autoscale_config(),
        autoscale_interval_s=e.autoscale_interval_s,
        edge_max_tasks=e.edge_max_tasks,
        edge_max_bytes=e.edge_max_bytes,
        monitors=[rec, *monitors],
    )


def simulate(
    scenario: Scenario,
    executor: str | None = None,
    seed: int | None = None,
    diagnose: bool = True,
    monitors: Sequence[Monitor] = (),
) -> SimRun:
    """Run ``scenario`` on a fresh ``SimulatedBackend`` (executor and seed may be overridden).
    ``monitors`` watch the run too (an ``EventLog`` for a report, Prometheus metrics).

    ``diagnose`` tracks placements to say why a stage was short of its target; turn it off
    to time the controller and simulator alone.
    """
    kind = executor or scenario.executor.kind
    problem = batch_problem(scenario, kind)
    if problem:
        raise ScenarioError(f"scenario {scenario.name!r}: {problem}")
    seed = scenario.seed if seed is None else seed
    if diagnose:
        backend = scenario.backend(seed, backend_class=TrackingBackend)
        assert isinstance(backend, TrackingBackend)
        shapes = {s.name: s.resources.build() for s in scenario.stages}
        recorder = Recorder(backend, shapes)
    else:
        backend = scenario.backend(seed)
        recorder = Recorder()
    pipeline = scenario.pipeline()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    run = pipeline.stream(
        _executor(kind, scenario, backend, recorder, monitors),
        initial_tasks=_source(scenario.source, backend.clock),
    )
    outputs = 0
    stop_at = scenario.stop_at_s
    with run:
        for _ in run:
            outputs += 1
            if stop_at is not None and backend.clock.now >= stop_at:
                break
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    result = run.result
    report = _report(scenario, kind, seed, backend, recorder, result, outputs, wall, cpu)
    return SimRun(report, backend, recorder.ticks, result, scenario)


# -- building the report ------------------------------------------------------------------
def _changes(ticks: list[RunSnapshot], index: int, what: str) -> list[tuple[float, int]]:
    points: list[tuple[float, int]] = []
    for tick in ticks:
        s = tick.stages[index]
        value = s.target if what == "target" else s.workers_ready + s.workers_starting
        if not points or points[-1][1] != value:
            points.append((round(tick.elapsed_s, 3), value))
    return points


def _window_sum(table: dict[int, Any], lo: int, hi: float) -> float:
    return float(sum(v for k, v in table.items() if lo <= k < hi))


def _gpu_share(scenario: Scenario, index: int) -> float:
    res = scenario.stages[index].resources.build()
    if res.gpus >= 1:
        return float(res.whole_gpus)
    if res.gpu_memory_gb:
        memory = next((g.gpu_memory_gb for g in scenario.cluster if g.gpu_memory_gb), None)
        return res.gpu_fraction(memory) if memory else 0.0
    return res.gpus


def _report(
    scenario: Scenario,
    kind: str,
    seed: int,
    backend: SimulatedBackend,
    recorder: Recorder,
    result: RunResult,
    outputs: int,
    wall: float,
    cpu: float,
) -> SimReport:
    ticks = recorder.ticks
    usage = backend.usage
    end = backend.clock.now
    b = usage.bucket_s
    notes: list[str] = []
    start = min(scenario.report.warmup_s, end)
    stop = scenario.report.until_s
    if stop is None:
        first_done = next((t.elapsed_s for t in ticks if t.stages[0].done), None)
        stop = first_done if first_done is not None else end
        if scenario.source.duration_s is not None:
            stop = min(stop, scenario.source.duration_s)
    stop = min(stop, end)
    steady = stop - start
    if steady <= 0:
        notes.append(
            f"no steady window: warm-up {start:g} s, first stage done at {stop:g} s; "
            "rates and busy fractions are left out"
        )
    lo, hi = int(start // b), stop / b
    buckets = math.ceil(end / b)
    names = [s.name for s in scenario.stages]
    gpu_busy = gpu_alive = 0.0
    stage_reports = []
    for i, name in enumerate(names):
        stats = result.stats.get(name)
        share = _gpu_share(scenario, i)
        busy_t, alive_t, done_t = usage.busy_s[name], usage.alive_s[name], usage.done[name]
        busy_series: list[float | None] = []
        for k in range(buckets):
            alive = alive_t.get(k, 0.0)
            busy_series.append(round(busy_t.get(k, 0.0) / alive, 4) if alive > 1e-9 else None)
        busy_w = _window_sum(busy_t, lo, hi) if steady > 0 else 0.0
        alive_w = _window_sum(alive_t, lo, hi) if steady > 0 else 0.0
        gpu_busy += busy_w * share
        gpu_alive += alive_w * share
        starts = [t for t, stage, _ in usage.starts if stage == name]
        stops = [t for t, stage, _ in usage.stops if stage == name]
        idle_with_work = sum(
            1
            for t in ticks
            if t.stages[i].queued
            and not t.stages[i].done
            and t.stages[i].workers_ready + t.stages[i].workers_starting == 0
        )
        stage_reports.append(
            StageReport(
                name=name,
                resources=scenario.stages[i].resources.build().describe(),
                gpu_share=share,
                pinned=scenario.stages[i].num_workers,
                workers=[round(w, 4) for w in usage.workers(name, end)],
                busy=busy_series,
                live=_changes(ticks, i, "live"),
                targets=_changes(ticks, i, "target"),
                busy_after_warmup=busy_w / alive_w if alive_w > 0 else None,
                throughput=_window_sum(done_t, lo, hi) / steady if steady > 0 else None,
                mean_workers=alive_w / steady if steady > 0 else None,
                peak_workers=stats.peak_workers if stats else 0,
                starts=len(starts),
                stops=len(stops),
                starts_in_window=sum(1 for t in starts if start <= t < stop),
                stops_in_window=sum(1 for t in stops if start <= t < stop),
                tasks_in=stats.tasks_in if stats else 0,
                tasks_out=stats.tasks_out if stats else 0,
                filtered=stats.filtered if stats else 0,
                failed=stats.failed if stats else 0,
                timeouts=stats.timeouts if stats else 0,
                queue_hwm_tasks=stats.queue_hwm_tasks if stats else 0,
                ticks_with_work_and_no_worker=idle_with_work,
                short_ticks=dict(sorted(recorder.short.get(name, {}).items())),
            )
        )
    capacity = {n.node_id: n for n in backend.sim_nodes}
    cpu_load = max(
        (v / capacity[node].cpus for node, v in usage.peak_cpus.items() if capacity[node].cpus),
        default=0.0,
    )
    gpu_load = max(
        (
            v / capacity[node].gpus
            for node, v in usage.peak_gpu_share.items()
            if capacity[node].gpus
        ),
        default=0.0,
    )
    targets = [tuple(s.target for s in t.stages) for t in ticks]
    changes = sum(1 for a, c in itertools.pairwise(targets) if a != c)
    first = stage_reports[0]
    return SimReport(
        scenario=scenario.name,
        executor=kind,
        seed=seed,
        gpus=scenario.total_gpus,
        cpus=scenario.total_cpus,
        virtual_s=round(end, 6),
        wall_s=round(wall, 4),
        cpu_s=round(cpu, 4),
        window=(round(start, 6), round(max(stop, start), 6)),
        bucket_s=b,
        inputs=result.counts.get("inputs", 0),
        outputs=outputs,
        failed=result.counts.get("failed", 0),
        source_tasks_per_s=first.throughput,
        gpu_busy_fraction=gpu_busy / gpu_alive if gpu_alive > 0 else None,
        target_changes=changes,
        worker_starts=len(usage.starts),
        worker_stops=len(usage.stops),
        worker_deaths=len(usage.deaths),
        max_node_cpu_load=round(cpu_load, 6),
        max_node_gpu_load=round(gpu_load, 6),
        multi_gpu=list(usage.multi_gpu),
        stages=stage_reports,
        notes=notes,
    )


# -- text ---------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def _at(points: list[tuple[float, int]], when: float) -> int:
    value = 0
    for t, v in points:
        if t > when:
            break
        value = v
    return value


def format_report(report: SimReport, samples: int = 8) -> str:
    """A plain-text table: per stage, workers at a few instants, busy fraction, tasks/s."""
    end = report.virtual_s
    times = [end * k / (samples - 1) for k in range(samples)] if end > 0 else [0.0]
    lo, hi = report.window
    head = (
        f"scenario {report.scenario} · {report.executor} · seed {report.seed} · "
        f"{report.gpus} GPUs, {report.cpus:g} CPUs"
    )
    lines = [head, f"steady window {lo:g}-{hi:g} s (after warm-up, before the drain)", ""]
    name_w = max(5, *(len(s.name) for s in report.stages))
    labels = [s.resources + (" (pinned)" if s.pinned else "") for s in report.stages]
    res_w = max(9, *(len(label) for label in labels))
    col = max(5, *(len(f"{t:.0f}") + 1 for t in times))
    lines.append(f"{'':<{name_w}}  {'':<{res_w}}  {'workers at t = ... s':^{col * len(times)}}")
    lines.append(
        f"{'stage':<{name_w}}  {'resources':<{res_w}}  "
        + "".join(f"{t:>{col}.0f}" for t in times)
        + f"  {'busy':>6}  {'tasks/s':>8}  {'peak':>4}  {'adds':>5}  {'drops':>5}"
    )
    for s, label in zip(report.stages, labels, strict=True):
        lines.append(
            f"{s.name:<{name_w}}  {label:<{res_w}}  "
            + "".join(f"{_at(s.live, t):>{col}}" for t in times)
            + f"  {_pct(s.busy_after_warmup):>6}  {_rate(s.throughput):>8}"
            + f"  {s.peak_workers:>4}  {s.starts:>5}  {s.stops:>5}"
        )
    lines.append("")
    timeouts = sum(s.timeouts for s in report.stages)
    lines.append(
        f"virtual {report.virtual_s:,.1f} s in {report.wall_s:.2f} s wall "
        f"({report.cpu_s:.2f} s CPU) · inputs {report.inputs:,} · outputs {report.outputs:,} · "
        f"failed {report.failed:,}" + (f" · timeouts {timeouts:,}" if timeouts else "")
    )
    lines.append(
        f"source tasks/s in window {_rate(report.source_tasks_per_s)} · GPU busy (share-weighted) "
        f"{_pct(report.gpu_busy_fraction)} · target changes {report.target_changes} · "
        f"worker starts/stops {report.worker_starts}/{report.worker_stops}"
    )
    lines.append(
        f"most held on one node: {100 * report.max_node_cpu_load:.0f}% of its CPUs, "
        f"{100 * report.max_node_gpu_load:.0f}% of its GPUs"
    )
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)
