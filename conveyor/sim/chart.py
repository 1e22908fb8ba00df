"""A PNG of a simulated run: workers per stage over time, and how busy they were.

Uses matplotlib's Agg backend (no display needed); imported only when a chart is written.
"""

from __future__ import annotations

import math
from pathlib import Path

from conveyor.sim.report import SimReport

__all__ = ["write_chart"]


def _smooth(values: list[float | None], width: int) -> list[float]:
    """Moving mean over ``width`` buckets, skipping buckets without a ready worker."""
    out: list[float] = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - width + 1) : i + 1] if v is not None]
        out.append(sum(window) / len(window) if window else math.nan)
    return out


def write_chart(report: SimReport, path: str | Path, dpi: int = 90) -> Path:
    """Draw ``report`` into ``path`` (PNG): ready workers (top) and busy fraction (bottom)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    b = report.bucket_s
    n = max(len(s.workers) for s in report.stages)
    # about 150 points across the chart: the busy fraction is a mean over that many buckets
    width = max(1, n // 150)
    times = [(k + 0.5) * b for k in range(n)]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 5.4), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    colors = plt.get_cmap("tab10").colors
    for i, stage in enumerate(report.stages):
        color = colors[i % len(colors)]
        workers = stage.workers + [0.0] * (n - len(stage.workers))
        top.step(times, workers, where="mid", color=color, lw=1.4, label=stage.name)
        busy = _smooth(stage.busy + [None] * (n - len(stage.busy)), width)
        bottom.plot(times, [100 * v for v in busy], color=color, lw=1.1)
    lo, hi = report.window
    for ax in (top, bottom):
        if hi > lo:
            ax.axvspan(lo, hi, color="0.93", zorder=0)
        ax.grid(True, color="0.85", lw=0.5)
    top.set_ylabel("ready workers")
    top.set_ylim(bottom=0)
    bottom.set_ylabel("busy %" + (f" ({width * b:g} s mean)" if width > 1 else ""))
    bottom.set_ylim(0, 105)
    bottom.set_xlabel("virtual time (s); shaded: steady window used for the report")
    rate = report.source_tasks_per_s
    title = f"{report.scenario} · {report.executor} · {report.gpus} GPUs, {report.cpus:g} CPUs"
    subtitle = f"{rate:.3g} source tasks/s in the window" if rate is not None else ""
    top.set_title(f"{title}\n{subtitle}", fontsize=10)
    top.legend(
        loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, title="stage"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    _shrink(path)
    return path


def _shrink(path: Path) -> None:
    """Re-save with a 64-colour palette: a line chart needs no more, and the file is ~3x
    smaller (charts are committed to docs/)."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)
