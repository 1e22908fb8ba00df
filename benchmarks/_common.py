"""Shared helpers of the benchmark scripts: stages, samplers, runners and plain-text tables.

Benchmarks print; they never assert timings. Every script runs each contender in the same
process, one after the other, so the printed ratios come from one run on one machine state.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import resource
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# numpy is imported here, at module level, as a real stage module would: the local backend's
# per-stage host process then imports it once and its forked workers share it. Imported lazily
# inside a stage, every worker would pay the import (~0.1-0.2 s) on its first task.
import numpy as np
import psutil
from _bytecode import without_bytecode

from conveyor import Pipeline, ProcessingStage, Resources
from conveyor.backends import LocalBackend
from conveyor.backends.shm_store import default_root
from conveyor.executors import BatchExecutor, StreamingExecutor

MIB = 1 << 20
ENGINES = ("local", "ray", "ray-data")


# -- engines ------------------------------------------------------------------------------
def ray_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def add_engine_args(p: Any) -> None:
    """``--engines`` (local, ray, ray-data; Ray ones by default when Ray is installed) and
    ``--ray-address`` (join a running cluster instead of starting a private one)."""
    default = ",".join(ENGINES) if ray_importable() else "local"
    p.add_argument(
        "--engines",
        default=default,
        help=f"comma-separated subset of {','.join(ENGINES)} (default {default}): "
        "local = LocalBackend, ray = RayBackend, ray-data = RayDataExecutor",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster (host:port) instead of starting a private local one "
        "for the Ray engines; its processes are then not in the memory figures",
    )


def parse_engines(p: Any, args: Any) -> None:
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(args.engines) - set(ENGINES)
    if unknown:
        p.error(f"--engines: unknown engine(s) {', '.join(sorted(unknown))}")
    if any(e != "local" for e in args.engines) and not ray_importable():
        p.error("--engines: ray and ray-data need Ray: pip install 'conveyor[ray]'")


#: how long a freshly started Ray cluster is left to settle before the first contender
SETTLE_S = 3.0


class RaySession:
    """The Ray cluster the Ray contenders share, as a cluster users already run.

    Started (private, local, ``num_cpus`` declared) when the first Ray contender needs it,
    after the local ones ran without it, so its start-up is reported on its own line rather
    than charged to a contender and its processes are not in the local contenders' memory;
    joined instead with ``--ray-address``. Stopped at the end only if started here.
    """

    def __init__(self, num_cpus: float, address: str | None, dashboard: bool = False) -> None:
        self.num_cpus = num_cpus
        self.address = address
        self.dashboard = dashboard  # Cosmos-Xenna reads actor state through it
        self.start_s: float | None = None
        self.connection: Any = None
        self._saved_address: str | None = None
        self._was_connected = False

    def ensure(self) -> None:
        if self.connection is not None:
            return
        import ray

        from conveyor.backends.ray import RayConnection

        self._was_connected = ray.is_initialized()  # then it is not ours to disconnect
        begun = time.perf_counter()
        if self.address is None:
            extra: dict[str, Any] = {}
            if self.dashboard:
                import socket

                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", 0))
                    port = sock.getsockname()[1]
                extra = {"include_dashboard": True, "dashboard_port": port}
            self.connection = RayConnection(None, self.num_cpus, 0, init_kwargs=extra)
        else:
            self.connection = RayConnection(self.address)
        self.connection.connect()
        self.start_s = time.perf_counter() - begun
        time.sleep(SETTLE_S)  # a fresh cluster is still starting its agents: not a run's cost
        import ray

        # peers that call ray.init() themselves must find this cluster, and only this one
        self._saved_address = os.environ.get("RAY_ADDRESS")
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        what = "joined" if self.address else f"started (num_cpus={self.num_cpus:g})"
        print(f"  Ray cluster {what} in {self.start_s:.1f} s (not in any contender's time)")

    def settle(self, max_s: float = 15.0, busy_share: float = 0.1) -> None:
        """Wait (up to ``max_s``) until the process tree is quiet: what the previous engine
        left running (actors winding down, idle workers killed) would tax the next one."""
        if self.connection is None:
            return
        me = psutil.Process()

        def cpu() -> float:
            total = 0.0
            for proc in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    total += t.user + t.system
            return total

        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline:
            before = cpu()
            time.sleep(0.5)
            if cpu() - before < 0.5 * busy_share:
                return

    def __enter__(self) -> RaySession:
        return self

    def restart(self) -> None:
        """A fresh cluster (private ones only): each engine then starts from the same state,
        not from what the previous one left (idle workers, actors winding down)."""
        if self.connection is not None and self.connection.private:
            self.close()
        self.ensure()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.connection is not None:
            import ray

            # the private cluster's processes are ours: some peers' actors survive the end of
            # their cluster, so whatever of this tree outlives the shutdown is killed by pid
            tree = psutil.Process().children(recursive=True) if self.connection.private else []
            self.connection.disconnect()
            _, alive = psutil.wait_procs(tree, timeout=5)
            for proc in alive:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            if ray.is_initialized() and not self._was_connected:
                ray.shutdown()  # a joined cluster: leave it running, just disconnect
            self.connection = None
            if self._saved_address is None:
                os.environ.pop("RAY_ADDRESS", None)
            else:
                os.environ["RAY_ADDRESS"] = self._saved_address


# -- stages -------------------------------------------------------------------------------
def burn(cost_s: float, mode: str) -> None:
    """Spend ``cost_s``: asleep (``sleep``) or burning this thread's CPU time (``cpu``)."""
    if cost_s <= 0:
        return
    if mode == "sleep":
        time.sleep(cost_s)
        return
    if mode != "cpu":
        raise ValueError(f"mode must be 'sleep' or 'cpu', got {mode!r}")
    clock = time.thread_time
    end = clock() + cost_s
    x = 0
    while clock() < end:
        for i in range(200):
            x += i * i
    del x


