"""Running a stage's code inside a worker, the same way on every backend.

Backends resolve handles to objects and store outputs; this module does what happens in
between: declared-input checks, ``process``/``process_batch``, lineage ids, filtered counts,
and per-task timing records.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import math
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from conveyor.backends.core_wait import core_wait_s
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.engine.policies.priority import fit_niceness
from conveyor.errors import PermanentError
from conveyor.stage import InputContract, ProcessingStage, several, yields_outputs
from conveyor.tasks.base import StagePerf, Task


def short_repr(obj: Any, limit: int = 80) -> str:
    """A bounded description of a task for failure records (never a huge repr)."""
    if isinstance(obj, Task):
        return obj.short_repr()
    if isinstance(obj, (str, bytes, int, float, bool, tuple, type(None))):
        text = repr(obj)
    else:
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def lower_priority(niceness: int) -> None:
    """Lower this process's CPU priority by ``niceness`` (``WorkerPlacement.niceness``).

    Workers call it once their stage is set up: at the start every stage's setup is on the
    way to the first output, and the slowest to set up (models, upstream) would otherwise
    come last. It is done once: lowering a nice value back needs a privilege workers lack."""
    if niceness > 0:
        with contextlib.suppress(OSError):  # not allowed here: run at the usual priority
            os.nice(fit_niceness(niceness, os.nice(0)))


def process_footprint() -> int:
    """Bytes this process costs the machine at its peak: the pages it holds alone, plus how
    far its resident size has peaked above now (activations freed since, which the next
    batch needs again). Pages shared with the stage host that forked it (the libraries and
    weights it loaded first) are not counted: one more worker does not add them."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines()[1:])
    except OSError:
        return int(peak)  # no per-page figures here: the peak resident size is the best one
    kib = {k: int(v.split()[0]) for k, v in fields.items() if v.split()}
    private = (kib.get(b"Private_Clean", 0) + kib.get(b"Private_Dirty", 0)) * 1024
    return private + max(0, int(peak) - kib.get(b"Rss", 0) * 1024)


class MemoryGauge:
    """A worker's peak footprint (``process_footprint``), read at most every ``INTERVAL_S``
    so that thousands of tiny batches a second do not each pay for reading it."""

    INTERVAL_S = 0.5

    def __init__(self) -> None:
        self._at = -math.inf
        self._peak = 0

    def read(self) -> int:
        now = time.monotonic()
        if now - self._at >= self.INTERVAL_S:
            self._at = now
            with contextlib.suppress(OSError, ValueError):
                self._peak = max(self._peak, process_footprint())
        return self._peak


#: growth of the resident memory (bytes) since the last trim below which trimming is not
#: worth it: the pages it hands back would be faulted in again by the next task (a short
#: video's encoder, some MB, is allocated and freed per clip: trimming after each made the
#: workers fault 400 pages per video and spend a twentieth of their time in the kernel)
TRIM_ABOVE_BYTES = 64 * 2**20


def resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc/self/statm``), or None."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): the heap's counters, in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library (looked up once: ``find_library`` may run ``ldconfig``)."""
    return ctypes.CDLL(ctypes.util.find_library("c"))


