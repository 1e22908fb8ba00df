"""The processes behind the local backend: a root zygote, one host per stage, and workers.

``LocalBackend`` starts the root with a control socket. The root loads each stage (imports
happen once, there) and forks a host per stage; the host runs ``setup_on_node`` and forks
one worker per request, so workers start in milliseconds and share the imported modules.
Neither root nor hosts run user batches or start threads, so forking them is safe.

Nothing outlives the driver, even one killed with ``kill -9``: the root and the hosts see
their control socket close; each host and worker also asks the kernel for ``SIGKILL`` when
its parent exits (``PR_SET_PDEATHSIG``), so a worker stuck in a long native call, or a host
in ``setup_on_node``, goes too. The root, whose parent is the driver, gets a signal it can
catch instead: it then takes its hosts down and removes the run's payload directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import math
import os
import pickle
import select
import shutil
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from conveyor.backends.runtime import BatchClock, MemoryGauge, StageRunner, lower_priority
from conveyor.backends.shm_store import ShmStore
from conveyor.backends.wire import (
    Done,
    Exit,
    Exited,
    Failed,
    Fork,
    Forked,
    ForkFailed,
    Hello,
    Init,
    Loaded,
    LoadFailed,
    More,
    Out,
    Ready,
    SetupFailed,
    StartHost,
    Stop,
    Stopped,
    Work,
    recv,
    recv_ctrl,
    send_ctrl,
)
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.engine.messages import ErrorInfo, Handle
from conveyor.errors import PermanentError

#: how long a host whose driver died lets idle workers tear down before killing them all
DRIVER_GONE_GRACE_S = 2.0
#: the signal the root gets when its parent (thread) exits; caught, so it can clean up
DRIVER_SIGNAL = signal.SIGUSR1
#: signals a whole process group gets (Ctrl-C, a closed terminal, a scheduler's stop) that
#: are the driver's to act on: a root killed by one left the run's shared memory behind.
#: Hosts and workers take SIGTERM and SIGHUP back (``_stoppable``), so that what a stage
#: starts (in ``setup_on_node`` too) stops when told (``Popen.terminate``).
DRIVERS_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
_libc: Any = None


class DriverGone(BaseException):
    """Raised in the root when the driver died: unwinds whatever it was doing to clean up."""


def die_with_parent(sig: int, parent: int) -> bool:
    """Ask the kernel to send ``sig`` when our parent exits (Linux; elsewhere a no-op).

    The signal follows the exit of the parent *thread* that forked us, and only that one
    parent: each generation asks for itself. Returns False when ``parent`` already exited
    before we asked (then no signal will come).
    """
    global _libc
    if sys.platform.startswith("linux"):
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(sig), *[ctypes.c_ulong(0)] * 3)
    return os.getppid() == parent


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {sig} ({name})"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


# -- the worker --------------------------------------------------------------------------
class Hangup(Exception):
    """The driver's end of a worker's connection closed (or it shuts the run down): the
    worker stops. Apart from ``EOFError``/``OSError`` so that a stage's own ``OSError`` (a
    missing file) fails its task, not the worker."""


class _Inbox:
    """The worker's end of its connection. While a generator batch waits to be allowed
    more outputs it reads on: messages for later are kept, in order, for the main loop."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.kept: deque[Any] = deque()

    def next(self) -> Any:
        """The next message to act on (``Hangup``: the driver is gone)."""
        if self.kept:
            return self.kept.popleft()
        return self._recv()

    def wait_for_more(self, batch_id: int) -> int:
        """Block until the driver allows batch ``batch_id`` more outputs; how many.
        ``Hangup`` when the driver shuts the run down meanwhile (it allows no more)."""
        while True:
            match self._recv():
                case More(batch, outputs) if batch == batch_id:
                    return int(outputs)
                case More():
                    continue  # for a batch that has ended: stale
                case Stop(now=True):
                    raise Hangup("the run is shutting down")
                case msg:
                    self.kept.append(msg)

    def send(self, data: bytes) -> None:
        try:
            self.conn.send_bytes(data)
        except OSError as exc:
            raise Hangup(str(exc)) from exc

    def _recv(self) -> Any:
        try:
            return recv(self.conn)
        except (EOFError, OSError) as exc:
            raise Hangup(str(exc)) from exc


