"""Stages for the Ray tests, in a module of their own so that Ray workers import it cheaply
(stages defined in an importable module are pickled by reference, and this one imports no
pytest)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from conveyor import PermanentError, ProcessingStage, Resources
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.tasks.base import Task


def ray_node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


class WhereAmI(ProcessingStage[Any, dict]):
    """Tells where it ran: Ray's node id, the worker, its GPUs as the process sees them."""

    def __init__(
        self,
        name: str,
        resources: Resources,
        workers: int | None,
        cost_s: float = 0.0,
        barrier: Path | None = None,
    ) -> None:
        self.name = name
        self.resources = resources
        self.num_workers = workers
        self.cost_s = cost_s
        self.barrier = barrier

    def setup(self, worker: WorkerInfo) -> None:
        import ray

        self.info = worker
        self.assigned = dict(ray.get_runtime_context().get_assigned_resources())
        if self.barrier is not None and self.num_workers:
            # every worker of the stage is ready before any takes work: each one has some
            (self.barrier / worker.worker_id).touch()
            deadline = time.monotonic() + 60
            while len(list(self.barrier.glob(f"{self.name}-*"))) < self.num_workers:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name}: not all workers started")
                time.sleep(0.05)

    def process(self, task: Any) -> dict:
        time.sleep(self.cost_s)
        return {
            "task": task,
            "worker": self.info.worker_id,
            "node": ray_node_id(),
            "info_node": self.info.node_id,
            "pid": os.getpid(),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": self.info.gpu_ids,
            "gpu_fraction": self.info.gpu_fraction,
            "assigned_gpu": self.assigned.get("GPU", 0.0),
            "assigned_cpu": self.assigned.get("CPU", 0.0),
        }


class NodeHooks(ProcessingStage[int, int]):
    """``setup_on_node`` marks its node; ``setup`` insists the mark is there; teardown notes."""

    resources = Resources(cpus=1)

    def __init__(self, out: Path, workers: int) -> None:
        self.out = out
        self.num_workers = workers

    def setup_on_node(self, node: NodeInfo, worker: WorkerInfo) -> None:
        assert node.node_id == ray_node_id(), "setup_on_node ran on another node"
        time.sleep(0.5)  # setup must wait for it
        with open(self.out / f"node-{node.node_id}", "a") as f:
            f.write("x")

    def setup(self, worker: WorkerInfo) -> None:
        mark = self.out / f"node-{worker.node_id}"
        if not mark.exists():
            raise RuntimeError(f"setup ran before setup_on_node on {worker.node_id}")
        (self.out / f"setup-{worker.worker_id}").write_text(worker.node_id)
        self.worker_id = worker.worker_id

    def process(self, task: int) -> int:
        time.sleep(0.1)  # enough work that a worker set up late on a busy machine gets some
        return task

    def teardown(self) -> None:
        (self.out / f"teardown-{self.worker_id}").write_text("")


class FailingSetup(ProcessingStage[int, int]):
    resources = Resources(cpus=0.5)

    def setup(self, worker: WorkerInfo) -> None:
        raise RuntimeError("no model here")

    def process(self, task: int) -> int:
        return task


class FailingNodeSetup(ProcessingStage[int, int]):
    resources = Resources(cpus=0.5)

    def setup_on_node(self, node: NodeInfo, worker: WorkerInfo) -> None:
        raise OSError("disk full on this node")

    def process(self, task: int) -> int:
        return task


class FlakyOnce(ProcessingStage[int, int]):
    """Fails the first attempt of every input divisible by 5 (state kept on disk)."""

    resources = Resources(cpus=0.5)

    def __init__(self, marker_dir: Path) -> None:
        self.marker_dir = marker_dir

    def process(self, task: int) -> int:
        if task % 5 == 0:
            marker = self.marker_dir / str(task)
            if not marker.exists():
                marker.touch()
                raise RuntimeError(f"transient failure on {task}")
        return task


class Poison(ProcessingStage[int, int]):
    """Raises, raises ``PermanentError``, returns what cannot be pickled, calls
    ``sys.exit``, kills its own worker, or hangs on one input."""

    resources = Resources(cpus=0.5)

    def __init__(self, bad: int, how: str = "raise", batch_size: int = 1, cost_s: float = 0.005):
        self.bad = bad
        self.how = how
        self.batch_size = batch_size
        self.cost_s = cost_s

    def process(self, task: int) -> int:
        if task == self.bad:
            if self.how == "raise":
                raise ValueError(f"cannot handle {task}")
            if self.how == "permanent":
                raise PermanentError(f"malformed {task}")
            if self.how == "hang":
                time.sleep(3600)
            if self.how == "unpicklable":
                return threading.Lock()  # type: ignore[return-value]
            if self.how == "exit":
                sys.exit(2)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(self.cost_s)
        return task


