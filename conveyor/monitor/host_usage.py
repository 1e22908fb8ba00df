"""What this machine's processors did during a run, measured from outside the engine.

The engine knows what its workers *hold* (reservations) and how long they are busy on
batches; neither says whether the machine itself was full. With CPUs shared by time
(docs/autoscaling.md) every stage's first worker runs on the same cores, so the reservations
can add up to more CPUs than the machine has and every stage can look half idle while the
cores are all busy. ``HostSampler`` measures what happened instead, as counters that only
grow from the run's start:

- ``host_cpu_s``: core-seconds the CPUs this process may run on were busy, by any program
  (the operating system's per-CPU times: everything but idle and I/O wait);
- ``run_cpu_s``: CPU seconds of this process and its descendants (the local backend's
  workers), the live ones' own time plus what their exited children left them;
- ``gpu_s``: GPU-seconds busy, NVML's utilisation sampled at each call times the time since
  the previous one, summed over the GPUs (only when asked for and NVML answers).

A sample reads ``/proc`` (every process's parent, then the run's processes' times), so
``EventLog`` takes one per snapshot, about once a second, not one per controller tick.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil


@dataclass(frozen=True, slots=True)
class HostTotals:
    """Counters since the sampler started.

    Attributes:
        wall_s: seconds since the sampler started (monotonic clock).
        host_cpu_s: core-seconds the watched CPUs were busy, all programs together.
        run_cpu_s: CPU seconds of this process and its descendants.
        gpu_s: GPU-seconds busy (``None`` where GPUs are not measured).
    """

    wall_s: float
    host_cpu_s: float
    run_cpu_s: float
    gpu_s: float | None = None


def watched_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), as the local backend counts them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def cpu_busy_s(cpus: list[int]) -> float:
    """Seconds the given CPUs have been busy since boot: all time but idle and I/O wait
    (guest time is already inside user time on Linux)."""
    per_cpu = psutil.cpu_times(percpu=True)
    busy = 0.0
    for index in cpus:
        if index < len(per_cpu):
            times = per_cpu[index]
            total = sum(times)
            total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
            busy += total - times.idle - getattr(times, "iowait", 0.0)
    return busy


def tree_cpu_s(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and its live descendants, each with what its exited children
    left it (a worker reaped by its host counts in the host's children times)."""
    total = 0.0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        processes = [root]
    for process in processes:
        try:
            t = process.cpu_times()
        except psutil.Error:  # gone between the listing and the read
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class _Gpus:
    """NVML utilisation of the GPUs CUDA would see, integrated over time."""

    def __init__(self, clock: Callable[[], float]) -> None:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        self._nvml: Any = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            indexes = list(range(count))
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is not None:
                wanted = [v.strip() for v in visible.split(",") if v.strip().isdigit()]
                indexes = [int(v) for v in wanted if int(v) < count]
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indexes]
        except Exception:
            pynvml.nvmlShutdown()
            raise
        self.count = len(self._handles)
        self._clock = clock
        self._busy_s = 0.0
        self._last = clock()

    def sample(self) -> float:
        now = self._clock()
        span, self._last = now - self._last, now
        for handle in self._handles:
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            except Exception:  # noqa: BLE001 - a GPU that stops answering counts as idle
                continue
            self._busy_s += span * min(100.0, max(0.0, float(rates.gpu))) / 100.0
        return self._busy_s

    def close(self) -> None:
        with contextlib.suppress(Exception):  # shutting down a driver that went away
            self._nvml.nvmlShutdown()


class HostSampler:
    """Counters of this machine's CPU (and, with ``gpus=True``, GPU) use since creation.

    ``cpus`` are the CPUs watched (default: this process's affinity); ``gpus`` asks NVML for
    the GPUs' utilisation (``gpu_count`` stays 0 where there is no NVML or no GPU);
    ``clock`` gives the seconds the counters are measured over.
    """

    def __init__(
        self,
        *,
        cpus: list[int] | None = None,
        gpus: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpus = list(cpus) if cpus is not None else watched_cpus()
        self._root = psutil.Process()
        self._gpus: _Gpus | None = None
        if gpus:
            try:
                self._gpus = _Gpus(clock)
            except Exception:  # noqa: BLE001 - no driver, no library: GPUs unmeasured
                self._gpus = None
        self.gpu_count = self._gpus.count if self._gpus is not None else 0
        self._clock = clock
        self._start = clock()
        self._host0 = cpu_busy_s(self.cpus)
        self._run0 = tree_cpu_s(self._root)
        self._run_max = 0.0
        self._host_max = 0.0
        self._gpu0 = self._gpus.sample() if self._gpus is not None else 0.0

    def sample(self) -> HostTotals:
        # a descendant that exits unreaped by the tree (an orphan) takes its time with it:
        # the counter never goes back
        self._run_max = max(self._run_max, tree_cpu_s(self._root) - self._run0)
        gpu_s = None
        if self._gpus is not None and self.gpu_count:
            gpu_s = self._gpus.sample() - self._gpu0
        # busy is a sum of the kernel's counters less idle and iowait, each rounded on its
        # own: two reads a moment apart can differ by a rounding the wrong way
        self._host_max = max(self._host_max, cpu_busy_s(self.cpus) - self._host0)
        return HostTotals(
            wall_s=self._clock() - self._start,
            host_cpu_s=self._host_max,
            run_cpu_s=self._run_max,
            gpu_s=gpu_s,
        )

    def close(self) -> None:
        if self._gpus is not None:
            self._gpus.close()
            self._gpus = None
