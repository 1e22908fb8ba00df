"""A simulated cluster on a virtual clock: the real controller and policies, modelled workers.

Nothing in ``engine/`` knows it is simulated: this backend implements the same protocol as the
local one, but workers are entries in an event queue whose batches take a time drawn from a
service-time model, and ``poll`` advances a virtual clock to the next event. One hour of a
2,000-GPU pipeline runs in seconds, deterministically for a seed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import zlib
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from conveyor.cluster import NodeInfo
from conveyor.engine.messages import (
    BackendEvent,
    BatchesDone,
    BatchFailed,
    BatchOutcome,
    BatchOutputs,
    ErrorInfo,
    Handle,
    WorkerDied,
    WorkerPlacement,
    WorkerReady,
    WorkerStopped,
)
from conveyor.engine.spec import StageSpec
from conveyor.errors import BackendError

#: events closer than this (virtual seconds) are delivered together, like a real poll would
COALESCE_S = 1e-3


class VirtualClock:
    """Seconds of simulated time; only the simulated backend moves it forward."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def advance_to(self, when: float) -> None:
        self.now = max(self.now, when)


@dataclass(frozen=True)
class Distribution:
    """A service-time model: a constant, or a seeded distribution with that mean.

    ``spread`` is the relative half-width for ``uniform`` and the sigma of the underlying
    normal for ``lognormal`` (both keep ``mean`` as the mean); ``exponential`` needs none.
    """

    mean: float
    kind: Literal["constant", "uniform", "exponential", "lognormal"] = "constant"
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.mean < 0:
            raise ValueError(f"Distribution.mean must be >= 0, got {self.mean}")
        if self.kind not in ("constant", "uniform", "exponential", "lognormal"):
            raise ValueError(
                f"Distribution.kind {self.kind!r} is not one of "
                "constant, uniform, exponential, lognormal"
            )
        if self.spread < 0 or (self.kind == "uniform" and self.spread > 1):
            raise ValueError(f"Distribution.spread out of range for {self.kind}: {self.spread}")

    def sample(self, rng: random.Random) -> float:
        if self.kind == "constant" or self.mean == 0:
            return self.mean
        if self.kind == "uniform":
            return self.mean * (1 + self.spread * (2 * rng.random() - 1))
        if self.kind == "exponential":
            return rng.expovariate(1 / self.mean)
        sigma = self.spread
        return rng.lognormvariate(math.log(self.mean) - sigma * sigma / 2, sigma)


@dataclass(frozen=True)
class StageModel:
    """How a simulated stage behaves.

    ``service`` is the time per task (per batch when ``per_batch``); ``phases`` replaces it
    from a given virtual time on (a source that slows down, a burst). ``output_ratio`` is the
    mean number of outputs per input (0.3 filters most, 20 fans out). ``failure_rate`` is the
    chance that one task raises; ``hang_rate`` the chance that one task never returns (its
    batch holds the worker until the stage's ``timeout_s`` has it killed).
    """

    service: Distribution
    setup_s: float = 0.0
    output_ratio: float = 1.0
    failure_rate: float = 0.0
    hang_rate: float = 0.0
    output_bytes: int = 1024
    per_batch: bool = False
    phases: tuple[tuple[float, Distribution], ...] = ()
    #: peak host memory a worker reports, in bytes (0: it reports none)
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        for label, value in (
            ("setup_s", self.setup_s),
            ("output_ratio", self.output_ratio),
            ("output_bytes", self.output_bytes),
            ("memory_bytes", self.memory_bytes),
        ):
            if value < 0:
                raise ValueError(f"StageModel.{label} must be >= 0, got {value}")
        for label, rate in (("failure_rate", self.failure_rate), ("hang_rate", self.hang_rate)):
            if not 0 <= rate <= 1:
                raise ValueError(f"StageModel.{label} must be in [0, 1], got {rate}")

    def service_at(self, now: float) -> Distribution:
        current = self.service
        for start, dist in self.phases:
            if now >= start:
                current = dist
        return current


