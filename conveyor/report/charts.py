"""Inline SVG charts of a run, drawn in Python: nothing to load when the page opens.

Every chart shares one time axis (same width, same left margin, same range) so a moment lines
up vertically across them. Series carry ``data-series="<stage>:<metric>"`` and
``data-stage`` attributes; each chart is ``<svg class="chart" data-chart="...">``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from conveyor.report.analysis import (
    Verdict,
    bucket_edges,
    bucket_mean,
    minmax,
    starved_mask,
    throughput,
)
from conveyor.report.load import RunLog

#: distinguishable categorical colours (Tableau 10), reused cyclically
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
    "#ff9da7",
    "#bab0ac",
    "#e15759",
    "#1b9e77",
    "#7570b3",
    "#e7298a",
    "#66a61e",
    "#17becf",
    "#8c564b",
    "#393b79",
    "#d95f02",
    "#637939",
    "#843c39",
)
WIDTH = 1100
LEFT = 170  # room for stage names
RIGHT = 24
PLOT_W = WIDTH - LEFT - RIGHT
MAX_POINTS = 600  # per series
HEAT_BUCKETS = 240
MAX_MARKERS = 150  # decision / worker-event markers per stage


def stage_colors(names: Sequence[str]) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _f(value: float) -> str:
    """Coordinates with one decimal, no trailing zeros."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


# -- scales and axes ------------------------------------------------------------------------
@dataclass
class TimeAxis:
    lo: float
    hi: float

    def x(self, t: float | np.ndarray) -> float | np.ndarray:
        span = max(self.hi - self.lo, 1e-9)
        return LEFT + (np.asarray(t, dtype=float) - self.lo) / span * PLOT_W

    def ticks(self) -> list[tuple[float, str]]:
        span = max(self.hi - self.lo, 1e-9)
        steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600]
        step = next((s for s in steps if span / s <= 10), 43200)
        if span < 5:
            step = next((s for s in (0.1, 0.2, 0.5, 1, 2) if span / s <= 10), 1)
        first = math.ceil(self.lo / step) * step
        out = []
        t = first
        while t <= self.hi + 1e-9:
            out.append((t, fmt_time(t, step)))
            t += step
        return out


def fmt_time(t: float, step: float = 1.0) -> str:
    if step < 1:
        return f"{t:.1f}s"
    if step < 60:
        return f"{t:.0f}s"
    if step < 3600:
        m, s = divmod(int(t + 0.5), 60)
        return f"{m}m" if s == 0 else f"{m}m{s:02d}"
    h, rest = divmod(int(t + 0.5), 3600)
    return f"{h}h" if rest == 0 else f"{h}h{rest // 60:02d}"


def nice_max(value: float, base: int = 1000) -> float:
    """A round axis maximum ≥ ``value`` (``base`` 1024: round in KB, MB, ...)."""
    if not value or value <= 0 or math.isnan(value):
        return 1.0
    if base == 1024:
        unit = 1.0
        while value / unit >= 1000:
            unit *= 1024
        return nice_max(value / unit) * unit
    exp = 10 ** math.floor(math.log10(value))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if value <= m * exp + 1e-12:
            return m * exp
    return 10 * exp


