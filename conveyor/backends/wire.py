"""What crosses a process or actor boundary on the local and Ray backends: small named
messages, read with ``match``.

On the local backend the driver speaks to the root zygote and to each stage host over a
control socket (``send_ctrl``/``recv_ctrl``: one pickled message, with a socket's descriptor
for ``StartHost`` and ``Fork``), and to each worker over its own connection
(``send``/``recv``). On Ray, an actor's calls return records of the same kinds.

The messages are ``NamedTuple``s: they pickle as little as the plain tuples they replace,
and the worker messages are on the hot path of every batch.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.engine.messages import ErrorInfo, Handle

#: the largest control message (a stage travels as a file name, never inline)
CTRL_MSG_MAX = 1 << 16


# -- control: driver -> root zygote --------------------------------------------------------
class Init(NamedTuple):
    """The root's first message: the driver's import path, the payload store, the node,
    and how the driver logs (``LogSetup``): stages log as the driver does."""

    sys_path: list[str]
    store_root: str
    node: NodeInfo
    logs: LogSetup | None = None


class LogSetup(NamedTuple):
    """How the driver shows log lines on its terminal: the level and format of its root
    logger's handler that writes to standard error (or output), and the levels it gave
    named loggers. Workers are fresh processes, which Python leaves unconfigured."""

    level: int
    format: str | None = None
    datefmt: str | None = None
    style: str = "%"
    levels: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of_this_process(cls) -> LogSetup | None:
        """The driver's setup, where the program gave its root logger a handler writing to
        standard error or output (else ``None``: workers keep Python's defaults). A file
        handler is not copied: workers would write the file from many processes at once."""
        import logging

        root = logging.getLogger()
        streams = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
        shown = next(
            (
                h
                for h in root.handlers
                if type(h) is logging.StreamHandler and getattr(h, "stream", None) in streams
            ),
            None,
        )
        if shown is None:
            return None
        formatter = shown.formatter
        # the format's style ("%", "{" or "$"): the formatter keeps it only as a private
        # object, whose kind logging's own table names
        style = next(
            (
                key
                for key, (kind, _) in logging._STYLES.items()
                if formatter is not None and type(formatter._style) is kind
            ),
            "%",
        )
        named = [
            (name, logger.level)
            for name, logger in list(root.manager.loggerDict.items())
            if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET
        ]
        return cls(
            max(root.level, shown.level),
            getattr(formatter, "_fmt", None),
            getattr(formatter, "datefmt", None),
            style,
            tuple(named),
        )

    def apply(self) -> None:
        """Configure this process's loggers the same way (to standard error). A setup that
        cannot be applied leaves Python's defaults: a worker's logging must never stop it."""
        import logging

        options = {"format": self.format, "datefmt": self.datefmt}
        try:
            logging.basicConfig(
                level=self.level,
                style=self.style,  # type: ignore[arg-type]
                force=True,
                **{k: v for k, v in options.items() if v is not None},
            )
            for name, level in self.levels:
                logging.getLogger(name).setLevel(level)
        except (ValueError, TypeError):
            logging.basicConfig(force=True)


class StartHost(NamedTuple):
    """Load the stage pickled in ``stage_file`` and fork its host (the host's control
    socket comes with it)."""

    name: str
    stage_file: str
    node_setup: bool


# -- control: driver -> stage host ---------------------------------------------------------
class Fork(NamedTuple):
    """Fork a worker (its connection comes with it)."""

    worker_id: str
    info: WorkerInfo
    env: dict[str, str]


class Exit(NamedTuple):
    """To the root or a host: shut down (children get their grace period)."""


# -- control: stage host -> driver ---------------------------------------------------------
class Hello(NamedTuple):
    pid: int


class Loaded(NamedTuple):
    """The stage loaded and ``setup_on_node`` ran: workers may be forked."""


class LoadFailed(NamedTuple):
    error: ErrorInfo


class Forked(NamedTuple):
    worker_id: str
    pid: int


class ForkFailed(NamedTuple):
    worker_id: str
    error: ErrorInfo


class Exited(NamedTuple):
    """A worker process exited; ``reason`` says how (a signal, an exit code)."""

    worker_id: str
    reason: str


# -- driver -> worker ----------------------------------------------------------------------
class Work(NamedTuple):
    """Batches ``(batch_id, handles)`` to run in order; ``threads`` for each (``None``: the
    stage's own CPUs); a generator stage's batch makes ``allowance`` outputs before it waits
    for ``More`` (``None``: no limit)."""

    batches: list[tuple[int, list[Handle]]]
    threads: int | None = None
    allowance: int | None = None


class More(NamedTuple):
    """A running generator batch may make ``outputs`` more outputs."""

    batch_id: int
    outputs: int


class Stop(NamedTuple):
    """Finish what is held, tear down and exit; ``now``: a generator batch waiting for
    ``More`` ends there too (the run is shutting down)."""

    now: bool = False


# -- worker (a local process or a Ray actor) -> driver --------------------------------------
class Ready(NamedTuple):
    """Set up in ``setup_s``; its memory footprint then (0: not measured)."""

    setup_s: float
    memory_bytes: int = 0


class SetupFailed(NamedTuple):
    error: ErrorInfo


class Out(NamedTuple):
    """Outputs a running generator batch made (local backend)."""

    batch_id: int
    outputs: list[Handle]


class Failed(NamedTuple):
    """One batch raised (both backends): tried again or recorded by the controller."""

    batch_id: int
    error: ErrorInfo


class Done(NamedTuple):
    """The batches of one ``Work`` message (local backend): those that ended, in order, as
    columns (batch ``batch_ids[i]`` made ``outputs[i]``, ``filtered[i]`` of its inputs gave
    nothing, it took ``busy_s[i]`` and ``cpu_s[i]`` and waited ``queued_s[i]`` of that for a
    core; lists of numbers pickle as cheaply as plain tuples, where a named record per batch
    would cost every batch more), those that raised, and the worker's memory footprint."""

    batch_ids: list[int]
    outputs: list[list[Handle]]
    filtered: list[int]
    busy_s: list[float]
    cpu_s: list[float]
    queued_s: list[float]
    failed: list[Failed]
    memory_bytes: int


class Stopped(NamedTuple):
    """Torn down: the worker exits now."""


# -- Ray actor records ---------------------------------------------------------------------
class Placed(NamedTuple):
    """An actor's first answer: Ray scheduled it on ``node_id`` as process ``pid``."""

    node_id: str
    pid: int


class Output(NamedTuple):
    """One output of a batch: pickle bytes ``inline``, or ``None`` where it is stored (the
    call's list of stored outputs holds it, in record order); ``pickled``: the stored object
    is pickle bytes rather than the object itself."""

    label: str
    inline: bytes | None
    nbytes: int
    pickled: bool


class Ran(NamedTuple):
    """One batch of a Ray call done, with its worker's memory footprint."""

    batch_id: int
    outputs: list[Output]
    filtered: int
    busy_s: float
    cpu_s: float
    queued_s: float
    memory_bytes: int


class Made(NamedTuple):
    """One output of a running generator batch (a streaming call); where ``inline`` is
    ``None`` the output itself is the call's next item."""

    label: str
    nbytes: int
    pickled: bool
    inline: bytes | None


class Ended(NamedTuple):
    """A generator batch's last item: it made all its outputs."""

    filtered: int
    busy_s: float
    cpu_s: float
    queued_s: float
    memory_bytes: int


class Raised(NamedTuple):
    """A generator batch's last item: it raised part way."""

    error: ErrorInfo


# -- framing -------------------------------------------------------------------------------
def send_ctrl(sock: socket.socket, msg: Any, fds: list[int] | None = None) -> None:
    """One control message, with ``fds`` (descriptors the receiver takes over)."""
    data = pickle.dumps(msg, protocol=5)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def recv_ctrl(sock: socket.socket) -> tuple[Any, list[int]] | None:
    """One control message and the descriptors that came with it; ``None`` at EOF."""
    data, fds, _flags, _addr = socket.recv_fds(sock, CTRL_MSG_MAX, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return pickle.loads(data), list(fds)


def send(conn: Connection, msg: Any) -> None:
    """One message on a worker's connection."""
    conn.send_bytes(pickle.dumps(msg, protocol=5))


def recv(conn: Connection) -> Any:
    """The next message on a worker's connection (``EOFError``/``OSError``: it closed)."""
    return pickle.loads(conn.recv_bytes())