@dataclass(frozen=True)
class SimNode:
    """A node of the simulated cluster, present from ``joins_at`` until ``leaves_at``."""

    node_id: str
    cpus: float
    gpus: int = 0
    gpu_memory_gb: float | None = None
    joins_at: float = 0.0
    leaves_at: float | None = None
    memory_gb: float | None = None  # host memory for workers (None: not a limit)
    #: NVDEC and NVENC units of each GPU (None: not a limit)
    nvdecs_per_gpu: float | None = None
    nvencs_per_gpu: float | None = None

    def present(self, now: float) -> bool:
        return self.joins_at <= now and (self.leaves_at is None or now < self.leaves_at)


@dataclass(eq=False)
class _SimWorker:
    worker_id: str
    stage: str
    model: StageModel
    batch_size: int
    node_id: str
    placement: WorkerPlacement
    cpus: float
    ready_at: float
    busy_until: float
    stopping: bool = False
    hung_since: float | None = None  # a task of its current batch never returns
    #: a generator stage's worker: its batches one at a time, outputs spread over each
    streams: bool = False
    waiting: deque[tuple[int, list[Handle], int | None]] = field(default_factory=deque)
    stream: _Stream | None = None


@dataclass(eq=False)
class _Stream:
    """A generator batch being run: output ``made`` comes ``step_s`` after the one before,
    unless it has made ``allowed`` (then it waits for ``resume``); it fails instead of
    making output ``fail_at``."""

    batch_id: int
    inputs: int
    outputs: list[Handle]
    filtered: int
    cost: float
    cpu: float
    step_s: float
    allowed: float
    fail_at: int | None
    made: int = 0
    paused: bool = False


@dataclass(frozen=True, slots=True)
class _Step:
    """The backend's own event: the worker's running generator batch moves one output on."""

    worker_id: str
    batch_id: int