def _stream_batch(
    runner: StageRunner,
    inbox: _Inbox,
    store: ShmStore,
    batch_id: int,
    tasks: list[Any],
    labels: list[str],
    threads: int | None,
    allowance: int | None,
) -> tuple[int, float]:
    """Run a generator stage's batch, sending each output as it is made; before making one
    more than it is allowed it waits (at the stage's ``yield``) for the driver's say-so.
    Returns inputs that gave nothing and the seconds spent waiting."""
    allowed = math.inf if allowance is None else allowance
    made, waited = 0, 0.0
    send = inbox.send
    outputs = runner.stream(tasks, labels, threads)
    try:
        while True:
            while made >= allowed:
                begun = time.perf_counter()
                allowed += inbox.wait_for_more(batch_id)
                waited += time.perf_counter() - begun
            try:
                obj, label = next(outputs)
            except StopIteration:
                return runner.filtered, waited
            handle = store.put(obj, label)
            del obj
            send(pickle.dumps(Out(batch_id, [handle]), protocol=5))
            made += 1
    finally:
        outputs.close()  # a failure part way: the stage's own ``finally`` runs now


def _read(get: Callable[[Handle], Any], handle: Handle) -> Any:
    """An input, or ``PermanentError`` where it cannot be read back (its unpickling raises:
    another try reads the same bytes, and the error was the stage's own to look at)."""
    try:
        return get(handle)
    except (OSError, PermanentError):
        raise
    except Exception as exc:
        raise PermanentError(
            f"input {handle.label} could not be read back (unpickled): {type(exc).__name__}: {exc}"
        ) from exc


def worker_main(fd: int, runner: StageRunner, store: ShmStore) -> int:
    """Serve batches until told to stop or the driver disappears; returns the exit code."""
    conn = Connection(fd)
    send = conn.send_bytes
    started = time.perf_counter()
    try:
        runner.setup()
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which stops the run
        send(pickle.dumps(SetupFailed(ErrorInfo.from_exception(exc))))
        return 1
    lower_priority(int(os.environ.get("CONVEYOR_NICENESS", "0")))
    me = os.getpid()  # a process the stage forks must not answer for the worker
    gauge = MemoryGauge()
    send(pickle.dumps(Ready(time.perf_counter() - started, gauge.read())))
    get, put, delete = store.get, store.put, store.delete
    inbox = _Inbox(conn)
    try:
        while True:
            try:
                msg = inbox.next()
            except Hangup:
                return 0
            match msg:
                case Stop():
                    return 0
                case Work(batches, threads, allowance):
                    pass  # run below
                case _:
                    continue  # ``More`` for a batch that has ended
            ended: list[int] = []  # the columns of ``Done``
            made: list[list[Handle]] = []
            gave_nothing: list[int] = []
            busy_s: list[float] = []
            cpu_s: list[float] = []
            queued_s: list[float] = []
            failed: list[Failed] = []
            consumed: list[Handle] = []
            ran_out = False
            for batch_id, handles in batches:
                clock = BatchClock()
                waited = 0.0
                try:
                    tasks = [_read(get, h) for h in handles]
                    labels = [h.label for h in handles]
                    if runner.streams:
                        out_handles: list[Handle] = []
                        filtered, waited = _stream_batch(
                            runner, inbox, store, batch_id, tasks, labels, threads, allowance
                        )
                    else:
                        outputs, labels, filtered = runner.run(tasks, labels, threads)
                        out_handles = [put(o, lab) for o, lab in zip(outputs, labels, strict=True)]
                        del outputs
                    del tasks
                except Hangup:
                    return 0  # the driver went away while a generator waited for it
                except BaseException as exc:  # noqa: BLE001 - a task failure, retried by the driver
                    # (KeyboardInterrupt raised by a stage's code too: workers ignore SIGINT)
                    if os.getpid() != me:
                        os._exit(0)  # a child the stage forked, that returned into our loop
                    failed.append(Failed(batch_id, ErrorInfo.from_exception(exc)))
                    if isinstance(exc, MemoryError):
                        ran_out = True
                    continue
                if os.getpid() != me:
                    os._exit(0)  # a child the stage forked: its outputs are not the worker's
                ended.append(batch_id)
                made.append(out_handles)
                gave_nothing.append(filtered)
                busy, cpu, queued = clock.read(waited)
                busy_s.append(busy)
                cpu_s.append(cpu)
                queued_s.append(queued)
                consumed.extend(handles)
            done = Done(ended, made, gave_nothing, busy_s, cpu_s, queued_s, failed, gauge.read())
            send(pickle.dumps(done, protocol=5))
            # Inputs are released only once their outputs are safely reported.
            delete(consumed)
            if ran_out:
                return 1  # what a MemoryError left behind fails the next inputs: a fresh worker
    finally:
        with contextlib.suppress(BaseException):
            runner.teardown()
        with contextlib.suppress(BaseException):
            send(pickle.dumps(Stopped()))


