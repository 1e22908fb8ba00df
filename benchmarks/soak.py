"""Chaos soak: a real pipeline runs for N minutes while workers are killed and inputs misbehave.

Three stages (``parse`` makes a payload from an int, ``transform`` hashes it, ``finish``
checks the hash and filters) run on the local backend or on a three-node loopback Ray
cluster while faults are injected:

* from outside, a chaos driver ``kill -9``'s a random worker every ``--kill-every`` seconds
  (on average; busy, idle or still in its ``setup``, which takes ``--setup-s`` as a model
  load would) and, on Ray, kills a whole node (every process of it) mid-run;
* from inside, each input's fate is a pure function of its value and ``--seed``: poison
  inputs raise ``PermanentError`` or an exception on every attempt, "crash" inputs kill their
  own worker on every attempt, "hang" inputs sleep forever in ``transform`` (which has
  ``timeout_s``), transient inputs raise once and must still come out, and some inputs are
  filtered by ``finish``.

Because the truth is known, the end is checked input by input: every input is accounted for
exactly once (an output with the right digest, filtered, or failed in the right stage with
the right error type and attempts), no innocent input is lost, no process or shared-memory
store of the run is left, and memory has not grown (the driver's peak RSS and the process
tree's peak PSS over a window after warm-up and over the last window before the source
closes). It prints the figures and exits 1 when a check fails. docs/soak.md has a run.

    .venv/bin/python benchmarks/soak.py                        # 2 minutes, local backend
    .venv/bin/python benchmarks/soak.py --minutes 10 --seed 3
    .venv/bin/python benchmarks/soak.py --backend ray --minutes 1
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _common import TraceMonitor, check, fmt, machine_line, mb, table

from conveyor import PermanentError, Pipeline, ProcessingStage, Resources
from conveyor.backends.shm_store import default_root
from conveyor.executors import StreamingExecutor
from conveyor.result import FailureRecord, RunResult

# -- the truth: what each input is meant to do ---------------------------------------------
OK = "ok"
FILTERED = "filtered"
TRANSIENT = "transient"  # raises once at one stage, then comes out
PERMANENT = "permanent"  # raises PermanentError at one stage: failed at once
POISON = "poison"  # raises an exception at one stage on every attempt
CRASH = "crash"  # kill -9's its own worker at one stage on every attempt
HANG = "hang"  # sleeps forever in ``transform`` (past its timeout_s) on every attempt

#: inputs that must come out (or be filtered): any other end is an innocent loss
INNOCENT = (OK, TRANSIENT, FILTERED)
#: per million inputs; the rest are OK
RATES: dict[str, int] = {
    FILTERED: 80_000,
    TRANSIENT: 20_000,
    PERMANENT: 4_000,
    POISON: 4_000,
    CRASH: 1_000,
    HANG: 400,
}
#: every kind is met among the first inputs, so even a 20-second run exercises all of them
FORCED: dict[int, str] = {
    11: HANG,
    23: CRASH,
    37: PERMANENT,
    41: POISON,
    53: TRANSIENT,
    67: FILTERED,
}
STAGES = ("parse", "transform", "finish")
HANG_STAGE = 1  # transform: the stage with timeout_s
FILTER_STAGE = 2  # finish
_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64: a well-spread 64-bit hash that every process computes alike (``hash()`` of
    a str is salted per process, so it cannot be used across workers)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class PoisonPermanent(PermanentError):
    """A poison input that says so: the engine records it at its first attempt."""


class PoisonError(ValueError):
    """A poison input that does not say so: retried until ``max_attempts``, then recorded."""


class TransientError(RuntimeError):
    """Raised once per transient input; its retry must succeed."""


@dataclass(frozen=True)
class Plan:
    """What every stage needs to know: the seed, the costs, where markers go.

    ``scratch`` is a directory every worker can write (on Ray too: the "nodes" share this
    machine): a transient input leaves a marker there the first time it raises, so its retry,
    wherever it runs, goes through; a hanging worker leaves its pid, so the chaos driver
    spares it and the engine's timeout, not a random kill, is what ends it.
    """

    seed: int
    scratch: str
    setup_s: float = 0.05  # what a real stage spends loading its model in ``setup``
    cost_s: tuple[float, float, float] = (0.002, 0.004, 0.001)
    small_bytes: int = 512
    big_bytes: int = 48 << 10  # beyond the 32 KiB inline limit: lives in shared memory
    big_every: int = 5

    def _hash(self, i: int) -> int:
        return _mix(((self.seed & 0xFFFFFFFF) << 32) ^ i)

    def fate(self, i: int) -> tuple[str, int]:
        """(kind, index of the stage where it strikes; -1 for OK)."""
        h = self._hash(i)
        kind = FORCED.get(i)
        if kind is None:
            u = h % 1_000_000
            kind = OK
            for name, rate in RATES.items():
                if u < rate:
                    kind = name
                    break
                u -= rate
        if kind == OK:
            return kind, -1
        if kind == HANG:
            return kind, HANG_STAGE
        if kind == FILTERED:
            return kind, FILTER_STAGE
        return kind, (h >> 32) % len(STAGES)

    def payload(self, i: int) -> bytes:
        h = self._hash(i)
        size = self.big_bytes if (h >> 48) % self.big_every == 0 else self.small_bytes
        block = hashlib.blake2b(f"{self.seed}:{i}".encode()).digest()  # 64 bytes
        return (block * (size // len(block) + 1))[:size]

    def digest(self, i: int) -> str:
        return _digest(self.payload(i))


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def strike(plan: Plan, i: int, stage: int) -> None:
    """Do to input ``i`` at ``stage`` what its fate says (nothing for most inputs)."""
    kind, where = plan.fate(i)
    if where != stage:
        return
    if kind == PERMANENT:
        raise PoisonPermanent(f"input {i} is poison (permanent) at {STAGES[stage]}")
    if kind == POISON:
        raise PoisonError(f"input {i} is poison at {STAGES[stage]}")
    if kind == TRANSIENT:
        try:  # O_EXCL: exactly one attempt, on whichever worker or node, creates it
            fd = os.open(Path(plan.scratch) / f"transient-{i}", os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        os.close(fd)
        raise TransientError(f"input {i} fails once at {STAGES[stage]}")
    if kind == CRASH:
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == HANG:
        (Path(plan.scratch) / f"hang-{os.getpid()}").touch()
        while True:
            time.sleep(3600)


# -- the pipeline ---------------------------------------------------------------------------
class _SoakStage(ProcessingStage[Any, Any]):
    """A stage with a ``setup`` that takes a while, as a real one loading a model does, so
    random kills also land on workers still setting up; its end is marked (``ready-<pid>``)
    so the chaos driver can count those."""

    def __init__(self, plan: Plan, cpus: float) -> None:
        self.plan = plan
        self.resources = Resources(cpus=cpus)

    def setup(self, worker: Any) -> None:
        time.sleep(self.plan.setup_s)
        (Path(self.plan.scratch) / f"ready-{os.getpid()}").touch()


class Parse(_SoakStage):
    """An int in, a record with its payload out (a fifth of them past the inline limit)."""

    name = "parse"

    def process(self, task: int) -> dict[str, Any]:
        strike(self.plan, task, 0)
        time.sleep(self.plan.cost_s[0])
        return {"id": task, "payload": self.plan.payload(task)}


class Transform(_SoakStage):
    """Hashes the payload; batches of 4, with ``timeout_s``: a hang shares its batch with
    innocent inputs, which must be retried alone and go on."""

    name = "transform"
    batch_size = 4

    def __init__(self, plan: Plan, cpus: float, timeout_s: float) -> None:
        super().__init__(plan, cpus)
        self.timeout_s = timeout_s

    def process(self, task: dict[str, Any]) -> dict[str, Any]:
        strike(self.plan, task["id"], 1)
        time.sleep(self.plan.cost_s[1])
        return {**task, "digest": _digest(task["payload"])}


class Finish(_SoakStage):
    """Checks the digest against the payload it came with, filters by the fate rule, and
    returns a small record (so nothing piles up in the driver)."""

    name = "finish"
    batch_size = 8

    def process(self, task: dict[str, Any]) -> dict[str, Any] | None:
        i = task["id"]
        strike(self.plan, i, 2)
        time.sleep(self.plan.cost_s[2])
        if self.plan.fate(i)[0] == FILTERED:
            return None
        return {"id": i, "digest": task["digest"], "intact": _digest(task["payload"])}


def build_pipeline(plan: Plan, cpus: float, timeout_s: float) -> Pipeline:
    return Pipeline(
        "soak",
        [Parse(plan, cpus), Transform(plan, cpus, timeout_s), Finish(plan, cpus)],
    )


class Source:
    """Ints 0, 1, 2, ... until the deadline; pulled lazily by the engine as it has room."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.count = 0

    def __iter__(self) -> Iterator[int]:
        while time.monotonic() < self.deadline:
            i = self.count
            self.count += 1
            yield i


