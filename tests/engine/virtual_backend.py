"""A deterministic in-process backend on a virtual clock, for testing the controller's logic.

Stage code really runs (in this process); only time is virtual: each batch takes
``service_s[stage] * len(batch)`` virtual seconds, each worker ``setup_s`` to start. A
message can also cost its worker ``call_overhead_s[stage]`` that the reported busy time does
not show, and take ``latency_s`` to reach the worker and again for its results to come back
(as actor calls on Ray do).

``hangs(task)`` true makes a batch holding that task never end (a hung call).
``lose`` names outputs (stage, label) whose stored payload vanishes once, as if their node
had left: a worker that reads one fails the batch with ``ErrorInfo.lost``. Set
``payloads_can_be_lost`` to say so to the controller, as ``RayBackend`` does.

A generator stage (``StageSpec.streams``) really pauses: its generator is advanced one output
per ``service_s[stage]`` virtual seconds, and not at all while it has made what it was
allowed (``submit``'s ``allowance``, then ``resume``), as a local worker does.
``resumes`` records every ``resume`` (virtual time, batch id, outputs).

``node_cpus`` makes a cluster of several nodes (outputs then name the node that stored
them), and ``node_fails`` lets one die the way Ray sees it: ``{node: (fails_at, seen_at)}``,
every payload stored there is lost when read from ``fails_at`` on, while its workers still
look alive and take work; at ``seen_at`` the node leaves the node list and its workers are
reported dead.
"""

from __future__ import annotations

import heapq
import itertools
import math
import pickle
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.backends.runtime import StageRunner
from conveyor.cluster import NodeInfo, WorkerInfo
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


class _Lost:
    """The ref of a payload that vanished."""


class _PayloadLost(Exception):
    pass


@dataclass(eq=False)
class _Running:
    """A generator batch in a worker: paused whenever ``made`` reaches ``allowed``."""

    batch_id: int
    outputs: Iterator[tuple[Any, str]]
    allowed: float
    began: float
    made: int = 0
    paused: bool = False


