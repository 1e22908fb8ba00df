"""The queue in front of a stage: handles with byte and count accounting, cut into batches."""

from __future__ import annotations

from collections import deque

from conveyor.engine.messages import Handle
from conveyor.engine.policies.backpressure import EdgeState


class Seek:
    """What a recomputation is after: the input ``label`` of stage ``stage`` whose payload was
    lost, and that input's failed attempts so far (they carry over to the new copy)."""

    __slots__ = ("attempts", "label", "stage")

    def __init__(self, label: str, stage: int, attempts: int) -> None:
        self.label = label
        self.stage = stage
        self.attempts = attempts

    def leads_to(self, label: str) -> bool:
        """Whether an output ``label`` is the sought input or one of its ancestors."""
        return self.label == label or self.label.startswith(label + ".")


class Entry:
    """A task waiting at or travelling through a stage, with its failed attempts so far.

    ``seek``: set on a source (and its descendants) being run again to make a lost input of
    a later stage; only outputs on the way to that input are kept.

    ``since``: when it joined the queue (the backend's clock; ``batch_wait_s`` counts from it).

    ``sent``: ids of outputs an earlier attempt of a generator stage sent on before it failed;
    the next attempt makes them again (same position, same id) and they are dropped, not
    sent twice. ``together``: the other inputs of a generator batch that sent outputs made
    from all of them (``first*j``) before it failed: it is tried again as it was, as a whole
    (the suspect queue holds the first entry only; bytes count them all).
    """

    __slots__ = ("attempts", "handle", "seek", "sent", "since", "together")

    def __init__(self, handle: Handle, attempts: int = 0, seek: Seek | None = None) -> None:
        self.handle = handle
        self.attempts = attempts
        self.seek = seek
        self.since = 0.0
        self.sent: set[str] | None = None
        self.together: list[Entry] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of its payload, and of the inputs tried again together with it."""
        if self.together is None:
            return self.handle.nbytes
        return self.handle.nbytes + sum(e.handle.nbytes for e in self.together)


class EdgeQueue:
    """Fresh entries in arrival order, plus suspects: retries that must run alone.

    Bytes are counted for both, so backpressure sees everything that is waiting.
    """

    __slots__ = ("bytes", "fresh", "hwm_bytes", "hwm_tasks", "suspects")

    #: how far past the oldest entry ``take`` looks for one stored on the worker's node
    LOOKAHEAD = 32

    def __init__(self) -> None:
        self.fresh: deque[Entry] = deque()
        self.suspects: deque[Entry] = deque()
        self.bytes = 0
        self.hwm_tasks = 0
        self.hwm_bytes = 0

    def __len__(self) -> int:
        return len(self.fresh) + len(self.suspects)

    def _grew(self) -> None:
        size = len(self.fresh) + len(self.suspects)
        if size > self.hwm_tasks:
            self.hwm_tasks = size
        if self.bytes > self.hwm_bytes:
            self.hwm_bytes = self.bytes

    def push(self, entry: Entry, now: float = 0.0) -> None:
        entry.since = now
        self.fresh.append(entry)
        self.bytes += entry.handle.nbytes
        self._grew()

    def push_suspect(self, entry: Entry) -> None:
        self.suspects.append(entry)
        self.bytes += entry.nbytes
        self._grew()

    def pop_suspect(self) -> Entry:
        entry = self.suspects.popleft()
        self.bytes -= entry.nbytes
        return entry

    def take(self, count: int, node: str | None = None) -> list[Entry]:
        """Up to ``count`` fresh entries, oldest first; for a worker on ``node``, entries whose
        data is stored there first, looking no further than ``LOOKAHEAD`` entries ahead (so
        nothing waits long behind local work)."""
        fresh = self.fresh
        if node is None or not fresh or fresh[0].handle.node in (None, node):
            if count == 1 and fresh:  # the common batch of one, without the list's loop
                entry = fresh.popleft()
                self.bytes -= entry.handle.nbytes
                return [entry]
            batch = [fresh.popleft() for _ in range(min(count, len(fresh)))]
        else:
            window = [fresh.popleft() for _ in range(min(self.LOOKAHEAD, len(fresh)))]
            local = [e for e in window if e.handle.node == node][:count]
            chosen = {id(e) for e in local}
            rest = [e for e in window if id(e) not in chosen]
            cut = count - len(local)
            batch = local + rest[:cut]
            fresh.extendleft(reversed(rest[cut:]))
        self.bytes -= sum(e.handle.nbytes for e in batch)
        return batch

    def state(self, expected_tasks: float = 0.0, expected_bytes: float = 0.0) -> EdgeState:
        return EdgeState(len(self), self.bytes, expected_tasks, expected_bytes)