def make_payload(seed: int, nbytes: int, kind: str) -> Any:
    """``nbytes`` of data derived from ``seed``: ``bytes`` or a numpy ``uint8`` array."""
    if kind == "numpy":
        return np.full(nbytes, seed % 251, dtype=np.uint8)
    if kind == "bytes":
        return bytes([seed % 251]) * nbytes
    raise ValueError(f"payload kind must be 'numpy' or 'bytes', got {kind!r}")


def payload_len(obj: Any) -> int:
    nbytes = getattr(obj, "nbytes", None)
    return int(nbytes) if nbytes is not None else len(obj)


class _Configured(ProcessingStage[Any, Any]):
    def __init__(self, name: str, cpus: float, cost_s: float, mode: str, batch_size: int) -> None:
        self.name = name
        self.resources = Resources(cpus=cpus)
        self.batch_size = batch_size
        self.cost_s = cost_s
        self.mode = mode


class MakePayload(_Configured):
    """An int in, a payload of ``nbytes`` out, after spending ``cost_s``."""

    def __init__(
        self,
        name: str = "make",
        *,
        cpus: float = 0.25,
        cost_s: float = 0.0,
        mode: str = "sleep",
        nbytes: int = MIB,
        payload: str = "numpy",
        batch_size: int = 1,
    ) -> None:
        super().__init__(name, cpus, cost_s, mode, batch_size)
        self.nbytes = nbytes
        self.payload = payload  # not "kind": that is a ProcessingStage method

    def process(self, task: int) -> Any:
        payload = make_payload(task, self.nbytes, self.payload)
        burn(self.cost_s, self.mode)
        return payload


class PassThrough(_Configured):
    """Receives a payload, spends ``cost_s``, returns it unchanged."""

    def __init__(
        self,
        name: str = "pass",
        *,
        cpus: float = 0.25,
        cost_s: float = 0.0,
        mode: str = "sleep",
        batch_size: int = 1,
    ) -> None:
        super().__init__(name, cpus, cost_s, mode, batch_size)

    def process(self, task: Any) -> Any:
        burn(self.cost_s, self.mode)
        return task


class Finish(_Configured):
    """Receives a payload, spends ``cost_s``, returns its length (small, so nothing piles up)."""

    def __init__(
        self,
        name: str = "finish",
        *,
        cpus: float = 0.25,
        cost_s: float = 0.0,
        mode: str = "sleep",
        batch_size: int = 1,
    ) -> None:
        super().__init__(name, cpus, cost_s, mode, batch_size)

    def process(self, task: Any) -> int:
        burn(self.cost_s, self.mode)
        return payload_len(task)


