"""Measurements of a stage while it runs: task time, fan-out, output size, setup, round trip."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(slots=True)
class Ewma:
    """Exponentially weighted mean; the first sample is taken as is (fast cold start)."""

    alpha: float = 0.3
    value: float | None = None

    def update(self, sample: float, weight: float = 1.0) -> None:
        if self.value is None:
            self.value = sample
        else:
            a = min(1.0, self.alpha * weight)
            self.value += a * (sample - self.value)


@dataclass(slots=True)
class StageMeter:
    """Task time, fan-out and output size of a stage, averaged over each autoscale interval.

    Per-batch samples are noisy (a thousand workers each reporting a lognormal draw would
    swing a per-batch average by tens of percent every second), so batches are summed and
    folded into the smoothed values once per interval by ``roll()``, weighted by tasks. Until
    the first roll the values are the running totals, so the first decision comes as soon as
    a stage has finished one batch.

    Task time is what a worker is *held* per task, which can exceed what the stage's code
    takes: the cost of a call and of delivering its result (milliseconds on Ray) is part of a
    worker's capacity. The held time counts only where it exceeds the busy time by more than
    ``HELD_TOLERANCE`` (below that it is the jitter of when results are seen) and by less than
    ``HELD_MAX_RATIO`` times: beyond that the worker was waiting on the controller (tiny tasks
    whose pace the dispatcher sets), and more workers would not help.
    """

    SAMPLE_TASKS: ClassVar[int] = 50
    MIN_WEIGHT: ClassVar[float] = 0.1
    HELD_TOLERANCE: ClassVar[float] = 0.02
    HELD_MAX_RATIO: ClassVar[float] = 2.0

    task_time: Ewma = field(default_factory=lambda: Ewma(alpha=0.5))  # s held per input task
    busy_time: Ewma = field(default_factory=lambda: Ewma(alpha=0.5))  # s of work per input task
    #: CPU seconds per input task, where the backend measures them (else never set)
    cpu_time: Ewma = field(default_factory=lambda: Ewma(alpha=0.5))
    fanout: Ewma = field(default_factory=lambda: Ewma(alpha=0.5))  # outputs per input task
    out_bytes: Ewma = field(default_factory=lambda: Ewma(alpha=0.5))  # output bytes per input
    setup_s: Ewma = field(default_factory=lambda: Ewma(alpha=0.5))
    #: round trip of one message beyond its busy time (dispatch, transport, result delivery)
    overhead: Ewma = field(default_factory=lambda: Ewma(alpha=0.3))
    rolled: bool = False
    _tasks: int = 0
    _outputs: int = 0
    _bytes: int = 0
    _busy: float = 0.0
    _held: float = 0.0
    _cpu: float = 0.0

    def record(
        self,
        tasks_in: int,
        tasks_out: int,
        out_bytes: int,
        busy_s: float,
        held_s: float | None = None,
        cpu_s: float = 0.0,
    ) -> None:
        """One finished batch; ``held_s`` (default: ``busy_s``) is how long it held a worker,
        ``cpu_s`` the CPU time it took (0: not measured)."""
        if tasks_in <= 0:
            return
        self._tasks += tasks_in
        self._outputs += tasks_out
        self._bytes += out_bytes
        self._busy += busy_s
        self._cpu += cpu_s
        self._held += busy_s if held_s is None else max(held_s, busy_s)
        if not self.rolled:
            self._publish_running()

    def _per_task(self) -> float:
        busy, held = self._busy, self._held
        if busy * (1.0 + self.HELD_TOLERANCE) < held < busy * self.HELD_MAX_RATIO:
            return held / self._tasks
        return busy / self._tasks

    def _publish_running(self) -> None:
        self.task_time.value = self._per_task()
        self.busy_time.value = self._busy / self._tasks
        if self._cpu > 0:
            self.cpu_time.value = self._cpu / self._tasks
        self.fanout.value = self._outputs / self._tasks
        self.out_bytes.value = self._bytes / self._tasks

    def roll(self) -> None:
        """Fold this interval's batches into the smoothed values.

        An interval's weight grows with the tasks it saw (``SAMPLE_TASKS`` tasks count fully,
        up to the EWMA's alpha), so a stage of long tasks, where a handful finish per
        interval, is averaged over about that many tasks instead of jumping with each
        handful; ``MIN_WEIGHT`` keeps it following real changes within ~20 intervals.
        """
        if not self._tasks:
            return
        if self.rolled:
            weight = max(self.MIN_WEIGHT, min(1.0, self._tasks / self.SAMPLE_TASKS))
            self.task_time.update(self._per_task(), weight)
            self.busy_time.update(self._busy / self._tasks, weight)
            if self._cpu > 0:
                self.cpu_time.update(self._cpu / self._tasks, weight)
            self.fanout.update(self._outputs / self._tasks, weight)
            self.out_bytes.update(self._bytes / self._tasks, weight)
        else:
            self._publish_running()
            self.rolled = True
        self._tasks = self._outputs = self._bytes = 0
        self._busy = self._held = self._cpu = 0.0

    @property
    def measured(self) -> bool:
        return self.task_time.value is not None