def _stoppable() -> None:
    """SIGTERM and SIGHUP back to their defaults in a host or a worker (the root ignores
    them): a stage's own processes inherit what it ignores."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


# -- processes that fork -----------------------------------------------------------------
class _Forker:
    """A single-threaded process that forks children and reaps them as they exit."""

    def __init__(self, ctrl: socket.socket) -> None:
        self.ctrl = ctrl
        self.children: dict[int, str] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def in_child(self) -> None:
        """What a fresh child must drop: this process's control socket and signal plumbing."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.ctrl.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def wait(self) -> tuple[Any, list[int]] | None:
        """Next control message (``None`` at EOF), reaping children while waiting."""
        while True:
            readable, _, _ = select.select([self.ctrl, self.wake_r], [], [])
            if self.wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
                self.reap()
            if self.ctrl in readable:
                return recv_ctrl(self.ctrl)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            name = self.children.pop(pid, None)
            if name is not None:
                self.on_exit(name, status)

    def on_late(self, name: str, grace_s: float) -> None:
        """A child still running ``grace_s`` after it was told to stop is killed now."""

    def on_exit(self, name: str, status: int) -> None:
        """A child exited; subclasses report it."""

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Give children time to finish (workers tear down), then make sure none is left."""
        deadline = time.monotonic() + grace_s
        while self.children:
            self.reap()
            left = deadline - time.monotonic()
            if not self.children or left <= 0:
                break
            # SIGCHLD writes to the wake pipe: sleep until a child exits, not in a poll loop
            if select.select([self.wake_r], [], [], left)[0]:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
        for pid, name in list(self.children.items()):
            self.on_late(name, grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.children.clear()
        stop_descendants()


_PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> None:
    """Become the parent of the processes our descendants leave behind (Linux; elsewhere a
    no-op): what a stage starts (a subprocess, a fork, a daemon) and its worker does not
    wait for then comes to us, and ``stop_descendants`` ends it with the run. They went to
    init and outlived the run, holding the driver's stdout open."""
    global _libc
    if sys.platform.startswith("linux"):
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), *[ctypes.c_ulong(0)] * 3)


def stop_descendants() -> None:
    """Kill what is left below this process (its workers are gone by now) and reap it."""
    import psutil

    with contextlib.suppress(psutil.Error):
        left = psutil.Process().children(recursive=True)
        for child in left:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(left, timeout=2.0)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