# -- chaos from outside -------------------------------------------------------------------
class _Background:
    """A daemon thread running ``_loop`` until ``stop``; ``_t0`` is when it started."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def _loop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Chaos(_Background):
    """A thread that ``kill -9``'s a random live worker at random intervals and, on Ray,
    kills a node once (at ``node_kill_at`` seconds, once that node holds workers).

    It only ever signals pids the backend reports as its workers and that are still what it
    expects (a descendant of this process on the local backend, a ``ray::`` process on Ray),
    so a recycled pid is never hit. Workers a hang holds are spared (see ``Plan``).
    """

    def __init__(
        self,
        backend: Any,
        plan: Plan,
        mean_s: float,
        seed: int,
        *,
        ray: bool,
        cluster: Any = None,
        node: Any = None,
        node_kill_at: float | None = None,
    ) -> None:
        self.backend = backend
        self.plan = plan
        self.mean_s = mean_s
        self.rng = random.Random(seed)
        self.ray = ray
        self.cluster = cluster
        self.node = node
        self.node_kill_at = node_kill_at
        self.kills: Counter[str] = Counter()  # by stage
        self.kills_in_setup = 0
        self.node_killed_at: float | None = None
        self.node_workers_lost = 0
        self.error: BaseException | None = None
        self._me = os.getpid()
        super().__init__("chaos")

    def _worker_pids(self) -> dict[str, int]:
        for _ in range(10):  # the engine's thread may change the table while it is read
            try:
                return dict(self.backend.worker_pids())
            except RuntimeError:
                time.sleep(0.001)
        return {}

    def _still_a_worker(self, pid: int) -> bool:
        try:
            proc = psutil.Process(pid)
            if self.ray:
                return " ".join(proc.cmdline()).startswith("ray::")
            return any(p.pid == self._me for p in proc.parents())
        except psutil.Error:
            return False

    def _kill_one(self) -> None:
        pids = self._worker_pids()
        hanging = self._marked("hang")
        candidates = sorted((w, p) for w, p in pids.items() if p not in hanging)
        if not candidates:
            return
        worker_id, pid = self.rng.choice(candidates)
        if not self._still_a_worker(pid):
            return
        in_setup = pid not in self._marked("ready")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.kills[worker_id.rsplit("-", 1)[0]] += 1
            self.kills_in_setup += in_setup

    def _marked(self, kind: str) -> set[int]:
        """Pids that left a ``<kind>-<pid>`` marker (see ``Plan`` and ``_SoakStage``)."""
        return {int(p.name.split("-", 1)[1]) for p in Path(self.plan.scratch).glob(f"{kind}-*")}

    def _maybe_kill_node(self) -> None:
        if self.node is None or self.node_killed_at is not None or self.node_kill_at is None:
            return
        if time.monotonic() - self._t0 < self.node_kill_at:
            return
        node_id = _ray_node_id(self.node.ip)
        for _ in range(10):
            try:
                on_it = sum(1 for n in self.backend.worker_nodes().values() if n == node_id)
                break
            except RuntimeError:
                time.sleep(0.001)
        else:
            on_it = 0
        if not on_it:
            return  # wait until it holds workers: losing an empty node tests nothing
        self.cluster.remove_node(self.node)  # SIGKILL to every process of the node
        self.node_killed_at = time.monotonic() - self._t0
        self.node_workers_lost = on_it

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.rng.uniform(0.5, 1.5) * self.mean_s):
                self._maybe_kill_node()
                self._kill_one()
        except BaseException as exc:  # noqa: BLE001 - reported: a dead chaos thread is a bug
            self.error = exc


def _ray_node_id(ip: str) -> str | None:
    import ray

    for n in ray.nodes():
        if n["Alive"] and n["NodeManagerAddress"] == ip:
            return str(n["NodeID"])
    return None


# -- memory and process samples -----------------------------------------------------------
@dataclass
class Window:
    """Peaks over one stretch of the run."""

    start_s: float
    end_s: float
    driver_rss: int = 0
    tree_rss: int = 0
    tree_pss: int = 0
    procs: int = 0
    zombies: int = 0
    workers: int = 0
    driver_fds: int = 0
    shm_bytes: int = 0
    samples: int = 0


class Sampler(_Background):
    """Samples the driver and its process tree every ``interval_s`` and keeps only the peaks
    of the start and end windows (so a long soak does not grow the driver it measures), and
    prints a progress line now and then."""

    def __init__(
        self,
        windows: tuple[Window, Window],
        backend: Any,
        progress: Any,
        interval_s: float = 0.5,
        progress_every_s: float = 10.0,
        shm_pattern: str | None = None,
        before: frozenset[tuple[int, float]] = frozenset(),
    ) -> None:
        self.windows = windows
        self.before = before
        self.backend = backend
        self.progress = progress
        self.interval_s = interval_s
        self.progress_every_s = progress_every_s
        self.shm_pattern = shm_pattern
        self.me = psutil.Process()
        super().__init__("soak-sampler")

    def _shm(self) -> int:
        if self.shm_pattern is None:
            return 0
        total = 0
        for run_dir in default_root().glob(self.shm_pattern):
            with contextlib.suppress(OSError), os.scandir(run_dir) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        total += entry.stat(follow_symlinks=False).st_size
        return total

    def sample(self, window: Window) -> None:
        rss = pss = procs = zombies = 0
        driver = self.me.memory_full_info()
        for proc in [self.me, *_descendants(self.me, self.before)]:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    zombies += 1
                    continue
                info = driver if proc.pid == self.me.pid else proc.memory_full_info()
            except psutil.Error:
                continue
            procs += 1
            rss += info.rss
            pss += info.pss
        try:
            workers = len(self.backend.worker_pids())
        except RuntimeError:
            workers = window.workers
        window.driver_rss = max(window.driver_rss, driver.rss)
        window.tree_rss = max(window.tree_rss, rss)
        window.tree_pss = max(window.tree_pss, pss)
        window.procs = max(window.procs, procs)
        window.zombies = max(window.zombies, zombies)
        window.workers = max(window.workers, workers)
        window.driver_fds = max(window.driver_fds, self.me.num_fds())
        window.shm_bytes = max(window.shm_bytes, self._shm())
        window.samples += 1

    def _loop(self) -> None:
        next_progress = self.progress_every_s
        while not self._stop.wait(self.interval_s):
            t = time.monotonic() - self._t0
            for window in self.windows:
                if window.start_s <= t <= window.end_s:
                    with contextlib.suppress(psutil.Error):
                        self.sample(window)
            if t >= next_progress:
                next_progress += self.progress_every_s
                self.progress(t)


# -- the run ------------------------------------------------------------------------------
@dataclass
class Report:
    """Every figure the soak prints; ``ok`` is whether every check passed."""

    backend: str
    seed: int
    minutes: float
    inputs: int = 0
    outputs: int = 0
    filtered: int = 0
    failed: int = 0
    fates: Counter[str] = field(default_factory=Counter)
    failures_by_type: Counter[str] = field(default_factory=Counter)
    expected_failures_by_type: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    kills_in_setup: int = 0
    node_kills: int = 0
    node_workers_lost: int = 0
    transient_raised: int = 0
    innocent_losses: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    unexpected_outputs: list[str] = field(default_factory=list)
    wrong_reasons: list[str] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    #: PermanentError inputs recorded after more than one attempt: each extra attempt was
    #: charged by a worker that died holding the input alone. The chaos driver killing it
    #: while the input ran explains that, rarely; so does an engine defect (the input was sent
    #: to a worker already dead, whose death was then charged to it): shown, not failed
    extra_attempts: list[str] = field(default_factory=list)
    #: poison inputs whose last attempt the chaos driver's kill ended (``_killed_by_chaos``):
    #: WorkerDied is then the right reason; shown, not failed
    chaos_ended: list[str] = field(default_factory=list)
    count_mismatches: list[str] = field(default_factory=list)
    source_s: float = 0.0
    total_s: float = 0.0
    start: Window | None = None
    end: Window | None = None
    processes_left: list[str] = field(default_factory=list)
    stores_left: list[str] = field(default_factory=list)
    run_error: str | None = None
    chaos_error: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    rss_factor: float = 1.5

    #: whether the run ended and every input was checked against its fate
    accounted: bool = False

    def _growth(self, key: str) -> float | None:
        if self.start is None or self.end is None or not self.end.samples:
            return None
        before, after = getattr(self.start, key), getattr(self.end, key)
        return after / before if before else None

    @property
    def driver_growth(self) -> float | None:
        """Peak driver RSS over the end window / over the start window."""
        return self._growth("driver_rss")

    @property
    def tree_growth(self) -> float | None:
        """The same for the whole process tree's PSS (RSS would count shared pages once per
        forked worker, so it moves with the number of workers)."""
        return self._growth("tree_pss")

    def checks(self) -> list[tuple[str, str, str, bool]]:
        """(figure, measured, target, passed) for every check that applies: a run that
        stopped has nothing to account for, but what it left behind still counts."""
        rows = [
            ("run completed", "no" if self.run_error else "yes", "yes", self.run_error is None),
            ("chaos driver ran", "no" if self.chaos_error else "yes", "yes", not self.chaos_error),
        ]
        if self.accounted:
            for label, items in (
                ("innocent losses", self.innocent_losses),
                ("duplicates", self.duplicates),
                ("unaccounted inputs", self.unaccounted),
                ("faulty inputs that came out", self.unexpected_outputs),
                ("failures with a wrong reason", self.wrong_reasons),
                ("outputs with a wrong digest", self.corrupt),
                ("engine counts that disagree", self.count_mismatches),
            ):
                rows.append((label, str(len(items)), "0", not items))
        rows += [
            ("processes left", str(len(self.processes_left)), "0", not self.processes_left),
            ("stores left", str(len(self.stores_left)), "0", not self.stores_left),
        ]
        if self.accounted:
            for label, growth in (
                ("driver RSS end / start", self.driver_growth),
                ("tree PSS end / start", self.tree_growth),
            ):
                passed = growth is not None and growth <= self.rss_factor
                rows.append((label, fmt(growth), f"<= {self.rss_factor:g}", passed))
        return rows

    @property
    def ok(self) -> bool:
        return all(passed for *_, passed in self.checks())


EXPECTED_FAILURE = {
    PERMANENT: "PoisonPermanent",
    POISON: "PoisonError",
    CRASH: "WorkerDied",
    HANG: "TaskTimeout",
}


def _killed_by_chaos(fails: list[FailureRecord], stage: str, kills: Counter[str]) -> bool:
    """An input that raises on every attempt ends as WorkerDied when the chaos driver's
    ``kill -9`` lands while its worker holds it alone on the last attempt: right, rarely
    (once in about 60 poison inputs over a quarter-minute soak)."""
    return (
        bool(fails)
        and fails[0].error_type == "WorkerDied"
        and fails[0].stage == stage
        and "SIGKILL" in fails[0].message
        and kills[stage] > 0
    )


def _root_id(label: str) -> int | None:
    """The input a lineage label descends from ("7.0" and "7" come from input 7; without a
    journal the engine labels source tasks by their position, which is their value here)."""
    head = label.split(".", 1)[0].split("*", 1)[0]
    return int(head) if head.isdigit() else None


def account(
    report: Report,
    plan: Plan,
    n: int,
    seen: bytearray,
    corrupt: list[int],
    result: RunResult,
    max_attempts: int,
) -> None:
    """Check every input against its fate; fill the report's lists and counters."""
    failures: dict[int, list[FailureRecord]] = {}
    for record in result.failures:
        i = _root_id(record.task)
        if i is None or i >= n:
            report.unaccounted.append(f"failure of unknown input {record.task!r}: {record}")
            continue
        failures.setdefault(i, []).append(record)
        report.failures_by_type[record.error_type] += 1
    report.corrupt = [f"input {i}" for i in corrupt]
    filtered = 0
    for i in range(n):
        kind, where = plan.fate(i)
        outs = seen[i] if i < len(seen) else 0
        fails = failures.get(i, [])
        if outs + len(fails) > 1:
            report.duplicates.append(f"input {i} ({kind}): {outs} outputs, {len(fails)} failures")
        if kind in INNOCENT:
            want_out = 0 if kind == FILTERED else 1
            if kind == FILTERED and not outs and not fails:
                filtered += 1
            if outs < want_out or fails:
                what = "; ".join(str(f) for f in fails) or "no output, no failure"
                report.innocent_losses.append(f"input {i} ({kind}): {what}")
            elif outs > want_out and kind == FILTERED:
                report.unexpected_outputs.append(f"input {i} ({kind}) came out")
            continue
        expected_type = EXPECTED_FAILURE[kind]
        if kind == POISON and _killed_by_chaos(fails, STAGES[where], report.kills):
            expected_type = "WorkerDied"
            report.chaos_ended.append(f"input {i}: {fails[0]}")
        report.expected_failures_by_type[expected_type] += 1
        if outs:
            report.unexpected_outputs.append(f"input {i} ({kind} at {STAGES[where]}) came out")
        if not fails:
            if not outs:
                report.unaccounted.append(f"input {i} ({kind} at {STAGES[where]}) vanished")
            continue
        record = fails[0]
        # PermanentError is recorded at the attempt that raises it; an attempt before that is
        # charged only when a worker died holding the input alone (see ``Report.extra_attempts``)
        attempts_ok = (
            1 <= record.attempts <= max_attempts
            if kind == PERMANENT
            else record.attempts == max_attempts
        )
        if (record.error_type, record.stage) != (expected_type, STAGES[where]) or not attempts_ok:
            report.wrong_reasons.append(
                f"input {i} ({kind} at {STAGES[where]}, expected {expected_type}): {record}"
            )
        elif kind == PERMANENT and record.attempts > 1:
            report.extra_attempts.append(f"input {i}: {record}")
    counts = result.counts
    want = {
        "inputs": n,
        "outputs": report.outputs,
        "failed": len(result.failures),
        "filtered": filtered,
    }
    for key, value in want.items():
        if counts.get(key) != value:
            report.count_mismatches.append(f"counts[{key!r}] = {counts.get(key)}, expected {value}")
    report.filtered = counts.get("filtered", 0)
    report.failed = len(result.failures)
    report.accounted = True