def fmt_count(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e4:
        return f"{value / 1e3:.3g}k"
    if value == int(value):
        return f"{int(value)}"
    return f"{value:.3g}"


def fmt_bytes(value: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{value:.3g} {unit}" if unit != "B" else f"{value:.0f} B"
        value /= 1024
    return f"{value:.3g} TB"  # pragma: no cover


def fmt_rate(value: float) -> str:
    return f"{value:.3g}/s" if value else "0"


def _time_grid(axis: TimeAxis, top: float, bottom: float, labels: bool) -> list[str]:
    out = []
    for t, label in axis.ticks():
        x = _f(float(axis.x(t)))
        out.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{_f(top)}" y2="{_f(bottom)}"/>')
        if labels:
            out.append(
                f'<text class="tick" x="{x}" y="{_f(bottom + 14)}" text-anchor="middle">'
                f"{_e(label)}</text>"
            )
    return out


def _divisions(vmax: float) -> int:
    """How many grid steps make round tick values (250: 5 steps of 50, not 4 of 62.5)."""
    for n in (4, 5, 3, 2, 6):
        step = vmax / n
        exp = 10 ** math.floor(math.log10(step)) if step > 0 else 1
        if any(abs(step / exp - m) < 1e-9 for m in (1, 2, 2.5, 5, 10)):
            return n
    return 4


def _y_axis(
    top: float, height: float, vmax: float, fmt: Callable[[float], str], n: int = 0
) -> list[str]:
    n = n or _divisions(vmax)
    out = []
    for i in range(n + 1):
        v = vmax * i / n
        y = _f(top + height - height * i / n)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y}" y2="{y}"/>')
        out.append(
            f'<text class="tick" x="{LEFT - 6}" y="{y}" dy="0.32em" text-anchor="end">'
            f"{_e(fmt(v))}</text>"
        )
    return out


def _path(xs: np.ndarray, ys: np.ndarray, step: bool = False) -> str:
    """``M``/``L`` path; NaN breaks the line; ``step`` holds each value until the next x."""
    parts: list[str] = []
    pen_up = True
    prev_y = None
    for x, y in zip(xs.tolist(), ys.tolist(), strict=True):
        if math.isnan(y):
            pen_up = True
            continue
        if pen_up:
            parts.append(f"M{_f(x)} {_f(y)}")
            pen_up = False
        elif step:
            parts.append(f"H{_f(x)}")
            if y != prev_y:
                parts.append(f"V{_f(y)}")
        else:
            parts.append(f"L{_f(x)} {_f(y)}")
        prev_y = y
    return "".join(parts)


def _svg(chart: str, run_id: str, height: float, body: list[str], title: str) -> str:
    return (
        f'<svg class="chart" data-chart="{chart}" id="{run_id}-{chart}" '
        f'viewBox="0 0 {WIDTH} {_f(height)}" width="{WIDTH}" height="{_f(height)}" '
        f'role="img" aria-label="{_e(title)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + f'<line class="xhair" x1="0" x2="0" y1="0" y2="{_f(height)}"/>'
        + "</svg>"
    )


def _stage_label(name: str, y: float, bottleneck: bool, state: str) -> str:
    badge = ""
    if bottleneck:
        badge = '<tspan class="badge-bn" dx="4">◀ bottleneck</tspan>'
    elif state == "starved":
        badge = '<tspan class="badge-st" dx="4">starved</tspan>'
    elif state == "blocked":
        badge = '<tspan class="badge-st" dx="4">held back</tspan>'
    short = name if len(name) <= 18 else name[:17] + "…"
    return (
        f'<text class="stage-label{" bn" if bottleneck else ""}" x="{LEFT - 8}" y="{_f(y)}" '
        f'text-anchor="end" data-stage="{_e(name)}"><title>{_e(name)}</title>{_e(short)}</text>'
        + (
            f'<text class="stage-state" x="{LEFT - 8}" y="{_f(y + 13)}" text-anchor="end">'
            f"{badge}</text>"
            if badge
            else ""
        )
    )


# -- the charts -----------------------------------------------------------------------------
def busy_heatmap(run: RunLog, run_id: str, axis: TimeAxis, verdict: Verdict) -> str:
    """One row per stage, colour = busy fraction; hatched = idle with nothing queued
    (starved); blank = no ready worker."""
    row_h, gap, top = 26, 6, 8
    names = run.stage_names
    height = top + len(names) * (row_h + gap) + 26
    buckets = max(1, min(HEAT_BUCKETS, len(run.times)))
    edges = bucket_edges(axis.lo, axis.hi, buckets)
    body = [
        '<defs><pattern id="' + run_id + '-hatch" width="6" height="6" '
        'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<line x1="0" y1="0" x2="0" y2="6" class="hatch"/></pattern></defs>'
    ]
    body += _time_grid(axis, top, height - 26, labels=True)
    times = run.times
    for i, name in enumerate(names):
        stage = run.stages[name]
        y = top + i * (row_h + gap)
        busy = stage["busy"].copy()
        ready = np.nan_to_num(stage["ready"])
        busy[ready <= 0] = np.nan
        # one-second busy fractions are noisy (a batch ends just before or after a
        # snapshot): each cell shows the mean over at least 3 snapshots
        mean = _hold(bucket_mean(times, rolling_mean(busy, 3), edges), times, edges)
        starved = starved_mask(run, name).astype(float)
        starved[ready <= 0] = np.nan
        starved_share = _hold(bucket_mean(times, starved, edges), times, edges)
        summary = verdict.stages.get(name)
        state = summary.state if summary else ""
        bn = name == verdict.bottleneck
        labelled = bn or state in ("starved", "blocked")
        body.append(_stage_label(name, y + row_h / 2 + (-3 if labelled else 4), bn, state))
        body.append(f'<rect class="row-bg" x="{LEFT}" y="{y}" width="{PLOT_W}" height="{row_h}"/>')
        cells: list[str] = []
        hatch: list[str] = []
        for a, b, level in _runs(mean):
            x0, x1 = float(axis.x(edges[a])), float(axis.x(edges[b]))
            cells.append(
                f'<rect x="{_f(x0)}" y="{y}" width="{_f(max(x1 - x0, 0.6))}" height="{row_h}" '
                f'fill="{heat_color(level / 20)}"/>'
            )
        for a, b, level in _runs(np.where(starved_share >= 0.5, 1.0, np.nan)):
            del level
            x0, x1 = float(axis.x(edges[a])), float(axis.x(edges[b]))
            hatch.append(
                f'<rect x="{_f(x0)}" y="{y}" width="{_f(max(x1 - x0, 0.6))}" height="{row_h}" '
                f'fill="url(#{run_id}-hatch)"/>'
            )
        avg = "" if summary is None or math.isnan(summary.busy) else f" — {summary.busy:.0%}"
        body.append(
            f'<g class="series heat" data-series="{_e(name)}:busy" data-stage="{_e(name)}">'
            f"<title>{_e(name)}: busy fraction{avg} on average (steady part)</title>"
            + "".join(cells)
            + "".join(hatch)
            + "</g>"
        )
        if bn:
            body.append(
                f'<rect class="bn-frame" x="{LEFT - 1}" y="{y - 1}" width="{PLOT_W + 2}" '
                f'height="{row_h + 2}"/>'
            )
    return _svg("busy", run_id, height, body, "busy fraction per stage over time")


def _hold(cells: np.ndarray, times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Cells no snapshot fell into keep the cell before (the state held until the next
    snapshot); cells whose snapshots had no value stay empty."""
    if not len(times):
        return cells
    index = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, len(cells) - 1)
    sampled = np.bincount(index, minlength=len(cells)) > 0
    out = cells.copy()
    for i in range(1, len(out)):
        if not sampled[i] and edges[i] <= times[-1]:
            out[i] = out[i - 1]
    return out


def rolling_mean(values: np.ndarray, width: int) -> np.ndarray:
    """Centered mean over ``width`` samples, NaN-aware (NaN stays NaN)."""
    if len(values) < width or width < 2:
        return values
    ok = ~np.isnan(values)
    kernel = np.ones(width)
    sums = np.convolve(np.where(ok, values, 0.0), kernel, mode="same")
    counts = np.convolve(ok.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        out = sums / counts
    out[~ok] = np.nan
    return out


def heat_color(level: float) -> str:
    """0 → pale, 1 → deep red (a saturated stage glows)."""
    stops = [
        (0.0, (222, 229, 238)),
        (0.35, (253, 219, 146)),
        (0.7, (244, 120, 60)),
        (1.0, (165, 15, 21)),
    ]
    level = min(max(level, 0.0), 1.0)
    for (a, ca), (b, cb) in itertools.pairwise(stops):
        if level <= b:
            f = (level - a) / (b - a)
            rgb = [round(x + (y - x) * f) for x, y in zip(ca, cb, strict=True)]
            return "#{:02x}{:02x}{:02x}".format(*tuple(rgb))
    return "#a50f15"  # pragma: no cover


def _runs(values: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of equal quantized level (0..20) over buckets, NaN skipped: (start, end, level)."""
    out: list[tuple[int, int, int]] = []
    start = None
    level = None
    for i, v in enumerate(values.tolist()):
        q = None if math.isnan(v) else round(min(max(v, 0.0), 1.0) * 20)
        if q != level:
            if level is not None and start is not None:
                out.append((start, i, level))
            start, level = i, q
    if level is not None and start is not None:
        out.append((start, len(values), level))
    return out


def workers_panels(
    run: RunLog, run_id: str, axis: TimeAxis, verdict: Verdict, colors: dict[str, str]
) -> str:
    """Per stage: ready workers (area), the autoscaler's target (dashed step), its decisions
    (triangles, hover for the reason), worker deaths and timeouts (red crosses)."""
    panel_h, gap, top = 58, 14, 10
    names = run.stage_names
    height = top + len(names) * (panel_h + gap) + 22
    body: list[str] = []
    times = run.times
    changes_by_stage: dict[str, list[tuple[float, dict]]] = {n: [] for n in names}
    for decision in run.decisions:
        for change in decision["changes"]:
            changes_by_stage.setdefault(str(change.get("stage")), []).append(
                (_t(decision.get("t")), change)
            )
    trouble: dict[str, list[dict]] = {n: [] for n in names}
    for event in run.workers:
        if event.get("event") in ("died", "timeout"):
            trouble.setdefault(str(event.get("stage")), []).append(event)
    for i, name in enumerate(names):
        stage = run.stages[name]
        color = colors[name]
        y0 = top + i * (panel_h + gap)
        ready = stage["ready"]
        target = stage["target"]
        changes = changes_by_stage.get(name, [])
        peak = max(
            _nanmax(ready),
            _nanmax(target),
            max((float(c.get("after") or 0) for _, c in changes), default=0.0),
        )
        vmax = max(1.0, float(math.ceil(peak * 1.15)))

        def y_of(v: np.ndarray, y0: float = y0, vmax: float = vmax) -> np.ndarray:
            return y0 + panel_h - v / vmax * panel_h

        summary = verdict.stages.get(name)
        state = summary.state if summary else ""
        bn = name == verdict.bottleneck
        body.append(
            f'<rect class="panel-bg{" bn" if bn else ""}" x="{LEFT}" y="{y0}" '
            f'width="{PLOT_W}" height="{panel_h}"/>'
        )
        body += _time_grid(axis, y0, y0 + panel_h, labels=False)
        body.append(_stage_label(name, y0 + panel_h / 2 - 3, bn, state))
        if not (bn or state in ("starved", "blocked")):
            body.append(
                f'<text class="stage-state" x="{LEFT - 8}" y="{_f(y0 + panel_h / 2 + 10)}" '
                f'text-anchor="end">workers</text>'
            )
        for v in (0, vmax):
            yy = _f(float(y_of(np.asarray(v))))
            body.append(
                f'<text class="tick" x="{LEFT + PLOT_W + 4}" y="{yy}" dy="0.32em">'
                f"{fmt_count(v)}</text>"
            )
        tr, vr = minmax(times, ready, MAX_POINTS)
        if len(tr):
            xs, ys = axis.x(tr), y_of(vr)
            line = _path(xs, ys, step=True)
            base = _f(y0 + panel_h)
            area = f"{line}V{base}H{_f(float(xs[0]))}Z" if line else ""
            body.append(
                f'<g class="series" data-series="{_e(name)}:ready" data-stage="{_e(name)}">'
                f"<title>{_e(name)}: ready workers</title>"
                f'<path d="{area}" fill="{color}" fill-opacity="0.35" stroke="none"/>'
                f'<path d="{line}" fill="none" stroke="{color}" stroke-width="1.6"/></g>'
            )
        tt, vt = minmax(times, target, MAX_POINTS)
        if len(tt):
            body.append(
                f'<path class="series target" data-series="{_e(name)}:target" '
                f'data-stage="{_e(name)}" d="{_path(axis.x(tt), y_of(vt), step=True)}" '
                f'fill="none" stroke="{_darker(color)}" stroke-width="1.4" '
                f'stroke-dasharray="5 3"><title>{_e(name)}: target workers</title></path>'
            )
        marks: list[str] = []
        for t, change, count in _thin(changes):
            before, after = change.get("before"), change.get("after")
            up = _num(after) >= _num(before)
            x = float(axis.x(t))
            yy = float(y_of(np.asarray(_num(after))))
            yy = min(max(yy, y0 + 5), y0 + panel_h - 2)
            shape = (
                f"M{_f(x)} {_f(yy - 5)}l4.5 7h-9z" if up else f"M{_f(x)} {_f(yy + 5)}l4.5 -7h-9z"
            )
            more = f" (+{count - 1} more changes here)" if count > 1 else ""
            marks.append(
                f'<path class="marker {"up" if up else "down"}" d="{shape}" '
                f'fill="{_darker(color)}"><title>t={_e(fmt_time(t, 0.5))}: '
                f"{_e(before)} → {_e(after)} workers — {_e(change.get('reason') or '')}"
                f"{_e(more)}</title></path>"
            )
        body.append(
            f'<g class="series markers" data-series="{_e(name)}:decisions" '
            f'data-stage="{_e(name)}">' + "".join(marks) + "</g>"
        )
        crosses: list[str] = []
        for event, count in _thin_events(trouble.get(name, [])):
            x = float(axis.x(_t(event.get("t"))))
            yb = y0 + panel_h - 5
            more = f" (+{count - 1} more)" if count > 1 else ""
            crosses.append(
                f'<path class="death" d="M{_f(x - 4)} {_f(yb - 4)}l8 8m0 -8l-8 8">'
                f"<title>t={_e(fmt_time(_t(event.get('t')), 0.5))}: worker "
                f"{_e(event.get('worker') or '')} {_e(event.get('event'))}"
                f"{': ' + _e(event.get('reason')) if event.get('reason') else ''}{_e(more)}"
                "</title></path>"
            )
        if crosses:
            body.append(
                f'<g class="series deaths" data-series="{_e(name)}:worker_deaths" '
                f'data-stage="{_e(name)}">' + "".join(crosses) + "</g>"
            )
    body += _time_axis_labels(axis, height - 22)
    return _svg("workers", run_id, height, body, "workers per stage over time")


def line_chart(
    run: RunLog,
    run_id: str,
    axis: TimeAxis,
    colors: dict[str, str],
    chart: str,
    metric: str,
    series: dict[str, tuple[np.ndarray, np.ndarray]],
    fmt: Callable[[float], str],
    y_label: str,
    bottleneck: str | None,
    extra: Sequence[tuple[str, str, np.ndarray, np.ndarray, str]] = (),
    backlog: str | None = None,
) -> str:
    """Stages overlaid, one colour each; the bottleneck's line is drawn thicker.

    ``backlog`` names the first stage when its series is the source's backlog (its input
    queue): drawn dashed, and left off the scale when it would flatten every other line."""
    top, plot_h = 10, 150
    height = top + plot_h + 24
    peaks = {name: _nanmax(v) for name, (_, v) in series.items()}
    others = max([p for n, p in peaks.items() if n != backlog] + [0.0])
    off_scale = backlog is not None and others > 0 and peaks.get(backlog, 0.0) > 3 * others
    peak = max(
        [p for n, p in peaks.items() if not (off_scale and n == backlog)]
        + [_nanmax(v) for *_, v, _ in extra]
        + [0.0]
    )
    vmax = nice_max(peak, 1024 if fmt is fmt_bytes else 1000) if peak > 0 else 1.0
    shown = vmax
    if fmt is fmt_bytes:  # round in the unit the ticks are written in
        while shown >= 1000:
            shown /= 1024
    body = _y_axis(top, plot_h, vmax, fmt, _divisions(shown))
    body += _time_grid(axis, top, top + plot_h, labels=False)
    body.append(
        f'<text class="axis-label" x="{LEFT - 72}" y="{_f(top + plot_h / 2)}" '
        f'text-anchor="middle" transform="rotate(-90 {LEFT - 72} {_f(top + plot_h / 2)})">'
        f"{_e(y_label)}</text>"
    )
    order = [n for n in series if n != bottleneck] + ([bottleneck] if bottleneck in series else [])
    for name in order:
        t, v = series[name]
        if not len(t):
            continue
        ys = top + plot_h - np.clip(v, 0, vmax * 1.04) / vmax * plot_h
        width = 3.0 if name == bottleneck else 1.6
        note = " (bottleneck)" if name == bottleneck else ""
        dash = ""
        if name == backlog:
            note += " — the source's backlog waiting for the first stage"
            dash = ' stroke-dasharray="6 3"'
            if off_scale:
                note += f", up to {fmt(peaks[name])} (off the scale)"
        body.append(
            f'<path class="series" data-series="{_e(name)}:{metric}" data-stage="{_e(name)}" '
            f'd="{_path(axis.x(t), ys)}" fill="none" stroke="{colors[name]}" '
            f'stroke-width="{width}" stroke-linejoin="round"{dash}>'
            f"<title>{_e(name)}{_e(note)}</title></path>"
        )
    if off_scale and backlog is not None:
        body.append(
            f'<text class="scale-note" x="{LEFT + PLOT_W - 4}" y="{top + 12}" text-anchor="end">'
            f"{_e(backlog)} (dashed): source backlog up to {_e(fmt(peaks[backlog]))}, "
            "off the scale</text>"
        )
    for key, label, t, v, style in extra:
        if not len(t):
            continue
        ys = top + plot_h - np.clip(v, 0, None) / vmax * plot_h
        body.append(
            f'<path class="series extra" data-series="{_e(key)}" d="{_path(axis.x(t), ys)}" '
            f'fill="none" {style}><title>{_e(label)}</title></path>'
        )
    if peak <= 0:
        body.append(
            f'<text class="empty-note" x="{LEFT + PLOT_W / 2}" y="{_f(top + plot_h / 2)}" '
            f'text-anchor="middle">all zero in this run</text>'
        )
    body += _time_axis_labels(axis, top + plot_h)
    return _svg(chart, run_id, height, body, y_label)


def _time_axis_labels(axis: TimeAxis, y: float) -> list[str]:
    out = [f'<line class="axis" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{_f(y)}" y2="{_f(y)}"/>']
    for t, label in axis.ticks():
        x = _f(float(axis.x(t)))
        out.append(
            f'<text class="tick" x="{x}" y="{_f(y + 14)}" text-anchor="middle">{_e(label)}</text>'
        )
    return out


def queue_series(run: RunLog, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {name: minmax(run.times, run.stages[name][key], MAX_POINTS) for name in run.stages}


def throughput_series(
    run: RunLog, axis: TimeAxis
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray], float]:
    """Tasks/s per stage (``tasks_in`` growth) and the pipeline's outputs/s, over a window
    of about 1/60 of the run (at least 5 s)."""
    window = max(5.0, (axis.hi - axis.lo) / 60)
    points = min(MAX_POINTS, 400)
    per_stage = {
        name: throughput(run.times, run.stages[name]["tasks_in"], points, window)
        for name in run.stages
    }
    outputs = run.run_values.get("outputs", np.zeros(0))
    return per_stage, throughput(run.times, outputs, points, window), window


# -- helpers --------------------------------------------------------------------------------
def _nanmax(values: np.ndarray) -> float:
    if not len(values) or np.all(np.isnan(values)):
        return 0.0
    return float(np.nanmax(values))


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _t(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _darker(color: str, f: float = 0.7) -> str:
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"#{int(r * f):02x}{int(g * f):02x}{int(b * f):02x}"


def _thin(changes: list[tuple[float, dict]]) -> list[tuple[float, dict, int]]:
    """At most MAX_MARKERS markers: changes close in time merge into the last of them."""
    if len(changes) <= MAX_MARKERS:
        return [(t, c, 1) for t, c in changes]
    lo, hi = changes[0][0], changes[-1][0]
    width = max(hi - lo, 1e-9) / MAX_MARKERS
    out: dict[int, tuple[float, dict, int]] = {}
    for t, c in changes:
        key = int((t - lo) / width)
        count = out[key][2] + 1 if key in out else 1
        out[key] = (t, c, count)
    return list(out.values())


def _thin_events(events: list[dict]) -> list[tuple[dict, int]]:
    thinned = _thin([(_t(e.get("t")), e) for e in events])
    return [(e, n) for _, e, n in thinned]