class Increment(_Configured):
    """``x + 1``, nothing else: measures per-task overhead."""

    def __init__(self, name: str = "inc", *, cpus: float = 0.5, batch_size: int = 1) -> None:
        super().__init__(name, cpus, 0.0, "sleep", batch_size)

    def process(self, task: int) -> int:
        return task + 1


# -- ideal throughput ---------------------------------------------------------------------
def best_allocation(costs: Sequence[float], slots: int) -> tuple[float, tuple[int, ...]]:
    """max over integer ``n_1 + ... + n_k <= slots`` (each >= 1) of ``min(n_i / cost_i)``."""
    k = len(costs)
    if slots < k:
        return 0.0, ()
    best, best_alloc = 0.0, tuple([1] * k)
    for cut in itertools.combinations(range(1, slots), k - 1):
        alloc = tuple(b - a for a, b in zip((0, *cut), (*cut, slots), strict=True))
        rate = min(n / c if c > 0 else math.inf for n, c in zip(alloc, costs, strict=True))
        if rate > best:
            best, best_alloc = rate, alloc
    return best, best_alloc


def usable_cores(num_cpus: float) -> float:
    try:
        machine = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        machine = os.cpu_count() or 1
    return min(num_cpus, machine)


# -- measurement --------------------------------------------------------------------------
class TreeSampler:
    """Background sampler of the whole process tree's memory and this run's shared memory.

    Every ``interval_s`` it sums RSS over the driver and all its descendants, and the bytes of
    files under ``<shm root>/conveyor-<driver pid>-*`` (where the local backend keeps payloads;
    other programs' run directories are not counted). Every ``pss_every`` samples it also sums
    PSS, which counts pages shared by forked workers once instead of once per process.
    """

    def __init__(self, interval_s: float = 0.02, pss_every: int = 5) -> None:
        self.interval_s = interval_s
        self.pss_every = pss_every
        self.root = default_root()
        self.pattern = f"conveyor-{os.getpid()}-*"
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_shm = 0
        self.peak_procs = 0
        self.samples = 0
        # CPU seconds per process of the tree, as last seen: live processes that are not
        # this one's waited-for children (a Ray cluster's) are counted this way
        self.cpu_seen: dict[int, float] = {}
        self.cpu_base: dict[int, float] = {}
        self._me = psutil.Process()
        self._procs: list[psutil.Process] = [self._me]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _refresh(self) -> None:
        try:
            self._procs = [self._me, *self._me.children(recursive=True)]
        except psutil.Error:
            self._procs = [self._me]

    def shm_bytes(self) -> int:
        total = 0
        for run_dir in self.root.glob(self.pattern):
            try:
                with os.scandir(run_dir) as entries:
                    for entry in entries:
                        with contextlib.suppress(OSError):
                            total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                pass
        return total

    def sample(self) -> None:
        if self.samples % 5 == 0:
            self._refresh()
        want_pss = self.pss_every > 0 and self.samples % self.pss_every == 0
        rss = pss = 0
        for proc in self._procs:
            try:
                if proc is not self._me and self.samples % 5 == 0:
                    times = proc.cpu_times()
                    self.cpu_seen[proc.pid] = times.user + times.system
                    if self.samples == 0:
                        self.cpu_base[proc.pid] = self.cpu_seen[proc.pid]
                if want_pss:
                    info = proc.memory_full_info()
                    pss += info.pss
                    rss += info.rss
                else:
                    rss += proc.memory_info().rss
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, rss)
        if want_pss:
            self.peak_pss = max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, len(self._procs))
        self.peak_shm = max(self.peak_shm, self.shm_bytes())
        self.samples += 1

    def descendants_cpu_s(self) -> float:
        """CPU seconds the driver's descendants used during the run (as sampled)."""
        return sum(v - self.cpu_base.get(pid, 0.0) for pid, v in self.cpu_seen.items())

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> TreeSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="tree-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()