def _descendants(me: psutil.Process, before: frozenset[tuple[int, float]]) -> list[psutil.Process]:
    """This process's descendants that were not there before the run (``before``: pid and
    start time of those that were, such as the tests' session Ray cluster)."""
    procs = []
    for proc in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if (proc.pid, proc.create_time()) not in before:
                procs.append(proc)
    return procs


def _existing(me: psutil.Process) -> frozenset[tuple[int, float]]:
    found = set()
    for proc in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found.add((proc.pid, proc.create_time()))
    return frozenset(found)


def _leftovers(
    me: psutil.Process, before: frozenset[tuple[int, float]], grace_s: float = 10.0
) -> list[str]:
    """Live (non-zombie) processes the run started that are still there after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for proc in _descendants(me, before):
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            out.append(f"{proc.pid}: {' '.join(proc.cmdline())[:120]}")
    return out


def _start_ray(cpus_per_node: int) -> tuple[Any, Any, Path]:
    """A head (127.0.0.2) and two worker nodes (127.0.0.3, .4) on loopback, each its own
    ports and token (``benchmarks/_ray_cluster.py``); the last one is the node chaos kills."""
    import _ray_cluster

    _ray_cluster.prepare()  # before anything imports ray
    token = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    root = token.parent
    env = {
        k: os.environ[k]
        for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED")
    }
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' cluster helper
    from tests.backends.ray_cluster import LocalRayCluster

    for attempt in (1, 2):
        cluster = LocalRayCluster(root, cpus_per_node=cpus_per_node, gpus_per_node=0, env=env)
        try:
            # one node at a time: on a loaded 2-core machine two joining at once time out
            cluster.start(workers=1)
            cluster.add_node("127.0.0.4")
        except Exception as exc:
            cluster.stop()
            # the helper picks each port free on its own, so two can clash (rarely): once
            # more, and a second failure is the caller's
            if attempt == 2:
                _remove_ray_root(root)
                raise
            print(f"  the cluster did not start ({str(exc).splitlines()[0]}); trying again")
            continue
        break
    return cluster, cluster.nodes[-1], root


def _remove_ray_root(root: Path) -> None:
    """Remove the cluster's directory (token, temp dir, logs) and forget it, as
    ``two_node_cluster`` does at its end, so a later ``prepare()`` makes a new one."""
    import _ray_cluster

    shutil.rmtree(root, ignore_errors=True)
    _ray_cluster._PREPARED = None


def run_soak(args: argparse.Namespace) -> Report:
    report = Report(args.backend, args.seed, args.minutes)
    duration = args.minutes * 60.0
    scratch = tempfile.mkdtemp(prefix="cvy-soak-")
    plan = Plan(args.seed, scratch, setup_s=args.setup_s)
    me = psutil.Process()
    before = _existing(me)  # not this run's: neither measured nor counted as left behind
    stores = f"conveyor-{os.getpid()}-*"  # the local backend's run directories (shm_store)
    stores_before = set(default_root().glob(stores))
    ray_mode = args.backend == "ray"
    cluster = node = ray_root = None
    window_s = max(5.0, 0.1 * duration)
    windows = (Window(window_s, 2 * window_s), Window(duration - window_s, duration))
    try:
        if ray_mode:
            print("  starting a 3-node Ray cluster on 127.0.0.2-4 ...", flush=True)
            begun = time.monotonic()
            cluster, node, ray_root = _start_ray(args.cpus_per_node)
            print(f"  Ray cluster up in {time.monotonic() - begun:.1f} s (not in the run's time)")
            from conveyor.backends import RayBackend

            backend: Any = RayBackend(cluster.address)
        else:
            from conveyor.backends import LocalBackend

            backend = LocalBackend(num_cpus=args.num_cpus)
        pipeline = build_pipeline(plan, args.cpus_per_worker, args.timeout_s)
        monitors = [TraceMonitor("soak")] if args.trace else []
        executor = StreamingExecutor(backend, max_attempts=args.max_attempts, monitors=monitors)
        seen = bytearray()
        corrupt: list[int] = []
        outputs = 0
        chaos = Chaos(
            backend,
            plan,
            args.kill_every,
            args.seed,
            ray=ray_mode,
            cluster=cluster,
            node=node,
            node_kill_at=0.5 * duration if ray_mode else None,
        )
        begun = time.monotonic()
        source = Source(begun + duration)

        def progress(t: float) -> None:
            print(
                f"  {t:6.0f} s  inputs {source.count:>7,}  outputs {outputs:>7,}  "
                f"kills {sum(chaos.kills.values()):>4}",
                flush=True,
            )

        sampler = Sampler(
            windows,
            backend,
            progress,
            progress_every_s=max(10.0, duration / 12),
            shm_pattern=None if ray_mode else stores,
            before=before,
        )
        result: RunResult | None = None
        run = pipeline.stream(executor, initial_tasks=source)
        sampler.start()
        chaos.start()
        try:
            with run:
                for out in run:
                    i = out["id"]
                    if i >= len(seen):
                        seen.extend(bytes(max(i + 1 - len(seen), 4096)))
                    seen[i] = min(seen[i] + 1, 255)
                    outputs += 1
                    if out["digest"] != out["intact"] or out["digest"] != plan.digest(i):
                        corrupt.append(i)
            result = run.result
        except Exception as exc:  # noqa: BLE001 - reported: a stopped run is a finding
            report.run_error = f"{type(exc).__name__}: {exc}"
        finally:
            chaos.stop()
            sampler.stop()
        report.total_s = time.monotonic() - begun
        report.source_s = min(duration, report.total_s)
        report.inputs = source.count
        report.outputs = outputs
        report.kills = chaos.kills
        report.kills_in_setup = chaos.kills_in_setup
        report.node_kills = int(chaos.node_killed_at is not None)
        report.node_workers_lost = chaos.node_workers_lost
        if chaos.error is not None:
            report.chaos_error = f"{type(chaos.error).__name__}: {chaos.error}"
        if ray_mode and chaos.node_killed_at is None:
            report.chaos_error = "the third node never held a worker: it was not killed"
        report.start, report.end = windows
        report.transient_raised = len(list(Path(scratch).glob("transient-*")))
        report.fates = Counter(plan.fate(i)[0] for i in range(source.count))
        if result is not None:
            report.stats = dict(result.stats)
            account(report, plan, source.count, seen, corrupt, result, args.max_attempts)
    finally:
        if ray_mode:
            import ray

            with contextlib.suppress(Exception):
                ray.shutdown()
            if cluster is not None:
                cluster.stop()
            if ray_root is not None:
                _remove_ray_root(ray_root)
        shutil.rmtree(scratch, ignore_errors=True)
    report.processes_left = _leftovers(me, before)
    report.stores_left = [str(p) for p in set(default_root().glob(stores)) - stores_before]
    if ray_root is not None and ray_root.exists():
        report.stores_left.append(str(ray_root))
    return report


# -- printing -----------------------------------------------------------------------------
def _stage_rows(stats: dict[str, Any]) -> list[list[str]]:
    return [
        [
            name,
            f"{s.tasks_in:,}",
            f"{s.tasks_out:,}",
            f"{s.filtered:,}",
            f"{s.failed:,}",
            f"{s.retried:,}",
            f"{s.worker_deaths:,}",
            f"{s.timeouts:,}",
            f"{s.recovered:,}",
            str(s.peak_workers),
        ]
        for name, s in stats.items()
    ]


STAGE_HEADER = [
    "stage",
    "in",
    "out",
    "filtered",
    "failed",
    "retried",
    "worker deaths",
    "timeouts",
    "recovered",
    "peak workers",
]


def _memory_rows(r: Report) -> list[list[str]]:
    assert r.start is not None and r.end is not None
    s, e = r.start, r.end
    rows = []
    for label, key, show in (
        ("driver RSS MB (peak)", "driver_rss", mb),
        ("process tree RSS MB (peak)", "tree_rss", mb),
        ("process tree PSS MB (peak)", "tree_pss", mb),
        ("processes (peak)", "procs", str),
        ("workers (peak)", "workers", str),
        ("zombie processes (peak)", "zombies", str),
        ("driver open fds (peak)", "driver_fds", str),
        ("payloads in shared memory MB (peak)", "shm_bytes", mb),
    ):
        if key == "shm_bytes" and r.backend != "local":
            continue  # Ray keeps payloads in its object store (in the tree's memory)
        before = getattr(s, key) if s.samples else None
        after = getattr(e, key) if e.samples else None
        ratio = after / before if before and after is not None and key != "zombies" else None
        rows.append(
            [
                label,
                "-" if before is None else show(before),
                "-" if after is None else show(after),
                fmt(ratio),
            ]
        )
    return rows


def print_report(report: Report, args: argparse.Namespace) -> None:
    """The figures: accounting, faults, the engine's per-stage counts, memory, checks."""
    r = report
    print()
    if r.run_error:
        print(f"!! the run stopped after {r.total_s:.1f} s: {r.run_error}")
    if r.chaos_error:
        print(f"!! chaos driver: {r.chaos_error}")
    print(
        f"duration: source open {r.source_s:.1f} s, then {r.total_s - r.source_s:.1f} s to "
        f"drain and shut down, {r.total_s:.1f} s in all; "
        f"{r.inputs / r.total_s if r.total_s else 0:.0f} inputs/s"
    )
    if r.accounted:
        exp_out = r.fates[OK] + r.fates[TRANSIENT]
        exp_failed = sum(r.expected_failures_by_type.values())
        rows = [
            ["inputs", f"{r.inputs:,}", "", ""],
            [
                "outputs (each with its digest checked)",
                f"{r.outputs:,}",
                f"{exp_out:,}",
                check(r.outputs == exp_out),
            ],
            [
                "filtered",
                f"{r.filtered:,}",
                f"{r.fates[FILTERED]:,}",
                check(r.filtered == r.fates[FILTERED]),
            ],
            ["failed", f"{r.failed:,}", f"{exp_failed:,}", check(r.failed == exp_failed)],
        ]
        for kind in sorted(set(r.failures_by_type) | set(r.expected_failures_by_type)):
            got, want = r.failures_by_type[kind], r.expected_failures_by_type[kind]
            rows.append([f"  failed: {kind}", f"{got:,}", f"{want:,}", check(got == want)])
        rows += [
            ["  PermanentError after > 1 attempt", str(len(r.extra_attempts)), "", ""],
            ["  poison ended by a chaos kill", str(len(r.chaos_ended)), "", ""],
            ["innocent losses", str(len(r.innocent_losses)), "0", check(not r.innocent_losses)],
            ["duplicates", str(len(r.duplicates)), "0", check(not r.duplicates)],
        ]
        print()
        print(
            table(
                "soak: every input accounted for",
                ["figure", "measured", "expected", "status"],
                rows,
            )
        )
    else:
        print(
            f"inputs admitted {r.inputs:,}, outputs seen {r.outputs:,} "
            "(not accounted for: the run stopped)"
        )
    kills = ", ".join(f"{s} {r.kills[s]}" for s in STAGES if r.kills[s]) or "none"
    attempts = f"failed after {args.max_attempts}"
    frows = [
        ["kill -9 of a random worker (chaos driver)", f"{sum(r.kills.values()):,}", kills],
        ["  of which during its setup", f"{r.kills_in_setup:,}", "replaced like any other"],
    ]
    if r.backend == "ray":
        frows.append(
            [
                "node killed (every process of 127.0.0.4)",
                str(r.node_kills),
                f"{r.node_workers_lost} workers on it",
            ]
        )
    frows += [
        [
            "exception raised once (transient)",
            f"{r.transient_raised:,}",
            f"{r.fates[TRANSIENT]:,} inputs, must come out",
        ],
        ["PermanentError (poison)", f"{r.fates[PERMANENT]:,}", "failed at once"],
        ["exception on every attempt (poison)", f"{r.fates[POISON]:,}", attempts],
        ["worker kills itself on every attempt", f"{r.fates[CRASH]:,}", attempts],
        [f"hang past timeout_s={args.timeout_s:g} (transform)", f"{r.fates[HANG]:,}", attempts],
    ]
    print()
    print(table("soak: faults injected", ["kind", "count", "expected end / where"], frows))
    if r.stats:
        print()
        print(table("soak: per stage (engine's counts)", STAGE_HEADER, _stage_rows(r.stats)))
    if r.start is not None and r.end is not None:
        s, e = r.start, r.end
        print()
        print(
            table(
                f"soak: memory, start window {s.start_s:.0f}-{s.end_s:.0f} s vs end window "
                f"{e.start_s:.0f}-{e.end_s:.0f} s ({s.samples} and {e.samples} samples)",
                ["figure", "start", "end", "end / start"],
                _memory_rows(r),
            )
        )
        tree = " (the Ray cluster included)" if r.backend == "ray" else ""
        print(
            "peaks over each window, sampled every 0.5 s; the tree is the driver and all its "
            f"descendants{tree}; RSS counts pages shared by forked workers once per process, "
            "PSS splits them"
        )
    print()
    print(
        table(
            "checks",
            ["check", "measured", "target", "status"],
            [[a, b, c, check(d)] for a, b, c, d in r.checks()],
        )
    )
    for label, items in (
        ("innocent losses", r.innocent_losses),
        ("duplicates", r.duplicates),
        ("unaccounted", r.unaccounted),
        ("faulty inputs that came out", r.unexpected_outputs),
        ("wrong reasons", r.wrong_reasons),
        ("wrong digests", r.corrupt),
        ("count mismatches", r.count_mismatches),
        ("PermanentError after more than one attempt (not a failed check)", r.extra_attempts),
        ("poison inputs a chaos kill ended (not a failed check)", r.chaos_ended),
        ("processes left", r.processes_left),
        ("stores left", r.stores_left),
    ):
        if items:
            print(f"!! {label} ({len(items)}), first {min(len(items), 10)}:")
            for item in items[:10]:
                print(f"   {item}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--minutes", type=float, default=2.0, help="how long the source stays open (default 2)"
    )
    p.add_argument("--backend", choices=["local", "ray"], default="local")
    p.add_argument(
        "--seed", type=int, default=1, help="decides every input's fate and the chaos (default 1)"
    )
    p.add_argument(
        "--kill-every",
        type=float,
        default=None,
        help="mean seconds between kill -9s (default 1 local, 3 Ray)",
    )
    p.add_argument("--timeout-s", type=float, default=2.0, help="transform's timeout_s (default 2)")
    p.add_argument(
        "--setup-s",
        type=float,
        default=0.05,
        help="seconds each worker's setup takes (default 0.05)",
    )
    p.add_argument(
        "--max-attempts", type=int, default=3, help="the executor's max_attempts (default 3)"
    )
    p.add_argument(
        "--num-cpus", type=float, default=2.0, help="LocalBackend(num_cpus=...) (default 2)"
    )
    p.add_argument(
        "--cpus-per-worker",
        type=float,
        default=None,
        help="Resources(cpus=...) of every stage (default 0.25 local, 0.5 Ray)",
    )
    p.add_argument(
        "--cpus-per-node", type=int, default=1, help="CPUs each Ray node declares (default 1)"
    )
    p.add_argument(
        "--rss-factor",
        type=float,
        default=1.5,
        help="largest end/start memory ratio that passes (default 1.5)",
    )
    p.add_argument("--trace", action="store_true", help="print the engine's state every tick")
    args = p.parse_args(argv)
    if args.minutes <= 0:
        p.error("--minutes must be > 0")
    if args.max_attempts < 2:
        p.error("--max-attempts must be >= 2: a transient input must get its second attempt")
    if args.kill_every is None:
        args.kill_every = 3.0 if args.backend == "ray" else 1.0
    if args.cpus_per_worker is None:
        args.cpus_per_worker = 0.5 if args.backend == "ray" else 0.25
    return args


def main(argv: list[str] | None = None) -> Report:
    args = parse_args(argv)
    print(
        f"soak: {args.minutes:g} min on the {args.backend} backend, seed {args.seed}, a kill -9 "
        f"every ~{args.kill_every:g} s, transform timeout_s={args.timeout_s:g}, "
        f"max_attempts={args.max_attempts}, cpus/worker={args.cpus_per_worker:g}"
    )
    print(machine_line(args.num_cpus))
    report = run_soak(args)
    report.rss_factor = args.rss_factor
    print_report(report, args)
    print(f"soak: {'PASSED' if report.ok else 'FAILED'}")
    return report


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1:]).ok else 1)
