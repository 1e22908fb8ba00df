"""Whether the machine was the limit, and the verdict's words for it.

A stage's busy fraction says whether *that stage* is full. With CPUs shared by time
(docs/autoscaling.md) the stages' workers take turns on the same cores, so the cores can be
full while every stage looks partly idle, and the CPUs the workers hold can add up to more
than the machine has. The event log measures the host (``conveyor.monitor.host_usage``):
``MachineLoad`` is that measure over the verdict's window, ``limits`` says what was full, and
the functions below say it in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: share of the cores (or GPUs) busy over the window from which they are the run's limit
FULL = 0.9
#: other programs are named when they used at least this share of the busy cores
OTHERS = 0.25


@dataclass(frozen=True, slots=True)
class MachineLoad:
    """The machine's resources over the verdict's window (NaN: not measured or not known).

    Attributes:
        cores: CPUs the host measurements watched (the machine's cores).
        cores_busy: cores busy on average, all programs together.
        run_cpus: cores the run's own processes used on average.
        cpus: CPUs the run was given (the cluster's).
        cpus_held: CPUs the workers held (reserved) on average.
        gpus: GPUs measured on the machine.
        gpus_busy: GPUs busy on average (NVML utilisation).
        cluster_gpus: GPUs the run was given.
        gpus_held: GPUs the workers held on average.
    """

    cores: float = math.nan
    cores_busy: float = math.nan
    run_cpus: float = math.nan
    cpus: float = math.nan
    cpus_held: float = math.nan
    gpus: float = math.nan
    gpus_busy: float = math.nan
    cluster_gpus: float = math.nan
    gpus_held: float = math.nan

    @property
    def limits(self) -> tuple[str, ...]:
        """What was full: ``"cpus"`` (the machine's cores), ``"budget"`` (the CPUs the run
        was given, on a machine with more), ``"gpus"``."""
        found = []
        if _full(self.cores_busy, self.cores):
            found.append("cpus")
        elif self.cpus < self.cores and _full(self.run_cpus, self.cpus):
            found.append("budget")
        if _full(self.gpus_busy, self.gpus):
            found.append("gpus")
        return tuple(found)

    @property
    def run_filled_cores(self) -> bool:
        """The cores were full of the run's own work: it went as fast as they allowed, and
        no one stage's workers could have had more of them (other programs left out)."""
        return "cpus" in self.limits and _full(self.run_cpus, self.cores)

    @property
    def others(self) -> float:
        """Cores other programs kept busy (0 where either use is not measured)."""
        return max(0.0, self.cores_busy - self.run_cpus)


def _full(busy: float, total: float) -> bool:
    return total > 0 and busy >= FULL * total  # NaN compares False


def _n(value: float) -> str:
    """Three significant digits below 1,000, whole numbers with separators above (a
    2,000-GPU cluster read "2e+03")."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _cores(value: float) -> str:
    """Cores busy: two decimals (``1.99``), the machine's count as it is (``2``)."""
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _busy_cores(m: MachineLoad) -> str:
    return f"{_cores(m.cores_busy)} of {_n(m.cores)} cores busy on average"


def _others(m: MachineLoad) -> bool:
    return m.others >= max(0.1, OTHERS * m.cores_busy)


def limit_lines(m: MachineLoad, window: str, stages: str) -> list[str]:
    """The verdict when no single stage is the bottleneck but the machine was full.

    ``stages`` says how the stages looked (a sentence: none saturated, several alike, busy
    ones that mostly waited for a core)."""
    lines = []
    for limit in m.limits:
        if limit == "cpus":
            text = f"The machine's CPUs were the limit: {_busy_cores(m)} ({window})"
            more = "more cores (a larger machine, or more nodes) would speed it up."
            if _others(m):
                text += f", {_cores(m.others)} of them by other programs than this run"
                more = (
                    "more cores (a larger machine, or more nodes), or fewer other programs "
                    "on this one, would speed it up."
                )
            lines.append(
                f"{text}. {stages}. The stages share the cores by time — their workers take "
                f"turns on them — so the run went as fast as the cores allowed; {more}"
            )
        elif limit == "budget":
            lines.append(
                f"The run's CPUs were the limit: its processes used {_cores(m.run_cpus)} CPUs "
                f"on average, all of the {_n(m.cpus)} it was given ({window}), while the "
                f"machine's {_n(m.cores)} cores were {m.cores_busy / m.cores:.0%} busy. "
                f"{stages}. The stages share those CPUs by time; giving the run more "
                "(--cpus, LocalBackend(num_cpus=...)) would speed it up."
            )
        elif limit == "gpus":
            lines.append(
                f"The GPUs were the limit: {_cores(m.gpus_busy)} of {_n(m.gpus)} GPUs busy on "
                f"average ({window}). {stages}. More GPUs would speed the run up."
            )
    return lines


def also_full_lines(m: MachineLoad, bottleneck: str) -> list[str]:
    """After a bottleneck's line: the machine was full too, so its stage cannot simply
    get more workers."""
    lines = []
    for limit in m.limits:
        if limit == "cpus":
            others = f", {_cores(m.others)} by other programs" if _others(m) else ""
            lines.append(
                f"The machine's CPUs were full too ({_busy_cores(m)}{others}): more "
                f"{bottleneck} workers would have to share cores that are already busy; more "
                "cores (a larger machine, or more nodes) would speed the run up."
            )
        elif limit == "budget":
            lines.append(
                f"The run's CPUs were full too (its processes used {_cores(m.run_cpus)} of the "
                f"{_n(m.cpus)} it was given): more {bottleneck} workers need more CPUs "
                "(--cpus, LocalBackend(num_cpus=...))."
            )
        elif limit == "gpus":
            lines.append(
                f"The GPUs were full too ({_cores(m.gpus_busy)} of {_n(m.gpus)} busy on average): "
                f"more {bottleneck} workers need more GPUs."
            )
    return lines


def resource_lines(m: MachineLoad) -> list[str]:
    """What the workers held next to what was measured, one line per kind of resource."""
    lines = []
    cpus = _resource(
        m.cpus_held, m.cpus,
        shared="the workers held {held} on average — more than the {total} there are, "
        "because a worker holds a share of the cores' time, not a core of its own (every "
        "stage's first worker runs on the same cores)",
    )  # fmt: skip
    if not math.isnan(m.cores_busy) and m.cores > 0:
        measured = (
            f"measured: {_cores(m.cores_busy)} of {_n(m.cores)} cores busy "
            f"({m.cores_busy / m.cores:.0%})"
        )
        if not math.isnan(m.run_cpus):
            measured += f", {_cores(m.run_cpus)} of them by this run's processes"
        cpus = f"{cpus}; {measured}" if cpus else measured
    if cpus:
        lines.append(f"CPUs: {cpus}.")
    gpus = _resource(m.gpus_held, m.cluster_gpus, shared="")
    if not math.isnan(m.gpus_busy) and m.gpus > 0:
        measured = (
            f"measured: {_cores(m.gpus_busy)} of {_n(m.gpus)} busy ({m.gpus_busy / m.gpus:.0%})"
        )
        gpus = f"{gpus}; {measured}" if gpus else measured
    if gpus:
        lines.append(f"GPUs: {gpus}.")
    return lines


def _resource(held: float, total: float, shared: str) -> str:
    """What the workers held; ``shared`` (with ``{held}`` and ``{total}``) explains a sum
    above what there is."""
    if math.isnan(held) or not total > 0:
        return ""
    if held > 1.05 * total and shared:
        return shared.format(held=_n(held), total=_n(total))
    text = f"the workers held {_n(held)} of {_n(total)} on average"
    if held >= 0.95 * total:
        text += " (all of them)"
    return text
