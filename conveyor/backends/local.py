"""The embedded local backend: worker processes on this machine, payloads in shared memory.

A root process loads each stage once and forks a host per stage, which forks its workers
Workers talk to the controller over socket pairs; the controller only ever sees handles.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil

from conveyor.backends import wire
from conveyor.backends.devices import detect_cpus, detect_gpus
from conveyor.backends.shm_store import ShmStore
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
    WorkerSetupFailed,
    WorkerStopped,
)
from conveyor.engine.spec import StageSpec
from conveyor.errors import BackendError
from conveyor.interrupts import deferred_interrupts

NODE_ID = "local"
_ROOT_MAIN = "from conveyor.backends.local_host import main; main()"
#: How long a worker whose connection closed may wait for its exit status before we give up.
EXIT_STATUS_WAIT_S = 1.0
#: workers still finishing their batch or teardown this long after the run ended are said
WAIT_SAID_S = 2.0


@dataclass(eq=False)
class _Host:
    stage: StageSpec
    ctrl: socket.socket
    pid: int | None = None
    gone: bool = False
    loaded: bool = False
    failed: ErrorInfo | None = None
    waiting: list[str] = field(default_factory=list)  # workers asked for before it loaded


@dataclass(eq=False)
class _Worker:
    worker_id: str
    stage: StageSpec
    conn: Connection
    host: _Host
    pid: int | None = None
    ready: bool = False
    stopping: bool = False
    closed_at: float | None = None  # when its connection hit EOF
    exit_reason: str | None = None
    #: ids of batches whose send failed: the worker was already gone
    undelivered: list[int] = field(default_factory=list)


def available_memory() -> int:
    """Bytes this process tree may still take: the machine's available memory, or less
    where a cgroup (a container's limit) allows less."""
    available = psutil.virtual_memory().available
    with contextlib.suppress(OSError, ValueError):
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text())
            available = min(available, max(0, int(limit) - used))
    return int(available)


