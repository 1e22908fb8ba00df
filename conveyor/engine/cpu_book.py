"""The CPU book: CPUs held on each node by each stage's workers while they hold a message.

A worker sent a message while it held none books CPUs until it holds none again
(``Worker.held_cpus``): its stage's ``cpus``, or the threads its message was granted. Two
rules read the book:

- ``may_start`` (``policies.first_output``): while a run fills, a batch starts only where
  its stage's other batches and the work after it leave it room, so that the first output
  is not held up between two stages by work that could wait;
- ``grant`` (``policies.threads``): while a run fills or a stage drains, a batch sent to an
  idle worker may use the node's idle cores, up to its stage's ``max_threads``.

Units: CPUs throughout (floats: fractions of a core add up), except what ``grant`` returns,
a count of threads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from conveyor.engine.policies.first_output import may_start
from conveyor.engine.policies.placement import Ledger
from conveyor.engine.policies.threads import batch_threads
from conveyor.engine.pool import Worker
from conveyor.engine.spec import StageSpec
from conveyor.engine.state import StageState

#: while a run fills, a stage whose batches take less than this is not held back for the
#: work on its way to the end (only for what is held): it is done before that work needs
#: the cores, and it feeds the stages behind it
QUICK_BATCH_S = 0.1


class CpuBook:
    """CPUs held per node and stage, and the rules that read them.

    ``stages`` and ``ledger`` are the controller's (read, never changed here);
    ``elastic_threads`` and ``first_output_first`` its settings of the same names.
    """

    def __init__(
        self,
        stages: Sequence[StageState],
        ledger: Ledger,
        elastic_threads: bool = True,
        first_output_first: bool = True,
    ) -> None:
        self._stages = stages
        self._ledger = ledger
        self._elastic = elastic_threads
        self._first_output_first = first_output_first
        self._held: dict[str | None, list[float]] = {}  # node -> CPUs per stage

    # -- the book -------------------------------------------------------------------------
    def _hold(self, worker: Worker, cpus: float) -> None:
        worker.held_cpus = cpus
        per_stage = self._held.get(worker.node)
        if per_stage is None:
            per_stage = self._held[worker.node] = [0.0] * len(self._stages)
        per_stage[worker.stage] += cpus

    def release(self, worker: Worker) -> None:
        """The worker holds no message any more: its CPUs are idle again."""
        if worker.held_cpus:
            self._held[worker.node][worker.stage] -= worker.held_cpus
            worker.held_cpus = 0.0

    def cpus_from(self, node: str | None, index: int) -> float:
        """CPUs held on ``node`` by workers of stage ``index`` and the stages after it."""
        held = self._held.get(node)
        return sum(held[index:]) if held else 0.0

    # -- the rules ------------------------------------------------------------------------
    def may_start(self, worker: Worker, spec: StageSpec, filling: bool) -> bool:
        """Whether ``worker`` may be sent a batch now: while the run fills (``filling``),
        only where this stage's other workers and the later stages leave CPUs for it
        (``policies.first_output``; a worker holding a message already counts for what it
        holds, so a quick stage's prefetching worker is no way around it)."""
        if not filling or not self._first_output_first:
            return True
        node = self._ledger.nodes.get(worker.node or "")
        if node is None:
            return True
        return may_start(spec.resources.cpus, node.total_cpus, self._ahead(worker, spec.index))

    def grant(self, worker: Worker, spec: StageSpec, filling: bool, draining: bool) -> int | None:
        """An idle worker is sent a message: book its CPUs, and grant the message the node's
        idle cores where its stage can use them (``policies.threads``). Returns the threads
        granted, ``None`` for the stage's own CPUs.

        Only while the run fills (``filling``: the last stage has not finished a batch yet)
        or this stage drains (``draining``: every stage before it is done): in between, a
        core idle at this moment is soon another stage's, and a batch on more threads than
        its stage's CPUs spends more CPU time for the same work. Every busy worker counts,
        niced ones too: threads that share a core wait for each other. Except while the run
        fills with ``first_output_first``: the stages before this one then get no new batch
        until it leaves them room, so their running batches hold the cores only until they
        end, and only this stage and the later ones count.
        """
        own = spec.resources.cpus
        held, threads = own, None
        node = self._ledger.nodes.get(worker.node or "")
        if self._elastic and spec.max_threads and node is not None and (filling or draining):
            seen = self.cpus_from(worker.node, 0)
            if filling and self._first_output_first:
                seen = self._ahead(worker, spec.index) + worker.held_cpus
            granted = batch_threads(own, spec.max_threads, node.total_cpus, seen)
            if granted > max(1, round(own)):
                held, threads = granted, granted
        self._hold(worker, held)
        return threads

    def _ahead(self, worker: Worker, index: int) -> float:
        """CPUs on ``worker``'s node that work at stage ``index`` and after it comes before
        while the run fills: its stage's other workers' batches, and what the stages after
        it hold, or, where work is on its way to the end there, what the most demanding
        stage left on that way can use (its threads): the first output must not find the
        cores taken between two of its hops. A stage whose batches take a moment
        (``QUICK_BATCH_S``) only waits for what is held."""
        held = self._held.get(worker.node)
        own = (held[index] if held else 0.0) - worker.held_cpus
        after = sum(held[index + 1 :]) if held else 0.0
        stage = self._stages[index]
        batch_s = stage.meter.busy_time.value
        if batch_s is not None and batch_s * stage.spec.batch_size < QUICK_BATCH_S:
            return own + after  # done before the work on its way needs the cores
        return own + max(after, self._way_to_the_end(worker.node, index))

    def _way_to_the_end(self, node: str | None, index: int) -> float:
        """The most CPUs one batch of a stage can take on ``node`` (its threads), over the
        stages from the first after ``index`` with work running or ready to start to the
        end; 0 where none after it has such work. Work is not ready to start where no
        worker of its stage is ready there yet (a model loading: its upstream goes on) nor
        as a partial batch waiting for its upstream (counting it would hold that upstream
        back for ever)."""
        node_info = self._ledger.nodes.get(node or "")
        total = node_info.total_cpus if node_info is not None else math.inf
        stages = self._stages
        for later in range(index + 1, len(stages)):
            stage = stages[later]
            queue = stage.queue
            startable = (
                bool(queue)
                and stage.pool.ready_on(node) > 0
                and (
                    bool(queue.suspects)
                    or len(queue.fresh) >= stage.spec.batch_size
                    or stages[later - 1].done  # its upstream is done: a partial batch goes
                )
            )
            if stage.in_flight_tasks or startable:
                return max(self.batch_cpus(s.spec, total) for s in stages[later:])
        return 0.0

    def batch_cpus(self, spec: StageSpec, node_cpus: float) -> float:
        """The most CPUs one batch of ``spec`` can use on a node of ``node_cpus``."""
        most = spec.resources.cpus
        if self._elastic and spec.max_threads:
            most = max(most, float(spec.max_threads))
        return min(most, node_cpus)