@dataclass
class Usage:
    """What the simulation observed, in buckets of ``bucket_s`` virtual seconds."""

    bucket_s: float
    busy_s: dict[str, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    alive_s: dict[str, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    done: dict[str, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    starts: list[tuple[float, str, str]] = field(default_factory=list)  # time, stage, worker
    stops: list[tuple[float, str, str]] = field(default_factory=list)
    deaths: list[tuple[float, str, str]] = field(default_factory=list)
    #: most of each node's CPUs and GPU share ever held at once (over-commit checks)
    peak_cpus: dict[str, float] = field(default_factory=dict)
    peak_gpu_share: dict[str, float] = field(default_factory=dict)
    #: placements of workers that asked for more than one GPU: (stage, node, gpu ids)
    multi_gpu: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)

    def _spread(self, table: dict[int, float], start: float, end: float) -> None:
        """Add ``[start, end)`` to the buckets it covers (once per batch: kept lean)."""
        b = self.bucket_s
        if not start < end - 1e-12:
            return
        index = int(start // b)
        get = table.get
        while True:
            edge = (index + 1) * b
            if edge >= end:
                table[index] = get(index, 0.0) + (end - start)
                return
            table[index] = get(index, 0.0) + (edge - start)
            start = edge
            if not start < end - 1e-12:
                return
            index += 1  # ``edge // b``: the bucket that starts at it

    def add_busy(self, stage: str, start: float, end: float) -> None:
        self._spread(self.busy_s[stage], start, end)

    def add_alive(self, stage: str, start: float, end: float) -> None:
        self._spread(self.alive_s[stage], start, end)

    def add_done(self, stage: str, when: float, tasks: int) -> None:
        table = self.done[stage]
        index = int(when // self.bucket_s)
        table[index] = table.get(index, 0) + tasks

    def busy_fraction(self, stage: str, start: float = 0.0, end: float = math.inf) -> float:
        """Busy worker-seconds over ready worker-seconds of a stage within [start, end)."""
        lo, hi = int(start // self.bucket_s), end / self.bucket_s
        busy = sum(v for k, v in self.busy_s[stage].items() if lo <= k < hi)
        alive = sum(v for k, v in self.alive_s[stage].items() if lo <= k < hi)
        return busy / alive if alive else 0.0

    def workers(self, stage: str, end: float) -> list[float]:
        """Mean ready workers of a stage in each bucket up to ``end``."""
        table = self.alive_s[stage]
        return [table.get(i, 0.0) / self.bucket_s for i in range(math.ceil(end / self.bucket_s))]


class SimulatedBackend:
    """A cluster of ``nodes`` whose workers follow ``models`` (by stage name) in virtual time.

    Stages without a model raise ``BackendError`` when their first worker starts. The same
    executors and controller run on it unchanged.
    """

    def __init__(
        self,
        nodes: Sequence[SimNode],
        models: Mapping[str, StageModel],
        clock: VirtualClock | None = None,
        seed: int = 0,
        memory_budget_bytes: int = 1 << 34,
        bucket_s: float = 1.0,
    ) -> None:
        if not nodes:
            raise ValueError("SimulatedBackend needs at least one node")
        ids = [n.node_id for n in nodes]
        if len(set(ids)) != len(ids):
            raise ValueError("SimulatedBackend: node ids must be unique")
        self.sim_nodes = list(nodes)
        self.models = dict(models)
        self.clock = clock or VirtualClock()
        self.seed = seed
        self.memory_budget_bytes = memory_budget_bytes
        self.usage = Usage(bucket_s)
        self._rng = random.Random(seed)
        self._seq = itertools.count()
        self._tokens = itertools.count()
        self._events: list[tuple[float, int, Any]] = []
        self._workers: dict[str, _SimWorker] = {}
        self._node_cpus: dict[str, float] = defaultdict(float)
        self._node_capacity = {n.node_id: n.cpus for n in nodes}
        self._on_node: dict[str, set[_SimWorker]] = defaultdict(set)
        self._node_gpus: dict[str, float] = defaultdict(float)
        self._gone_nodes: set[str] = set()
        self._lifecycle = sorted(
            [(n.leaves_at, n.node_id) for n in nodes if n.leaves_at is not None]
        )
        # ``nodes()`` is the same list between the times a node joins or leaves
        self._changes = sorted(
            {n.joins_at for n in nodes} | {n.leaves_at for n in nodes if n.leaves_at is not None}
        )
        self._joins = sorted({n.joins_at for n in nodes})
        self._view: list[NodeInfo] = []
        self._view_ids: frozenset[str] = frozenset()
        self._view_from = self._view_until = math.nan

    # -- cluster --------------------------------------------------------------------------
    def open(self) -> None:
        pass

    def now(self) -> float:
        return self.clock.now

    def nodes_may_join(self) -> bool:
        """Whether a node joins later (``Backend``): the scenario says when each does."""
        return any(joins > self.clock.now for joins in self._joins)

    def nodes(self) -> list[NodeInfo]:
        """The nodes present now; the list is built again only when a node joins or leaves
        (asked at every autoscale decision, of hundreds of nodes)."""
        self._look()
        return list(self._view)

    def present_ids(self) -> frozenset[str]:
        """Ids of the nodes present now."""
        self._look()
        return self._view_ids

    def _look(self) -> None:
        now = self.clock.now
        if not self._view_from <= now < self._view_until:
            self._view = self._present(now)
            self._view_ids = frozenset(n.node_id for n in self._view)
            self._view_from = max((t for t in self._changes if t <= now), default=-math.inf)
            self._view_until = min((t for t in self._changes if t > now), default=math.inf)

    def _present(self, now: float) -> list[NodeInfo]:
        return [
            NodeInfo(
                n.node_id,
                n.cpus,
                n.gpus,
                n.gpu_memory_gb,
                address=f"sim:{n.node_id}",
                memory_bytes=None if n.memory_gb is None else int(n.memory_gb * 2**30),
                nvdecs_per_gpu=n.nvdecs_per_gpu,
                nvencs_per_gpu=n.nvencs_per_gpu,
            )
            for n in self.sim_nodes
            if n.present(now)
        ]

    # -- payloads are tokens --------------------------------------------------------------
    def put(self, obj: Any, label: str) -> Handle:
        return Handle(next(self._tokens), 64, label)

    def get(self, handle: Handle) -> Any:
        return handle.label

    def free(self, handles: Sequence[Handle]) -> None:
        pass

    # -- workers --------------------------------------------------------------------------
    def _push(self, when: float, event: Any) -> None:
        heapq.heappush(self._events, (when, next(self._seq), event))

    def start_worker(self, worker_id: str, stage: StageSpec, placement: WorkerPlacement) -> None:
        model = self.models.get(stage.name)
        if model is None:
            raise BackendError(
                f"SimulatedBackend has no model for stage {stage.name!r} "
                f"(models: {', '.join(sorted(self.models)) or 'none'})"
            )
        now = self.clock.now
        ready_at = now + model.setup_s
        worker = _SimWorker(
            worker_id,
            stage.name,
            model,
            stage.batch_size,
            placement.node_id,
            placement,
            stage.resources.cpus,
            ready_at,
            ready_at,
            streams=stage.streams,
        )
        self._workers[worker_id] = worker
        self._on_node[worker.node_id].add(worker)
        self._hold(worker, +1)
        self.usage.starts.append((now, stage.name, worker_id))
        if len(placement.gpu_ids) > 1:
            self.usage.multi_gpu.append((stage.name, placement.node_id, placement.gpu_ids))
        if placement.node_id in self._gone_nodes:
            # placed from a view older than the node's departure: it dies at once, as on Ray
            reason = f"node {placement.node_id} was lost"
            self._push(now, WorkerDied(worker_id, reason))
            return
        self._push(ready_at, WorkerReady(worker_id, model.setup_s, model.memory_bytes))

    def _hold(self, worker: _SimWorker, sign: int) -> None:
        node = worker.node_id
        share = worker.placement.gpu_fraction * len(worker.placement.gpu_ids)
        self._node_cpus[node] += sign * worker.cpus
        self._node_gpus[node] += sign * share
        if sign > 0:
            usage = self.usage
            usage.peak_cpus[node] = max(usage.peak_cpus.get(node, 0.0), self._node_cpus[node])
            usage.peak_gpu_share[node] = max(
                usage.peak_gpu_share.get(node, 0.0), self._node_gpus[node]
            )

    def stop_worker(self, worker_id: str) -> None:
        worker = self._workers.get(worker_id)
        if worker is None or worker.stopping:
            return
        worker.stopping = True
        if worker.streams and (worker.stream is not None or worker.waiting):
            return  # stops once its batches end (``_next_stream``)
        when = max(self.clock.now, worker.busy_until)
        self._push(when, WorkerStopped(worker_id))

    def submit(
        self,
        worker_id: str,
        batches: list[tuple[int, list[Handle]]],
        threads: int | None = None,
        allowance: int | None = None,
    ) -> None:
        # ``threads`` is not modelled: a simulated stage's service time is what its
        # scenario measured, and scenarios declare no ``max_threads``
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        if worker.streams:
            worker.waiting.extend((b, h, allowance) for b, h in batches)
            if worker.stream is None and worker.hung_since is None:
                self._next_stream(worker, max(self.clock.now, worker.ready_at))
            return
        model = worker.model
        rng = self._rng
        begin = max(self.clock.now, worker.busy_until)
        slowdown = self._contention(worker, begin)
        outcomes: list[BatchOutcome] = []
        for batch_id, handles in batches:
            dist = model.service_at(begin)
            n = len(handles)
            if model.hang_rate and any(rng.random() < model.hang_rate for _ in range(n)):
                if outcomes:  # those before it did end
                    self._push(begin, BatchesDone(worker_id, outcomes))
                    outcomes = []
                worker.hung_since = begin  # this batch and those behind it never end
                begin = math.inf
                break
            cost = dist.sample(rng) if model.per_batch else sum(dist.sample(rng) for _ in range(n))
            cpu = cost * worker.cpus  # the work itself: a worker uses its CPUs while it works
            cost *= slowdown
            end = begin + cost
            self.usage.add_busy(worker.stage, begin, end)
            begin = end
            if model.failure_rate and any(rng.random() < model.failure_rate for _ in range(n)):
                if outcomes:
                    self._push(end, BatchesDone(worker_id, outcomes))
                    outcomes = []
                error = ErrorInfo("SimulatedFailure", f"a task of {worker.stage} failed")
                self._push(end, BatchFailed(worker_id, batch_id, error))
                continue
            outputs, filtered = self._outputs(worker, handles)
            self.usage.add_done(worker.stage, end, n)
            outcomes.append(
                BatchOutcome(batch_id, outputs, filtered, cost, cpu, worker.model.memory_bytes)
            )
        worker.busy_until = begin
        if outcomes:
            self._push(begin, BatchesDone(worker_id, outcomes))

    # -- generator stages ------------------------------------------------------------------
    def _next_stream(self, worker: _SimWorker, begin: float) -> None:
        """Start the worker's next generator batch at ``begin``: its outputs (deterministic
        per input, so a retry makes the same ones) come evenly over its service time."""
        worker.stream = None
        if not worker.waiting:
            worker.busy_until = begin
            if worker.stopping:
                self._push(begin, WorkerStopped(worker.worker_id))
            return
        batch_id, handles, allowance = worker.waiting.popleft()
        model, rng = worker.model, self._rng
        n = len(handles)
        if model.hang_rate and any(rng.random() < model.hang_rate for _ in range(n)):
            worker.hung_since = begin  # this batch never ends, nor those behind it
            worker.busy_until = math.inf
            return
        dist = model.service_at(begin)
        cost = dist.sample(rng) if model.per_batch else sum(dist.sample(rng) for _ in range(n))
        cpu = cost * worker.cpus
        cost *= self._contention(worker, begin)
        outputs, filtered = self._outputs(worker, handles, streams=True)
        fail_at = None
        if model.failure_rate and any(rng.random() < model.failure_rate for _ in range(n)):
            fail_at = rng.randrange(max(1, len(outputs)))  # fails part way
        step = cost / max(1, len(outputs))
        allowed = math.inf if allowance is None else allowance
        worker.stream = _Stream(batch_id, n, outputs, filtered, cost, cpu, step, allowed, fail_at)
        worker.busy_until = math.inf  # until it ends (a paused batch holds its worker)
        self._push(begin + step, _Step(worker.worker_id, batch_id))

    def _step(self, worker: _SimWorker, step: _Step) -> None:
        stream = worker.stream
        if stream is None or stream.batch_id != step.batch_id:
            return
        now = self.clock.now
        self.usage.add_busy(worker.stage, now - stream.step_s, now)
        if stream.fail_at is not None and stream.made == stream.fail_at:
            error = ErrorInfo("SimulatedFailure", f"a task of {worker.stage} failed part way")
            self._push(now, BatchFailed(worker.worker_id, stream.batch_id, error))
            self._next_stream(worker, now)
            return
        if stream.made < len(stream.outputs):
            output = stream.outputs[stream.made]
            stream.made += 1
            self._push(now, BatchOutputs(worker.worker_id, stream.batch_id, [output]))
        if stream.made >= len(stream.outputs):
            self.usage.add_done(worker.stage, now, stream.inputs)
            outcome = BatchOutcome(
                stream.batch_id, [], stream.filtered, stream.cost, stream.cpu,
                worker.model.memory_bytes,
            )  # fmt: skip
            self._push(now, BatchesDone(worker.worker_id, [outcome]))
            self._next_stream(worker, now)
        elif stream.made >= stream.allowed:
            stream.paused = True  # at its ``yield``, until resumed
        else:
            self._push(now + stream.step_s, step)

    def resume(self, worker_id: str, batch_id: int, outputs: int) -> None:
        worker = self._workers.get(worker_id)
        stream = worker.stream if worker is not None else None
        if stream is None or stream.batch_id != batch_id:
            return  # it ended meanwhile
        stream.allowed += outputs
        if stream.paused and stream.made < stream.allowed:
            stream.paused = False
            self._push(self.clock.now + stream.step_s, _Step(worker_id, batch_id))

    def kill_worker(self, worker_id: str) -> None:
        """The controller gave up on a batch (``timeout_s``): the worker dies now."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        now = self.clock.now
        if worker.hung_since is not None and now > worker.hung_since:
            self.usage.add_busy(worker.stage, worker.hung_since, now)
        self._die(worker, now)

    def _contention(self, worker: _SimWorker, begin: float) -> float:
        """How much slower work runs when the node's busy workers want more CPUs than it
        has (they share them by time): busy CPUs wanted over the node's CPUs, at least 1.
        Judged when a message starts; later arrivals do not slow it (a first-order model)."""
        capacity = self._node_capacity.get(worker.node_id, 0.0)
        if capacity <= 0 or worker.cpus <= 0:
            return 1.0
        if self._node_cpus[worker.node_id] < capacity * (1 - 1e-9):
            return 1.0  # all of the node's workers busy at once would not fill it
        wanted = worker.cpus + sum(
            [
                other.cpus
                for other in self._on_node[worker.node_id]
                if other.busy_until > begin and other is not worker
            ]
        )
        return max(1.0, wanted / capacity)

    def _outputs(
        self, worker: _SimWorker, handles: list[Handle], streams: bool = False
    ) -> tuple[list[Handle], int]:
        """Each input's outputs (``output_ratio`` of them on average). A generator's are
        ``label.j`` always, and as many on every attempt at an input (drawn from the input,
        not from the run's random sequence)."""
        ratio = worker.model.output_ratio
        whole, frac = int(ratio), ratio - int(ratio)
        size = worker.model.output_bytes
        outputs: list[Handle] = []
        filtered = 0
        for handle in handles:
            if streams:
                draw = zlib.crc32(f"{self.seed}/{worker.stage}/{handle.label}".encode())
                k = whole + (1 if frac and draw / 2**32 < frac else 0)
            else:
                k = whole + (1 if frac and self._rng.random() < frac else 0)
            if k == 0:
                filtered += 1
            elif k == 1 and not streams:
                outputs.append(Handle(next(self._tokens), size, handle.label, worker.node_id))
            else:
                outputs.extend(
                    Handle(next(self._tokens), size, f"{handle.label}.{j}", worker.node_id)
                    for j in range(k)
                )
        return outputs, filtered

    # -- time -----------------------------------------------------------------------------
    def _remove(self, worker: _SimWorker, when: float) -> None:
        del self._workers[worker.worker_id]
        self._on_node[worker.node_id].discard(worker)
        self._hold(worker, -1)
        start = max(worker.ready_at, 0.0)
        if when > start:
            self.usage.add_alive(worker.stage, start, when)

    def _die(self, worker: _SimWorker, when: float) -> None:
        self._remove(worker, when)
        self.usage.deaths.append((when, worker.stage, worker.worker_id))

    def _lose_nodes(self, until: float) -> list[BackendEvent]:
        events: list[BackendEvent] = []
        while self._lifecycle and self._lifecycle[0][0] <= until:
            when, node_id = self._lifecycle.pop(0)
            self.clock.advance_to(when)
            self._gone_nodes.add(node_id)
            for worker in [w for w in self._workers.values() if w.node_id == node_id]:
                self._die(worker, when)
                events.append(WorkerDied(worker.worker_id, f"node {node_id} was lost"))
        return events

    def poll(self, timeout: float) -> list[BackendEvent]:
        deadline = self.clock.now + max(timeout, 0.0)
        next_event = self._events[0][0] if self._events else math.inf
        lost = self._lose_nodes(min(deadline, next_event))
        if lost:
            return lost
        if next_event > deadline:
            self.clock.advance_to(deadline)
            return []
        self.clock.advance_to(next_event)
        horizon = next_event + COALESCE_S
        events: list[BackendEvent] = []
        while self._events and self._events[0][0] <= horizon:
            _, _, event = heapq.heappop(self._events)
            worker = self._workers.get(event.worker_id)
            if worker is None:
                continue  # its worker died with its node: the death was reported instead
            if isinstance(event, _Step):
                self._step(worker, event)
                continue
            if isinstance(event, WorkerStopped):
                self._remove(worker, self.clock.now)
                self.usage.stops.append((self.clock.now, worker.stage, worker.worker_id))
            elif isinstance(event, WorkerDied):
                self._die(worker, self.clock.now)
            events.append(event)
        return events

    def shutdown(self) -> None:
        now = self.clock.now
        for worker in list(self._workers.values()):
            self._remove(worker, now)
        self._events.clear()
