"""The Ray backend: workers are Ray actors, handles are ObjectRefs, Ray does the accounting.

Every worker is an actor that asks Ray for its real resources (CPUs, a GPU fraction or whole
GPUs) and is pinned to the node the placement policy chose, so Ray's own books stay true and
Conveyor can share a cluster with other Ray work. Inside the actor the stage runs through the
same ``StageRunner`` as on the local backend, so stage semantics do not depend on the backend.

Payloads. A worker's call returns two objects: a small record per batch (counts, timing,
sizes, and outputs of at most 32 KiB inline as pickle bytes), and one list of every larger
output of the call. Return values of an actor call are owned by the caller (the driver), not
by the actor, so they outlive the worker that made them; they stay in the object store of the
node that produced them. A handle to a stored output is that list's ref and a position in it:
a consumer maps the list (NumPy/Arrow buffers and pickle bytes alike are out-of-band, so
without a copy) and takes its item. Two fixed returns cost one reply; a streaming generator
(one report per item) cost about half as much again in driver and worker CPU per call. The
controller only ever holds ``Handle``s; ``get`` fetches a payload to the driver for the last
stage's outputs alone.

A generator stage (``StageSpec.streams``) is the exception: each of its batches is one
streaming call (``num_returns="streaming"``), whose items are a small record per output, then
that output itself where it is stored, then a record of the batch's end. Items of a streaming
call are owned by the caller too. The driver takes items only while the batch may make more
outputs (``submit``'s ``allowance``, then ``resume``), and Ray pauses the actor's generator
once it is ``STREAM_AHEAD`` items ahead of what the driver took: backpressure reaches into the
running batch.

``nbytes`` of a handle is measured in the worker by pickling the output with protocol 5 and
a buffer callback: out-of-band buffers (NumPy, Arrow) are counted, not copied, so the figure is
what Ray stores, give or take its framing. An output with no such buffers is shipped as those
very pickle bytes, so it is serialized once.

Ray is imported by this module only; ``import conveyor`` and the local backend never load it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
import os
import pickle
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import cloudpickle

try:
    import ray
except ModuleNotFoundError as exc:  # said with what installs it, on the command line too
    if exc.name != "ray":
        raise
    raise ModuleNotFoundError(
        "the Ray backend needs Ray: pip install 'conveyor[ray]'", name="ray"
    ) from None
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from conveyor.backends.runtime import BatchClock, MemoryGauge, StageRunner, lower_priority
from conveyor.backends.shm_store import claim_dir, sweep_stale
from conveyor.backends.wire import (
    Ended,
    Failed,
    Made,
    Output,
    Placed,
    Raised,
    Ran,
    Ready,
    SetupFailed,
)
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
from conveyor.errors import BackendError, UnpicklablePayload

log = logging.getLogger(__name__)

#: outputs up to this size travel inline in the batch record (a store round trip costs more)
INLINE_LIMIT = 32 * 1024
#: inline bytes per batch record; beyond it small outputs are stored like large ones, so the
#: record stays under Ray's own inline threshold (100 KiB) and never lands in the object store
RECORD_INLINE_MAX = 64 * 1024
#: how often poll() compares the cluster's live nodes with the nodes holding workers
NODE_CHECK_S = 0.5
#: how long a GPU-memory probe of a new node may take before its memory counts as unknown
PROBE_TIMEOUT_S = 60.0
DEFAULT_MEMORY_BUDGET = 512 << 20
#: items a streaming call may make beyond those the driver took before Ray pauses it: one
#: output's record and its payload
STREAM_AHEAD = 2
#: longest actor name, and longest stem of an actor class name: Ray takes any non-empty name,
#: but the dashboard's columns and the process title (``ray::<Class>.run``) should stay short
NAME_MAX = 64
#: set to 1 to see Ray's own messages about dying workers and nodes on the console again
RAY_LOGS_ENV = "CONVEYOR_RAY_LOGS"
#: error messages Ray publishes to the driver when a worker or a node dies: the raylet's "A
#: worker died or was killed ...", a core worker's crash, the GCS removing a node, a raylet's
#: death with the tail of its log. Conveyor reports these deaths itself, in one line.
DEATH_MESSAGE_TYPES = frozenset({"worker_died", "worker_crash", "node_removed", "raylet_died"})

_GPU_MEMORY_CACHE: dict[str, float | None] = {}  # node id -> GB of its GPU 0 (per process)


# -- payloads -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RayPayload:
    """What ``Handle.ref`` holds on Ray: pickle bytes inline, or an ObjectRef.

    ``index``: the ref is a call's list of stored outputs and the payload is that item
    (``None``: the ref is the payload itself, as ``put`` stores it). ``pickled`` says the
    stored object is pickle bytes (to ``pickle.loads``) rather than the object itself (stored
    by Ray, so NumPy/Arrow buffers are read without a copy).
    """

    ref: ray.ObjectRef | None = None
    data: bytes | None = None
    pickled: bool = True
    index: int | None = None


@dataclass(frozen=True, slots=True)
class _Encoded:
    inline: bytes | None  # small: pickle bytes to carry in the record
    store: Any  # large: what to put in the object store
    pickled: bool
    nbytes: int


def _dumps(obj: Any, sizes: list[int] | None) -> bytes:
    callback = None if sizes is None else (lambda buf: sizes.append(memoryview(buf).nbytes))
    try:
        return pickle.dumps(obj, protocol=5, buffer_callback=callback)
    except Exception:  # noqa: BLE001 - classes defined in __main__ or a function: by value
        if sizes is not None:
            sizes.clear()
    try:
        return cloudpickle.dumps(obj, protocol=5, buffer_callback=callback)
    except UnpicklablePayload.CAUSES as exc:
        raise UnpicklablePayload.of(obj, exc) from exc


def encode(obj: Any, inline_ok: bool = True) -> _Encoded:
    """Measure a payload and decide how it travels (see the module docstring)."""
    sizes: list[int] = []
    inband = _dumps(obj, sizes)
    if not sizes:
        if inline_ok and len(inband) <= INLINE_LIMIT:
            return _Encoded(inband, None, True, len(inband))
        return _Encoded(None, inband, True, len(inband))
    total = len(inband) + sum(sizes)
    if inline_ok and total <= INLINE_LIMIT:
        data = _dumps(obj, None)
        return _Encoded(data, None, True, len(data))
    return _Encoded(None, obj, False, total)


def _is_lost(exc: BaseException) -> bool:
    return isinstance(exc, ray.exceptions.ObjectLostError)


def _error(exc: BaseException) -> ErrorInfo:
    """An exception as ``ErrorInfo``; a payload lost with its node says so: retrying the call
    cannot help, making the input again from its source can (the controller does)."""
    info = ErrorInfo.from_exception(exc)
    if _is_lost(exc):
        info = dataclasses.replace(
            info,
            message="the input's payload was lost (its node left the cluster): "
            + info.message.strip().splitlines()[0],
            lost=True,
        )
    return info


def _extend_sys_path(paths: Sequence[str]) -> None:
    """Put the driver's import paths first where they exist on this node (stages by reference)."""
    for path in reversed(paths):
        if path and path not in sys.path and os.path.exists(path):
            sys.path.insert(0, path)