class LocalBackend:
    """Workers as processes on this machine.

    ``num_cpus``/``num_gpus`` default to what the machine has; declared values are honoured
    even when larger (for I/O-bound work and tests with fake GPUs). ``memory_budget_bytes``
    bounds the payload bytes that may sit in queues between stages. ``gpu_memory_gb`` is the
    memory of one GPU, used to turn ``Resources(gpu_memory_gb=...)`` into a fraction; it is
    read from NVML when not given.

    ``nvdecs_per_gpu``/``nvencs_per_gpu``: video decoder and encoder units of each GPU, which
    ``Resources(nvdecs=, nvencs=)`` are placed against; known from the GPU's model when not
    given (``devices.VIDEO_ENGINES``), else no limit. Declared values win, as for GPUs.

    ``memory_gb`` is the host memory the run may take, workers and queued payloads together;
    it defaults to what the machine (or its cgroup) has available when the backend is made.
    What is left after the payload budget is the node's memory for workers: the autoscaler
    starts no worker whose measured peak would not fit in it (each stage's first one aside).
    """

    def __init__(
        self,
        num_cpus: float | None = None,
        num_gpus: int | None = None,
        memory_budget_bytes: int | None = None,
        gpu_memory_gb: float | None = None,
        memory_gb: float | None = None,
        *,
        nvdecs_per_gpu: float | None = None,
        nvencs_per_gpu: float | None = None,
    ) -> None:
        for label, value in (
            ("num_cpus", num_cpus),
            ("memory_budget_bytes", memory_budget_bytes),
            ("gpu_memory_gb", gpu_memory_gb),
            ("memory_gb", memory_gb),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"LocalBackend: {label} must be > 0, got {value!r}")
        for label, value in (
            ("nvdecs_per_gpu", nvdecs_per_gpu),
            ("nvencs_per_gpu", nvencs_per_gpu),
        ):
            if value is not None and not value >= 0:
                raise ValueError(f"LocalBackend: {label} must be >= 0, got {value!r}")
        if num_gpus is not None and (num_gpus < 0 or int(num_gpus) != num_gpus):
            raise ValueError(
                f"LocalBackend: num_gpus must be a whole number >= 0, got {num_gpus!r}"
            )
        inventory = detect_gpus()
        self.num_cpus = float(num_cpus) if num_cpus is not None else float(detect_cpus())
        count = int(num_gpus) if num_gpus is not None else len(inventory.physical_ids)
        physical = list(inventory.physical_ids)
        # Declared GPUs beyond the hardware get the next indices (fake GPUs for tests).
        while len(physical) < count:
            physical.append(str(len(physical)))
        self.gpu_ids = physical[:count]
        self.gpu_memory_gb = gpu_memory_gb if gpu_memory_gb is not None else inventory.memory_gb
        known_decs, known_encs = inventory.video_engines
        self.nvdecs_per_gpu = nvdecs_per_gpu if nvdecs_per_gpu is not None else known_decs
        self.nvencs_per_gpu = nvencs_per_gpu if nvencs_per_gpu is not None else known_encs
        total = psutil.virtual_memory().total
        self.memory_budget_bytes = int(memory_budget_bytes or min(total // 8, 512 << 20))
        if memory_gb is None:
            # a machine short of memory still runs (each stage's first worker always starts)
            available = available_memory()
            self.worker_memory_bytes = max(available - self.memory_budget_bytes, available // 2)
        elif memory_gb * 2**30 <= self.memory_budget_bytes:
            raise ValueError(
                f"LocalBackend: memory_gb={memory_gb:g} leaves nothing for workers once queued "
                f"payloads have their {self.memory_budget_bytes / 2**30:.2f} GB "
                "(memory_budget_bytes)"
            )
        else:
            self.worker_memory_bytes = int(memory_gb * 2**30) - self.memory_budget_bytes
        self._store: ShmStore | None = None
        self._root: tuple[subprocess.Popen[bytes], socket.socket] | None = None
        self._hosts: dict[str, _Host] = {}
        self._workers: dict[str, _Worker] = {}
        self._by_fd: dict[int, _Worker | _Host] = {}
        self._selector: selectors.BaseSelector | None = None
        self._events: list[BackendEvent] = []

    # -- cluster --------------------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        return [
            NodeInfo(
                NODE_ID,
                self.num_cpus,
                len(self.gpu_ids),
                self.gpu_memory_gb,
                memory_bytes=self.worker_memory_bytes,
                nvdecs_per_gpu=self.nvdecs_per_gpu,
                nvencs_per_gpu=self.nvencs_per_gpu,
            )
        ]

    def now(self) -> float:
        return time.monotonic()

    def nodes_may_join(self) -> bool:
        """This machine is the whole cluster (``Backend``)."""
        return False

    def open(self) -> None:
        """Create the run's payload store and start the zygote that forks stage hosts: a
        caller that opens the backend while it still prepares the run (the CLI lists and
        checks its inputs) has the zygote's interpreter started by the time the first
        workers are asked for."""
        if self._store is None:
            self._store = ShmStore.create()
            self._selector = selectors.DefaultSelector()
            self._root_ctrl()

    @property
    def store(self) -> ShmStore:
        if self._store is None:
            raise BackendError("LocalBackend used before open()")
        return self._store

    # -- payloads -------------------------------------------------------------------------
    def put(self, obj: Any, label: str) -> Handle:
        return self.store.put(obj, label)

    def get(self, handle: Handle) -> Any:
        obj = ShmStore.get(handle)
        ShmStore.delete([handle])
        return obj

    def free(self, handles: Sequence[Handle]) -> None:
        ShmStore.delete(handles)

    def shared_bytes(self) -> int:
        """Bytes of payloads currently held in shared memory (for benchmarks and monitors)."""
        return self.store.bytes_on_disk() if self._store else 0

    # -- workers --------------------------------------------------------------------------
    def _root_ctrl(self) -> socket.socket:
        """The zygote that forks stage hosts, started on first use."""
        if self._root is not None and self._root[0].poll() is None:
            return self._root[1]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_ids)
        # -P: not the current folder first on its path, so that the root imports the
        # conveyor the driver runs (a checkout in the current folder would shadow it)
        proc = subprocess.Popen(  # our pid: the root tells the driver's death by it
            [sys.executable, "-P", "-c", _ROOT_MAIN, str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()],
            env=env,
        )
        theirs.close()
        logs = wire.LogSetup.of_this_process()
        init = wire.Init(list(sys.path), str(self.store.root), self.nodes()[0], logs)
        wire.send_ctrl(ours, init)
        self._root = (proc, ours)
        return ours

    def _host_for(self, stage: StageSpec) -> _Host:
        host = self._hosts.get(stage.name)
        if host is not None and not host.gone:
            return host
        stage_file = self.store.root / f"stage-{stage.index}.pkl"
        stage_file.write_bytes(stage.payload)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = wire.StartHost(stage.name, str(stage_file), stage.has_node_setup)
        wire.send_ctrl(self._root_ctrl(), request, [theirs.fileno()])
        theirs.close()
        host = _Host(stage, ours)
        self._hosts[stage.name] = host
        ours.setblocking(False)
        self._register(ours, host)
        return host

    def _register(self, fileobj: Any, owner: _Worker | _Host) -> None:
        assert self._selector is not None
        self._selector.register(fileobj, selectors.EVENT_READ, owner)

    def _unregister(self, fileobj: Any) -> None:
        assert self._selector is not None
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(fileobj)

    def start_worker(self, worker_id: str, stage: StageSpec, placement: WorkerPlacement) -> None:
        self.open()
        host = self._host_for(stage)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        conn = Connection(ours.detach())
        worker = _Worker(worker_id, stage, conn, host)
        self._workers[worker_id] = worker
        self._register(conn, worker)
        info = WorkerInfo(
            worker_id, stage.name, placement.node_id, placement.gpu_ids, placement.gpu_fraction
        )
        env = {
            "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_ids[i] for i in placement.gpu_ids),
            "CONVEYOR_WORKER_ID": worker_id,
            "CONVEYOR_NICENESS": str(placement.niceness),
        }
        try:
            wire.send_ctrl(host.ctrl, wire.Fork(worker_id, info, env), [theirs.fileno()])
        except OSError as exc:
            self._fail_worker(worker, ErrorInfo("BackendError", f"could not start worker: {exc}"))
        finally:
            theirs.close()
        if not host.loaded:
            host.waiting.append(worker_id)

    def stop_worker(self, worker_id: str, now: bool = False) -> None:
        """Let the worker finish what it holds and stop; ``now`` (the run is shutting
        down): a generator batch waiting to be allowed more outputs ends there too."""
        worker = self._workers.get(worker_id)
        if worker is None or (worker.stopping and not now):
            return
        worker.stopping = True
        with contextlib.suppress(OSError):  # already gone: the EOF path reports it
            wire.send(worker.conn, wire.Stop(now))

    def submit(
        self,
        worker_id: str,
        batches: list[tuple[int, list[Handle]]],
        threads: int | None = None,
        allowance: int | None = None,
    ) -> None:
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        # if it died, its in-flight work is retried when the death is reported; what could
        # not be sent is reported as such, so that no input is charged for the death
        if worker.closed_at is None:
            try:
                wire.send(worker.conn, wire.Work(batches, threads, allowance))
                return
            except OSError:
                pass
        worker.undelivered.extend(batch_id for batch_id, _ in batches)

    def resume(self, worker_id: str, batch_id: int, outputs: int) -> None:
        worker = self._workers.get(worker_id)
        if worker is not None and worker.closed_at is None:
            with contextlib.suppress(OSError):  # gone: its death is reported as usual
                wire.send(worker.conn, wire.More(batch_id, outputs))

    # -- events ---------------------------------------------------------------------------
    def _fail_worker(self, worker: _Worker, error: ErrorInfo) -> None:
        if worker.worker_id not in self._workers:
            return
        self._drop(worker)
        self._events.append(WorkerSetupFailed(worker.worker_id, error))

    def _drop(self, worker: _Worker) -> None:
        if self._workers.pop(worker.worker_id, None) is None:
            return
        self._unregister(worker.conn)
        with contextlib.suppress(OSError):
            worker.conn.close()

    def _on_host_message(self, host: _Host) -> None:
        while True:
            try:
                got = wire.recv_ctrl(host.ctrl)
            except BlockingIOError:
                return
            except OSError:
                got = None
            if got is None:
                self._on_host_gone(host)
                return
            msg, fds = got
            for fd in fds:
                os.close(fd)
            match msg:
                case wire.Hello(pid):
                    host.pid = pid
                case wire.Loaded():
                    host.loaded = True
                    host.waiting.clear()
                case wire.LoadFailed(error):
                    host.failed = error
                    for worker_id in host.waiting:
                        worker = self._workers.get(worker_id)
                        if worker is not None:
                            self._fail_worker(worker, error)
                    host.waiting.clear()
                case wire.ForkFailed(worker_id, error):
                    worker = self._workers.get(worker_id)
                    if worker is not None:
                        self._fail_worker(worker, error)
                case wire.Forked(worker_id, pid):
                    worker = self._workers.get(worker_id)
                    if worker is not None:
                        worker.pid = pid
                case wire.Exited(worker_id, reason):
                    worker = self._workers.get(worker_id)
                    if worker is not None:
                        worker.exit_reason = reason

    def _on_host_gone(self, host: _Host) -> None:
        host.gone = True
        self._unregister(host.ctrl)
        with contextlib.suppress(OSError):
            host.ctrl.close()
        if self._hosts.get(host.stage.name) is host:
            del self._hosts[host.stage.name]
        error = host.failed or ErrorInfo(
            "WorkerDied", f"the host process of stage {host.stage.name!r} exited"
        )
        for worker_id in host.waiting:
            worker = self._workers.get(worker_id)
            if worker is not None:
                self._fail_worker(worker, error)
        host.waiting.clear()

    def _on_worker_message(self, worker: _Worker) -> None:
        try:
            msg = wire.recv(worker.conn)
        except (EOFError, OSError):
            self._unregister(worker.conn)
            worker.closed_at = time.monotonic()
            return
        match msg:
            case wire.Out(batch_id, outputs):
                self._events.append(BatchOutputs(worker.worker_id, batch_id, outputs))
            case wire.Done(batch_ids, outputs, filtered, busy_s, cpu_s, queued_s, failed, memory):
                for failure in failed:
                    self._events.append(
                        BatchFailed(worker.worker_id, failure.batch_id, failure.error)
                    )
                if batch_ids:
                    columns = zip(
                        batch_ids, outputs, filtered, busy_s, cpu_s, queued_s, strict=True
                    )
                    outcomes = [
                        BatchOutcome(batch_id, made, nothing, busy, cpu, memory, queued)
                        for batch_id, made, nothing, busy, cpu, queued in columns
                    ]
                    self._events.append(BatchesDone(worker.worker_id, outcomes))
            case wire.Ready(setup_s, memory):
                worker.ready = True
                self._events.append(WorkerReady(worker.worker_id, setup_s, memory))
            case wire.SetupFailed(error):
                self._fail_worker(worker, error)
            case wire.Stopped():
                self._drop(worker)
                self._events.append(WorkerStopped(worker.worker_id))

    def _reap_closed(self) -> None:
        now = time.monotonic()
        for worker in list(self._workers.values()):
            if worker.closed_at is None:
                continue
            if worker.exit_reason is None and now - worker.closed_at < EXIT_STATUS_WAIT_S:
                continue
            reason = worker.exit_reason or "closed its connection (no exit status came)"
            self._drop(worker)
            if worker.stopping:
                self._events.append(WorkerStopped(worker.worker_id))
            elif not worker.ready:
                self._events.append(
                    WorkerSetupFailed(
                        worker.worker_id,
                        ErrorInfo("WorkerDied", f"worker process died during setup ({reason})"),
                    )
                )
            else:
                self._events.append(
                    WorkerDied(
                        worker.worker_id, f"worker process {reason}", tuple(worker.undelivered)
                    )
                )

    def poll(self, timeout: float) -> list[BackendEvent]:
        assert self._selector is not None
        pending_close = any(w.closed_at is not None for w in self._workers.values())
        if self._events:
            timeout = 0.0
        elif pending_close:
            timeout = min(timeout, 0.01)
        if self._selector.get_map():
            for key, _ in self._selector.select(max(timeout, 0.0)):
                owner = key.data
                if isinstance(owner, _Host):
                    self._on_host_message(owner)
                else:
                    self._on_worker_message(owner)
        elif timeout > 0:
            time.sleep(timeout)
        if pending_close or any(w.closed_at is not None for w in self._workers.values()):
            self._reap_closed()
        events, self._events = self._events, []
        return events

    # -- teardown -------------------------------------------------------------------------
    def kill_worker(self, worker_id: str) -> None:
        """Hard-kill a worker (tests and the shutdown path); its death is reported as usual."""
        worker = self._workers.get(worker_id)
        if worker is not None and worker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)

    def worker_pids(self) -> dict[str, int]:
        return {w.worker_id: w.pid for w in self._workers.values() if w.pid is not None}

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop every worker (each finishes its batch and runs its teardown, for up to
        ``grace_s``), then the processes, and remove the run's shared memory.

        An interrupt while the workers finish (a second Ctrl-C) kills them at once instead;
        what follows runs whatever arrives meanwhile, which is raised after it: a cleanup
        cut short left processes and the run's shared memory behind."""
        if self._store is None:
            return
        interrupted = True
        try:
            self._let_workers_stop(grace_s)
            interrupted = False
        finally:
            with deferred_interrupts():
                self._stop_processes(0.0 if interrupted else grace_s, said=not interrupted)

    def _let_workers_stop(self, grace_s: float) -> None:
        for worker_id in list(self._workers):
            self.stop_worker(worker_id, now=True)
        start = time.monotonic()
        told = False
        while self._workers and time.monotonic() - start < grace_s:
            self.poll(0.05)
            if not told and self._workers and time.monotonic() - start > WAIT_SAID_S:
                told = True
                print(
                    f"conveyor: waiting up to {grace_s:g} s for {len(self._workers)} "
                    "worker(s) to finish their batch and teardown (Ctrl-C kills them now)",
                    file=sys.stderr,
                    flush=True,
                )

    def _stop_processes(self, grace_s: float, said: bool) -> None:
        """Kill the workers still there, stop the hosts and the root, remove the store."""
        for worker in list(self._workers.values()):
            if worker.pid is not None:
                if said:  # on the console: a teardown that flushes buffered rows lost them
                    print(
                        f"conveyor: worker {worker.worker_id} did not stop within {grace_s:g} s "
                        "of the end of the run (its batch, setup or teardown still running); "
                        "killed",
                        file=sys.stderr,
                        flush=True,
                    )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
            self._drop(worker)
        for host in list(self._hosts.values()):
            with contextlib.suppress(OSError):
                wire.send_ctrl(host.ctrl, wire.Exit())
            self._unregister(host.ctrl)
            with contextlib.suppress(OSError):
                host.ctrl.close()
        if self._root is not None:
            proc, ctrl = self._root
            with contextlib.suppress(OSError):
                wire.send_ctrl(ctrl, wire.Exit())
            try:  # the root waits for its hosts, which wait for their workers
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                for host in self._hosts.values():
                    if host.pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(host.pid, signal.SIGKILL)
                proc.kill()
                proc.wait()
            ctrl.close()
            self._root = None
        self._hosts.clear()
        self._events.clear()
        if self._selector is not None:
            self._selector.close()
        self._selector = None
        if self._store is not None:
            self._store.destroy()
        self._store = None
