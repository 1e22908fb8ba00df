"""A stage's workers as the controller tracks them, indexed for O(1) dispatch choices.

With thousands of workers (the simulator runs 2,000-GPU clusters) scanning every worker for
each batch would dominate; instead ready workers sit in buckets by how many messages they
hold, and counts are kept as things change.

The choices take ``avoid``: nodes the controller suspects of losing what is stored on them
(a payload read from there was lost, and the backend has not yet seen the node leave).
Workers elsewhere come first; one on an avoided node is chosen only when the stage has no
ready worker on any other node, so a stage on one node never stalls. With nothing to avoid
(the common case) the choices cost what they did without it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

#: ``avoid`` when there is nothing to avoid
NOWHERE: frozenset[str] = frozenset()


@dataclass(eq=False, slots=True)
class Worker:
    worker_id: str
    stage: int
    started_at: float = 0.0
    ready: bool = False
    stopping: bool = False
    alone: bool = False  # holds a suspect task: gets nothing else meanwhile
    last_done: float = -math.inf  # when its last batch was seen to end (occupancy)
    node: str | None = None  # where it runs: batches whose data is there prefer it
    messages: deque[list[int]] = field(default_factory=deque)  # batch ids per message sent
    held_cpus: float = 0.0  # CPUs it counts as busy while it holds messages (``CpuBook``)
    occupied_since: float | None = None  # since when it has held messages (``Pool.occupied_s``)
    sent_batches: int = 0  # batches sent to it (``max_batches_per_worker``)

    @property
    def in_flight(self) -> int:
        return len(self.messages)


class Pool:
    """Workers of one stage: all of them, the live count, and who can take work now."""

    __slots__ = (
        "_closed_s",
        "_free",
        "_local",
        "_open",
        "_open_since",
        "_ready_on",
        "live_count",
        "ready_count",
        "reserved",
        "workers",
    )

    #: a worker holds at most this many messages (one running, one waiting)
    MAX_DEPTH = 2

    def __init__(self) -> None:
        self.workers: dict[str, Worker] = {}
        self.live_count = 0  # not asked to stop
        self.ready_count = 0  # ready and not asked to stop
        self.reserved: Worker | None = None  # left to run dry for a suspect
        self._free: tuple[dict[str, Worker], ...] = tuple({} for _ in range(self.MAX_DEPTH))
        # the same buckets by node, for batches whose data lives on one
        self._local: tuple[dict[str, dict[str, Worker]], ...] = tuple(
            {} for _ in range(self.MAX_DEPTH)
        )
        # ready (not stopping) workers per node: whether a stage has one off an avoided node
        self._ready_on: dict[str, int] = {}
        # ``occupied_s``: the time workers have held messages, ended spells and open ones
        self._closed_s = 0.0
        self._open = 0
        self._open_since = 0.0

    def occupied_s(self, now: float) -> float:
        """Seconds the stage's workers have held work, all of them together, up to ``now``.

        It grows while a batch runs, where the busy time the workers report grows when a
        batch ends: a busy fraction taken over a window shorter than a batch (a snapshot a
        second, of 12 s batches) read 0 and 1 in turn. Kept as sums, so that a snapshot of
        thousands of workers costs nothing.
        """
        return self._closed_s + self._open * now - self._open_since

    def _occupy(self, worker: Worker, now: float) -> None:
        if worker.occupied_since is None:
            worker.occupied_since = now
            self._open += 1
            self._open_since += now

    def _vacate(self, worker: Worker, now: float) -> None:
        since = worker.occupied_since
        if since is not None:
            worker.occupied_since = None
            self._open -= 1
            self._open_since -= since
            self._closed_s += max(0.0, now - since)

    def __len__(self) -> int:
        return len(self.workers)

    def ready_on(self, node: str | None) -> int:
        """Ready workers (not stopping) on ``node`` (``None``: anywhere)."""
        return self.ready_count if node is None else self._ready_on.get(node, 0)

    def _index(self, worker: Worker) -> None:
        """File ``worker`` in the bucket of what it holds now, if it may take more (it runs
        at every send and every batch's end: kept lean)."""
        wid = worker.worker_id
        node = worker.node
        for level, bucket in enumerate(self._free):
            if bucket.pop(wid, None) is not None and node is not None:
                local = self._local[level].get(node)
                if local is not None:
                    local.pop(wid, None)
                    if not local:
                        del self._local[level][node]
        depth = len(worker.messages)
        if (
            depth < self.MAX_DEPTH
            and worker.ready
            and not worker.stopping
            and not worker.alone
            and wid in self.workers
        ):
            self._free[depth][wid] = worker
            if node is not None:
                self._local[depth].setdefault(node, {})[wid] = worker

    def add(self, worker: Worker) -> None:
        self.workers[worker.worker_id] = worker
        self.live_count += 1

    def remove(self, worker_id: str, now: float) -> Worker | None:
        worker = self.workers.pop(worker_id, None)
        if worker is None:
            return None
        self._vacate(worker, now)
        if not worker.stopping:
            self.live_count -= 1
            if worker.ready:
                self._count_ready(worker, -1)
        if self.reserved is worker:
            self.reserved = None
        self._index(worker)
        return worker

    def _count_ready(self, worker: Worker, delta: int) -> None:
        self.ready_count += delta
        node = worker.node
        if node is not None:
            count = self._ready_on.get(node, 0) + delta
            if count:
                self._ready_on[node] = count
            else:
                self._ready_on.pop(node, None)

    def mark_ready(self, worker: Worker) -> None:
        if not worker.ready and not worker.stopping:
            self._count_ready(worker, 1)
        worker.ready = True
        self._index(worker)

    def mark_stopping(self, worker: Worker) -> None:
        if not worker.stopping:
            self.live_count -= 1
            if worker.ready:
                self._count_ready(worker, -1)
        worker.stopping = True
        if self.reserved is worker:
            self.reserved = None
        self._index(worker)

    def sent(self, worker: Worker, batch_ids: list[int], alone: bool, now: float) -> None:
        self._occupy(worker, now)
        worker.messages.append(batch_ids)
        worker.alone = alone
        if self.reserved is worker:
            self.reserved = None
        self._index(worker)

    def batch_done(self, worker: Worker, batch_id: int, now: float) -> None:
        """A batch finished; its message ends with its last batch, in whatever order they end."""
        for message in worker.messages:
            if batch_id in message:
                message.remove(batch_id)
                if not message:
                    worker.messages.remove(message)
                    if not worker.messages:
                        worker.alone = False
                        self._vacate(worker, now)
                    self._index(worker)
                return

    def ready_elsewhere(self, avoid: Collection[str]) -> bool:
        """Whether a ready worker runs on a node not in ``avoid``."""
        if not avoid:
            return self.ready_count > 0
        return self.ready_count > sum(self._ready_on.get(node, 0) for node in avoid)

    def _first(
        self, workers: Iterable[Worker], avoid: Collection[str], skip: Worker | None = None
    ) -> Worker | None:
        """The first of ``workers`` (not ``skip``) off the avoided nodes: the scan passes
        over at most the workers of those nodes."""
        for worker in workers:
            if worker is not skip and worker.node not in avoid:
                return worker
        return None

    def idle(self, avoid: Collection[str] = NOWHERE) -> Worker | None:
        """A ready worker with nothing in flight (for a suspect, which must run alone); off
        the ``avoid`` nodes unless the stage has no ready worker elsewhere."""
        free = self._free[0]
        if not avoid:
            return next(iter(free.values()), None)
        worker = self._first(free.values(), avoid)
        if worker is None and not self.ready_elsewhere(avoid):
            worker = next(iter(free.values()), None)
        return worker

    def may_feed_any(self, depth: int) -> bool:
        """Whether a worker other than the reserved one holds fewer than ``depth`` messages:
        where not, ``feedable`` finds none, whatever the node."""
        reserved = self.reserved
        for level in range(min(depth, self.MAX_DEPTH)):
            bucket = self._free[level]
            if len(bucket) > (reserved is not None and reserved.worker_id in bucket):
                return True
        return False

    def feedable(
        self, depth: int, node: str | None = None, avoid: Collection[str] = NOWHERE
    ) -> Worker | None:
        """The least busy worker that may take another message, never the reserved one;
        among the equally busy, one on ``node`` (where the batch's data is) if any. Off the
        ``avoid`` nodes, unless the stage has no ready worker elsewhere: then the batch waits
        for one rather than go where what it makes may be lost."""
        if avoid:
            if self.ready_elsewhere(avoid):
                return self._feedable_avoiding(depth, node, avoid)
            avoid = NOWHERE
        for level in range(min(depth, self.MAX_DEPTH)):
            if node is not None:
                for worker in self._local[level].get(node, {}).values():
                    if worker is not self.reserved:
                        return worker
            for worker in self._free[level].values():
                if worker is not self.reserved:
                    return worker
        return None

    def _feedable_avoiding(
        self, depth: int, node: str | None, avoid: Collection[str]
    ) -> Worker | None:
        reserved = self.reserved
        for level in range(min(depth, self.MAX_DEPTH)):
            if node is not None and node not in avoid:
                for worker in self._local[level].get(node, {}).values():
                    if worker is not reserved:
                        return worker
            worker = self._first(self._free[level].values(), avoid, reserved)
            if worker is not None:
                return worker
        return None

    def reserve_for_suspect(self, avoid: Collection[str] = NOWHERE) -> None:
        """Stop feeding the least busy worker so that it runs dry and can take a suspect; off
        the ``avoid`` nodes unless the stage has no ready worker elsewhere (a reserved worker
        on an avoided node is let go when there is)."""
        current = self.reserved
        if current is not None and (current.node not in avoid or not self.ready_elsewhere(avoid)):
            return
        busy = self._free[1]
        if not avoid:
            self.reserved = next(iter(busy.values()), None)
            return
        worker = self._first(busy.values(), avoid)
        if worker is None and not self.ready_elsewhere(avoid):
            worker = next(iter(busy.values()), None)
        self.reserved = worker

    def live(self) -> list[Worker]:
        return [w for w in self.workers.values() if not w.stopping]