def _node_id() -> str:
    return str(ray.get_runtime_context().get_node_id())


def _gpu_ids() -> tuple[int, ...]:
    ids = []
    for position, gpu in enumerate(ray.get_gpu_ids()):
        try:
            ids.append(int(gpu))
        except (TypeError, ValueError):  # a UUID: report its position
            ids.append(position)
    return tuple(ids)


def actor_name(worker_id: str) -> str:
    """The name of a worker's actor: its worker id (``<stage>-<n>``, unique in a run), with
    spaces and unprintable characters as ``_`` and at most ``NAME_MAX`` characters, the
    worker's number kept (a stage name may be long, the number tells workers apart)."""
    name = "".join(c if c.isprintable() and not c.isspace() else "_" for c in worker_id)
    name = name or "worker"
    if len(name) > NAME_MAX:
        head, dash, number = name.rpartition("-")
        keep = dash + number if head and number.isdigit() and len(number) < 16 else ""
        name = name[: NAME_MAX - len(keep) - 1] + "~" + keep
    return name


def actor_class_name(stage_name: str) -> str:
    """``<stage>Worker``: the class Ray shows for a stage's actors (the dashboard's Class
    column, ``ray list actors``, log prefixes, the process title). An identifier: other
    characters become ``_``."""
    stem = re.sub(r"\W", "_", stage_name, flags=re.ASCII)[: NAME_MAX - len("Worker")]
    return f"{stem or 'Stage'}Worker"


# -- remote code ----------------------------------------------------------------------------
def _node_setup(payload: bytes, name: str, node: NodeInfo, sys_path: list[str]) -> ErrorInfo | None:
    """``setup_on_node`` of one stage on one node (a Ray task pinned there)."""
    try:
        _extend_sys_path(sys_path)
        stage = cloudpickle.loads(payload)
        worker = WorkerInfo(f"{name}/node-setup", name, node.node_id)
        StageRunner(stage, name, worker).setup_on_node(node)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which stops the run
        return ErrorInfo.from_exception(exc)
    return None


def _probe_gpu_memory() -> float | None:
    """GB of memory of GPU 0 of the node this task runs on (NVML), or None without one."""
    from conveyor.backends.devices import _nvml

    found = _nvml()
    return None if found is None else found[1]


class _Worker:
    """The actor: one worker of one stage. Each stage's actors are of a subclass named after
    the stage (``stage_actor_class``), to which ``ray.remote`` is applied."""

    def __init__(
        self,
        payload: bytes,
        worker_id: str,
        stage_name: str,
        gpu_fraction: float,
        sys_path: list[str],
    ) -> None:
        self.payload = payload
        self.worker_id = worker_id
        self.stage_name = stage_name
        self.gpu_fraction = gpu_fraction
        self.sys_path = sys_path
        self.runner: StageRunner | None = None
        self.gauge = MemoryGauge()

    def hello(self) -> Placed:
        """Answers as soon as Ray has scheduled the actor: its node and process id."""
        return Placed(_node_id(), os.getpid())

    def setup(self, node_error: ErrorInfo | None, niceness: int = 0) -> Ready | SetupFailed:
        started = time.perf_counter()
        if node_error is not None:
            return SetupFailed(node_error)
        try:
            _extend_sys_path(self.sys_path)
            gpu_ids = _gpu_ids()
            if not gpu_ids:
                os.environ["CUDA_VISIBLE_DEVICES"] = ""  # as on the local backend
            os.environ["CONVEYOR_WORKER_ID"] = self.worker_id
            stage = cloudpickle.loads(self.payload)
            info = WorkerInfo(
                self.worker_id,
                self.stage_name,
                _node_id(),
                gpu_ids,
                self.gpu_fraction if gpu_ids else 0.0,
            )
            self.runner = StageRunner(stage, self.stage_name, info)
            self.runner.setup()
        except BaseException as exc:  # noqa: BLE001 - reported; the driver ends the run
            return SetupFailed(ErrorInfo.from_exception(exc))
        lower_priority(niceness)  # an actor is a process of its own; after setup (see there)
        return Ready(time.perf_counter() - started, self.gauge.read())

    def run(
        self, batches: list[tuple[int, list[tuple[str, Any]]]], threads: int | None = None
    ) -> tuple[list[Ran | Failed], list[Any]]:
        """Per batch a record; and every stored output of the call, in record order."""
        runner = self.runner
        assert runner is not None, "run() before a successful setup()"
        records: list[Ran | Failed] = []
        stored: list[Any] = []
        room = RECORD_INLINE_MAX
        for batch_id, items in batches:
            clock = BatchClock()
            mark = len(stored)
            try:
                labels = [label for label, _ in items]
                tasks = _resolve([value for _, value in items])
                outputs, out_labels, filtered = runner.run(tasks, labels, threads)
                del tasks
                entries: list[Output] = []
                for obj, label in zip(outputs, out_labels, strict=True):
                    enc = encode(obj, inline_ok=room > 0)
                    if enc.inline is not None and len(enc.inline) <= room:
                        room -= len(enc.inline)
                        entries.append(Output(label, enc.inline, enc.nbytes, True))
                    else:
                        entries.append(Output(label, None, enc.nbytes, enc.pickled))
                        # pickle bytes out-of-band too: a consumer maps them, never copies
                        data = enc.inline if enc.inline is not None else enc.store
                        stored.append(pickle.PickleBuffer(data) if enc.pickled else data)
                del outputs
            except Exception as exc:  # noqa: BLE001 - a task failure, retried by the driver
                del stored[mark:]
                records.append(Failed(batch_id, _error(exc)))
                continue
            busy, cpu, queued = clock.read()
            records.append(Ran(batch_id, entries, filtered, busy, cpu, queued, self.gauge.read()))
        return records, stored

    def stream(self, items: list[tuple[str, Any]], threads: int | None = None) -> Iterator[Any]:
        """A generator stage's batch (a streaming call): per output a ``Made`` record,
        followed by the output itself where it is not inline; then ``Ended`` or ``Raised``.
        Time spent paused at a ``yield`` is not busy time."""
        runner = self.runner
        assert runner is not None, "stream() before a successful setup()"
        clock = BatchClock()
        waited = 0.0
        try:
            labels = [label for label, _ in items]
            tasks = _resolve([value for _, value in items])
            for obj, label in runner.stream(tasks, labels, threads):
                enc = encode(obj)
                del obj
                paused = time.perf_counter()
                if enc.inline is not None:
                    yield Made(label, enc.nbytes, True, enc.inline)
                else:
                    yield Made(label, enc.nbytes, enc.pickled, None)
                    yield pickle.PickleBuffer(enc.store) if enc.pickled else enc.store
                waited += time.perf_counter() - paused
            del tasks
        except Exception as exc:  # noqa: BLE001 - a task failure, retried by the driver
            yield Raised(_error(exc))
            return
        busy, cpu, queued = clock.read(waited)
        yield Ended(runner.filtered, busy, cpu, queued, self.gauge.read())

    def stop(self) -> bool:
        if self.runner is not None:
            with contextlib.suppress(BaseException):
                self.runner.teardown()
        self.runner = None
        return True