@functools.cache
def _heap_in_use() -> Callable[[], int | None]:
    """Bytes this process holds through malloc (glibc's ``mallinfo2``: in the heap and in
    mappings of their own, under a microsecond), else its resident memory, which misses
    what is freed into the heap and kept there."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        mallinfo2 = _libc().mallinfo2
        mallinfo2.restype = _MallInfo2

        def in_use() -> int | None:
            info = mallinfo2()
            return int(info.uordblks + info.hblkhd)

        return in_use
    return resident_bytes


#: memory (bytes) a collection of reference cycles must free for it to run again after the
#: very next task, whatever it cost: what it costs then is mostly freeing that memory, not
#: wasted scanning (tasks each leaving a 40 MB cycle behind grew a worker by 8 tasks' worth
#: between collections budgeted by their time alone)
COLLECT_AGAIN_BYTES = 8 * 2**20


def collect_cycles(in_use: Callable[[], int | None] | None = None) -> bool:
    """A tidying step: a full collection of reference cycles; True where it freed
    ``COLLECT_AGAIN_BYTES`` or more (``in_use``: bytes held, by default through malloc)."""
    read = in_use or _heap_in_use()
    before = read()
    gc.collect()
    after = read()
    return before is not None and after is not None and before - after >= COLLECT_AGAIN_BYTES


class HeapTrim:
    """A tidying step: glibc's ``malloc_trim`` hands the heap's free pages back to the
    system, once the resident memory has grown by ``above`` bytes since the last trim (or
    since it was made), so that a worker that freed a large task's memory gives it back
    while one whose tasks reuse the same few MB is left alone. Where the resident memory
    cannot be read, it trims every time."""

    def __init__(
        self,
        trim: Callable[[int], object],
        resident: Callable[[], int | None] = resident_bytes,
        above: int = TRIM_ABOVE_BYTES,
    ) -> None:
        self._trim, self._resident, self._above = trim, resident, above
        self._base = resident()

    def __call__(self) -> None:
        now = self._resident()
        if now is not None and self._base is not None and now - self._base < self._above:
            self._base = min(self._base, now)  # memory handed back by other means
            return
        self._trim(0)
        self._base = self._resident()

    @classmethod
    def of_libc(cls) -> HeapTrim | None:
        """The step with glibc's ``malloc_trim``, or None where there is none."""
        with contextlib.suppress(OSError, AttributeError, TypeError):
            return cls(_libc().malloc_trim)
        return None


class BatchClock:
    """A batch's three clocks, started together when it starts and read together when it
    ends: its busy (wall) time, the CPU time of the worker's process, and how long its thread
    waited for a core (``core_wait``), which every backend's workers report apart.

    The wait is read inside the wall time's span (after it at the start, before it at the
    end), so a wait for a core between two reads is never counted without the wall time it
    took. And it is at most the wall time less what the thread itself ran: the kernel's
    count of waits went past that by up to 50 ms a batch in a niced Ray worker on a loaded
    machine, which measured a 20 ms task as taking 1 ms."""

    __slots__ = ("_cpu", "_queued", "_ran", "_wall")

    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        self._ran = time.thread_time()
        self._queued = core_wait_s()

    def read(self, paused_s: float = 0.0) -> tuple[float, float, float]:
        """Busy, CPU and core-wait seconds so far; ``paused_s`` (a generator waiting for
        room downstream) is not busy time."""
        queued = core_wait_s() - self._queued
        ran = time.thread_time() - self._ran
        cpu = time.process_time() - self._cpu
        wall = time.perf_counter() - self._wall
        return wall - paused_s, cpu, max(0.0, min(queued, wall - ran))


class Tidier:
    """Frees what a worker's tasks left behind, each step (``steps``: by default a collection
    of reference cycles, then a heap trim) for at most ``SHARE`` of the worker's busy time.

    A step that returns True (``collect_cycles`` when it freed a lot) found its work
    worth doing and runs again after the next task, outside the budget: what it cost was
    mostly freeing memory that had to be freed anyway.

    Python collects its oldest generation only once it has grown by a quarter of what lives
    there, and a few cyclic objects can hold a lot: a PyAV frame whose side data was read
    is in a cycle with it, four objects holding 1.4 MB at 720p, so a worker could sit on
    gigabytes between collections. After ``freeze`` (what setup built lives as long as the
    worker and is never scanned again) a collection after each task costs microseconds;
    glibc's ``malloc_trim`` then hands the freed pages back to the machine where many are
    free (``TRIM_ABOVE_BYTES``), which costs more (the next batch faults them in again)
    and so runs less often.

    What the first task built to stay (the modules a stage imports on first use, their
    caches) is frozen too, after that task: a stage that collects on its own (the motion
    tally, after each clip) would otherwise walk it again every time: a third of a
    millisecond per clip in the transcoder, 1% of what a 2 s video costs it.
    """

    SHARE = 0.005

    def __init__(self, steps: Sequence[Callable[[], object]] | None = None) -> None:
        if steps is None:
            trim = HeapTrim.of_libc()
            steps = [collect_cycles] if trim is None else [collect_cycles, trim]
        self._steps = list(steps)
        self._busy = 0.0  # busy seconds in all
        self._due = [0.0] * len(self._steps)  # when each step runs next, in busy seconds
        self._next = 0.0  # the earliest of them
        self._first = True  # no task has ended yet

    def freeze(self) -> None:
        gc.collect()
        gc.freeze()

    def after(self, busy_s: float) -> None:
        """Call after each task (or batch) with the seconds it took."""
        self._busy += busy_s
        if self._first:
            # what the first task left behind is garbage and is collected; the steps wait
            # for the next task: run now they would find nothing and wait long for it
            self._first = False
            self.freeze()
            return
        if self._busy < self._next:
            return
        for i, step in enumerate(self._steps):
            if self._busy >= self._due[i]:
                clock = BatchClock()
                if step() is True:
                    self._due[i] = self._busy  # worth it: again after the next task
                else:
                    # what the step took, less any wait for a core: on a loaded machine
                    # that wait was most of it, and put the next step off far too long
                    took, _, queued = clock.read()
                    self._due[i] = self._busy + (took - queued) / self.SHARE
        self._next = min(self._due)