class StageHost(_Forker):
    """One stage on one node: runs ``setup_on_node``, then forks that stage's workers."""

    def __init__(
        self,
        ctrl: socket.socket,
        name: str,
        stage: Any,
        failure: ErrorInfo | None,
        node: NodeInfo,
        store_root: str,
        node_setup: bool,
    ) -> None:
        super().__init__(ctrl)
        adopt_orphans()  # what the stage's workers start ends with the run
        self.name = name
        self.stage = stage
        self.failure = failure
        self.node = node
        self.store_root = store_root
        self.node_setup = node_setup
        self.driver_gone = False  # its control socket closed without an "exit"

    def on_exit(self, name: str, status: int) -> None:
        with contextlib.suppress(OSError):
            send_ctrl(self.ctrl, Exited(name, describe_status(status)))

    def on_late(self, name: str, grace_s: float) -> None:
        """Said on stderr (the driver's console): its teardown may have been flushing rows."""
        print(
            f"conveyor: stage {self.name!r}, worker {name}: teardown did not finish within "
            f"{grace_s:g} s of the end of the run; killed",
            file=sys.stderr,
            flush=True,
        )

    def fork_worker(self, info: WorkerInfo, env: dict[str, str], fd: int) -> None:
        host = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                if not die_with_parent(signal.SIGKILL, host):
                    return  # the host is already gone
                self.in_child()
                _stoppable()
                os.environ.update(env)
                runner = StageRunner(self.stage, info.stage, info)
                code = worker_main(fd, runner, ShmStore(self.store_root, info.worker_id))
            finally:
                os._exit(code)
        os.close(fd)
        self.children[pid] = info.worker_id
        send_ctrl(self.ctrl, Forked(info.worker_id, pid))

    def serve(self) -> None:
        send_ctrl(self.ctrl, Hello(os.getpid()))
        if self.failure is None and self.node_setup:
            worker = WorkerInfo(f"{self.name}/node-setup", self.name, self.node.node_id)
            try:
                StageRunner(self.stage, self.name, worker).setup_on_node(self.node)
            except BaseException as exc:  # noqa: BLE001 - reported; the driver ends the run
                self.failure = ErrorInfo.from_exception(exc)
        if self.failure is None:
            send_ctrl(self.ctrl, Loaded())
        else:
            send_ctrl(self.ctrl, LoadFailed(self.failure))
        # A host that failed stays until told to exit: closing with requests unread would
        # reset the socket and lose the error report.
        while True:
            got = self.wait()
            match got:
                case None | (Exit(), _):
                    self.driver_gone = got is None
                    return
                case (Fork(worker_id), fds) if self.failure is not None:
                    os.close(fds[0])
                    send_ctrl(self.ctrl, ForkFailed(worker_id, self.failure))
                case (Fork(_, info, env), fds):
                    self.fork_worker(info, env, fds[0])