def stage_actor_class(stage_name: str) -> type[_Worker]:
    """``_Worker`` under the stage's class name (``actor_class_name``), so that Ray shows
    which stage an actor works for. Defined here, not importable: cloudpickle sends it by
    value (a few hundred bytes, once per stage and run), its methods by reference."""
    name = actor_class_name(stage_name)
    doc = f"A worker of stage {stage_name!r} (see ``_Worker``)."
    return type(name, (_Worker,), {"__module__": __name__, "__qualname__": name, "__doc__": doc})


def _resolve(values: list[Any]) -> list[Any]:
    """Inline pickle bytes and ``(ObjectRef, index, pickled)`` triples -> the task objects."""
    refs = list({v[0]: None for v in values if not isinstance(v, bytes)})
    fetched = dict(zip(refs, ray.get(refs), strict=True)) if refs else {}
    tasks = []
    for value in values:
        if isinstance(value, bytes):
            tasks.append(pickle.loads(value))
            continue
        ref, index, pickled = value
        obj = fetched[ref] if index is None else fetched[ref][index]
        tasks.append(pickle.loads(obj) if pickled else obj)
    return tasks


def probe_gpu_memory(node_ids: Sequence[str]) -> dict[str, float | None]:
    """GB of GPU memory of each node, read there by a small task once per node and process.

    ``None`` where the node has no GPU that NVML can read (fake GPUs, no driver) or the probe
    did not answer within ``PROBE_TIMEOUT_S``.
    """
    missing = [n for n in node_ids if n not in _GPU_MEMORY_CACHE]
    if missing:
        probe = ray.remote(num_cpus=0, max_retries=0)(_probe_gpu_memory)
        refs = {
            node_id: probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote()
            for node_id in missing
        }
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        for node_id, ref in refs.items():
            value = None
            if ref in ready:
                with contextlib.suppress(Exception):
                    value = ray.get(ref)
            _GPU_MEMORY_CACHE[node_id] = value
    return {n: _GPU_MEMORY_CACHE.get(n) for n in node_ids}


# -- connecting -----------------------------------------------------------------------------
def private_temp_dir() -> tuple[str, int]:
    """A temp dir for a private cluster and the lock that marks it in use (close it after).

    A driver killed with ``kill -9`` cannot remove its cluster's dir (Ray's sockets, logs and
    session files); the next private cluster sweeps those whose driver is gone first.
    """
    sweep_stale(Path(tempfile.gettempdir()), "conveyor-ray-*")
    path = tempfile.mkdtemp(prefix="conveyor-ray-")
    return path, claim_dir(Path(path))


def dashboard_available() -> bool:
    """Whether Ray's dashboard can run here: what Ray itself checks (``ray[default]``'s
    aiohttp & co. import); a plain ``ray`` install has no dashboard."""
    try:
        importlib.import_module("ray.dashboard.optional_deps")
    except Exception:  # noqa: BLE001 - missing or broken: start without it
        return False
    return True


