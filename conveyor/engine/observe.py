"""Measurements of a stage while it runs: smoothed task time, fan-out, output size, setup time."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    task_time: Ewma = field(default_factory=Ewma)  # busy seconds per input task
    fanout: Ewma = field(default_factory=Ewma)  # outputs per input task
    out_bytes: Ewma = field(default_factory=Ewma)  # output bytes per input task
    setup_s: Ewma = field(default_factory=lambda: Ewma(alpha=0.5))

    def record(self, tasks_in: int, tasks_out: int, out_bytes: int, busy_s: float) -> None:
        if tasks_in <= 0:
            return
        self.task_time.update(busy_s / tasks_in)
        self.fanout.update(tasks_out / tasks_in)
        self.out_bytes.update(out_bytes / tasks_in)

    @property
    def measured(self) -> bool:
        return self.task_time.value is not None
