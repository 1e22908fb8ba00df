"""What backends and the controller say to each other: handles, placements and worker events.

Backends import these; the controller never imports a backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from conveyor.errors import DeferredError, PermanentError


class Handle(NamedTuple):
    """A task's payload as the controller sees it: an opaque reference, its size and its id.

    ``ref`` is backend-specific (inline bytes or a shared-memory path locally, an ObjectRef on
    Ray, a token in the simulator). The controller never looks inside. ``node`` is where the
    payload is stored when that matters (a cluster's object store), so that the controller can
    hand it to a worker there; ``None`` for inline payloads and single-machine backends.
    """

    ref: Any
    nbytes: int
    label: str
    node: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    """Where a worker runs: its node and, for GPU workers, device indices and share; and how
    much lower than the default its CPU priority is (a ``nice`` increment)."""

    node_id: str
    gpu_ids: tuple[int, ...] = ()
    gpu_fraction: float = 0.0
    niceness: int = 0


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An exception as text, so it crosses process boundaries whatever its type."""

    type: str
    message: str
    traceback: str = ""
    #: the stage said retrying cannot help (it raised ``PermanentError``)
    permanent: bool = False
    #: the stage said only a later run can help (it raised ``DeferredError``)
    deferred: bool = False
    #: the input's stored payload is gone (its node left the cluster): the input itself is
    #: fine, and only making it again from its source can help
    lost: bool = False

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        """``exc`` as text, whatever it does: an exception whose ``__str__`` raises is said by
        its type (formatting it killed the worker, and the record said only "worker stopped
        with work in flight"), and a message of megabytes is cut to ``MAX_MESSAGE_CHARS``,
        a traceback to ``MAX_ERROR_CHARS`` with the message in it cut alike (each attempt
        crossed the socket with it, and every record kept it: 760 MB for 40 failures of a
        10 MB message; a stage putting its input in its message held 165 KB per failure in
        the driver, 1.6 GB for 1% of a million inputs)."""
        import traceback

        try:
            message = str(exc)
        except Exception as inner:  # noqa: BLE001 - said instead
            message = f"<{type(exc).__name__} whose message could not be made: {inner!r}>"
        try:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        except Exception:  # noqa: BLE001 - the frames without the message
            text = "".join(traceback.format_tb(exc.__traceback__))
        short = _cut(message, MAX_MESSAGE_CHARS)
        if short != message:  # the traceback's last line holds it again
            text = text.replace(message, short)
        return cls(
            type=type(exc).__name__,
            message=short,
            traceback=_cut(text),
            permanent=isinstance(exc, PermanentError),
            deferred=isinstance(exc, DeferredError),
        )

    @property
    def final(self) -> bool:
        """Whether another attempt in this run is pointless (the input's own error)."""
        return self.permanent or self.deferred


#: the most of a failure's traceback a record keeps
MAX_ERROR_CHARS = 64 << 10
#: the most of a failure's message a record keeps (in its traceback too)
MAX_MESSAGE_CHARS = 4 << 10


def _cut(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text``, its middle left out past ``limit`` characters (its start names the error,
    its end is where it was raised)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters left out] ...\n{text[-half:]}"


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """A batch a worker finished: output handles, how many inputs gave nothing, busy time,
    the CPU time the worker's process spent on it (all its threads), the worker's peak
    memory footprint so far in bytes (0: not measured), and how much of the busy time its
    thread waited for a core (``backends.core_wait``; 0: none, or not measured)."""

    batch_id: int
    outputs: list[Handle]
    filtered: int
    busy_s: float
    cpu_s: float = 0.0
    memory_bytes: int = 0
    queued_s: float = 0.0


# -- events a backend reports from poll() ------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkerReady:
    worker_id: str
    setup_s: float
    #: the worker's peak memory footprint once set up, in bytes (0: not measured)
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class WorkerSetupFailed:
    worker_id: str
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class BatchesDone:
    worker_id: str
    outcomes: list[BatchOutcome]


@dataclass(frozen=True, slots=True)
class BatchOutputs:
    """Outputs a batch of a generator stage has made so far, sent on while it makes the
    rest (``StageSpec.streams``); its ``BatchesDone`` or ``BatchFailed`` follows."""

    worker_id: str
    batch_id: int
    outputs: list[Handle]


@dataclass(frozen=True, slots=True)
class BatchFailed:
    worker_id: str
    batch_id: int
    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class WorkerDied:
    worker_id: str
    reason: str
    #: batches the backend knows never reached the worker (sent after it died): they go
    #: back to their queue as they were, charged to no input
    undelivered: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkerStopped:
    worker_id: str


BackendEvent = (
    WorkerReady
    | WorkerSetupFailed
    | BatchOutputs
    | BatchesDone
    | BatchFailed
    | WorkerDied
    | WorkerStopped
)
