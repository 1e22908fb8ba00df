"""What the controller keeps of each stage and of each batch in flight (its records, shared
by the controller's rooms: the CPU book, the snapshot)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from conveyor.engine.events import SERVICE_TIME_BUCKETS_S
from conveyor.engine.messages import Handle
from conveyor.engine.observe import StageMeter
from conveyor.engine.pool import Pool
from conveyor.engine.queues import EdgeQueue, Entry
from conveyor.engine.spec import StageSpec
from conveyor.resources import Resources
from conveyor.result import StageStats


@dataclass(eq=False, slots=True)
class Batch:
    """A batch sent to a worker, from its sending until its outcome is known."""

    batch_id: int
    stage: int
    worker_id: str
    entries: list[Entry]
    alone: bool
    sent_at: float = 0.0
    idle_send: bool = False  # the worker held nothing else when this was sent
    threads: int | None = None  # more threads than its stage's CPUs (``policies.threads``)
    # -- a generator stage's batch (``StageSpec.streams``): outputs come while it runs --
    made: int = 0  # outputs reported so far (sent on, or dropped as an earlier attempt's)
    made_bytes: int = 0
    sent: list[str] | None = None  # ids of the outputs it sent on
    skip: frozenset[str] | None = None  # ids earlier attempts sent on: dropped if made again
    allowed: int | None = None  # outputs it may make before it pauses (None: no limit)
    window: int = 0  # what ``stream_grant`` tops ``allowed`` up to ahead of ``made``
    progress_at: float = 0.0  # its last output or resume (``timeout_s`` bounds the gaps)
    paused_at: float | None = None  # it used up its allowance then
    paused_s: float = 0.0  # time it waited for room downstream, not working
    held: list[Handle] | None = None  # a recomputation's outputs, judged when it ends

    @property
    def outstanding(self) -> int:
        """Outputs it may still make before it pauses."""
        return 0 if self.allowed is None else max(0, self.allowed - self.made)


@dataclass(eq=False)
class StageState:
    """What the controller keeps of one stage: its queue, workers, measurements, target."""

    spec: StageSpec
    stats: StageStats
    queue: EdgeQueue = field(default_factory=EdgeQueue)
    pool: Pool = field(default_factory=Pool)
    meter: StageMeter = field(default_factory=StageMeter)
    in_flight_tasks: int = 0
    target: int = 0
    done: bool = False
    setup_deaths: int = 0
    #: batches per service-time bucket (``SERVICE_TIME_BUCKETS_S``, then one for slower)
    service_counts: list[int] = field(
        default_factory=lambda: [0] * (len(SERVICE_TIME_BUCKETS_S) + 1)
    )
    service_sum_s: float = 0.0
    #: one of its workers has reported its memory (or that it cannot be measured)
    memory_known: bool = False
    #: what every one of its placed workers is booked at in the ledger (``None``: not known)
    booked: Resources | None = None
    #: a generator stage's running batches, what they may still make before they pause,
    #: and the count and bytes of every output they reported (its outputs' mean size)
    streaming: dict[int, Batch] = field(default_factory=dict)
    outstanding: int = 0
    streamed: int = 0
    streamed_bytes: int = 0

    @property
    def backlog(self) -> int:
        return len(self.queue) + self.in_flight_tasks

    def note_memory(self, memory_bytes: int) -> None:
        """One of its workers reported its footprint (0 where the backend cannot tell:
        from then on the stage's memory is known to be what it declared)."""
        self.memory_known = True
        stats = self.stats
        stats.worker_memory_bytes = max(stats.worker_memory_bytes, memory_bytes)

    def worker_resources(self) -> Resources:
        """What one of its workers takes: its declared resources, with the memory its
        workers were measured to peak at where that is more than it declared."""
        declared = self.spec.resources
        measured = self.stats.worker_memory_bytes
        if measured <= declared.memory_bytes:
            return declared
        return dataclasses.replace(declared, memory_gb=measured / 2**30)