def ray_logs_wanted() -> bool:
    """Whether ``CONVEYOR_RAY_LOGS`` asks for Ray's own death messages on the console."""
    return os.environ.get(RAY_LOGS_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class _QuietErrors:
    """Ray's error subscriber as the driver's listener thread polls it, less the messages about
    dying workers and nodes (``DEATH_MESSAGE_TYPES``): those go to this module's log at DEBUG.
    The thread prints each message it gets as a "(raylet) ..." block on stdout."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def poll(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        key, data = self._inner.poll(*args, **kwargs)
        if isinstance(data, dict) and data.get("type") in DEATH_MESSAGE_TYPES:
            log.debug("Ray: %s", data.get("error_message"))
            return None, None  # the thread reads this as "nothing yet" and polls again
        return key, data

    def __getattr__(self, name: str) -> Any:  # subscribe, close
        return getattr(self._inner, name)


@contextlib.contextmanager
def _death_messages_off() -> Iterator[None]:
    """Around ``ray.init``: the error listener that ``ray.init`` starts for this driver gets a
    ``_QuietErrors`` (installed by the thread itself, before its first poll, so that no
    message slips through). ``log_to_driver`` does not cover these (the listener runs
    either way) and stays on, so that what stages print still reaches the console. Where
    Ray's internals differ from 2.x's, nothing is changed: the messages show, the run goes."""
    module = getattr(getattr(ray, "_private", None), "worker", None)
    listen = getattr(module, "listen_error_messages", None)
    if not callable(listen):
        log.debug("Ray has no listen_error_messages: its death messages stay on the console")
        yield
        return

    def quiet_listen(worker: Any, *args: Any, **kwargs: Any) -> Any:
        subscriber = getattr(worker, "gcs_error_subscriber", None)
        if subscriber is not None and not isinstance(subscriber, _QuietErrors):
            worker.gcs_error_subscriber = _QuietErrors(subscriber)
        return listen(worker, *args, **kwargs)

    module.listen_error_messages = quiet_listen
    try:
        yield
    finally:
        module.listen_error_messages = listen


@dataclass
class RayConnection:
    """How this process talks to Ray: an existing connection, a cluster it joined, or a private
    local cluster it started (the only kind it ever shuts down).

    A private cluster runs Ray's dashboard on 127.0.0.1 where ``ray[default]`` is installed,
    and its URL is printed to stderr once. Connections it makes keep Ray's messages about
    dying workers and nodes off the console (``CONVEYOR_RAY_LOGS=1``: on); an existing
    connection is left as it is.
    """

    address: str | None = None
    num_cpus: float | None = None
    num_gpus: int | None = None
    object_store_memory: int | None = None
    node_ip_address: str | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    started: bool = False  # we called ray.init
    private: bool = False  # ... and it started a local cluster
    temp_dir: str | None = None
    temp_lock: int | None = None  # held while temp_dir is in use
    dashboard_url: str | None = None  # of the private cluster, where it runs one
    holds: int = 0  # ``held`` blocks open: a private cluster outlives the runs within them

    def __post_init__(self) -> None:
        if self.address is not None and (
            not isinstance(self.address, str) or not self.address.strip()
        ):
            raise ValueError(
                f"RayBackend: address must be None, 'auto' or 'host:port', got {self.address!r}"
            )
        if self.num_cpus is not None and not self.num_cpus > 0:
            raise ValueError(f"RayBackend: num_cpus must be > 0, got {self.num_cpus!r}")
        if self.num_gpus is not None and (
            isinstance(self.num_gpus, bool)
            or self.num_gpus < 0
            or int(self.num_gpus) != self.num_gpus
        ):
            raise ValueError(
                f"RayBackend: num_gpus must be a whole number >= 0, got {self.num_gpus!r}"
            )

    def target(self) -> str | None:
        """The cluster to join (``address``, else ``RAY_ADDRESS``), or None for a private one."""
        return self.address or os.environ.get("RAY_ADDRESS") or None

    def connect(self) -> None:
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before init: Ray reads it there
        if ray.is_initialized():
            return  # the caller's connection: used as is, never shut down
        target = self.target()
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING, **self.init_kwargs}
        if target is None:
            if self.num_cpus is not None:
                kwargs["num_cpus"] = self.num_cpus
            if self.num_gpus is not None:
                kwargs["num_gpus"] = int(self.num_gpus)
            if self.object_store_memory is not None:
                kwargs["object_store_memory"] = self.object_store_memory
            ip = self.node_ip_address or ("127.0.0.2" if sys.platform == "linux" else None)
            if ip is not None:
                kwargs["_node_ip_address"] = ip  # Ray rewrites 127.0.0.1 to the external IP
            self.temp_dir, self.temp_lock = private_temp_dir()
            kwargs.setdefault("_temp_dir", self.temp_dir)
            if dashboard_available():
                # None: Ray starts it, and a dashboard that fails to start fails no run
                kwargs.setdefault("include_dashboard", None)
                kwargs.setdefault("dashboard_host", "127.0.0.1")  # this machine only
            else:
                kwargs.setdefault("include_dashboard", False)
            self.private = True  # before: a Ctrl-C inside ray.init left its processes
            try:
                context = self._init(address="local", **kwargs)
            except BaseException:
                self.disconnect()
                raise
            url = getattr(context, "dashboard_url", None)
            if url:
                self.dashboard_url = url if "://" in url else f"http://{url}"
                print(f"Ray dashboard: {self.dashboard_url}", file=sys.stderr, flush=True)
        else:
            if self.num_cpus is not None or self.num_gpus is not None:
                raise ValueError(
                    "RayBackend: num_cpus/num_gpus declare the resources of a private local "
                    f"cluster; joining {target!r} uses the cluster's own"
                )
            check_answers(target)
            ip = self.node_ip_address or _loopback_host(target)
            if ip is not None:
                kwargs["_node_ip_address"] = ip
            try:
                self._init(address=target, **kwargs)
            except Exception as exc:
                if not _token_refused(exc):
                    raise
                # Ray said only "Failed to connect", the cause in its chain, after 20 s
                raise ConnectionError(
                    f"the Ray cluster at {target} refused this driver's token: a cluster "
                    "started with token authentication (Ray's default for ray start) takes "
                    "drivers run with RAY_AUTH_MODE=token and its token (~/.ray/auth_token, "
                    "or RAY_AUTH_TOKEN_PATH)"
                ) from None
        self.started = True

    @staticmethod
    def _init(**kwargs: Any) -> Any:
        """``ray.init``, with Ray's messages about dying workers and nodes off the console
        unless ``CONVEYOR_RAY_LOGS`` asks for them."""
        # ray.init takes SIGTERM for its own (sys.exit, then crash dumps): the command's
        # handler, which stops a run as Ctrl-C does, is put back
        main = threading.current_thread() is threading.main_thread()
        saved = signal.getsignal(signal.SIGTERM) if main else None
        try:
            if ray_logs_wanted():
                return ray.init(**kwargs)
            with _death_messages_off():
                return ray.init(**kwargs)
        except SystemExit as exc:  # Ray's handler got a SIGTERM while ray.init ran
            if exc.code == signal.SIGTERM and callable(saved):
                saved(signal.SIGTERM, None)  # the command's own, as if it had got it
            raise
        finally:
            if saved is not None:
                signal.signal(signal.SIGTERM, saved)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Within the block a private cluster, once started, stays up between runs; it stops
        when the block ends. For a workflow of several runs (semantic dedup's four passes):
        each run started and stopped a cluster of its own, some 5 s each here."""
        self.holds += 1
        try:
            yield
        finally:
            self.holds -= 1
            if not self.holds:
                self.disconnect()

    def answers(self, timeout_s: float = 2.0) -> bool:
        """Whether the cluster's GCS answers within ``timeout_s``: a signal to the driver's
        whole process group (``timeout``, a scheduler's stop) reaches a private cluster's
        processes too, and its GCS, alive, stopped answering; every call to it then waited
        60 s, and Ray ended the driver with exit 1."""
        try:
            client = ray._private.worker.global_worker.gcs_client
            client.internal_kv_get(b"conveyor-probe", None, timeout=timeout_s)
        except Exception:  # noqa: BLE001 - a timeout, a closed channel: no answer
            return False
        return True

    def disconnect(self) -> None:
        """Stop the private cluster (unless ``held``); a joined cluster's connection stays
        for the next run."""
        if self.holds:
            return
        if self.private:
            with contextlib.suppress(Exception):
                ray.shutdown()
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
            if self.temp_lock is not None:
                os.close(self.temp_lock)
            self.temp_dir = self.temp_lock = self.dashboard_url = None
            self.private = self.started = False


#: how long a cluster's address may take to answer before joining it is given up
ANSWER_TIMEOUT_S = 10.0


def _token_refused(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception in its chain is Ray refusing the driver's token."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        text = f"{type(seen).__name__} {seen}"
        if "InvalidAuthToken" in text or "Unauthenticated" in text or "AuthenticationError" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def check_answers(address: str) -> None:
    """``ConnectionError`` unless something listens at ``host:port`` (``ray.init`` retries
    an address where nothing does for minutes, printing only its own retries)."""
    if address == "auto" or "://" in address:
        return  # Ray finds the local cluster itself; a client URL is Ray Client's
    parsed = urlparse(f"//{address}")
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host = port = None
    if not host or not port:
        raise ValueError(f"Ray address {address!r} is not host:port (nor 'auto')")
    try:
        socket.create_connection((host, port), timeout=ANSWER_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}): is it running, "
            "and is this its head's address (ray start --head prints it)?"
        ) from None


def _loopback_host(address: str) -> str | None:
    """The host of ``host:port`` when it is a loopback address (the driver must use it)."""
    if address == "auto" or "://" in address:
        return None
    host = urlparse(f"//{address}").hostname
    return host if host and host.startswith("127.") else None


# -- the backend ------------------------------------------------------------------------------
@dataclass(eq=False, slots=True)
class _Call:
    """One ``run`` call in flight: its records and its list of stored outputs."""

    records: Any  # ObjectRef of the per-batch records (small: returned inline)
    stored: Any  # ObjectRef of the list of stored outputs
    batch_ids: list[int]


