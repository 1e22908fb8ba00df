"""The per-stage host process of the local backend, and the worker loop it forks.

Started by ``LocalBackend`` with a control socket descriptor. The host loads the stage once (imports
happen once), runs ``setup_on_node``, then forks one worker per request: workers start in
milliseconds and share the host's imported modules. The host never runs user batches and
never starts threads, so forking it is safe. When the driver goes away the host takes its
workers down with it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from conveyor.backends.runtime import StageRunner
from conveyor.backends.shm_store import ShmStore
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.engine.messages import ErrorInfo, Handle

CTRL_MSG_MAX = 1 << 16


def send_ctrl(sock: socket.socket, msg: Any, fds: list[int] | None = None) -> None:
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
def worker_main(fd: int, runner: StageRunner, store: ShmStore) -> int:
    """Serve batches until told to stop or the driver disappears; returns the exit code."""
    conn = Connection(fd)
    send = conn.send_bytes
    started = time.perf_counter()
    try:
        runner.setup()
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which stops the run
        send(pickle.dumps(("setup_failed", ErrorInfo.from_exception(exc))))
        return 1
    send(pickle.dumps(("ready", time.perf_counter() - started)))
    get, put, delete = store.get, store.put, store.delete
    try:
        while True:
            try:
                msg = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                return 0
            if msg[0] == "stop":
                return 0
            results = []
            consumed: list[Handle] = []
            for batch_id, handles in msg[1]:
                begun = time.perf_counter()
                try:
                    tasks = [get(h) for h in handles]
                    outputs, labels, filtered = runner.run(tasks, [h.label for h in handles])
                    del tasks
                    out_handles = [put(o, lab) for o, lab in zip(outputs, labels, strict=True)]
                    del outputs
                except Exception as exc:  # noqa: BLE001 - a task failure, retried by the driver
                    results.append((batch_id, None, 0, 0.0, ErrorInfo.from_exception(exc)))
                    continue
                busy = time.perf_counter() - begun
                results.append((batch_id, out_handles, filtered, busy, None))
                consumed.extend(handles)
            send(pickle.dumps(("done", results), protocol=5))
            # Inputs are released only once their outputs are safely reported.
            delete(consumed)
    finally:
        with contextlib.suppress(BaseException):
            runner.teardown()
        with contextlib.suppress(BaseException):
            send(pickle.dumps(("stopped",)))


# -- the host ----------------------------------------------------------------------------
class Host:
    def __init__(self, ctrl_fd: int) -> None:
        self.ctrl = socket.socket(fileno=ctrl_fd)
        self.children: dict[int, str] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def load(self, init: dict[str, Any]) -> tuple[Any, ShmStore, NodeInfo]:
        sys.path[:] = init["sys_path"]
        with open(init["stage_file"], "rb") as f:
            stage = pickle.loads(f.read())
        node: NodeInfo = init["node"]
        if init["node_setup"]:
            runner = StageRunner(
                stage,
                init["stage_name"],
                WorkerInfo(
                    worker_id=f"{init['stage_name']}/node-setup",
                    stage=init["stage_name"],
                    node_id=node.node_id,
                ),
            )
            runner.setup_on_node(node)
        return stage, ShmStore(init["store_root"], "h"), node

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker_id = self.children.pop(pid, None)
            if worker_id is not None:
                with contextlib.suppress(OSError):
                    send_ctrl(self.ctrl, ("exited", worker_id, describe_status(status)))

    def fork_worker(
        self, stage: Any, store: ShmStore, info: WorkerInfo, env: dict[str, str], fd: int
    ) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                self.ctrl.close()
                os.close(self.wake_r)
                os.close(self.wake_w)
                os.environ.update(env)
                runner = StageRunner(stage, info.stage, info)
                code = worker_main(fd, runner, ShmStore(store.root, info.worker_id))
            finally:
                os._exit(code)
        os.close(fd)
        self.children[pid] = info.worker_id
        send_ctrl(self.ctrl, ("forked", info.worker_id, pid))

    def serve(self) -> None:
        first = recv_ctrl(self.ctrl)
        if first is None:
            return
        (_, init), _fds = first
        try:
            stage, store, _node = self.load(init)
        except BaseException as exc:  # noqa: BLE001 - reported; the driver ends the run
            failure: ErrorInfo | None = ErrorInfo.from_exception(exc)
            send_ctrl(self.ctrl, ("load_failed", failure))
        else:
            failure = None
            send_ctrl(self.ctrl, ("loaded",))
        # A host that failed to load stays until told to exit: closing with requests unread
        # would reset the socket and lose the error report.
        while True:
            readable, _, _ = select.select([self.ctrl, self.wake_r], [], [])
            if self.wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
                self.reap()
            if self.ctrl not in readable:
                continue
            got = recv_ctrl(self.ctrl)
            if got is None or got[0][0] == "exit":
                return
            (kind, *args), fds = got
            if kind == "fork":
                worker_id, info, env = args
                if failure is not None:
                    os.close(fds[0])
                    send_ctrl(self.ctrl, ("fork_failed", worker_id, failure))
                else:
                    self.fork_worker(stage, store, info, env, fds[0])

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Give workers time to tear down, then make sure none is left."""
        deadline = time.monotonic() + grace_s
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def main() -> None:
    host = Host(int(sys.argv[1]))
    try:
        host.serve()
    finally:
        host.shutdown()


if __name__ == "__main__":
    main()