class Slow(ProcessingStage[Any, Any]):
    """Sleeps; with ``pad`` its output carries that many bytes (stored, not inline, on Ray)
    as ``(n, bytes)``, which the next ``Slow`` turns back into ``n``."""

    def __init__(self, name: str, cost_s: float, cpus: float = 0.5, pad: int = 0) -> None:
        self.name = name
        self.cost_s = cost_s
        self.pad = pad
        self.resources = Resources(cpus=cpus)

    def process(self, task: Any) -> Any:
        time.sleep(self.cost_s)
        n = task[0] if isinstance(task, tuple) else task
        return (n, bytes(self.pad)) if self.pad else n


class Gated(Slow):
    """A ``Slow`` that holds each input while the file ``gate`` exists (two minutes at most),
    so that a test can act while work waits in front of it."""

    def __init__(self, name: str, cost_s: float, gate: str, cpus: float = 0.5) -> None:
        super().__init__(name, cost_s, cpus)
        self.gate = gate

    def process(self, task: Any) -> Any:
        deadline = time.monotonic() + 120
        while os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return super().process(task)


@dataclass
class Item(Task[Any]):
    """A typed task: lineage ids and stage timings ride on it."""


class MakeItem(ProcessingStage[int, Item]):
    """An int in; an ``Item`` holding a NumPy array (large for odd inputs) out."""

    resources = Resources(cpus=0.25)

    def __init__(self, nbytes: int = 1 << 20) -> None:
        self.nbytes = nbytes

    def process(self, task: int) -> Item:
        size = self.nbytes if task % 2 else 16
        return Item(data=np.full(size, task % 251, dtype=np.uint8), metadata={"n": task})


class Split(ProcessingStage[Item, Item]):
    """Fan-out and filtering: drops multiples of 7, splits multiples of 3 into three."""

    resources = Resources(cpus=0.25)

    def inputs(self) -> list[str]:
        return ["data", "metadata"]

    def process(self, task: Item) -> Item | list[Item] | None:
        n = task.metadata["n"]
        if n % 7 == 0:
            return None
        if n % 3 == 0:
            return [Item(data=task.data[: 8 + j], metadata={"n": n, "part": j}) for j in range(3)]
        return task


class Summarize(ProcessingStage[Item, tuple]):
    """Batches of four; turns each item into a small comparable tuple."""

    resources = Resources(cpus=0.25)
    batch_size = 4

    def process_batch(self, tasks: list[Item]) -> list[tuple]:
        return [
            (
                t.task_id,
                t.metadata["n"],
                t.metadata.get("part"),
                int(t.data.sum()),
                len(t.data),
                [p.stage for p in t.stage_perf],
            )
            for t in tasks
        ]


def item_pipeline_stages() -> list[ProcessingStage[Any, Any]]:
    return [MakeItem(), Split(), Summarize()]


class Nice(ProcessingStage[Any, Any]):
    """Adds its worker's nice values to the task, during setup and at work:
    ``(first stage's setup, first's work, last's setup, last's work)``."""

    def setup(self, worker: Any) -> None:
        self.setup_nice = os.getpriority(os.PRIO_PROCESS, 0)

    def process(self, task: Any) -> Any:
        nice = (self.setup_nice, os.getpriority(os.PRIO_PROCESS, 0))
        return nice if isinstance(task, int) else (*task, *nice)


class Threads(ProcessingStage[Any, Any]):
    """Tells how many threads each of its batches was given (it can use up to four)."""

    max_threads = 4

    def process(self, task: Any) -> Any:
        return self.threads


class SpinOnCoreZero(ProcessingStage[int, int]):
    """Each task spins ``WORK_S`` of its own thread's CPU; every worker runs on core 0 alone,
    so three of them wait for it two thirds of the time.

    The thread's clock, not the process's: a Ray worker's own threads (gRPC, the core
    worker) run on the other cores and add to the process's CPU time, so a spin on that
    clock could end after half its work, as it once did in CI."""

    WORK_S = 0.02

    resources = Resources(cpus=1)
    num_workers = 3

    def setup(self, worker: WorkerInfo) -> None:
        os.sched_setaffinity(0, {0})

    def process(self, task: int) -> int:
        end = time.thread_time() + self.WORK_S
        while time.thread_time() < end:
            pass
        return task