class Root(_Forker):
    """The zygote: loads each stage (its imports happen once, here) and forks its host.

    Stage hosts then run ``setup_on_node`` in parallel and share the imported modules with
    every worker they fork, so a pipeline of five pyarrow stages imports pyarrow once. The
    modules a stage lists in ``preload_modules`` (imported lazily by its code, like torch)
    are imported here too, before its host is forked. Such a host waits until no other
    request is pending: importing torch takes seconds, and the light stages asked for in
    the same breath should not wait for it.
    """

    #: how long to wait for more requests before starting a slow import
    SETTLE_S = 0.05

    def __init__(self, ctrl: socket.socket, driver: int) -> None:
        super().__init__(ctrl)
        for sig in DRIVERS_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        self.driver = driver
        self.driver_gone = False
        self.store_root: str | None = None

    def watch_driver(self) -> None:
        """Get ``DRIVER_SIGNAL`` when the driver exits, to stop even in a long import."""
        signal.signal(DRIVER_SIGNAL, self._on_parent_exit)
        if not die_with_parent(DRIVER_SIGNAL, self.driver):
            self.driver_gone = True  # died before we asked: its socket's EOF tells the rest

    def _on_parent_exit(self, signum: int, _frame: Any) -> None:
        # The signal also comes when only the driver thread that started us ended; our
        # parent is then still the driver process.
        if os.getppid() == self.driver:
            return
        signal.signal(signum, signal.SIG_IGN)
        if not self.driver_gone:
            self.driver_gone = True
            raise DriverGone

    def clean_up(self) -> None:
        """Once every host is down: a dead driver's payloads are ours to remove."""
        if self.driver_gone and self.store_root is not None:
            shutil.rmtree(self.store_root, ignore_errors=True)

    def serve(self) -> None:
        first = recv_ctrl(self.ctrl)
        if first is None:
            self.driver_gone = True
            return
        init: Init = first[0]
        self.store_root = init.store_root
        sys.path[:] = init.sys_path
        if init.logs is not None:  # stages log as the driver does (its hosts are forked)
            init.logs.apply()
        deferred: list[tuple[str, Any, ErrorInfo | None, bool, int]] = []
        while True:
            if deferred and not self._pending(self.SETTLE_S):
                for name, stage, failure, node_setup, fd in deferred:
                    if failure is None:
                        failure = self._preload(stage)
                    self.fork_host(init, name, stage, failure, node_setup, fd)
                deferred.clear()
            got = self.wait()
            match got:
                case None | (Exit(), _):
                    self.driver_gone = self.driver_gone or got is None
                    for *_, fd in deferred:
                        os.close(fd)
                    return
                case (StartHost(name, stage_file, node_setup), fds):
                    stage, failure = self._load(stage_file)
                    slow = stage is not None and any(
                        m not in sys.modules for m in stage.preload_modules
                    )
                    if slow:
                        deferred.append((name, stage, failure, node_setup, fds[0]))
                    else:
                        self.fork_host(init, name, stage, failure, node_setup, fds[0])

    def _pending(self, timeout: float) -> bool:
        readable, _, _ = select.select([self.ctrl], [], [], timeout)
        return bool(readable)

    @staticmethod
    def _load(stage_file: str) -> tuple[Any, ErrorInfo | None]:
        try:
            with open(stage_file, "rb") as f:
                return pickle.loads(f.read()), None
        except BaseException as exc:  # noqa: BLE001 - the stage host reports it
            return None, ErrorInfo.from_exception(exc)

    @staticmethod
    def _preload(stage: Any) -> ErrorInfo | None:
        try:
            for module in stage.preload_modules:
                importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - the stage host reports it
            return ErrorInfo.from_exception(exc)
        return None

    def fork_host(
        self,
        init: Init,
        name: str,
        stage: Any,
        failure: ErrorInfo | None,
        node_setup: bool,
        fd: int,
    ) -> None:
        root = os.getpid()
        pid = os.fork()
        if pid == 0:  # the stage host
            host = None
            try:
                if not die_with_parent(signal.SIGKILL, root):
                    return  # the root is already gone
                signal.signal(DRIVER_SIGNAL, signal.SIG_DFL)
                self.in_child()
                _stoppable()
                host = StageHost(
                    socket.socket(fileno=fd),
                    name,
                    stage,
                    failure,
                    init.node,
                    init.store_root,
                    node_setup,
                )
                host.serve()
            finally:
                if host is not None:
                    host.shutdown(DRIVER_GONE_GRACE_S if host.driver_gone else 5.0)
                os._exit(0)
        os.close(fd)
        self.children[pid] = name


def main() -> None:
    """``python -c ... CTRL_FD DRIVER_PID``: serve the driver, then leave nothing behind."""
    driver = int(sys.argv[2]) if len(sys.argv) > 2 else os.getppid()
    root = Root(socket.socket(fileno=int(sys.argv[1])), driver)
    try:
        root.watch_driver()
        root.serve()
    except DriverGone:
        pass
    finally:
        try:
            # hosts get a little longer than they give their workers, then are killed
            with contextlib.suppress(DriverGone):
                root.shutdown(DRIVER_GONE_GRACE_S + 1.0 if root.driver_gone else 5.0)
            signal.signal(DRIVER_SIGNAL, signal.SIG_IGN)
            root.clean_up()
        finally:
            os._exit(0)  # nothing left to flush: skip the interpreter's slow finalization


if __name__ == "__main__":
    main()