@dataclass(eq=False, slots=True)
class _StreamCall:
    """One streaming call in flight: a generator stage's batch (see the module docstring)."""

    records: Any  # the ObjectRefGenerator of its items
    batch_id: int
    allowed: float  # outputs the driver may take before the batch pauses
    made: int = 0
    stored: tuple[str, int, bool] | None = None  # a record whose payload is the next item

    @property
    def batch_ids(self) -> list[int]:
        return [self.batch_id]

    @property
    def takes(self) -> bool:
        """Whether the driver may take its next item now."""
        return self.stored is not None or self.made < self.allowed


@dataclass(eq=False)
class _RayWorker:
    worker_id: str
    stage: StageSpec
    placement: WorkerPlacement
    cpus: float
    gpus: float
    actor: Any = None  # None while it waits for its turn to be created
    hello: Any = None
    setup: Any = None
    started_at: float = 0.0
    scheduled: bool = False
    ready: bool = False
    stopping: bool = False
    stop_ref: Any = None
    stopped: bool = False  # its stop call returned: it is gone once its calls are reported
    pid: int | None = None
    ping: Any = None  # a hello sent to an idle worker: a dead one fails it
    calls: deque[_Call | _StreamCall] = field(default_factory=deque)

    @property
    def node_id(self) -> str:
        return self.placement.node_id