@dataclass
class Measurement:
    """One contender's run as the benchmarks report it."""

    label: str
    tasks: int
    outputs: int = 0
    wall_s: float = 0.0  # driver side: from the call to the last output and shutdown
    first_output_s: float | None = None  # RunResult.first_output_s (loop: first task done)
    driver_first_s: float | None = None  # driver side, from the stream() call
    startup_s: float | None = None  # RunResult.startup_s (None for the loop)
    steady_tps: float | None = None  # (outputs - 1) / (last output - first output)
    shutdown_s: float | None = None  # driver side: from the last output to the end of the run
    peak_rss: int = 0
    peak_pss: int = 0
    peak_shm: int = 0
    peak_procs: int = 0
    failures: int = 0
    workers: dict[str, int] = field(default_factory=dict)  # peak workers per stage
    queue_hwm_bytes: int = 0  # largest edge high-water mark (bytes)
    queue_hwm_tasks: int = 0
    queue_hwm_mb: dict[str, float] = field(default_factory=dict)  # per stage (its input edge)
    load_1m: float = 0.0  # the machine's 1-minute load average when the run ended
    driver_cpu_s: float = 0.0  # user + system CPU of this process (sampler thread included)
    workers_cpu_s: float = 0.0  # user + system CPU of exited descendants (hosts and workers)

    @property
    def tps(self) -> float:
        return self.outputs / self.wall_s if self.wall_s > 0 else 0.0


class TraceMonitor:
    """Prints the controller's snapshot every tick (``--trace``): workers, queues, task times."""

    def __init__(self, label: str) -> None:
        self.label = label

    def on_start(self, pipeline: str, stages: list[str]) -> None:
        print(
            f"  [{self.label}] trace: t  stage=ready+starting/target q=queued f=in flight "
            "o=done tt=task time ms"
        )

    def on_tick(self, snap: Any) -> None:
        parts = []
        for s in snap.stages:
            tt = None if s.task_time_s is None else s.task_time_s * 1e3
            parts.append(
                f"{s.name}={s.workers_ready}+{s.workers_starting}/{s.target} "
                f"q={s.queued} f={s.in_flight} o={s.tasks_out} tt={fmt(tt, '.0f')}"
            )
        print(f"  [{self.label}] {snap.elapsed_s:6.2f}s  " + " | ".join(parts), flush=True)

    def on_end(self, result: Any) -> None:
        pass


def _steady(outputs: int, first: float | None, last: float | None) -> float | None:
    if outputs < 2 or first is None or last is None or last <= first:
        return None
    return (outputs - 1) / (last - first)


def run_conveyor(
    label: str,
    stages: list[ProcessingStage[Any, Any]],
    executor_cls: type[StreamingExecutor] | type[BatchExecutor] | None,
    tasks: Iterable[Any],
    n_tasks: int,
    *,
    num_cpus: float,
    memory_budget_bytes: int | None = None,
    on_output: Callable[[Any], None] | None = None,
    sample_interval_s: float = 0.02,
    pss_every: int = 5,
    trace: bool = False,
    engine: str = "local",
    ray_session: RaySession | None = None,
    journal: str | os.PathLike[str] | None = None,
    monitors: Sequence[Any] = (),
) -> Measurement:
    """Run ``stages`` through ``Pipeline.stream()`` on a fresh backend of ``engine``.

    ``local``: ``LocalBackend(num_cpus)``; ``ray``: ``RayBackend`` on the script's Ray
    cluster (``RaySession``); ``ray-data``: ``RayDataExecutor`` there (``executor_cls`` is
    ignored). Ray runs sample memory less often: reading PSS of Ray's many processes costs
    CPU that the run would miss. ``journal``: the run keeps one there (``Pipeline.stream``).
    ``monitors`` watch the run (besides the trace).
    """
    monitors = [*([TraceMonitor(label)] if trace else []), *monitors]
    if engine == "local":
        backend: Any = LocalBackend(num_cpus=num_cpus, memory_budget_bytes=memory_budget_bytes)
    elif engine in ("ray", "ray-data"):
        if ray_session is not None:
            ray_session.ensure()
            ray_session.settle()
        sample_interval_s, pss_every = max(sample_interval_s, 0.05), max(pss_every, 10)
    else:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "ray":
        from conveyor.backends import RayBackend

        backend = RayBackend(memory_budget_bytes=memory_budget_bytes)
    if engine == "ray-data":
        from conveyor.executors import RayDataExecutor

        executor: Any = RayDataExecutor()
    else:
        assert executor_cls is not None
        executor = executor_cls(backend, monitors=monitors)
    pipeline = Pipeline(f"bench-{label}", stages)
    m = Measurement(label, n_tasks)
    first = last = None
    with TreeSampler(sample_interval_s, pss_every) as sampler, CpuClock() as cpu:
        begun = time.perf_counter()
        run = pipeline.stream(executor, initial_tasks=tasks, journal=journal)
        with run:
            for out in run:
                last = time.perf_counter() - begun
                if first is None:
                    first = last
                m.outputs += 1
                if on_output is not None:
                    on_output(out)
        m.wall_s = time.perf_counter() - begun
    result = run.result
    m.first_output_s = result.first_output_s
    m.driver_first_s = first
    m.startup_s = result.startup_s
    m.steady_tps = _steady(m.outputs, first, last)
    m.shutdown_s = None if last is None else m.wall_s - last
    m.failures = len(result.failures)
    m.workers = {name: s.peak_workers for name, s in result.stats.items()}
    m.queue_hwm_bytes = max((s.queue_hwm_bytes for s in result.stats.values()), default=0)
    m.queue_hwm_tasks = max((s.queue_hwm_tasks for s in result.stats.values()), default=0)
    m.queue_hwm_mb = {name: s.queue_hwm_bytes / MIB for name, s in result.stats.items()}
    _take_peaks(m, sampler)
    m.driver_cpu_s = cpu.driver_s
    m.workers_cpu_s = max(cpu.children_s, sampler.descendants_cpu_s())
    if result.failures:
        print(f"  !! {label}: {len(result.failures)} failures, first: {result.failures[0]}")
    return m


