"""Running a stage's code inside a worker, the same way on every backend.

Backends resolve handles to objects and store outputs; this module does what happens in
between: declared-input checks, ``process``/``process_batch``, lineage ids, filtered counts,
and per-task timing records.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import sys
import time
from collections.abc import Mapping
from typing import Any

from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.stage import ProcessingStage, declared_names
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


def _has(task: Any, name: str) -> bool:
    if isinstance(task, Mapping):
        return name in task
    checker = getattr(task, "has_attribute", None)
    if checker is not None:
        return bool(checker(name))
    return hasattr(task, name)


def lower_priority(niceness: int) -> None:
    """Lower this process's CPU priority by ``niceness`` (``WorkerPlacement.niceness``)."""
    if niceness > 0:
        with contextlib.suppress(OSError):  # not allowed here: run at the usual priority
            os.nice(niceness)


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


class StageRunner:
    """One worker's view of its stage."""

    def __init__(self, stage: ProcessingStage[Any, Any], name: str, worker: WorkerInfo) -> None:
        self.stage = stage
        self.name = name
        self.worker = worker
        self.per_task = not stage.overrides("process_batch")
        self.required = sorted(declared_names(stage.inputs()) or ())

    def setup_on_node(self, node: NodeInfo) -> None:
        self.stage.setup_on_node(node, self.worker)

    def setup(self) -> None:
        self.stage.setup(self.worker)

    def teardown(self) -> None:
        self.stage.teardown()

    def _check_inputs(self, tasks: list[Any], labels: list[str]) -> None:
        for task, label in zip(tasks, labels, strict=True):
            missing = [name for name in self.required if not _has(task, name)]
            if missing:
                raise ValueError(
                    f"stage {self.name!r}: input {label} ({short_repr(task)}) lacks declared "
                    f"input attribute(s) {', '.join(missing)}"
                )

    def run(self, tasks: list[Any], labels: list[str]) -> tuple[list[Any], list[str], int]:
        """Process one batch; returns outputs, their lineage ids, and inputs that gave nothing."""
        if self.required:
            self._check_inputs(tasks, labels)
        started = time.perf_counter()
        outputs: list[Any] = []
        out_labels: list[str] = []
        filtered = 0
        if self.per_task:
            process = self.stage.process
            for task, label in zip(tasks, labels, strict=True):
                result = process(task)
                if result is None or (isinstance(result, list) and not result):
                    filtered += 1
                elif isinstance(result, list):
                    outputs.extend(result)
                    out_labels.extend(f"{label}.{j}" for j in range(len(result)))
                else:
                    outputs.append(result)
                    out_labels.append(label)
        else:
            result = self.stage.process_batch(tasks)
            if result is None:
                result = []
            if not isinstance(result, list):
                raise TypeError(
                    f"stage {self.name!r}: process_batch must return a list, got "
                    f"{type(result).__name__}"
                )
            outputs = result
            if len(outputs) == len(tasks):
                out_labels = list(labels)
            else:
                out_labels = [f"{labels[0]}*{j}" for j in range(len(outputs))]
            filtered = max(0, len(tasks) - len(outputs))
        elapsed = time.perf_counter() - started
        perf = None
        for obj, label in zip(outputs, out_labels, strict=True):
            if isinstance(obj, Task):
                obj.task_id = label
                if perf is None:
                    perf = StagePerf(self.name, elapsed, self.worker.worker_id, len(tasks))
                obj.stage_perf.append(perf)
        return outputs, out_labels, filtered