class Trickle(ProcessingStage[int, tuple[int, int]]):
    """A generator: ``count`` outputs per input, ``gap_s`` apart, each ``size`` bytes of
    payload; the first attempt at an input in ``fail_once`` raises after ``fail_after``
    outputs (attempts are told apart by marker files under ``marks``, since every attempt
    may run in another process). It notes when each input ended in ``marks/end-<input>``."""

    name = "trickle"

    def __init__(
        self,
        marks: Path,
        count: int,
        gap_s: float = 0.0,
        size: int = 0,
        fail_once: tuple[int, ...] = (),
        fail_after: int = 0,
    ) -> None:
        self.marks = Path(marks)
        self.count = count
        self.gap_s = gap_s
        self.size = size
        self.fail_once = fail_once
        self.fail_after = fail_after

    def process(self, task: int) -> Any:
        first = False
        if task in self.fail_once:
            mark = self.marks / f"tried-{task}"
            first = not mark.exists()
            mark.touch()
        for j in range(self.count):
            if first and j == self.fail_after:
                raise RuntimeError(f"input {task} broke off after {j} outputs")
            if self.gap_s:
                time.sleep(self.gap_s)
            yield (task, j, b"x" * self.size) if self.size else (task, j)
        (self.marks / f"end-{task}").write_text(repr(time.time()))

    @staticmethod
    def ended(marks: Path, task: int) -> float:
        """When the generator finished ``task`` (``time.time()``)."""
        return float((Path(marks) / f"end-{task}").read_text())


class Arrivals(ProcessingStage[Any, Any]):
    """Notes when each input arrived (``marks/seen-<n>``, one file per input) and, with
    ``cost_s``, takes that long over it; passes on what identifies the input."""

    name = "arrivals"

    def __init__(self, marks: Path, cost_s: float = 0.0) -> None:
        self.marks = Path(marks)
        self.cost_s = cost_s

    def process(self, task: Any) -> Any:
        key = task[:2]
        (self.marks / f"seen-{key[0]}-{key[1]}-{os.getpid()}-{time.monotonic_ns()}").write_text(
            repr(time.time())
        )
        if self.cost_s:
            time.sleep(self.cost_s)
        return key

    @staticmethod
    def seen(marks: Path) -> list[tuple[tuple[int, int], float]]:
        """(input, output) and when this stage got it (``time.time()``), in arrival order."""
        found = []
        for path in Path(marks).glob("seen-*"):
            _, task, j, *_ = path.name.split("-")
            found.append(((int(task), int(j)), float(path.read_text())))
        return sorted(found, key=lambda item: item[1])


class Stalls(ProcessingStage[int, int]):
    """Yields ``task`` outputs ``gap_s`` apart (a generator with ``timeout_s``)."""

    name = "stalls"
    timeout_s = 1.0

    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s

    def process(self, task: int) -> Any:
        for j in range(task):
            time.sleep(self.gap_s)
            yield j


class Paced(ProcessingStage[Any, Any]):
    """Passes each task on after ``cost_s`` of sleep: an input that trickles in."""

    resources = Resources(cpus=0.5)
    num_workers = 1

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s

    def process(self, task: Any) -> Any:
        time.sleep(self.cost_s)
        return task


class BatchSizes(ProcessingStage[Any, int]):
    """Outputs the size of each batch it gets (up to 8, waiting ``batch_wait_s`` at most)."""

    resources = Resources(cpus=0.5)
    batch_size = 8

    def __init__(self, batch_wait_s: float | None) -> None:
        self.batch_wait_s = batch_wait_s

    def process_batch(self, tasks: list[Any]) -> list[int]:
        return [len(tasks)]


def partial_batches(sizes: list[int]) -> int:
    """Batches under 8 before the last (which may be short anyway)."""
    return sum(n < 8 for n in sizes[:-1])


class Leaky(ProcessingStage[int, tuple]):
    """Counts its calls per process and notes its teardown: ``max_batches_per_worker``."""

    resources = Resources(cpus=0.5)

    def __init__(self, out: Path, limit: int, batch_size: int = 1) -> None:
        self.out = out
        self.max_batches_per_worker = limit
        self.batch_size = batch_size

    def setup(self, worker: WorkerInfo) -> None:
        self.calls = 0

    def process_batch(self, tasks: list[int]) -> list[tuple]:
        self.calls += 1
        time.sleep(0.01)
        return [(t, os.getpid(), self.calls) for t in tasks]

    def teardown(self) -> None:
        (self.out / f"teardown-{os.getpid()}").write_text(str(self.calls))