class RayBackend:
    """Workers as Ray actors on a Ray cluster.

    ``address``: ``None`` joins the cluster in ``RAY_ADDRESS`` when set and otherwise starts a
    private local cluster (declaring ``num_cpus``/``num_gpus`` when given: fake GPUs work, as on
    ``LocalBackend``); ``"auto"`` joins the cluster running on this machine; ``"host:port"``
    joins that one (run the driver on a node of the cluster). An existing ``ray.init``
    connection is used as is. Only a private cluster is ever shut down.

    ``gpu_memory_gb`` is the memory of one GPU, used to turn ``Resources(gpu_memory_gb=...)``
    into a fraction when a node's GPU cannot be read (NVML, probed once per node).
    ``schedule_timeout_s`` bounds how long a worker may wait for Ray to grant its resources
    (other work on the cluster can hold them) before the run stops with a clear error.
    ``nvdecs_per_gpu``/``nvencs_per_gpu``: video decoder and encoder units of each GPU of the
    cluster, which ``Resources(nvdecs=, nvencs=)`` are placed against (not given: no limit).
    A worker that asks only for them gets a sliver of a GPU from Ray (0.0001), so that the
    device is visible to it.

    What Ray shows. Each worker is an actor of class ``<stage>Worker`` named after its worker
    id, ``<stage>-<n>`` (the dashboard's Class and Name columns, ``ray list actors``, the
    "(<stage>Worker pid=...)" prefix of what it prints, its process title). A private
    cluster runs Ray's dashboard on 127.0.0.1 where ``ray[default]`` is installed and prints
    its URL to stderr once ("Ray dashboard: http://127.0.0.1:8265"); without it, none.

    Ray's own messages about dying workers and nodes (the raylet's "A worker died or was
    killed ..." blocks) are kept off the console on the connections the backend makes
    (Conveyor says what died, in one line, and retries); set ``CONVEYOR_RAY_LOGS=1`` in the
    environment to see them again, or log ``conveyor.backends.ray`` at DEBUG. What stages
    print still reaches the console.
    """

    #: a node that leaves takes the payloads in its object store along (see ``Backend``)
    payloads_can_be_lost = True

    def __init__(
        self,
        address: str | None = None,
        num_cpus: float | None = None,
        num_gpus: int | None = None,
        *,
        memory_budget_bytes: int | None = None,
        gpu_memory_gb: float | None = None,
        object_store_memory: int | None = None,
        node_ip_address: str | None = None,
        schedule_timeout_s: float = 300.0,
        init_kwargs: dict[str, Any] | None = None,
        nvdecs_per_gpu: float | None = None,
        nvencs_per_gpu: float | None = None,
    ) -> None:
        for label, value in (
            ("memory_budget_bytes", memory_budget_bytes),
            ("gpu_memory_gb", gpu_memory_gb),
            ("object_store_memory", object_store_memory),
            ("schedule_timeout_s", schedule_timeout_s),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"RayBackend: {label} must be > 0, got {value!r}")
        for label, value in (
            ("nvdecs_per_gpu", nvdecs_per_gpu),
            ("nvencs_per_gpu", nvencs_per_gpu),
        ):
            if value is not None and not value >= 0:
                raise ValueError(f"RayBackend: {label} must be >= 0, got {value!r}")
        self.engines_per_gpu = (nvdecs_per_gpu, nvencs_per_gpu)
        self.connection = RayConnection(
            address, num_cpus, num_gpus, object_store_memory, node_ip_address, init_kwargs or {}
        )
        self.gpu_memory_gb = gpu_memory_gb
        self.schedule_timeout_s = schedule_timeout_s
        self._declared_budget = memory_budget_bytes
        self.memory_budget_bytes = int(memory_budget_bytes or DEFAULT_MEMORY_BUDGET)
        self._open = False
        self._token = ""  # per open: tells this run's actor names from a taken one
        self._node_setup_fn: Any = None
        self._sys_path: list[str] = []
        self._here: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._workers: dict[str, _RayWorker] = {}
        self._refs: dict[Any, tuple[str, _RayWorker]] = {}  # hello/setup/stop refs
        self._events: list[BackendEvent] = []
        self._payloads: dict[int, Any] = {}  # stage index -> ObjectRef of its pickled stage
        self._actor_classes: dict[int, Any] = {}  # stage index -> its ray.remote actor class
        self._node_setups: dict[tuple[int, str], Any] = {}
        # records ref (a streaming call's generator) of a call in flight -> worker
        self._calls: dict[Any, _RayWorker] = {}
        self._cpu_used: dict[str, float] = {}
        self._queued: deque[_RayWorker] = deque()  # waiting for a start slot on their node
        self._alive: dict[str, dict[str, Any]] = {}
        self._nodes_at = -1.0
        self._checked_at = float("-inf")

    # -- cluster --------------------------------------------------------------------------
    def open(self) -> None:
        if self._open:
            return
        self.connection.connect()
        self._token = secrets.token_hex(3)
        self._node_setup_fn = ray.remote(num_cpus=0, max_retries=0)(_node_setup)
        self._sys_path = [p for p in sys.path if p]
        self._here = _node_id()  # where the driver's puts are stored
        if self._declared_budget is None:
            store = ray.cluster_resources().get("object_store_memory", 0.0)
            if store:
                self.memory_budget_bytes = int(min(DEFAULT_MEMORY_BUDGET, store / 4))
        self._open = True

    def _require_open(self) -> None:
        if not self._open:
            raise BackendError("RayBackend used before open()")

    def _live_nodes(self, max_age_s: float = 0.2) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        if now - self._nodes_at > max_age_s:
            self._alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
            self._nodes_at = now
        return self._alive

    def nodes(self) -> list[NodeInfo]:
        self._require_open()
        live = self._live_nodes()
        result = []
        for node_id, node in live.items():
            res = node.get("Resources", {})
            cpus, gpus = float(res.get("CPU", 0.0)), int(res.get("GPU", 0.0))
            if cpus <= 0 and gpus <= 0:
                continue  # e.g. a head started with --num-cpus=0: nothing to place there
            memory = res.get("memory")  # what Ray lets tasks and actors take on the node
            result.append(
                NodeInfo(
                    node_id,
                    cpus,
                    gpus,
                    None,
                    str(node.get("NodeManagerAddress", "")),
                    int(memory) if memory else None,
                )
            )
        memory = self._gpu_memory([n for n in result if n.gpus])
        decs, encs = self.engines_per_gpu
        return [
            dataclasses.replace(
                n,
                gpu_memory_gb=memory.get(n.node_id),
                nvdecs_per_gpu=decs if n.gpus else None,
                nvencs_per_gpu=encs if n.gpus else None,
            )
            for n in result
        ]

    def _gpu_memory(self, nodes: list[NodeInfo]) -> dict[str, float | None]:
        """GPU memory per GPU node: declared, else read on the node once (cached per process)."""
        if self.gpu_memory_gb is not None:
            return {n.node_id: self.gpu_memory_gb for n in nodes}
        return probe_gpu_memory([n.node_id for n in nodes])

    def now(self) -> float:
        return time.monotonic()

    # -- payloads -------------------------------------------------------------------------
    def put(self, obj: Any, label: str) -> Handle:
        enc = encode(obj)
        if enc.inline is not None:
            return Handle(RayPayload(None, enc.inline, True), enc.nbytes, label)
        return Handle(
            RayPayload(ray.put(enc.store), None, enc.pickled), enc.nbytes, label, self._here
        )

    def get(self, handle: Handle) -> Any:
        payload: RayPayload = handle.ref
        if payload.data is not None:
            return pickle.loads(payload.data)
        obj = ray.get(payload.ref)
        if payload.index is not None:
            obj = obj[payload.index]
        return pickle.loads(obj) if payload.pickled else obj

    def free(self, handles: Sequence[Handle]) -> None:
        """Nothing to do: Ray frees an object when its last ObjectRef is dropped."""

    # -- workers --------------------------------------------------------------------------
    def _stage_payload(self, stage: StageSpec) -> Any:
        ref = self._payloads.get(stage.index)
        if ref is None:
            ref = self._payloads[stage.index] = ray.put(stage.payload)
        return ref

    def _node_setup(self, stage: StageSpec, node_id: str) -> Any:
        """The ``setup_on_node`` task of (stage, node), started on first use; None if none."""
        if not stage.has_node_setup:
            return None
        key = (stage.index, node_id)
        ref = self._node_setups.get(key)
        if ref is None:
            node = next((n for n in self.nodes() if n.node_id == node_id), None)
            if node is None:
                node = NodeInfo(node_id, 0.0)
            ref = self._node_setup_fn.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote(self._stage_payload(stage), stage.name, node, self._sys_path)
            self._node_setups[key] = ref
        return ref

    def _requests(self, stage: StageSpec, placement: WorkerPlacement) -> tuple[float, float]:
        """CPUs and GPUs to ask Ray for.

        GPUs are what placement granted (whole devices, or this node's fraction). CPUs are the
        stage's, except that a stage's first worker may be placed beyond a node's CPUs (the
        controller overcommits rather than stall the stream): it then asks for what is left,
        so that Ray can still schedule it.
        """
        res = stage.resources
        if res.gpus >= 1:
            gpus = float(res.whole_gpus)
        elif res.requires_gpu or res.video_engines:
            gpus = round(placement.gpu_fraction, 4) or 0.0001
        else:
            gpus = 0.0
        node = self._live_nodes().get(placement.node_id, {})
        total = float(node.get("Resources", {}).get("CPU", 0.0))
        left = max(0.0, total - self._cpu_used.get(placement.node_id, 0.0))
        cpus = res.cpus if res.cpus <= left + 1e-9 else round(left, 4)
        return cpus, gpus

    def start_worker(self, worker_id: str, stage: StageSpec, placement: WorkerPlacement) -> None:
        """Queue the worker; ``_launch`` creates its actor when the node has a start slot."""
        self._require_open()
        cpus, gpus = self._requests(stage, placement)
        worker = _RayWorker(worker_id, stage, placement, cpus, gpus)
        self._workers[worker_id] = worker
        self._cpu_used[placement.node_id] = self._cpu_used.get(placement.node_id, 0.0) + cpus
        self._queued.append(worker)
        self._launch()

    def _start_slots(self, node_id: str) -> int:
        """How many actors may be starting at once on a node.

        A new actor is a new process that imports Ray, Conveyor and the stage; started all at
        once on a small node they would share its cores and none would be ready for seconds.
        A stage's first worker does not wait for a slot: the controller sizes stages only once
        every stage has been measured, so all first workers should be ready together.
        """
        cpus = float(self._live_nodes().get(node_id, {}).get("Resources", {}).get("CPU", 0.0))
        return max(2, math.ceil(cpus / 2))

    def _launch(self) -> None:
        if not self._queued:
            return
        starting: dict[str, int] = {}
        staffed: set[int] = set()  # stages with an actor, starting or ready
        for worker in self._workers.values():
            if worker.actor is not None:
                staffed.add(worker.stage.index)
                if not worker.scheduled:
                    starting[worker.node_id] = starting.get(worker.node_id, 0) + 1
        waiting: deque[_RayWorker] = deque()
        while self._queued:
            worker = self._queued.popleft()
            if self._workers.get(worker.worker_id) is not worker:
                continue  # stopped or lost before its turn
            node = worker.node_id
            first = worker.stage.index not in staffed
            if not first and starting.get(node, 0) >= self._start_slots(node):
                waiting.append(worker)
                continue
            staffed.add(worker.stage.index)
            starting[node] = starting.get(node, 0) + 1
            self._create(worker)
        self._queued = waiting

    def _actor_class(self, stage: StageSpec) -> Any:
        cls = self._actor_classes.get(stage.index)
        if cls is None:
            cls = ray.remote(max_restarts=0, max_task_retries=0)(stage_actor_class(stage.name))
            self._actor_classes[stage.index] = cls
        return cls

    def _new_actor(self, cls: Any, worker_id: str, options: dict[str, Any], args: tuple) -> Any:
        """Create the actor under the worker's name (``actor_name``). A name taken in the
        namespace (an actor of a run before that Ray is still removing, or someone else's)
        gets this open's token; one Ray refuses again, no name: a name never fails a run."""
        name = actor_name(worker_id)
        for attempt in (name, f"{name}@{self._token}"):
            try:
                return cls.options(name=attempt, **options).remote(*args)
            except ValueError as exc:  # ActorAlreadyExistsError is one
                log.debug("Ray refused the actor name %r: %s", attempt, exc)
        return cls.options(**options).remote(*args)

    def _create(self, worker: _RayWorker) -> None:
        stage, placement = worker.stage, worker.placement
        strategy = NodeAffinitySchedulingStrategy(placement.node_id, soft=False)
        actor = self._new_actor(
            self._actor_class(stage),
            worker.worker_id,
            {"num_cpus": worker.cpus, "num_gpus": worker.gpus, "scheduling_strategy": strategy},
            (
                self._stage_payload(stage),
                worker.worker_id,
                stage.name,
                placement.gpu_fraction,
                self._sys_path,
            ),
        )
        worker.actor = actor
        worker.started_at = time.monotonic()
        worker.hello = actor.hello.remote()
        worker.setup = actor.setup.remote(
            self._node_setup(stage, placement.node_id), placement.niceness
        )
        self._refs[worker.hello] = ("hello", worker)
        self._refs[worker.setup] = ("setup", worker)

    def stop_worker(self, worker_id: str) -> None:
        worker = self._workers.get(worker_id)
        if worker is None or worker.stopping:
            return
        worker.stopping = True
        if not worker.scheduled:  # not created, or Ray never granted it: nothing to tear down
            self._gone(worker, WorkerStopped(worker_id))
            return
        worker.stop_ref = worker.actor.stop.remote()  # runs after the calls it holds
        self._refs[worker.stop_ref] = ("stop", worker)

    def submit(
        self,
        worker_id: str,
        batches: list[tuple[int, list[Handle]]],
        threads: int | None = None,
        allowance: int | None = None,
    ) -> None:
        worker = self._workers.get(worker_id)
        if worker is None:
            return  # it died: its in-flight work is retried when the death is reported
        message = []
        for batch_id, handles in batches:
            items = []
            for h in handles:
                p: RayPayload = h.ref
                items.append(
                    (h.label, p.data if p.data is not None else (p.ref, p.index, p.pickled))
                )
            message.append((batch_id, items))
        if worker.stage.streams:
            allowed = math.inf if allowance is None else allowance
            for batch_id, items in message:
                gen = worker.actor.stream.options(
                    num_returns="streaming", _generator_backpressure_num_objects=STREAM_AHEAD
                ).remote(items, threads)
                worker.calls.append(_StreamCall(gen, batch_id, allowed))
                self._calls[gen] = worker
            return
        records, stored = worker.actor.run.options(num_returns=2).remote(message, threads)
        worker.calls.append(_Call(records, stored, [b for b, _ in batches]))
        self._calls[records] = worker

    def resume(self, worker_id: str, batch_id: int, outputs: int) -> None:
        worker = self._workers.get(worker_id)
        for call in worker.calls if worker is not None else ():
            if isinstance(call, _StreamCall) and call.batch_id == batch_id:
                call.allowed += outputs  # the next poll takes its items again
                return

    # -- events ---------------------------------------------------------------------------
    def _gone(self, worker: _RayWorker, event: BackendEvent) -> None:
        """Forget a worker, free its actor and report ``event`` (once)."""
        if self._workers.pop(worker.worker_id, None) is None:
            return
        for ref in (worker.hello, worker.setup, worker.stop_ref, worker.ping):
            self._refs.pop(ref, None)
        for call in worker.calls:
            self._calls.pop(call.records, None)
        worker.calls.clear()
        self._cpu_used[worker.node_id] = self._cpu_used.get(worker.node_id, 0.0) - worker.cpus
        if worker.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(worker.actor, no_restart=True)
        self._events.append(event)

    def _died(self, worker: _RayWorker, reason: str, node_lost: bool = False) -> None:
        if worker.stopping:
            self._gone(worker, WorkerStopped(worker.worker_id))
        elif worker.ready or node_lost:
            # a node that left takes its starting workers too: start others, do not abort
            self._gone(worker, WorkerDied(worker.worker_id, reason))
        else:
            error = ErrorInfo("WorkerDied", f"worker died during setup ({reason})")
            self._gone(worker, WorkerSetupFailed(worker.worker_id, error))

    def _death_reason(self, worker: _RayWorker, exc: BaseException) -> tuple[str, bool]:
        node = self._live_nodes(max_age_s=0.0).get(worker.node_id)
        if node is None:
            return f"its node {worker.node_id[:12]} left the cluster", True
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"Ray actor died ({type(exc).__name__}: {first})", False

    def _on_ref(self, kind: str, worker: _RayWorker, ref: Any) -> None:
        self._refs.pop(ref, None)
        if self._workers.get(worker.worker_id) is not worker:
            return
        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            self._died(worker, *self._death_reason(worker, exc))
            return
        except Exception as exc:  # noqa: BLE001 - e.g. the node-setup task's node died
            reason, lost = self._death_reason(worker, exc)
            if lost or kind in ("stop", "ping"):
                self._died(worker, reason, lost)
            else:
                self._gone(
                    worker, WorkerSetupFailed(worker.worker_id, ErrorInfo.from_exception(exc))
                )
            return
        if kind == "hello":
            worker.scheduled = True
            worker.pid = value.pid
        elif kind == "setup":
            match value:
                case Ready(setup_s, memory):
                    worker.ready = True
                    self._events.append(WorkerReady(worker.worker_id, setup_s, memory))
                case SetupFailed(error):
                    self._gone(worker, WorkerSetupFailed(worker.worker_id, error))
        elif kind == "stop":
            # it ran after the calls it held, whose records may come later in this poll or
            # the next: reported stopped before them, their batches were taken for lost
            worker.stopped = True
            self._stop_if_drained(worker)
        elif kind == "ping":
            worker.ping = None

    def _stop_if_drained(self, worker: _RayWorker) -> None:
        """A worker whose stop call returned is reported stopped after its last call."""
        if worker.stopped and not worker.calls and self._workers.get(worker.worker_id) is worker:
            self._gone(worker, WorkerStopped(worker.worker_id))

    @staticmethod
    def _waits(key: Any, worker: _RayWorker) -> bool:
        """Whether poll waits on this call: a streaming one only while it may go on."""
        for call in worker.calls:
            if call.records is key:
                return not isinstance(call, _StreamCall) or call.takes
        return True

    def _finish(self, worker: _RayWorker, call: _Call) -> None:
        """The worker's oldest call's records arrived (or its failure): report its batches."""
        self._calls.pop(call.records, None)
        worker.calls.popleft()
        try:
            records = ray.get(call.records)
        except ray.exceptions.RayActorError as exc:
            self._died(worker, *self._death_reason(worker, exc))
            return
        except Exception as exc:  # noqa: BLE001 - the call failed as a whole; the actor lives
            error = _error(exc)
            for batch_id in call.batch_ids:
                self._events.append(BatchFailed(worker.worker_id, batch_id, error))
            return
        done: list[BatchOutcome] = []
        position = 0  # of the next stored output in the call's list
        for record in records:
            match record:
                case Failed(batch_id, error):
                    if done:
                        self._events.append(BatchesDone(worker.worker_id, done))
                        done = []
                    self._events.append(BatchFailed(worker.worker_id, batch_id, error))
                case Ran(batch_id, entries, filtered, busy_s, cpu_s, queued_s, memory):
                    handles = []
                    for label, data, nbytes, pickled in entries:
                        node = None
                        if data is not None:
                            payload = RayPayload(None, data, True)
                        else:
                            payload = RayPayload(call.stored, None, pickled, position)
                            position += 1
                            node = worker.node_id  # stays in that node's object store
                        handles.append(Handle(payload, nbytes, label, node))
                    done.append(
                        BatchOutcome(batch_id, handles, filtered, busy_s, cpu_s, memory, queued_s)
                    )
        if done:
            self._events.append(BatchesDone(worker.worker_id, done))

    def _take(self, worker: _RayWorker, call: _StreamCall) -> bool:
        """Take the items of the worker's running streaming call that are ready and that it
        may make; report its outputs, and its end. True once it has ended (and is gone
        from ``worker.calls``)."""
        outputs: list[Handle] = []
        ended: BackendEvent | None = None
        while call.takes:
            if not ray.wait([call.records], timeout=0, fetch_local=False)[0]:
                break
            try:
                ref = next(call.records)
            except StopIteration:  # never without its end record: the call broke off
                ended = BatchFailed(
                    worker.worker_id, call.batch_id, ErrorInfo("WorkerDied", "the call ended")
                )
                break
            if call.stored is not None:  # the payload of the record before
                label, nbytes, pickled = call.stored
                call.stored = None
                call.made += 1
                payload = RayPayload(ref, None, pickled)
                outputs.append(Handle(payload, nbytes, label, worker.node_id))
                continue
            try:
                record = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                if outputs:
                    self._events.append(BatchOutputs(worker.worker_id, call.batch_id, outputs))
                self._died(worker, *self._death_reason(worker, exc))
                return True
            except Exception as exc:  # noqa: BLE001 - the call failed as a whole
                ended = BatchFailed(worker.worker_id, call.batch_id, _error(exc))
                break
            match record:
                case Made(label, nbytes, pickled, None):
                    call.stored = (label, nbytes, pickled)  # the output is the next item
                case Made(label, nbytes, _, data):
                    call.made += 1
                    outputs.append(Handle(RayPayload(None, data, True), nbytes, label))
                case Ended(filtered, busy_s, cpu_s, queued_s, memory):
                    outcome = BatchOutcome(
                        call.batch_id, [], filtered, busy_s, cpu_s, memory, queued_s
                    )
                    ended = BatchesDone(worker.worker_id, [outcome])
                    break
                case Raised(error):
                    ended = BatchFailed(worker.worker_id, call.batch_id, error)
                    break
        if outputs:
            self._events.append(BatchOutputs(worker.worker_id, call.batch_id, outputs))
        if ended is None:
            return False
        self._events.append(ended)
        self._calls.pop(call.records, None)
        worker.calls.popleft()
        return True

    def _check_nodes(self) -> None:
        """Workers on a node that left the cluster are dead, whatever Ray says of them yet;
        idle workers are pinged, so that one that died while idle is noticed too."""
        now = time.monotonic()
        if now - self._checked_at < NODE_CHECK_S or not self._workers:
            return
        self._checked_at = now
        live = self._live_nodes(max_age_s=0.0)
        for worker in list(self._workers.values()):
            if worker.node_id not in live:
                self._died(worker, f"its node {worker.node_id[:12]} left the cluster", True)
            elif worker.ready and not worker.calls and not worker.stopping and not worker.ping:
                worker.ping = worker.actor.hello.remote()
                self._refs[worker.ping] = ("ping", worker)
            elif (
                worker.actor is not None
                and not worker.scheduled
                and now - worker.started_at > self.schedule_timeout_s
            ):
                error = ErrorInfo(
                    "BackendError",
                    f"Ray did not schedule worker {worker.worker_id} on node "
                    f"{worker.node_id[:12]} within {self.schedule_timeout_s:g} s; the node lacks "
                    f"the free resources it asks for ({worker.cpus:g} CPUs, "
                    f"{worker.stage.resources.describe()}): is other Ray work holding them?",
                )
                self._gone(worker, WorkerSetupFailed(worker.worker_id, error))

    def poll(self, timeout: float) -> list[BackendEvent]:
        self._require_open()
        self._check_nodes()
        self._launch()
        if self._events:
            timeout = 0.0
        # every call's records: an actor runs its calls in order, so they arrive in order;
        # a streaming call only while the driver may take its next item
        waitables = [*self._refs, *(k for k, w in self._calls.items() if self._waits(k, w))]
        if not waitables:
            if timeout > 0:
                time.sleep(min(timeout, NODE_CHECK_S))
        else:
            ready, _ = ray.wait(waitables, num_returns=1, timeout=timeout, fetch_local=False)
            if ready and len(waitables) > 1:
                ready, _ = ray.wait(
                    waitables, num_returns=len(waitables), timeout=0, fetch_local=False
                )
            arrived = set(ready)
            for item in ready:
                worker = self._calls.get(item)
                if worker is not None:
                    # the controller expects a worker's batches back in the order it sent them
                    while self._workers.get(worker.worker_id) is worker and worker.calls:
                        head = worker.calls[0]
                        if isinstance(head, _StreamCall):
                            if not self._take(worker, head):
                                break
                        elif head.records in arrived:
                            self._finish(worker, head)
                        else:
                            break
                    self._stop_if_drained(worker)
                elif item in self._refs:
                    kind, worker = self._refs[item]
                    self._on_ref(kind, worker, item)
        self._launch()  # workers that became scheduled freed start slots
        events, self._events = self._events, []
        return events

    # -- tests and diagnostics ------------------------------------------------------------
    def kill_worker(self, worker_id: str) -> None:
        """Kill a worker's actor as a crash would (``ray.kill``); its death is reported."""
        worker = self._workers.get(worker_id)
        if worker is not None and worker.actor is not None:
            ray.kill(worker.actor, no_restart=True)

    def worker_pids(self) -> dict[str, int]:
        return {w.worker_id: w.pid for w in self._workers.values() if w.pid is not None}

    def worker_nodes(self) -> dict[str, str]:
        return {w.worker_id: w.node_id for w in self._workers.values()}

    def held(self) -> contextlib.AbstractContextManager[None]:
        """A private cluster stays up between the runs within the block (``RayConnection``)."""
        return self.connection.held()

    # -- teardown -------------------------------------------------------------------------
    def shutdown(self, grace_s: float = 10.0) -> None:
        if not self._open:
            return
        try:
            if self.connection.answers():
                for worker_id in list(self._workers):
                    self.stop_worker(worker_id)
                deadline = time.monotonic() + grace_s
                while self._workers and time.monotonic() < deadline:
                    self.poll(0.05)
            for worker in list(self._workers.values()):
                self._gone(worker, WorkerStopped(worker.worker_id))
        finally:
            self._reset()
            self._open = False
            self.connection.disconnect()


__all__ = ["RayBackend", "RayConnection", "RayPayload", "encode", "probe_gpu_memory"]