class VirtualBackend:
    payloads_can_be_lost = False

    def __init__(
        self,
        cpus: float = 4,
        gpus: int = 0,
        service_s: dict[str, float | Callable[[float], float]] | None = None,
        setup_s: float = 0.1,
        memory_budget_bytes: int = 1 << 30,
        call_overhead_s: dict[str, float] | None = None,
        latency_s: float = 0.0,
        lose: set[tuple[str, str]] | None = None,
        hangs: Callable[[Any], bool] | None = None,
        node_cpus: dict[str, float] | None = None,
        node_fails: dict[str, tuple[float, float]] | None = None,
        queued_s: dict[str, float] | None = None,
        queued_reported: bool = True,
    ) -> None:
        self.node_cpus = node_cpus
        #: per stage, seconds each task waits for a core on top of its service time (a
        #: machine whose cores are all busy): reported apart, as a real worker measures it
        self.queued_s = queued_s or {}
        self.queued_reported = queued_reported  # False: as a backend that cannot measure it
        self.node_fails = dict(node_fails or {})
        self.worker_node: dict[str, str] = {}
        self.lose = set(lose or ())
        self.hangs = hangs
        self.cpus = cpus
        self.gpus = gpus
        self.service_s = service_s or {}
        self.setup_s = setup_s
        self.memory_budget_bytes = memory_budget_bytes
        self.call_overhead_s = call_overhead_s or {}
        self.latency_s = latency_s
        self.clock = 0.0
        self._seq = itertools.count()
        self._timeline: list[tuple[float, int, Any]] = []
        self.runners: dict[str, StageRunner] = {}
        self.busy_until: dict[str, float] = {}
        self.starts: list[tuple[float, str]] = []
        self.stops: list[tuple[float, str]] = []
        self.submitted: list[tuple[str, list[int]]] = []
        #: (virtual time, stage, threads) per message: more threads run it that much faster
        #: in the same CPU time
        self.threads_sent: list[tuple[float, str, int | None]] = []
        self.dead: set[str] = set()
        #: per dead worker, the batches sent to it after it died (never delivered)
        self.undelivered: dict[str, list[int]] = {}
        self.killed: list[tuple[float, str]] = []
        self.batch_starts: list[tuple[float, str]] = []  # (virtual time, worker)
        self.ran_on: list[tuple[str, str, str]] = []  # (stage, label, node) per task run
        self.resumes: list[tuple[float, int, int]] = []
        self._waiting: dict[str, deque[tuple[int, list[Handle], float]]] = {}
        self._running: dict[str, _Running] = {}
        self._stopping: set[str] = set()
        for node, (_, seen_at) in self.node_fails.items():
            self._at(seen_at, ("node gone", node))

    def open(self) -> None:
        pass

    def nodes(self) -> list[NodeInfo]:
        if self.node_cpus is None:
            return [NodeInfo("v0", self.cpus, self.gpus, 80.0)]
        return [
            NodeInfo(node, cpus, self.gpus, 80.0)
            for node, cpus in self.node_cpus.items()
            if node not in self.node_fails or self.clock < self.node_fails[node][1]
        ]

    def now(self) -> float:
        return self.clock

    def put(self, obj: Any, label: str) -> Handle:
        data = pickle.dumps(obj)
        return Handle(data, len(data), label)

    def get(self, handle: Handle) -> Any:
        return pickle.loads(handle.ref)

    def free(self, handles: Sequence[Handle]) -> None:
        pass

    def _stored(self, stage: str, obj: Any, label: str, node: str | None = None) -> Handle:
        if (stage, label) in self.lose:
            self.lose.discard((stage, label))
            return Handle(_Lost(), 1, label, node)
        return self.put(obj, label)._replace(node=node)

    def _is_lost(self, handle: Handle, when: float) -> bool:
        if isinstance(handle.ref, _Lost):
            return True
        fails = self.node_fails.get(handle.node) if handle.node is not None else None
        return fails is not None and fails[0] <= when

    def _at(self, when: float, event: Any) -> None:
        heapq.heappush(self._timeline, (when, next(self._seq), event))

    def start_worker(self, worker_id: str, stage: StageSpec, placement: WorkerPlacement) -> None:
        info = WorkerInfo(
            worker_id, stage.name, placement.node_id, placement.gpu_ids, placement.gpu_fraction
        )
        runner = StageRunner(pickle.loads(stage.payload), stage.name, info)
        runner.setup()
        self.runners[worker_id] = runner
        self.worker_node[worker_id] = placement.node_id
        self.busy_until[worker_id] = self.clock + self.setup_s
        self.starts.append((self.clock, stage.name))
        self._at(self.clock + self.setup_s, WorkerReady(worker_id, self.setup_s))

    def stop_worker(self, worker_id: str) -> None:
        self.stops.append((self.clock, worker_id))
        if worker_id in self._running:
            self._stopping.add(worker_id)  # once its generator batches end
            return
        self._at(max(self.clock, self.busy_until[worker_id]), WorkerStopped(worker_id))

    def kill_worker(self, worker_id: str) -> None:
        self.killed.append((self.clock, worker_id))
        self.kill(worker_id)

    def kill(self, worker_id: str, unseen_s: float = 0.0) -> None:
        """Kill a worker now: its queued work is lost and reported as a death, ``unseen_s``
        later (until then the controller may send it work, which is never delivered)."""
        self.dead.add(worker_id)
        self.undelivered[worker_id] = []
        self._at(self.clock + unseen_s, ("died", worker_id))

    def submit(
        self,
        worker_id: str,
        batches: list[tuple[int, list[Handle]]],
        threads: int | None = None,
        allowance: int | None = None,
    ) -> None:
        if worker_id in self.dead:
            self.undelivered[worker_id].extend(batch_id for batch_id, _ in batches)
            return
        runner = self.runners[worker_id]
        if runner.streams:
            self.submitted.append((runner.name, [len(h) for _, h in batches]))
            allowed = math.inf if allowance is None else allowance
            waiting = self._waiting.setdefault(worker_id, deque())
            waiting.extend((batch_id, handles, allowed) for batch_id, handles in batches)
            if worker_id not in self._running:
                self._start_next(
                    worker_id, max(self.clock + self.latency_s, self.busy_until[worker_id])
                )
            return
        self.submitted.append((runner.name, [len(h) for _, h in batches]))
        self.threads_sent.append((self.clock, runner.name, threads))
        begin = max(self.clock + self.latency_s, self.busy_until[worker_id])
        begin += self.call_overhead_s.get(runner.name, 0.0)
        for batch_id, handles in batches:
            self.batch_starts.append((begin, worker_id))
            per_task = self.service_s.get(runner.name, 0.01)
            if callable(per_task):
                per_task = per_task(begin)
            cpu = per_task * len(handles)
            queued = self.queued_s.get(runner.name, 0.0) * len(handles)
            cost = cpu / (threads or 1) + queued
            if self.hangs is not None and any(self.hangs(self.get(h)) for h in handles):
                cost = 1e9  # never seen to end, unless its worker is killed
            done = begin + cost
            begin = done
            node = self.worker_node[worker_id]
            try:
                if any(self._is_lost(h, begin) for h in handles):
                    raise _PayloadLost("payload lost with its node")
                outputs, labels, filtered = runner.run(
                    [self.get(h) for h in handles], [h.label for h in handles], threads
                )
                self.ran_on.extend((runner.name, h.label, node) for h in handles)
                where = node if self.node_cpus is not None else None
                outs = [
                    self._stored(runner.name, o, lab, where)
                    for o, lab in zip(outputs, labels, strict=True)
                ]
                event: Any = BatchesDone(
                    worker_id,
                    [
                        BatchOutcome(
                            batch_id,
                            outs,
                            filtered,
                            cost,
                            cpu if threads else 0.0,
                            queued_s=queued if self.queued_reported else 0.0,
                        )
                    ],
                )
            except _PayloadLost as exc:
                event = BatchFailed(
                    worker_id, batch_id, ErrorInfo("ObjectLostError", str(exc), lost=True)
                )
            except Exception as exc:  # noqa: BLE001 - reported like a real worker would
                event = BatchFailed(worker_id, batch_id, ErrorInfo.from_exception(exc))
            self._at(done + self.latency_s, event)
        self.busy_until[worker_id] = begin

    # -- generator stages ------------------------------------------------------------------
    def _start_next(self, worker_id: str, when: float) -> None:
        waiting = self._waiting.get(worker_id)
        if not waiting:
            self._running.pop(worker_id, None)
            self.busy_until[worker_id] = when
            if worker_id in self._stopping:
                self._at(when, WorkerStopped(worker_id))
            return
        batch_id, handles, allowed = waiting.popleft()
        runner = self.runners[worker_id]
        self.batch_starts.append((when, worker_id))
        outputs = runner.stream([self.get(h) for h in handles], [h.label for h in handles])
        self._running[worker_id] = _Running(batch_id, outputs, allowed, when)
        self.busy_until[worker_id] = math.inf
        self._step_at(worker_id, when)

    def _step_at(self, worker_id: str, when: float) -> None:
        running = self._running[worker_id]
        pace = self.service_s.get(self.runners[worker_id].name, 0.01)
        pace = pace(when) if callable(pace) else pace
        self._at(when + pace, ("step", worker_id, running.batch_id))

    def _step(self, worker_id: str, batch_id: int) -> BackendEvent | None:
        """The running generator makes its next output (or ends, or fails)."""
        running = self._running.get(worker_id)
        if running is None or running.batch_id != batch_id or worker_id in self.dead:
            return None
        runner = self.runners[worker_id]
        try:
            output, label = next(running.outputs)
        except StopIteration:
            busy = self.clock - running.began
            outcome = BatchOutcome(batch_id, [], runner.filtered, busy)
            self._start_next(worker_id, self.clock)
            return BatchesDone(worker_id, [outcome])
        except Exception as exc:  # noqa: BLE001 - reported like a real worker would
            self._start_next(worker_id, self.clock)
            return BatchFailed(worker_id, batch_id, ErrorInfo.from_exception(exc))
        running.made += 1
        if running.made >= running.allowed:
            running.paused = True  # at its ``yield`` until resumed
        else:
            self._step_at(worker_id, self.clock)
        return BatchOutputs(worker_id, batch_id, [self._stored(runner.name, output, label)])

    def resume(self, worker_id: str, batch_id: int, outputs: int) -> None:
        self.resumes.append((self.clock, batch_id, outputs))
        running = self._running.get(worker_id)
        if running is None or running.batch_id != batch_id:
            return
        running.allowed += outputs
        if running.paused and running.made < running.allowed:
            running.paused = False
            self._step_at(worker_id, self.clock)

    def poll(self, timeout: float) -> list[BackendEvent]:
        deadline = self.clock + timeout
        if not self._timeline or self._timeline[0][0] > deadline:
            self.clock = deadline
            return []
        when = self._timeline[0][0]
        self.clock = max(self.clock, when)
        events = []
        while self._timeline and self._timeline[0][0] <= when:
            _, _, event = heapq.heappop(self._timeline)
            if isinstance(event, tuple) and event[0] == "step":
                made = self._step(event[1], event[2])
                if made is not None:
                    events.append(made)
                continue
            if isinstance(event, tuple) and event[0] == "node gone":
                for worker_id, node in self.worker_node.items():
                    if node == event[1] and worker_id not in self.dead:
                        self.dead.add(worker_id)
                        self.undelivered.setdefault(worker_id, [])
                        events.append(WorkerDied(worker_id, "its node left the cluster"))
                continue
            if isinstance(event, tuple):  # a death, reported with what never arrived
                dead = event[1]
                event = WorkerDied(dead, "killed by the test", tuple(self.undelivered[dead]))
            worker = getattr(event, "worker_id", None)
            if worker in self.dead and not isinstance(event, WorkerDied):
                continue
            events.append(event)
        return events

    def shutdown(self) -> None:
        for runner in self.runners.values():
            runner.teardown()
        self.runners.clear()