def run_loop(
    label: str,
    stages: list[ProcessingStage[Any, Any]],
    tasks: Iterable[Any],
    n_tasks: int,
    *,
    sample_interval_s: float = 0.02,
    pss_every: int = 5,
) -> Measurement:
    """The same stage objects called one task at a time in this process (no engine at all)."""
    m = Measurement(label, n_tasks)
    first = last = None
    with TreeSampler(sample_interval_s, pss_every) as sampler, CpuClock() as cpu:
        begun = time.perf_counter()
        for task in tasks:
            items = [task]
            for stage in stages:
                items = stage.process_batch(items) if items else items
            if items:
                last = time.perf_counter() - begun
                if first is None:
                    first = last
                m.outputs += len(items)
        m.wall_s = time.perf_counter() - begun
    m.first_output_s = m.driver_first_s = first
    m.steady_tps = _steady(m.outputs, first, last)
    m.shutdown_s = None if last is None else m.wall_s - last
    _take_peaks(m, sampler)
    m.driver_cpu_s, m.workers_cpu_s = cpu.driver_s, cpu.children_s
    return m


def measure_iter(
    label: str, n: int, produce: Callable[[], Iterable[Any]], stamped: bool = False
) -> Measurement:
    """Measure a run that is not Conveyor's: ``produce()`` yields its outputs.

    ``stamped``: each output is ``(value, made_at, started_at)`` in wall-clock time, for
    engines that hand outputs back only at the end; first output and start-up then come from
    those stamps rather than from arrival at the driver.
    """
    m = Measurement(label, n)
    first = last = None
    made: list[float] = []
    starts: list[float] = []
    with TreeSampler(0.05, 10) as sampler, CpuClock() as cpu:
        wall0 = time.time()
        begun = time.perf_counter()
        for out in produce():
            last = time.perf_counter() - begun
            if first is None:
                first = last
            if stamped:
                made.append(out[1])
                starts.append(out[2])
            m.outputs += 1
        m.wall_s = time.perf_counter() - begun
    if stamped and made:
        m.first_output_s = min(made) - wall0
        m.startup_s = min(starts) - wall0
    else:
        m.first_output_s = first
        m.steady_tps = _steady(m.outputs, first, last)
        m.shutdown_s = None if last is None else m.wall_s - last
    m.driver_first_s = first
    _take_peaks(m, sampler)
    m.driver_cpu_s = cpu.driver_s
    m.workers_cpu_s = max(cpu.children_s, sampler.descendants_cpu_s())
    return m