class StageRunner:
    """One worker's view of its stage."""

    def __init__(self, stage: ProcessingStage[Any, Any], name: str, worker: WorkerInfo) -> None:
        self.stage = stage
        self.name = name
        self.worker = worker
        self.per_task = not stage.overrides("process_batch")
        self._required: InputContract | None = None
        self._asked = False  # inputs() is asked once, at the first batch
        self.tidier = Tidier()
        #: the stage yields its outputs (``stream``); ``filtered`` is the last batch's count
        self.streams = yields_outputs(stage)
        self.filtered = 0

    def setup_on_node(self, node: NodeInfo) -> None:
        self.stage.setup_on_node(node, self.worker)

    def setup(self) -> None:
        self.stage.setup(self.worker)
        self.tidier.freeze()

    def teardown(self) -> None:
        """The stage's ``teardown``. Its failure cannot fail a task any more (every output
        is reported by then), so it is said on stderr, which reaches the driver's console,
        rather than lost: a teardown that flushes buffered rows may have lost data."""
        try:
            self.stage.teardown()
        except Exception:  # noqa: BLE001 - said, then the worker stops as it would
            import traceback

            print(
                f"conveyor: stage {self.name!r}, worker {self.worker.worker_id}: teardown "
                f"failed:\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )

    @property
    def required(self) -> InputContract | None:
        """What the stage declares of its inputs (``inputs()``), asked when the first batch
        comes: after ``setup``, which ``inputs()`` may read. Raising there made the worker
        die before it could say why ("worker process died during setup")."""
        if not self._asked:
            try:
                self._required = InputContract.of(self.stage.inputs())
            except Exception as exc:
                raise PermanentError(
                    f"stage {self.name!r}: inputs() raised {type(exc).__name__}: {exc}"
                ) from exc
            self._asked = True
        return self._required

    def _check_inputs(self, tasks: list[Any], labels: list[str]) -> None:
        contract = self._required
        assert contract is not None
        for task, label in zip(tasks, labels, strict=True):
            missing = contract.missing(task)
            if missing:
                raise ValueError(
                    f"stage {self.name!r}: input {label} ({short_repr(task)}) lacks declared "
                    f"input(s) {', '.join(missing)}"
                )

    def run(
        self, tasks: list[Any], labels: list[str], threads: int | None = None
    ) -> tuple[list[Any], list[str], int]:
        """Process one batch with ``threads`` CPU threads (``None``: the stage's CPUs);
        returns outputs, their lineage ids, and inputs that gave nothing."""
        if self.streams:  # made one by one, taken all at once (Ray Data; tests)
            made = list(self.stream(tasks, labels, threads))
            return [o for o, _ in made], [lab for _, lab in made], self.filtered
        # as ``_exit_fails_the_batch`` does, without a context manager's cost on each batch
        try:
            return self._run(tasks, labels, threads)
        except SystemExit as exc:
            raise self._exit_failure(exc) from exc

    @contextlib.contextmanager
    def _exit_fails_the_batch(self) -> Iterator[None]:
        """``sys.exit()`` in a stage's code (a library's command-line helper, a slip) fails
        the batch like any error: it would have stopped the worker, every input of it then
        failed as "stopped with work in flight", its exit code lost, the worker started
        again."""
        try:
            yield
        except SystemExit as exc:
            raise self._exit_failure(exc) from exc

    def _exit_failure(self, exc: SystemExit) -> RuntimeError:
        return RuntimeError(
            f"stage {self.name!r} called sys.exit({exc.code!r}) while processing: the "
            "batch fails, the worker goes on"
        )

    def _metrics(self) -> dict[str, float]:
        """What the stage recorded of the batch so far (``log_metric``), for an output."""
        return dict(self.stage._batch_metrics or ())

    def _run(
        self, tasks: list[Any], labels: list[str], threads: int | None
    ) -> tuple[list[Any], list[str], int]:
        self.stage._threads = threads
        self.stage._batch_metrics = None
        if self.required:
            self._check_inputs(tasks, labels)
        started = time.perf_counter()
        outputs: list[Any] = []
        out_labels: list[str] = []
        filtered = 0
        if self.per_task:
            process, after, clock = self.stage.process, self.tidier.after, time.perf_counter
            for task, label in zip(tasks, labels, strict=True):
                begun = clock()
                result = process(task)
                if not isinstance(result, list) and several(result):  # undeclared: map(), ...
                    result = list(result)
                after(clock() - begun)
                if result is None or (isinstance(result, list) and not result):
                    filtered += 1
                elif isinstance(result, list):
                    outputs.extend(result)
                    out_labels.extend(f"{label}.{j}" for j in range(len(result)))
                else:
                    outputs.append(result)
                    out_labels.append(label)
        else:
            # a copy: a stage that appends to its list and returns it changed ``tasks``
            result = self.stage.process_batch(list(tasks))
            self.tidier.after(time.perf_counter() - started)
            if not isinstance(result, list) and several(result):
                result = list(result)
            if not isinstance(result, list):
                # None too: a forgotten return dropped every input as filtered ([] filters)
                hint = " (a missing return? [] filters every input)" if result is None else ""
                raise TypeError(
                    f"stage {self.name!r}: process_batch must return a list, got "
                    f"{type(result).__name__}{hint}"
                )
            outputs = result
            if len(outputs) == len(tasks):
                out_labels = list(labels)
                filtered = 0
            else:
                out_labels, filtered = Attribution(tasks, labels).labels(outputs)
        elapsed = time.perf_counter() - started
        perf = None
        for obj, label in zip(outputs, out_labels, strict=True):
            if isinstance(obj, Task):
                obj.task_id = label
                if perf is None:
                    perf = StagePerf(
                        self.name, elapsed, self.worker.worker_id, len(tasks), self._metrics()
                    )
                obj.stage_perf.append(perf)
        return outputs, out_labels, filtered

    def stream(
        self, tasks: list[Any], labels: list[str], threads: int | None = None
    ) -> Iterator[tuple[Any, str]]:
        """Run a generator stage's batch: yields each output with its lineage id as the stage
        yields it (the stage is paused in between, for as long as the caller waits); once it
        is exhausted, ``filtered`` holds how many inputs gave nothing.

        Lineage ids follow position: the ``j``-th output of input ``label`` is ``label.j``
        (a ``process_batch`` of several inputs: of the input it is known to come from,
        ``Attribution``, else ``first*j``), so the outputs of a second attempt at an input
        carry the ids of the first attempt's (``yields_outputs``).
        """
        with self._exit_fails_the_batch():
            yield from self._stream(tasks, labels, threads)

    def _stream(
        self, tasks: list[Any], labels: list[str], threads: int | None
    ) -> Iterator[tuple[Any, str]]:
        self.stage._threads = threads
        self.stage._batch_metrics = None
        self.filtered = 0
        if self.required:
            self._check_inputs(tasks, labels)
        started = time.perf_counter()
        clock, after = time.perf_counter, self.tidier.after
        if self.per_task:
            for task, label in zip(tasks, labels, strict=True):
                begun = clock()
                made = 0
                for obj in _each(self.stage.process(task)):
                    yield self._stamp(obj, f"{label}.{made}", started, 1), f"{label}.{made}"
                    made += 1
                after(clock() - begun)
                if not made:
                    self.filtered += 1
            return
        made = 0
        attribution = Attribution(tasks, labels) if len(tasks) > 1 else None
        for obj in _each(self.stage.process_batch(tasks)):
            if attribution is None:
                label = f"{labels[0]}.{made}"
            else:
                label = attribution.label(obj) or f"{labels[0]}*{made}"
            yield self._stamp(obj, label, started, len(tasks)), label
            made += 1
        after(clock() - started)
        self.filtered = attribution.filtered() if attribution else max(0, len(tasks) - made)

    def _stamp(self, obj: Any, label: str, started: float, count: int) -> Any:
        if isinstance(obj, Task):
            obj.task_id = label
            elapsed = time.perf_counter() - started
            obj.stage_perf.append(
                StagePerf(self.name, elapsed, self.worker.worker_id, count, self._metrics())
            )
        return obj


#: values Python may share between unrelated places (small ints, short strings, ``()``):
#: being one of the inputs says nothing of where such an output came from
_SHAREABLE = (int, float, complex, str, bytes, bool, tuple, frozenset, type(None))


class Attribution:
    """Which input of a batch each output of ``process_batch`` was made from, where that can
    be told: the input itself passed on (changed in place), or a task carrying its input's
    ``task_id`` (as NeMo Curator's stages make their outputs).

    An output told so is labelled as its input's (``7.0``, ``7.1``; ``7`` for a list's only
    one), so it carries that input's lineage, and a generator batch that fails part way
    fails only its culprit: its other inputs are tried again alone, and what they sent
    already is known by its id. Any other output is the whole batch's (``first*j``).
    """

    def __init__(self, tasks: Sequence[Any], labels: Sequence[str]) -> None:
        self._tasks = list(tasks)  # alive while ids are compared: an id is reused once freed
        self._labels = labels
        self._by_id = {id(t): i for i, t in enumerate(tasks) if not isinstance(t, _SHAREABLE)}
        ids = [t.task_id if isinstance(t, Task) else "" for t in tasks]
        self._by_task_id = {t: i for i, t in enumerate(ids) if t and ids.count(t) == 1}
        self._made = [0] * len(self._tasks)
        self._merged = 0

    def _input(self, obj: Any) -> int | None:
        index = self._by_id.get(id(obj))
        if index is None and isinstance(obj, Task) and obj.task_id:
            index = self._by_task_id.get(obj.task_id)
        return index

    def label(self, obj: Any) -> str | None:
        """``obj``'s id as the next output of its input, or ``None`` if its input is not
        known (it is the batch's)."""
        index = self._input(obj)
        if index is None:
            self._merged += 1
            return None
        made = self._made[index]
        self._made[index] = made + 1
        return f"{self._labels[index]}.{made}"

    def filtered(self) -> int:
        """Inputs that gave nothing: those of which no output was made, where every output's
        input was known; else as many as the outputs fall short of the inputs."""
        if self._merged:
            return max(0, len(self._tasks) - self._merged - sum(self._made))
        return self._made.count(0)

    def labels(self, outputs: list[Any]) -> tuple[list[str], int]:
        """The ids of a whole list of outputs, and how many inputs gave nothing."""
        found = [self._input(obj) for obj in outputs]
        inputs = [i for i in found if i is not None]
        if len(inputs) < len(found):
            merged = [f"{self._labels[0]}*{j}" for j in range(len(outputs))]
            return merged, max(0, len(self._tasks) - len(outputs))
        counts = Counter(inputs)
        per_input = [counts[i] for i in range(len(self._tasks))]
        out: list[str] = []
        for index in inputs:
            if per_input[index] == 1:
                out.append(self._labels[index])
            else:
                out.append(f"{self._labels[index]}.{self._made[index]}")
                self._made[index] += 1
        return out, per_input.count(0)


def _each(result: Any) -> Iterator[Any]:
    """What a ``process`` call gave, one output at a time (``None``: none)."""
    if result is None:
        return iter(())
    if several(result):
        return iter(result)
    return iter((result,))
