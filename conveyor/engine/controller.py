"""The control loop: admit inputs, dispatch batches, collect results, retry, rescale.

Backend-agnostic: it talks to a backend only through the ``Backend`` protocol and moves
``Handle``s, never payloads (except the last stage's outputs it hands back to the caller).
Decisions come from the pure policies; this module only applies them. What the loop keeps
and consults lives in rooms beside it: ``state`` (the records of stages and batches),
``lineage`` (sources followed to their end), ``cpu_book`` (CPUs held by running batches),
``suspects`` (nodes avoided), ``streams`` (generator batches' books), ``observations``
(what the policies are told) and ``snapshot`` (the run as monitors and the result see it).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import itertools
import logging
import math
import operator
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conveyor.engine import streams
from conveyor.engine.cpu_book import CpuBook
from conveyor.engine.events import (
    SERVICE_TIME_BUCKETS_S,
    DecisionEvent,
    FailureEvent,
    Monitor,
    RunEvent,
    RunSnapshot,
    RunStarted,
    TargetChange,
    WorkerEvent,
)
from conveyor.engine.journal import Journal, JournalKey, key_label, source_key
from conveyor.engine.lineage import FORGIVEN_LOSSES, Lineage, maps_one_to_one
from conveyor.engine.messages import (
    BatchesDone,
    BatchFailed,
    BatchOutputs,
    ErrorInfo,
    Handle,
    WorkerDied,
    WorkerReady,
    WorkerSetupFailed,
    WorkerStopped,
)
from conveyor.engine.observations import cpus_per_gpu, observations
from conveyor.engine.policies.autoscale import (
    AutoscaleConfig,
    AutoscaleState,
    Budget,
    StageObservation,
    explain,
    plan,
    stage_rates,
)
from conveyor.engine.policies.backpressure import (
    EdgeBudget,
    EdgeState,
    demand_budget,
    edge_budget,
    may_feed,
    stream_grant,
    stream_window,
)
from conveyor.engine.policies.placement import Ledger, fits_nowhere
from conveyor.engine.policies.priority import stage_niceness
from conveyor.engine.pool import Worker
from conveyor.engine.queues import Entry, Seek
from conveyor.engine.snapshot import Progress, fill_result, run_snapshot, run_started
from conveyor.engine.spec import StageSpec
from conveyor.engine.state import Batch, StageState
from conveyor.engine.suspects import SUSPECT_NODE_S, Suspects
from conveyor.engine.tracebacks import named_sources
from conveyor.errors import BackendError, EngineStalled, StageSetupError, UnpicklablePayload
from conveyor.result import FailureRecord, RunResult, StageStats
from conveyor.tasks.base import EmptyTask, Task

if TYPE_CHECKING:
    from conveyor.backends.base import Backend

__all__ = ["FORGIVEN_LOSSES", "SUSPECT_NODE_S", "Controller", "ControllerConfig"]

log = logging.getLogger(__name__)


def _together(message: str, inputs: int) -> str:
    """A failure's message for each input of a batch tried again as a whole: which of them
    caused it is not known (its outputs, made from the whole batch, had gone on)."""
    return (
        f"{message} (failed together with the {inputs} inputs of its batch: it had sent on "
        "outputs made from the batch as a whole, so it was tried again as one; which input "
        "caused it is not known)"
    )


#: the longest a turn of the loop takes tasks from a slow source once some wait to run
ADMIT_SLICE_S = 0.02


def _ignore(controller: Controller, event: Any) -> None:
    """What an event of a kind the controller does not know does."""


#: a second message may wait at a worker for stages this fast (hides the round trip) ...
PREFETCH_BELOW_S = 0.05
#: ... or where the measured round trip (send to result, beyond the work) costs more than this
#: share of a batch's time: on Ray an actor call and the return of its result take milliseconds
PREFETCH_OVERHEAD_SHARE = 0.02
#: how much work one message to a worker should carry for very fast stages ...
MESSAGE_TARGET_S = 0.002
#: ... and at least this many times the measured round trip of a message, so that per-call
#: costs (milliseconds for an actor call on Ray) stay a small part of the work ...
MESSAGE_OVERHEAD_FACTOR = 4.0
#: ... but never more output than this share of the next edge's byte budget: what one
#: message makes is in flight (and on Ray freed only as a whole) until all of it is consumed
MESSAGE_EDGE_SHARE = 1 / 32
MAX_BATCHES_PER_MESSAGE = 64
#: first decision soon after the first measurements, never more often than this
MIN_AUTOSCALE_SPACING_S = 0.1
TICK_S = 0.25
#: an unfinished run with nothing in flight and no worker starting for this long is a defect
#: of the engine (unless a stage waits for room in the cluster): it stops rather than hang
STALL_S = 60.0
#: a batch of a stage without ``timeout_s`` that has run this long, and this many times its
#: stage's mean batch, is said once in the log: a hung call otherwise waits without a word
LONG_BATCH_S = 300.0
LONG_BATCH_FACTOR = 20.0
LONG_CHECK_S = 5.0
#: workers stopped first: not ready yet, then idle, then the least busy
_STOP_ORDER = operator.attrgetter("ready", "in_flight")


@dataclass(frozen=True)
class ControllerConfig:
    """Settings of one run; the executors expose them (each one is read below)."""

    max_attempts: int = 3
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    autoscale_interval_s: float = 1.0
    edge_max_tasks: int = 1024
    edge_max_bytes: int | None = None
    stage_at_a_time: bool = False
    #: later stages get a contended CPU first (``policies.priority``)
    stage_priority: bool = True
    #: a batch sent while cores idle may use them (``policies.threads``)
    elastic_threads: bool = True
    #: until the first output, later stages get the cores first (``policies.first_output``)
    first_output_first: bool = True

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {attempts!r}")
        if self.autoscale_interval_s <= 0:
            raise ValueError(f"autoscale_interval_s must be > 0, got {self.autoscale_interval_s}")
        if self.edge_max_tasks < 1:
            raise ValueError(f"edge_max_tasks must be >= 1, got {self.edge_max_tasks}")
        if self.edge_max_bytes is not None and self.edge_max_bytes < 1:
            raise ValueError(f"edge_max_bytes must be >= 1, got {self.edge_max_bytes}")

    def settings(self, journal: str | None = None) -> dict[str, Any]:
        """These settings as ``RunStarted`` reports them (``journal``: its path, if any)."""
        return {
            "max_attempts": self.max_attempts,
            "autoscale_interval_s": self.autoscale_interval_s,
            "edge_max_tasks": self.edge_max_tasks,
            "edge_max_bytes": self.edge_max_bytes,
            "stage_priority": self.stage_priority,
            "elastic_threads": self.elastic_threads,
            "first_output_first": self.first_output_first,
            "journal": journal,
            **{f"autoscale.{k}": v for k, v in dataclasses.asdict(self.autoscale).items()},
        }


class Controller:
    """Runs one built pipeline on one backend. Iterate it to get last-stage outputs."""

    def __init__(
        self,
        specs: list[StageSpec],
        backend: Backend,
        initial_tasks: Iterable[Any] | None,
        config: ControllerConfig,
        pipeline_name: str = "pipeline",
        monitors: Iterable[Monitor] = (),
        journal: Journal | None = None,
        journal_key: JournalKey | None = None,
        description: str = "",
    ) -> None:
        self.backend = backend
        self.config = config
        self.pipeline_name = pipeline_name
        self.description = description
        self.monitors = list(monitors)
        # monitors that want events (workers, failures, decisions); none: none are built
        self._listeners = [m for m in self.monitors if callable(getattr(m, "on_event", None))]
        self.stages = [StageState(spec, StageStats(spec.name)) for spec in specs]
        self.source: Iterator[Any] = iter([EmptyTask()] if initial_tasks is None else initial_tasks)
        self.source_done = False
        self._ahead: tuple[Any, str, Any] | None = None  # pulled before the backend opened
        self.admitted = 0
        self.outputs = 0
        self.final: deque[Handle] = deque()  # last-stage outputs not yet handed out
        # where stored payloads can be lost, each source task is kept until all that was made
        # from it is done, so that a lost input can be made again; with a journal, each
        # source is followed until then to be recorded as finished
        self.lineage = Lineage(bool(getattr(backend, "payloads_can_be_lost", False)), journal)
        self.journal = journal
        self.journal_key = journal_key
        self.skipped = 0
        self.final_bytes = 0
        self.failures: list[FailureRecord] = []
        self.batches: dict[int, Batch] = {}
        self.batch_ids = itertools.count()
        self.worker_seq = itertools.count()
        self.workers: dict[str, Worker] = {}
        self.autoscale_state = AutoscaleState()
        # what each node holds, filled with the cluster when the run begins
        self.ledger = Ledger(share_cpus=config.autoscale.share_cpus)
        self.base_budget: EdgeBudget | None = None
        self.budgets: list[EdgeBudget] = []  # edge i feeds stage i; edge n is the output
        self.result = RunResult()
        self._t0 = 0.0
        self._next_autoscale = 0.0
        self._last_autoscale = -math.inf
        self._next_tick = 0.0
        # when the oldest partial batch that waits to fill (``batch_wait_s``) is due
        self._batch_due = math.inf
        self._startup_s: float | None = None
        self._first_output_s: float | None = None
        self._closed = False
        self._ended = False
        self._initial_workers: set[str] = set()
        # set when a start could succeed now (new targets, freed resources): failed
        # placements are not retried on every turn of the loop
        self._placement_dirty = True
        self._quiet_since: float | None = None  # work waits, nothing moves, since then
        self._stall_told = False
        self._admitting = False  # the source has more that the first edge has room for
        self._stop_requested = False
        self._setup_told: set[str] = set()  # stages whose slow setup was said (once each)
        self._long_told: set[str] = set()  # stages whose long batch was said (once each)
        self._next_long_check = 0.0  # long batches are looked for every LONG_CHECK_S
        self._timed = [s for s in self.stages if s.spec.timeout_s is not None]
        self._streams = any(s.spec.streams for s in self.stages)
        # nodes that lost a payload: their workers get work only where no other can take it
        self.suspects = Suspects()
        # what each kind of backend event does (``_on_event``): the class's functions, not
        # bound methods, which would make the controller a cycle that only the garbage
        # collector frees, and with it the run's result and outputs (a caller's ``del``
        # freed nothing)
        self._handlers: dict[type, Callable[[Controller, Any], None]] = {
            BatchOutputs: Controller._on_outputs,
            BatchesDone: Controller._on_done,
            BatchFailed: Controller._on_failed,
            WorkerReady: Controller._on_ready,
            WorkerDied: Controller._on_died,
            WorkerStopped: Controller._on_stopped,
            WorkerSetupFailed: Controller._on_setup_failed,
        }
        # CPUs held per node and stage by workers running a batch
        self.cpu_book = CpuBook(
            self.stages, self.ledger, config.elastic_threads, config.first_output_first
        )

    @property
    def _suspect_nodes(self) -> dict[str, float]:
        """The suspect nodes and the time of each one's last loss (``Suspects.since``)."""
        return self.suspects.since

    # -- the loop -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self._run()

    def _run(self) -> Iterator[Any]:
        """The loop. Each turn admits the source tasks the first edge has room for,
        dispatches batches to free workers (and lets paused generator batches go on), hands
        out the outputs, polls the backend and handles its events, autoscales at its
        interval, reconciles the workers with their targets, and ticks (timeouts, journal,
        monitors)."""
        backend = self.backend
        self._t0 = backend.now()
        try:
            for monitor in self.monitors:  # a slow first source shows the run starting
                monitor.on_start(self.pipeline_name, [s.spec.name for s in self.stages])
            if self._closed or self._stop_requested:  # closed before it started: it ran
                self._started_without_backend()  # whole, its processes left till exit
                return
            # the first source to run is known before the backend starts: a run with nothing
            # to do (every source finished by an earlier run, or none given) starts no
            # workers, and no cluster (a private Ray one took 9 s to find nothing to do)
            try:
                self._ahead = self._next_source()
            except BaseException:
                self._started_without_backend()  # the source's error is logged
                raise
            if self._ahead is None:
                self._started_without_backend()
                self._finish(completed=True)
                return
            backend.open()
            self._begin()  # the cluster in the ledger, the first targets and workers
            while True:
                if self._stop_requested:  # ``request_stop`` from another thread
                    return
                self._admit()
                self._dispatch()
                if self._streams:
                    self._resume_streams()
                while self.final:
                    taken = self._take_output()
                    if taken is None:
                        continue  # it could not be read back: recorded as a failure
                    label, output = taken
                    yield output
                    # the caller asked for the next one: this one is theirs now
                    self.lineage.live(label, -1)
                if self._finished():
                    break
                now = backend.now()
                due = min(self._next_autoscale, self._next_tick, self._batch_due)
                wait = 0.0 if self._admitting else max(0.0, due - now)
                events = backend.poll(wait)
                for event in events:
                    self._on_event(event)
                now = backend.now()
                self._check_stall(now, bool(events))
                self._update_done()
                if now >= self._next_autoscale:
                    self._autoscale(now)
                self._reconcile()
                if now >= self._next_tick:
                    self._tick(now)
            self._finish(completed=True)
        finally:
            if not self._ended:
                # stopped early or failed: monitors and the result still get what is known
                with contextlib.suppress(Exception):
                    self._finish(completed=False)
            self.close()

    def _take_output(self) -> tuple[str, Any] | None:
        """The next output for the caller; ``None`` for one that cannot be read back (its
        unpickling raised): a failure of the last stage, for its input. It raised out of
        the run, and every other output was lost."""
        handle = self.final.popleft()
        self.final_bytes -= handle.nbytes
        try:
            output = self.backend.get(handle)
        except Exception as exc:  # noqa: BLE001 - the output's own __setstate__, ...
            info = ErrorInfo.from_exception(exc)
            message = f"its output could not be read back (unpickled): {info.message}"
            self._record_failure(self.stages[-1], handle.label, info.type, message, info, 1)
            self.backend.free([handle])
            self.lineage.live(handle.label, -1)
            return None
        if self._first_output_s is None:
            self._first_output_s = self.backend.now() - self._t0
        self.outputs += 1
        return handle.label, output

    def _started_without_backend(self) -> None:
        """The start of a run that ends before its backend starts (nothing to run, or its
        source failed at once), for the event log."""
        if self._listeners:
            self._emit(self._run_started([]))
        self._update_done()

    def _begin(self) -> None:
        nodes = self.backend.nodes()
        self.ledger.refresh(nodes)
        n = len(self.stages)
        budget = edge_budget(
            self.backend.memory_budget_bytes,
            n,
            self.config.edge_max_tasks,
            self.config.edge_max_bytes,
        )
        self.base_budget = budget
        self.budgets = [budget] * (n + 1)
        if self._listeners:
            self._emit(self._run_started(nodes))
        self._admit()
        self._update_done()
        self._autoscale(self.backend.now(), initial=True)
        self._reconcile()
        self._initial_workers = set(self.workers)
        missing = [s for s in self.stages if s.target > 0 and not s.pool.live_count]
        for stage in missing:
            why = fits_nowhere(stage.spec.name, stage.spec.resources, nodes)
            if why is not None:
                raise BackendError(why)
        if missing:
            cpus, gpus = self.ledger.totals()
            units = ""
            if any(s.spec.resources.video_engines for s in self.stages):
                decoders, encoders = self.ledger.engine_totals()
                units = "".join(
                    f", {n:g} {kind} units" if n is not None else f", {kind} units unknown"
                    for kind, n in (("NVDEC", decoders), ("NVENC", encoders))
                )
            raise BackendError(
                f"no node can host a worker of stage(s) {', '.join(s.spec.name for s in missing)} "
                "next to one worker "
                f"of every other stage; the cluster has {cpus:g} CPUs and {gpus:g} GPUs{units} "
                "(streaming runs all stages at once; BatchExecutor runs one at a time)"
            )

    # -- inputs ---------------------------------------------------------------------------
    def _edge(self, stage_index: int) -> EdgeState:
        """The queue *into* stage ``stage_index`` (or the final outputs past the last stage)."""
        if stage_index >= len(self.stages):
            if self.stages[-1].spec.streams:  # its running batches' allowances count
                expected = self._expected(stage_index - 1)
                return EdgeState(len(self.final), self.final_bytes, *expected)
            return EdgeState(len(self.final), self.final_bytes)
        stage = self.stages[stage_index]
        return stage.queue.state(*self._expected(stage_index - 1))

    def _expected(self, index: int) -> tuple[float, float]:
        """Outputs (and their bytes) stage ``index``'s batches in flight are expected to add
        to the edge after it: from the measured fan-out and output size, or, for a generator
        stage, what its running batches are allowed to make before they pause."""
        if index < 0:
            return 0.0, 0.0
        up = self.stages[index]
        if up.spec.streams:
            size = up.streamed_bytes / up.streamed if up.streamed else 0.0
            return float(up.outstanding), up.outstanding * size
        fanout = up.meter.fanout.value if up.meter.fanout.value is not None else 1.0
        size = up.meter.out_bytes.value or 0.0
        return up.in_flight_tasks * fanout, up.in_flight_tasks * size

    def _may_feed(self, stage_index: int) -> bool:
        if self.config.stage_at_a_time:
            return True
        nxt = stage_index + 1
        if nxt < len(self.stages):
            queue = self.stages[nxt].queue
            if len(queue) < self.stages[nxt].spec.batch_size:
                return True  # the fast path of the policy's deadlock rule, without allocations
        return may_feed(self._edge(nxt), self.budgets[nxt], self._consumer_batch(nxt))

    def _consumer_batch(self, edge: int) -> int:
        return self.stages[edge].spec.batch_size if edge < len(self.stages) else 1

    def _admit(self) -> None:
        """Take source tasks while the first edge has room. A source slow to give each task
        (a listing, an API paged through) is taken from for ``ADMIT_SLICE_S`` at most per
        turn once something waits to be dispatched, so that its first tasks run while it
        gives the next: filling the edge first kept every worker idle until the source ran
        dry or the edge was full (on the backend's clock: a simulated run's virtual one does
        not move while its source is read, and its runs stay the same). A ``next()`` that
        blocks holds the loop all the same: the source is read in the loop's thread."""
        self._admitting = False
        if self.source_done:
            return
        first = self.stages[0]
        budget = self.budgets[0]
        began = self.backend.now()
        while self.config.stage_at_a_time or may_feed(
            first.queue.state(),
            budget,
            first.spec.batch_size,
        ):
            if len(first.queue) and self.backend.now() - began > ADMIT_SLICE_S:
                self._admitting = True  # the loop comes back without waiting for events
                return
            pulled = self._next_source()
            if pulled is None:
                return
            task, label, key = pulled
            if isinstance(task, Task):
                task.task_id = label
            self.admitted += 1
            try:
                handle = self.backend.put(task, label)
            except UnpicklablePayload as exc:  # the caller's to fix: the run stops at once
                exc.add_note(f"(initial task {label} of pipeline {self.pipeline_name!r})")
                raise
            self.lineage.follow(label, handle, key)
            first.queue.push(Entry(handle), self.backend.now())

    def _next_source(self) -> tuple[Any, str, Any] | None:
        """The next source task to run, its label and journal key (None without a journal);
        None once the source is done. Sources the journal holds as finished are skipped."""
        if self._ahead is not None:
            pulled, self._ahead = self._ahead, None
            return pulled
        while True:
            try:
                task = next(self.source)
            except StopIteration:
                self.source_done = True
                return None
            except Exception as exc:
                # the caller's own error (a pipeline's sources refuse an input this way):
                # it ends the run, said to come from there
                exc.add_note(
                    f"(raised by the initial_tasks of pipeline {self.pipeline_name!r} after "
                    f"{self.admitted} tasks)"
                )
                raise
            if self.journal is None:
                return task, str(self.admitted), None
            key = source_key(task, self.journal_key)
            label = key_label(key)
            # a source given twice is running (its root is live) or finished: the journal
            # already holds every key, so none is kept a second time for this
            if self.journal.skips(key) or self.lineage.running(label):
                self.skipped += 1  # finished by an earlier run (or given twice)
                continue
            return task, label, key

    # -- dispatch -------------------------------------------------------------------------
    def _upstream_done(self, index: int) -> bool:
        return self.source_done if index == 0 else self.stages[index - 1].done

    def _dispatch(self) -> None:
        self._batch_due = math.inf
        for index in range(len(self.stages) - 1, -1, -1):
            stage = self.stages[index]
            if stage.queue:
                self._dispatch_stage(index, stage)

    def _dispatch_stage(self, index: int, stage: StageState) -> None:
        pool = stage.pool
        if not pool.ready_count:
            if not pool.live_count and stage.target:
                self._placement_dirty = True  # input for a stage left without workers
            return
        # suspects first, each alone on an idle worker
        queue = stage.queue
        avoid = self.suspects.avoid
        if not queue.suspects and pool.reserved is not None:
            pool.reserved = None  # the suspect it ran dry for went elsewhere: feed it again
        while queue.suspects and self._may_feed(index):
            idle = pool.idle(avoid)
            if idle is None:
                pool.reserve_for_suspect(avoid)  # so a suspect does not wait for the end
                break
            if not self.cpu_book.may_start(idle, stage.spec, self._filling()):
                break
            entry = queue.pop_suspect()
            self._send(index, idle, [[entry, *(entry.together or ())]], alone=True)
        depth = self._depth(stage)
        if not queue.fresh or not pool.may_feed_any(depth):
            return  # every worker holds what it may (the common case with thousands)
        batch_size = stage.spec.batch_size
        meter = stage.meter
        task_time = meter.busy_time.value  # messages are sized by work, not round trips
        message_s = max(MESSAGE_TARGET_S, MESSAGE_OVERHEAD_FACTOR * (meter.overhead.value or 0.0))
        upstream_done = self._upstream_done(index)
        while queue.fresh and self._may_feed(index):
            full_batches = len(queue.fresh) // batch_size
            partial = not full_batches and not upstream_done
            if partial and not self._partial_due(stage):
                return  # wait for a full batch; the remainder goes once upstream is done
            worker = pool.feedable(depth, queue.fresh[0].handle.node, avoid)
            if worker is None or not self.cpu_book.may_start(worker, stage.spec, self._filling()):
                return
            count = 1
            if task_time is not None:
                count = int(message_s / max(task_time * batch_size, 1e-7))
                out_bytes = meter.out_bytes.value or 0.0
                if out_bytes > 0:
                    room = MESSAGE_EDGE_SHARE * self.budgets[index + 1].max_bytes
                    count = min(count, int(room / (out_bytes * batch_size)))
                fair = math.ceil(max(1, full_batches) / pool.ready_count)
                count = max(1, min(count, fair, MAX_BATCHES_PER_MESSAGE))
            if not upstream_done:
                # never a partial batch before the end, but for one that waited its time
                count = 1 if partial else min(count, full_batches)
            if stage.spec.timeout_s is not None or stage.spec.streams:
                # each batch's start is then known, and so is when it is late; and a
                # generator's batch is allowed outputs while it runs, not while it waits
                count = 1
            if stage.spec.max_batches_per_worker is not None:
                count = min(count, stage.spec.max_batches_per_worker - worker.sent_batches)
            batches = [queue.take(batch_size, worker.node) for _ in range(count) if queue.fresh]
            self._send(index, worker, batches, alone=False)

    def _partial_due(self, stage: StageState) -> bool:
        """Whether the stage's queue, too short for a batch, goes as a smaller one now: while
        no task has reached the last stage (nothing waits for the first output), or once its
        oldest task has waited ``batch_wait_s``; else the controller wakes when it has."""
        wait = stage.spec.batch_wait_s
        if wait is None:
            return False
        if self._filling():
            return True
        due = stage.queue.fresh[0].since + wait
        if self.backend.now() >= due:
            return True
        self._batch_due = min(self._batch_due, due)
        return False

    @staticmethod
    def _depth(stage: StageState) -> int:
        """Messages a worker of this stage may hold: two where the round trip would show."""
        meter = stage.meter
        task_time = meter.busy_time.value
        if task_time is None:
            return 1
        batch_time = task_time * stage.spec.batch_size
        overhead = meter.overhead.value
        if batch_time < PREFETCH_BELOW_S or (
            overhead is not None and overhead > PREFETCH_OVERHEAD_SHARE * batch_time
        ):
            return 2
        return 1

    def _send(self, index: int, worker: Worker, groups: list[list[Entry]], alone: bool) -> None:
        stage = self.stages[index]
        ids, payload = [], []
        now = self.backend.now()
        idle = worker.in_flight == 0
        threads = None
        if idle:  # it books its CPUs, and may get the node's idle cores
            filling, draining = self._filling(), self._upstream_done(index)
            threads = self.cpu_book.grant(worker, stage.spec, filling, draining)
        window = None
        if stage.spec.streams and not self.config.stage_at_a_time:
            size = stage.streamed_bytes / stage.streamed if stage.streamed else None
            budget = self.budgets[index + 1]
            window = stream_window(self._consumer_batch(index + 1), budget, size)
        for entries in groups:
            batch_id = next(self.batch_ids)
            batch = Batch(batch_id, index, worker.worker_id, entries, alone, now, idle, threads)
            self.batches[batch_id] = batch
            ids.append(batch_id)
            payload.append((batch_id, [e.handle for e in entries]))
            stage.in_flight_tasks += len(entries)
            if stage.spec.streams:
                streams.start(stage, batch, window)
        stage.pool.sent(worker, ids, alone, now)
        if stage.spec.streams:
            self.backend.submit(worker.worker_id, payload, threads, allowance=window)
        else:
            self.backend.submit(worker.worker_id, payload, threads)
        worker.sent_batches += len(ids)
        limit = stage.spec.max_batches_per_worker
        if limit is not None and worker.sent_batches >= limit:
            self._retire(stage, worker, f"it was sent its {limit} batches (max_batches_per_worker)")

    def _retire(self, stage: StageState, worker: Worker, reason: str) -> None:
        """Stop ``worker`` once it has run what it holds (another takes its place while the
        stage's target wants one)."""
        stage.pool.mark_stopping(worker)
        self.backend.stop_worker(worker.worker_id)
        self._placement_dirty = True
        if self._listeners:
            self._worker_event("stop", worker, reason=reason)

    def _filling(self) -> bool:
        """No task has reached the last stage yet (and stages run at the same time)."""
        return not self.stages[-1].stats.tasks_in and not self.config.stage_at_a_time

    # -- events ---------------------------------------------------------------------------
    def _on_event(self, event: Any) -> None:
        """Hand a backend event to its handler (``_handlers``; an unknown kind is ignored)."""
        handler = self._handlers.get(type(event))
        if handler is None:  # a subclass of a known kind: handled as that kind
            kinds = type(event).__mro__
            handler = next((self._handlers[k] for k in kinds if k in self._handlers), _ignore)
            self._handlers[type(event)] = handler
        handler(self, event)

    def _on_failed(self, event: BatchFailed) -> None:
        """A batch raised: it is tried again or recorded (``_retry_or_fail``)."""
        worker = self.workers.get(event.worker_id)
        if worker is not None:
            worker.last_done = self.backend.now()
        batch = self._pop_batch(event.worker_id, event.batch_id)
        if batch is not None:
            streams.keep_sent(batch)
            self._retry_or_fail(batch.stage, batch.entries, event.error, culprit=True)

    def _on_ready(self, event: WorkerReady) -> None:
        """A worker finished its setup: it takes work, and what it cost to start is measured."""
        worker = self.workers.get(event.worker_id)
        if worker is None:
            return
        stage = self.stages[worker.stage]
        stage.pool.mark_ready(worker)
        stage.note_memory(event.memory_bytes)
        # deaths in setup end the run only when they come in a row: a setup that works
        # shows the stage can start, and kills spread over days are no sign
        stage.setup_deaths = 0
        # what a new worker costs: process start and setup, as the controller waits
        started = self.backend.now() - worker.started_at
        stage.meter.setup_s.update(max(started, event.setup_s))
        if self._listeners:
            self._worker_event("ready", worker, setup_s=max(started, event.setup_s))
        self._initial_workers.discard(worker.worker_id)
        if self._startup_s is None and not self._initial_workers:
            self._startup_s = self.backend.now() - self._t0

    def _on_died(self, event: WorkerDied) -> None:
        error = ErrorInfo("WorkerDied", event.reason)
        self._on_worker_gone(event.worker_id, error, undelivered=event.undelivered)
        self._refresh_nodes()  # its node may have left: place no replacement there

    def _on_stopped(self, event: WorkerStopped) -> None:
        error = ErrorInfo("WorkerDied", "worker stopped with work in flight")
        self._on_worker_gone(event.worker_id, error)

    def _on_setup_failed(self, event: WorkerSetupFailed) -> None:
        """A worker whose process died while setting up (its node was lost, it was killed)
        is replaced like any dead worker, up to ``max_attempts`` deaths in a row per stage;
        an exception raised by setup itself ends the run at once."""
        worker = self.workers.get(event.worker_id)
        stage = self.stages[worker.stage] if worker else None
        if stage is not None and event.error.type == "WorkerDied":
            stage.setup_deaths += 1
            if stage.setup_deaths < self.config.max_attempts:
                self._on_worker_gone(event.worker_id, event.error)
                return
        name = stage.spec.name if stage else event.worker_id
        trace = named_sources(event.error.traceback, stage.spec.stage) if stage else ""
        raise StageSetupError(
            name, f"{event.error.type}: {event.error.message}", trace or event.error.traceback
        )

    def _pop_batch(self, worker_id: str, batch_id: int, now: float | None = None) -> Batch | None:
        """Forget a batch whose outcome came (``now``: the backend's clock, when the caller
        read it already for this event)."""
        batch = self.batches.pop(batch_id, None)
        if batch is None:
            return None
        stage = self.stages[batch.stage]
        stage.in_flight_tasks -= len(batch.entries)
        if now is None:
            now = self.backend.now()
        if stage.spec.streams:
            streams.end(stage, batch, now)
        worker = self.workers.get(worker_id)
        if worker is not None:
            stage.pool.batch_done(worker, batch_id, now)
            if not worker.in_flight:
                self.cpu_book.release(worker)
        return batch

    def _on_done(self, event: BatchesDone) -> None:
        # one reading of the clock for the whole message: its batches ended together
        now = self.backend.now()
        done = []
        pop, worker_id = self._pop_batch, event.worker_id
        for outcome in event.outcomes:
            batch = pop(worker_id, outcome.batch_id, now)
            if batch is not None:
                done.append((outcome, batch))
        if not done:
            return
        held = self._held_s(event.worker_id, done)
        stages, lineage = self.stages, self.lineage
        for (outcome, batch), held_s in zip(done, held, strict=True):
            stage = stages[batch.stage]
            stats = stage.stats
            outputs = outcome.outputs
            n_in = len(batch.entries)
            n_out = len(outputs) + batch.made
            stats.tasks_in += n_in
            stats.busy_s += outcome.busy_s
            stats.cpu_s += outcome.cpu_s
            stage.note_memory(outcome.memory_bytes)
            stage.service_counts[bisect.bisect_left(SERVICE_TIME_BUCKETS_S, outcome.busy_s)] += 1
            stage.service_sum_s += outcome.busy_s
            first_measurement = not stage.meter.measured
            out_bytes = 0
            for handle in outputs:
                out_bytes += handle.nbytes
            out_bytes += batch.made_bytes
            # the time its thread waited for a core was the machine's, not the stage's: more
            # workers would not have made it sooner (they would have waited too)
            busy_s = max(0.0, outcome.busy_s - outcome.queued_s)
            held_s = max(busy_s, held_s - outcome.queued_s)
            # a generator that waited for room downstream held its worker without working:
            # more workers would not have made it sooner
            held_s = max(busy_s, held_s - batch.paused_s) if batch.paused_s else held_s
            if batch.threads:
                # more threads made it quicker than the stage's own CPUs would: measure it
                # by its CPU time over them, so that the autoscaler sizes the pool for the
                # steady state, when no core is spare
                busy_s = max(busy_s, outcome.cpu_s / max(stage.spec.resources.cpus, 1e-9))
            stage.meter.record(n_in, n_out, out_bytes, busy_s, held_s, outcome.cpu_s)
            if first_measurement and all(s.meter.measured or s.done for s in self.stages):
                # every stage has been seen working: decide now rather than at the interval
                self._next_autoscale = min(
                    self._next_autoscale, self._last_autoscale + MIN_AUTOSCALE_SPACING_S
                )
            seek = batch.entries[0].seek  # a recomputation runs alone
            if stage.spec.streams:
                self._forward(batch, outputs)  # what it did not report on the way
                if seek is not None:
                    self._on_recomputed(batch.stage, seek, batch.held or [])
                stats.filtered += outcome.filtered
                self._release(batch.entries)
            elif seek is not None:
                self._on_recomputed(batch.stage, seek, outputs)
                self._release(batch.entries)
            elif lineage.tracked and maps_one_to_one(batch.entries, outputs):
                # each output carries on its input's lineage: what is alive does not change
                self._pass_on(batch, outputs, outcome.filtered, counted=True, now=now)
            else:
                self._pass_on(batch, outputs, outcome.filtered, now=now)
                self._release(batch.entries)

    def _held_s(self, worker_id: str, done: list[tuple[Any, Batch]]) -> list[float]:
        """How long each of these batches held its worker (see ``StageMeter``).

        A worker is held from when it could start a batch (its previous one ended while this
        one waited at it, or this one was sent to it idle) until the controller sees the
        result. A batch sent to an idle worker of a stage that prefetches is the exception: fed
        steadily its worker would not wait for the round trip, so only its busy time counts.
        Also measures that round trip (send to result, beyond busy), which decides prefetching.
        """
        busy = [outcome.busy_s for outcome, _ in done]
        worker = self.workers.get(worker_id)
        if worker is None:
            return busy
        now = self.backend.now()
        sent = min(batch.sent_at for _, batch in done)
        waited = sent < worker.last_done  # queued behind the previous message
        start = max(sent, worker.last_done)
        worker.last_done = now
        held = now - start
        stage = self.stages[done[0][1].stage]
        if not waited and len(done) == 1 and done[0][1].idle_send:
            stage.meter.overhead.update(max(0.0, held - busy[0]))
        if not waited and self._depth(stage) > 1:
            return busy
        total = sum(busy)
        if total <= 0:
            return [held / len(done)] * len(done)
        return [b * held / total for b in busy]

    def _release(self, entries: list[Entry]) -> None:
        lineage = self.lineage
        if not lineage.tracked:
            return  # ``live`` counts nothing
        for entry in entries:  # after the outputs: a source may be let go now
            lineage.live(entry.handle.label, -1)

    def _pass_on(
        self,
        batch: Batch,
        outputs: list[Handle],
        filtered: int = 0,
        counted: bool = False,
        now: float | None = None,
    ) -> None:
        """Queue a batch's ``outputs`` for the next stage (or the caller); ``counted``: they
        take their inputs' places among what is alive of each source; ``now``: the backend's
        clock, where the caller read it already for this event."""
        index = batch.stage
        stages = self.stages
        stats = stages[index].stats
        stats.tasks_out += len(outputs)
        stats.filtered += filtered
        lineage = self.lineage
        if lineage.tracked:
            for handle in outputs:
                lineage.made(handle.label, batch.entries)
                if not counted:
                    lineage.live(handle.label, 1)
        nxt = index + 1
        if nxt < len(stages):
            push = stages[nxt].queue.push
            if now is None:
                now = self.backend.now()
            for handle in outputs:
                push(Entry(handle), now)
        else:
            self.final.extend(outputs)
            self.final_bytes += sum(h.nbytes for h in outputs)

    # -- outputs as they are made (generator stages; ``engine.streams`` keeps the books) --
    def _on_outputs(self, event: BatchOutputs) -> None:
        """Outputs a running generator batch made: on to the next stage at once."""
        batch = self.batches.get(event.batch_id)
        if batch is None:  # given up on (timed out, its worker gone): tried again elsewhere
            self.backend.free(event.outputs)
            return
        streams.made(self.stages[batch.stage], batch, event.outputs, self.backend.now())
        self._forward(batch, event.outputs)

    def _forward(self, batch: Batch, outputs: list[Handle]) -> None:
        """Send a generator batch's outputs on, except those an earlier attempt at its
        inputs sent already (same position, same id: ``yields_outputs``)."""
        if not outputs:
            return
        outputs, dropped = streams.unsent(batch, outputs)
        if dropped:
            self.backend.free(dropped)
        if batch.entries[0].seek is not None:  # a recomputation: judged when it ends
            batch.held = [*(batch.held or []), *outputs]
            return
        if batch.sent is None:
            batch.sent = []
        batch.sent.extend(h.label for h in outputs)
        self._pass_on(batch, outputs)

    def _resume_streams(self) -> None:
        """Allow running generator batches more outputs where the edge after their stage
        has room (``policies.backpressure.stream_grant``); where it has none they stay
        paused at their ``yield``, holding one output at most."""
        now = None
        for index, stage in enumerate(self.stages):
            if not stage.streaming:
                continue
            nxt = index + 1
            consumer = self._consumer_batch(nxt)
            for batch in list(stage.streaming.values()):
                if batch.allowed is None:
                    continue
                more = stream_grant(
                    self._edge(nxt), self.budgets[nxt], consumer, batch.outstanding, batch.window
                )
                if not more:
                    continue
                now = self.backend.now() if now is None else now
                streams.allow(stage, batch, more, now)
                self.backend.resume(batch.worker_id, batch.batch_id, more)

    # -- failures: retries, lost payloads made again, workers gone ------------------------
    def _recompute(self, index: int, entry: Entry) -> bool:
        """Make a lost input of stage ``index`` again: its source task runs again, alone at
        every stage, keeping only the outputs on the way to it. False where that cannot work
        (a stage's own input, a batch-level output, a source already let go)."""
        label = entry.handle.label
        source = self.lineage.rerun(label) if index else None
        if source is None:
            return False
        seek = Seek(label, index, entry.attempts)
        for upstream in self.stages[:index]:
            if upstream.done:  # a finished stage takes work again: it needs a worker back
                upstream.done = False
                upstream.target = max(upstream.target, 1)
                self._placement_dirty = True
        self.stages[0].queue.push_suspect(Entry(source, seek=seek))
        self._next_autoscale = min(
            self._next_autoscale, self._last_autoscale + MIN_AUTOSCALE_SPACING_S
        )
        return True

    def _on_recomputed(self, index: int, seek: Seek, outputs: list[Handle]) -> None:
        """Outputs of one step of a recomputation: pass on the one on the way, drop the rest."""
        kept = [h for h in outputs if seek.leads_to(h.label)]
        self.backend.free([h for h in outputs if not seek.leads_to(h.label)])
        if not kept:
            message = (
                "the input's payload was lost (its node left the cluster) and running its "
                f"source again did not make it: stage {self.stages[index].spec.name!r} gave "
                "other outputs this time"
            )
            target = self.stages[seek.stage]
            self._record_failure(target, seek.label, "PayloadLost", message, None, seek.attempts)
            return
        handle = kept[0]
        self.lineage.live(handle.label, 1)
        nxt = index + 1
        if nxt == seek.stage:
            self.stages[nxt].stats.recovered += 1
            self.stages[nxt].queue.push(Entry(handle, attempts=seek.attempts), self.backend.now())
        else:
            self.stages[nxt].queue.push_suspect(Entry(handle, seek=seek))

    def _record_failure(
        self,
        stage: StageState,
        task: str,
        error_type: str,
        message: str,
        error: ErrorInfo | None,
        attempts: int,
    ) -> None:
        """Input ``task`` of ``stage`` failed for good: counted, recorded, told to listeners."""
        stage.stats.failed += 1
        if error is None or not error.permanent:
            # its source is journaled as failed, and the next run tries it again; a
            # ``PermanentError`` says trying again cannot help: finished, as filtered
            self.lineage.fail(task)
        record = FailureRecord(
            stage=stage.spec.name,
            task=task,
            error_type=error_type,
            message=message,
            traceback=named_sources(error.traceback, stage.spec.stage) if error else "",
            attempts=attempts,
            deferred=error is not None and error.deferred,
        )
        self.failures.append(record)
        if self._listeners:
            self._emit(FailureEvent(self.backend.now() - self._t0, record))

    def _retry_or_fail(
        self, index: int, entries: list[Entry], error: ErrorInfo, culprit: bool
    ) -> None:
        """``entries`` failed with ``error``; ``culprit``: they were all the worker was
        running, so the error is theirs (else it may be a neighbour's).

        A lost payload is its node's fault, not the input's: the node the handles name
        becomes suspect (``_suspect_node``), and an input lost alone whose handle names its
        node is made again from its source without spending an attempt, up to
        ``FORGIVEN_LOSSES`` times; past that (or with no node to blame) a loss spends an
        attempt like any failure, so that a loop of losses ends.
        """
        stage = self.stages[index]
        if error.lost:
            node = entries[0].handle.node
            # inputs from several nodes: which one lost it is not known (each runs again
            # alone, and the lost one tells)
            if node is not None and all(e.handle.node == node for e in entries):
                self._suspect_node(node)
        # an error counts against an input only when it is known to be its own (it ran
        # alone); a lost input is then made again from its source where that can work. A
        # batch tried again as a whole (``Entry.together``) counts as one input
        whole = entries[0].together is not None
        alone = culprit and (len(entries) == 1 or whole)
        limit = stage.spec.max_attempts or self.config.max_attempts
        final = (error.final or (error.lost and not whole)) and alone
        if not alone:
            # whose fault it was is not known: each input is tried again alone, without
            # spending an attempt, so the innocent go on whatever max_attempts is
            stage.stats.retried += len(entries)
            for entry in entries[:1] if whole else entries:
                stage.queue.push_suspect(entry)
            return
        if whole:  # its inputs share their attempts
            tries = max(e.attempts for e in entries)
            for entry in entries:
                entry.attempts = tries
        for entry in entries:
            forgiven = error.lost and not whole and self.lineage.forgive_loss(entry)
            if not forgiven:
                entry.attempts += 1
            if final or entry.attempts >= limit:
                if (
                    error.lost
                    and (forgiven or entry.attempts < limit)
                    and self._recompute(index, entry)
                ):
                    self.lineage.live(entry.handle.label, -1)
                    continue
                if forgiven:
                    entry.attempts += 1  # not made again after all: this try counts
                message = _together(error.message, len(entries)) if whole else error.message
                label = entry.handle.label
                self._record_failure(stage, label, error.type, message, error, entry.attempts)
                self.lineage.live(label, -1)  # after: its source is journaled as failed
                self.backend.free([entry.handle])
            else:
                stage.stats.retried += 1
                if not whole or entry is entries[0]:
                    stage.queue.push_suspect(entry)

    def _on_worker_gone(
        self,
        worker_id: str,
        error: ErrorInfo,
        kind: str = "died",
        undelivered: tuple[int, ...] = (),
    ) -> None:
        worker = self.workers.pop(worker_id, None)
        if worker is None:
            return
        if self._listeners and not worker.stopping:
            self._worker_event(kind, worker, reason=error.message)
        self._initial_workers.discard(worker_id)
        stage = self.stages[worker.stage]
        stage.pool.remove(worker_id, self.backend.now())
        self.cpu_book.release(worker)
        self.ledger.release(worker_id)
        self._placement_dirty = True
        if not worker.stopping:
            stage.stats.worker_deaths += 1
        held = [self.batches.pop(b, None) for m in worker.messages for b in m]
        batches = [b for b in held if b is not None and b.batch_id not in undelivered]
        for batch in held:
            if batch is not None and stage.spec.streams:
                streams.end(stage, batch, self.backend.now())
            if batch is not None and batch.batch_id in undelivered:
                # never reached the worker: back to the queue as it was, charged to no one
                stage.in_flight_tasks -= len(batch.entries)
                if batch.entries[0].together is not None:
                    stage.queue.push_suspect(batch.entries[0])  # a batch tried as a whole
                    continue
                for entry in batch.entries:
                    if batch.alone:
                        stage.queue.push_suspect(entry)
                    else:
                        stage.queue.push(entry, entry.since)
        for batch in batches:
            stage.in_flight_tasks -= len(batch.entries)
            streams.keep_sent(batch)
            self._retry_or_fail(worker.stage, batch.entries, error, culprit=len(batches) == 1)

    def _suspect_node(self, node: str) -> None:
        """A payload stored on ``node`` was lost: avoid it for a while (``engine.suspects``);
        one that left the node list already needs nothing."""
        if node in self.ledger.nodes:
            self.suspects.suspect(node, self.backend.now())

    # -- timeouts and stalls --------------------------------------------------------------
    def _check_timeouts(self, stage: StageState, now: float) -> None:
        """Kill the workers whose running batch is past the stage's ``timeout_s``.

        A worker runs its messages in order and each holds one batch here, so the batch at
        the head started when it was sent or when the one before it was seen to end. A
        generator's batch is late when it makes no output for that long (from its start,
        an output or being allowed more); not while it waits for room downstream.
        """
        limit = stage.spec.timeout_s
        assert limit is not None
        for worker in list(stage.pool.workers.values()):
            running = self._running_for(worker, now)
            if running is not None and running[1] > limit:
                self._time_out(stage, worker, *running)

    def _running_for(self, worker: Worker, now: float) -> tuple[Batch, float] | None:
        """The batch at the head of ``worker``'s messages and how long it has worked (a
        generator's: since its last output; none while it waits for room downstream)."""
        if not worker.messages:
            return None
        batch = self.batches.get(worker.messages[0][0])
        if batch is None or batch.paused_at is not None:
            return None
        return batch, now - max(batch.sent_at, worker.last_done, batch.progress_at)

    def _tell_long_batches(self, now: float) -> None:
        """Say once per stage without ``timeout_s``, in the log, that one of its batches has
        run for ``LONG_BATCH_S`` and ``LONG_BATCH_FACTOR`` times its stage's mean batch:
        a call that hangs (a dead mount, a stuck lock) otherwise held the run silently.
        Every ``LONG_CHECK_S``: it looks at every worker, and the limit is minutes."""
        if now < self._next_long_check:
            return
        self._next_long_check = now + LONG_CHECK_S
        for stage in self.stages:
            if stage.spec.timeout_s is not None or stage.spec.name in self._long_told:
                continue
            finished = sum(stage.service_counts)
            mean = stage.service_sum_s / finished if finished else 0.0
            limit = max(LONG_BATCH_S, LONG_BATCH_FACTOR * mean)
            for worker in stage.pool.workers.values():
                running = self._running_for(worker, now)
                if running is None or running[1] <= limit:
                    continue
                batch, elapsed = running
                self._long_told.add(stage.spec.name)
                usual = (
                    f"its batches took {mean:.3g} s on average"
                    if finished
                    else "none of its batches has finished yet"
                )
                log.warning(
                    "pipeline %r: a batch of stage %r (inputs %s) has run for %.0f s, and %s; "
                    "the stage has no timeout_s, so the run waits for it (with_(timeout_s=...) "
                    "kills such a batch's worker and retries its inputs)",
                    self.pipeline_name,
                    stage.spec.name,
                    ", ".join(e.handle.label for e in batch.entries),
                    elapsed,
                    usual,
                )
                break

    def _time_out(self, stage: StageState, worker: Worker, batch: Batch, elapsed: float) -> None:
        """The late batch fails as ``TaskTimeout`` (each input is retried alone), batches
        waiting behind it go back to the queue untouched, and the worker is killed."""
        stage.stats.timeouts += 1
        waiting = [b for m in list(worker.messages)[1:] for b in m]
        self._pop_batch(worker.worker_id, batch.batch_id)
        for batch_id in waiting:
            late = self._pop_batch(worker.worker_id, batch_id)
            if late is not None:
                for entry in late.entries:
                    stage.queue.push(entry, entry.since)  # its wait goes on
        n = len(batch.entries)
        what = f"a batch of {n} input{'s' if n != 1 else ''}"
        late = f"ran {elapsed:.1f} s"
        if stage.spec.streams:
            late = f"made no output for {elapsed:.1f} s (after {batch.made})"
        error = ErrorInfo(
            "TaskTimeout",
            f"stage {stage.spec.name!r}: {what} {late}, longer than its "
            f"timeout_s={stage.spec.timeout_s:g}; its worker was killed and replaced",
        )
        labels = ", ".join(e.handle.label for e in batch.entries)
        log.warning("%s (inputs %s)", error.message, labels)
        streams.keep_sent(batch)
        self._retry_or_fail(batch.stage, batch.entries, error, culprit=True)
        self._on_worker_gone(worker.worker_id, error, kind="timeout")
        self.backend.kill_worker(worker.worker_id)

    def _check_stall(self, now: float, active: bool) -> None:
        """An unfinished run with nothing in flight and no worker starting for ``STALL_S``:
        unless a stage with work wants workers the cluster has no room for (it waits, a node
        may join, and that is said once in the log), the engine itself is stuck, and the run
        stops with its state (``EngineStalled``) rather than hang."""
        self._tell_slow_setups(now)
        if (
            active
            or self.batches
            or self.final
            or any(s.pool.live_count > s.pool.ready_count for s in self.stages)
        ):
            self._quiet_since = None
            return
        if self._quiet_since is None:
            self._quiet_since = now
            self._stall_told = False
            return
        quiet = now - self._quiet_since
        if quiet <= STALL_S:
            return
        waiting = [s for s in self.stages if s.queue]
        unplaced = [s.spec.name for s in waiting if not s.pool.ready_count and s.target > 0]
        if not unplaced:
            raise EngineStalled(
                self._state_text(
                    f"pipeline {self.pipeline_name!r} made no progress for {quiet:.0f} s "
                    "with nothing in flight and no worker starting (an engine defect; please "
                    "report it with this state):"
                )
            )
        may_join = getattr(self.backend, "nodes_may_join", None)
        if may_join is not None and not may_join():
            cpus, gpus = self.ledger.totals()
            raise BackendError(
                self._state_text(
                    f"pipeline {self.pipeline_name!r} cannot go on: {', '.join(unplaced)} "
                    f"has work and no room for a worker, the cluster has {cpus:g} CPUs and "
                    f"{gpus:g} GPUs, and no node will join:"
                )
            )
        if not self._stall_told:
            self._stall_told = True
            cpus, gpus = self.ledger.totals()
            log.warning(
                self._state_text(
                    f"pipeline {self.pipeline_name!r} has waited {quiet:.0f} s for room for "
                    f"a worker of {', '.join(unplaced)} (the cluster has {cpus:g} CPUs and "
                    f"{gpus:g} GPUs); it goes on once a node joins or resources free up:"
                )
            )

    def _tell_slow_setups(self, now: float) -> None:
        """Say once per stage, in the log, that inputs wait for a worker whose ``setup()``
        has not returned for ``STALL_S`` (a model loading for minutes is fine; a setup that
        never returns hung the run without a word)."""
        for stage in self.stages:
            pool = stage.pool
            if pool.ready_count or not stage.queue or stage.spec.name in self._setup_told:
                continue
            starting = [w.started_at for w in pool.workers.values() if not w.ready]
            if starting and now - min(starting) > STALL_S:
                self._setup_told.add(stage.spec.name)
                log.warning(
                    "pipeline %r: %d input(s) of stage %r wait for a worker whose setup() has "
                    "not returned for %.0f s; the run goes on once one is ready",
                    self.pipeline_name,
                    len(stage.queue),
                    stage.spec.name,
                    now - min(starting),
                )

    def _state_text(self, headline: str) -> str:
        lines = [headline]
        for index, stage in enumerate(self.stages):
            queue, pool = stage.queue, stage.pool
            lines.append(
                f"  {stage.spec.name}: {len(queue.fresh)} queued, {len(queue.suspects)} to run "
                f"alone, {stage.in_flight_tasks} in flight, {pool.ready_count} ready of "
                f"{pool.live_count} live workers (target {stage.target}), done={stage.done}, "
                f"upstream done={self._upstream_done(index)}, "
                f"may feed next={self._may_feed(index)}, "
                f"reserved={pool.reserved.worker_id if pool.reserved else None}"
            )
        return "\n".join(lines)

    # -- completion -----------------------------------------------------------------------
    def _update_done(self) -> None:
        for index, stage in enumerate(self.stages):
            if not stage.done and self._upstream_done(index) and stage.backlog == 0:
                stage.done = True
                stage.stats.final_workers = stage.pool.live_count
                if self._listeners and stage.target:
                    why = "finished: no input left"
                    change = TargetChange(stage.spec.name, stage.target, 0, why)
                    self._emit(DecisionEvent(self.backend.now() - self._t0, (change,)))
                stage.target = 0  # free its resources for the stages still working
                self._next_autoscale = min(
                    self._next_autoscale, self._last_autoscale + MIN_AUTOSCALE_SPACING_S
                )

    def _finished(self) -> bool:
        self._update_done()
        return self.stages[-1].done and not self.final

    # -- scaling --------------------------------------------------------------------------
    def _resize_workers(self) -> None:
        """Book every placed worker at its stage's current memory figure (a stage whose
        workers are all booked at it already is not walked)."""
        for stage in self.stages:
            resources = stage.worker_resources()
            if stage.booked is not None and stage.booked == resources:
                continue
            for worker in stage.pool.live():
                held = self.ledger.held.get(worker.worker_id)
                if held is not None and held[0] is not resources and held[0] != resources:
                    self.ledger.resize(worker.worker_id, resources)
            stage.booked = resources

    def _refresh_nodes(self) -> None:
        """Adopt the backend's node list (workers on a vanished node are reported dead by
        the backend); a suspect node that left it is suspect no more."""
        self.ledger.refresh(self.backend.nodes())
        self.suspects.keep_present(self.ledger.nodes)

    def _autoscale(self, now: float, initial: bool = False) -> None:
        before = [s.target for s in self.stages]
        obs, budget = self._plan(now, initial)
        if self._listeners:
            after = [s.target for s in self.stages]
            if after != before:
                reasons = explain(obs, before, after, budget)
                changes = tuple(
                    TargetChange(s.spec.name, b, a, r or "")
                    for s, b, a, r in zip(self.stages, before, after, reasons, strict=True)
                    if a != b
                )
                self._emit(DecisionEvent(now - self._t0, changes))

    def _plan(self, now: float, initial: bool) -> tuple[list[StageObservation], Budget]:
        """Set every stage's target for this cycle; returns the observations and budget used."""
        self._placement_dirty = True
        self._last_autoscale = now
        self._next_autoscale = now + self.config.autoscale_interval_s
        self._refresh_nodes()
        self._resize_workers()
        cpus, gpus = self.ledger.totals()
        for stage in self.stages:
            stage.meter.roll()
        obs = observations(self.stages, self.ledger, self.source_done)
        budget = Budget(cpus, gpus, self.ledger.total_memory(), *self.ledger.engine_totals())
        if self.base_budget is not None and not self.config.stage_at_a_time:
            for index, (rate, o) in enumerate(zip(stage_rates(obs), obs, strict=True)):
                up = obs[index - 1] if index else None
                # outputs the producer has in flight at this pace count against the edge too
                producer_s = up.task_time_s * up.batch_size if up and up.task_time_s else 0.0
                self.budgets[index] = demand_budget(
                    self.base_budget, rate, o.workers, o.batch_size, producer_s
                )
        if self.config.stage_at_a_time:
            current = next((i for i, s in enumerate(self.stages) if not s.done), None)
            for index, stage in enumerate(self.stages):
                if index == current:
                    stage.target = plan(
                        [obs[index]], budget, self.config.autoscale, now, self.autoscale_state
                    )[0]
                else:
                    stage.target = 0
            return obs, budget
        if initial:
            # cold start: one worker per stage (or its pin) until measurements arrive
            for stage, o in zip(self.stages, obs, strict=True):
                stage.target = 0 if o.finished else (o.pinned or 1)
            return obs, budget
        targets = plan(obs, budget, self.config.autoscale, now, self.autoscale_state)
        for stage, target in zip(self.stages, targets, strict=True):
            stage.target = target
        return obs, budget

    def _reconcile(self) -> None:
        for stage in self.stages:
            excess = stage.pool.live_count - stage.target
            if excess <= 0:
                continue
            # stop the least useful first: not ready yet, then idle, then busy
            live = sorted(stage.pool.live(), key=_STOP_ORDER)
            for worker in live[:excess]:
                self._retire(stage, worker, f"target lowered to {stage.target}")
        if not self._placement_dirty:
            return
        self._placement_dirty = False
        self.ledger.gpu_cpu_reserve = cpus_per_gpu(self.stages, self.ledger)
        # a stage whose input has ended and whose queue is empty needs no new worker (one
        # replaced at the very end would set up for nothing); a retry or a recomputation
        # that reaches it later asks again (``_dispatch_stage``)
        short = [
            s
            for s in self.stages
            if s.pool.live_count < s.target and (s.queue or not self._upstream_done(s.spec.index))
        ]
        short.sort(key=lambda s: s.pool.live_count / max(s.target, 1))
        for stage in short:
            pool = stage.pool
            wanted = [
                f"{stage.spec.name}-{next(self.worker_seq)}"
                for _ in range(stage.target - pool.live_count)
            ]
            # a stage's first worker may share CPUs: without it the stream would stall; a
            # node suspected of losing payloads gets new workers only if no other can
            resources = stage.worker_resources()
            if stage.booked is not None and stage.booked != resources:
                stage.booked = None  # its workers are booked at two figures now
            placements = self.ledger.allocate_many(
                wanted,
                resources,
                overcommit_first=not pool.live_count,
                avoid=self.suspects.avoid,
            )
            niceness = 0
            if self.config.stage_priority:
                niceness = stage_niceness(stage.spec.index, len(self.stages))
            for worker_id, placement in zip(wanted, placements, strict=False):
                if niceness:
                    placement = dataclasses.replace(placement, niceness=niceness)
                worker = Worker(
                    worker_id,
                    stage.spec.index,
                    started_at=self.backend.now(),
                    node=placement.node_id,
                )
                pool.add(worker)
                self.workers[worker_id] = worker
                if len(pool) > stage.stats.peak_workers:
                    stage.stats.peak_workers = len(pool)
                self.backend.start_worker(worker_id, stage.spec, placement)
                if self._listeners:
                    self._worker_event("start", worker)

    # -- reporting (``engine.snapshot``) -------------------------------------------------
    def _progress(self, now: float) -> Progress:
        return Progress(
            self.pipeline_name,
            now - self._t0,
            self.admitted,
            self.outputs,
            self.skipped,
            self.source_done,
            self._startup_s,
            self._first_output_s,
        )

    def snapshot(self, now: float) -> RunSnapshot:
        """The run as a monitor sees it at ``now`` (the backend's clock)."""
        return run_snapshot(self._progress(now), self.stages, self.ledger, now)

    # -- events for monitors that want them -----------------------------------------------
    def _emit(self, event: RunEvent) -> None:
        for monitor in self._listeners:
            monitor.on_event(event)  # type: ignore[attr-defined]

    def _worker_event(
        self,
        kind: str,
        worker: Worker,
        reason: str | None = None,
        setup_s: float | None = None,
    ) -> None:
        name = self.stages[worker.stage].spec.name
        t = self.backend.now() - self._t0
        self._emit(WorkerEvent(t, kind, name, worker.worker_id, worker.node, reason, setup_s))

    def _run_started(self, nodes: list[Any]) -> RunStarted:
        journal = str(self.journal.path) if self.journal is not None else None
        return run_started(
            self._progress(self.backend.now()),
            self.description,
            "batch" if self.config.stage_at_a_time else "streaming",
            getattr(self.backend, "label", type(self.backend).__name__),
            self.stages,
            nodes,
            self.config.settings(journal),
        )

    def _tick(self, now: float) -> None:
        self._next_tick = now + TICK_S
        self.suspects.expire(now)
        for stage in self._timed:
            self._check_timeouts(stage, now)
        self._tell_long_batches(now)
        if self.journal is not None:
            self.journal.sync()
        if self.monitors:
            snap = self.snapshot(now)
            for monitor in self.monitors:
                monitor.on_tick(snap)

    def _finish(self, completed: bool) -> None:
        self._ended = True
        now = self.backend.now()
        progress = self._progress(now)
        fill_result(self.result, progress, self.stages, self.failures, completed)
        if self.monitors:
            snap = run_snapshot(progress, self.stages, self.ledger, now)
            for monitor in self.monitors:
                monitor.on_tick(snap)
                monitor.on_end(self.result)

    @property
    def closed(self) -> bool:
        return self._closed

    def request_stop(self) -> None:
        """Have the loop, iterated by another thread, stop the run at its next turn (within
        a second) as ``close`` would: a generator cannot be closed while another thread
        runs it."""
        self._stop_requested = True

    def close(self) -> None:
        """Stop every worker and close the journal (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.backend.shutdown()
        finally:
            if self.journal is not None:
                self.journal.close()