class CpuClock:
    """CPU seconds of this process and of its (exited, waited-for) descendants over a block."""

    @staticmethod
    def _now() -> tuple[float, float]:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime

    def __enter__(self) -> CpuClock:
        self._start = self._now()
        self.driver_s = self.children_s = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._now()
        self.driver_s = end[0] - self._start[0]
        self.children_s = end[1] - self._start[1]


def _take_peaks(m: Measurement, sampler: TreeSampler) -> None:
    m.load_1m = os.getloadavg()[0]
    m.peak_rss = sampler.peak_rss
    m.peak_pss = sampler.peak_pss
    m.peak_shm = sampler.peak_shm
    m.peak_procs = sampler.peak_procs


# -- output -------------------------------------------------------------------------------
def fmt(value: Any, spec: str = ".2f", none: str = "-") -> str:
    if value is None:
        return none
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)


def mb(nbytes: int | None) -> str:
    return fmt(None if nbytes is None else nbytes / MIB, ".1f")


def check(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "MISS")


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        parts = [
            row[i].ljust(widths[i]) if i == 0 else row[i].rjust(widths[i]) for i in range(len(row))
        ]
        return "  ".join(parts).rstrip()

    rule = "-" * len(line(cells[0]))
    out = [title, rule, line(cells[0]), rule, *(line(r) for r in cells[1:]), rule]
    return "\n".join(out)


RESOURCE_HEADER = [
    "contender",
    "peak RSS MB",
    "peak PSS MB",
    "shm peak MB",
    "procs",
    "driver cpu s",
    "workers cpu s",
    "cpu util",
    "load 1m",
]
RESOURCE_NOTE = (
    "peak RSS/PSS = sum over the driver and all its descendants (RSS sampled every 20 ms, PSS "
    "every 100 ms; Ray runs 50 / 500 ms;\n  RSS counts pages shared by forked workers once per "
    "process, PSS splits them); shm peak = bytes in this run's <shm>/conveyor-<pid>-* dirs "
    "(Ray keeps payloads in its object store, mapped into its processes: in RSS/PSS);\n  "
    "procs = most "
    "processes seen at once; cpu = user+sys seconds (driver includes the sampler thread; "
    "workers = exited children, or the sampled\n  descendants for Ray, whose cluster "
    "outlives a run; with --ray-address the cluster is not a descendant and not counted); "
    "cpu util = (driver + workers cpu) / (wall x usable cores);\n  load 1m = the machine's "
    "1-minute load average at the end of the run (other programs' load makes timings noisy)"
)


def resource_row(m: Measurement, cores: float) -> list[str]:
    total = m.driver_cpu_s + m.workers_cpu_s
    util = total / (m.wall_s * cores) if m.wall_s > 0 and cores > 0 else None
    return [
        m.label,
        mb(m.peak_rss),
        mb(m.peak_pss),
        mb(m.peak_shm),
        str(m.peak_procs),
        fmt(m.driver_cpu_s),
        fmt(m.workers_cpu_s),
        fmt(util),
        fmt(m.load_1m),
    ]


def machine_line(num_cpus: float) -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    vm = psutil.virtual_memory()
    missing = without_bytecode()
    bytecode = (
        f"MISSING for {', '.join(missing)} (every process compiles them; `make bytecode`)"
        if missing
        else "compiled"
    )
    return (
        f"machine: {usable_cores(num_cpus):g} usable cores (budget num_cpus={num_cpus:g}, "
        f"os.cpu_count()={os.cpu_count()}), {vm.total / 2**30:.1f} GiB RAM, "
        f"load avg {load}, shm root {Path(default_root())}, installed packages' bytecode "
        f"{bytecode}"
    )


def contenders(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(label, engine, kind): local ones keep their plain names, then Ray's.

    ``hand`` (a hand-written Ray pipeline, see ``_ray_hand``) exists on Ray only, ``loop``
    (no engine at all) only once, with the local contenders.
    """
    plan = []
    for engine in args.engines:
        if engine == "local":
            plan += [(name, engine, name) for name in args.only if name != "hand"]
        elif engine == "ray":
            plan += [(f"ray {name}", engine, name) for name in args.only if name != "loop"]
        else:
            plan.append(("ray-data", engine, "ray-data"))
    return plan
