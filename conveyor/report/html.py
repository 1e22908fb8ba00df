"""``report.html``: one self-contained page per event log (inline SVG, CSS and a little JS;
nothing is fetched when it opens, so it can be mailed, archived or opened offline)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.report import charts
from conveyor.report.analysis import Verdict, analyse, bucket_edges, bucket_mean, fmt_duration
from conveyor.report.load import EVENTS_FILE, ReportError, RunEvents, RunLog, load_events

REPORT_FILE = "report.html"
#: rows shown per table (the first and last halves; the log keeps them all)
MAX_ROWS = 600
MAX_TRACEBACK = 20_000
#: the most of a failure's message the report shows (the event log has what was kept)
MAX_MESSAGE = 2_000
#: the failures of one kind (stage and error) listed; the rest are counted (a run failing
#: 1% of a million inputs made a report of hundreds of megabytes)
MAX_FAILURE_ROWS = 100
TOOLTIP_POINTS = 300


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Read ``run_dir/events.jsonl`` (with its rotated parts) and write ``run_dir/report.html``
    (or ``out``); returns the path written. Raises ``ReportError`` for a missing or unreadable
    log. The page is written next to its final name and moved there, never half-written."""
    run_dir = Path(run_dir)
    events = load_events(run_dir / EVENTS_FILE if run_dir.is_dir() else run_dir)
    target = Path(out) if out is not None else events.path.parent / REPORT_FILE
    page = render(events)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        # a path the OS gave as bytes that are not UTF-8 (surrogates) is shown escaped
        tmp.write_text(page, encoding="utf-8", errors="backslashreplace")
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"{target}: cannot write the report ({exc.strerror})") from None
    return target


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def render(events: RunEvents) -> str:
    """The whole page as text."""
    runs = events.runs
    title = runs[-1].pipeline if runs else "run"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # nothing may load from anywhere: no network, not even this page's folder
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        f"<title>{_e(title)} — Conveyor run report</title>",
        f"<style>{CSS}</style></head><body>",
        '<div id="tip" class="tip" hidden></div>',
    ]
    if len(runs) > 1:
        links = "".join(
            f'<li><a href="#run{i}">pass {i + 1}: {_e(r.pipeline)}</a> {_status_badge(r)}</li>'
            for i, r in enumerate(runs)
        )
        parts.append(f'<nav class="runs"><b>{len(runs)} runs in this log</b><ol>{links}</ol></nav>')
    for i, run in enumerate(runs):
        parts.append(_run_section(run, f"run{i}", i, len(runs), events))
    parts.append(_footer(events))
    parts.append(f"<script>{JS}</script></body></html>")
    return "\n".join(parts)


def _status_badge(run: RunLog) -> str:
    if run.end is None:
        return '<span class="status bad">did not finish</span>'
    if run.completed:
        return '<span class="status ok">completed</span>'
    return '<span class="status warn">stopped early</span>'


def _run_section(run: RunLog, run_id: str, index: int, total: int, events: RunEvents) -> str:
    verdict = analyse(run)
    colors = charts.stage_colors(run.stage_names)
    start = run.start
    duration = max(run.duration_s, 1e-3)
    axis = charts.TimeAxis(0.0, duration)
    out = [f'<section class="run" id="{run_id}" data-lo="0" data-hi="{duration:.6g}">']
    heading = _e(run.pipeline)
    if total > 1:
        heading = f'<span class="pass">pass {index + 1} of {total}</span> ' + heading
    out.append(f"<header><h1>{heading} {_status_badge(run)}</h1>")
    if start.get("description"):
        out.append(f'<p class="desc">{_e(str(start["description"]).strip())}</p>')
    out.append(_notices(run, events if index == total - 1 else None))
    out.append(_figures(run))
    out.append("</header>")
    out.append(
        '<div class="verdict" data-bottleneck="'
        + _e(verdict.bottleneck or "")
        + '" data-limit="'
        + _e(" ".join(verdict.limits))
        + '"><h2>At a glance</h2><ul>'
        + "".join(f"<li>{_e(line)}</li>" for line in verdict.lines)
        + "</ul></div>"
    )
    out.append(_timeline(run, run_id, axis, verdict, colors))
    out.append(_stage_table(run, verdict, colors))
    out.append(_decisions_table(run, colors))
    out.append(_failures_table(run, colors))
    out.append(_workers_table(run, colors))
    out.append(_setup_section(run))
    out.append("</section>")
    return "\n".join(out)


def _notices(run: RunLog, events: RunEvents | None) -> str:
    notes = []
    if run.end is None:
        notes.append(
            "The run did not finish (no run_end event): it was killed or is still going; "
            "the figures stop at its last event."
        )
    if run.dropped:
        notes.append(
            f"The event log hit its size cap: {run.dropped:,} older lines were dropped, so the "
            "beginning of the run is missing from these charts."
        )
    if not len(run.times):
        notes.append("The log holds no snapshots of this run: there is nothing to chart.")
    if events is not None and events.skipped_lines:
        notes.append(
            f"{events.skipped_lines:,} unreadable line(s) skipped (a torn last line is normal "
            "for a killed run)."
        )
    if not notes:
        return ""
    return '<div class="notices">' + "".join(f"<p>⚠ {_e(n)}</p>" for n in notes) + "</div>"


def _figures(run: RunLog) -> str:
    end = run.end or {}
    counts = end.get("counts") or {}
    if not counts and len(run.times):
        counts = {
            "inputs": _last(run.run_values.get("inputs")),
            "outputs": _last(run.run_values.get("outputs")),
        }
    started = run.start.get("time")
    when = ""
    if isinstance(started, (int, float)):
        when = _dt.datetime.fromtimestamp(started, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    wall = end.get("wall_s") if end else run.duration_s
    items = [
        ("wall time", fmt_duration(wall) + ("" if end else " (so far)")),
        ("start-up", fmt_duration(end.get("startup_s"))),
        ("first output", fmt_duration(end.get("first_output_s"))),
    ]
    for key in ("inputs", "outputs", "filtered", "failed", "skipped"):
        value = counts.get(key)
        items.append((key, f"{int(value):,}" if isinstance(value, (int, float)) else "—"))
    cells = "".join(
        f'<div class="fig{" fail" if k == "failed" and v not in ("0", "—") else ""}">'
        f"<span>{_e(v)}</span><label>{_e(k)}</label></div>"
        for k, v in items
    )
    meta = [
        ("executor", run.start.get("executor")),
        ("backend", run.start.get("backend")),
        ("started", when),
    ]
    meta_html = " · ".join(f"{_e(k)} <b>{_e(v)}</b>" for k, v in meta if v)
    return f'<div class="figures">{cells}</div><p class="meta">{meta_html}</p>'


def _last(values: np.ndarray | None) -> float | None:
    if values is None or not len(values) or math.isnan(values[-1]):
        return None
    return float(values[-1])


def _legend(run: RunLog, verdict: Verdict, colors: dict[str, str]) -> str:
    items = []
    for name in run.stage_names:
        state = verdict.stages[name].state if name in verdict.stages else ""
        tag = ""
        if name == verdict.bottleneck:
            tag = ' <em class="bn">bottleneck</em>'
        elif state == "starved":
            tag = ' <em class="st">starved</em>'
        elif state == "blocked":
            tag = ' <em class="st">held back</em>'
        items.append(
            f'<button type="button" class="key" data-stage="{_e(name)}" '
            f'title="show or hide this stage in the charts">'
            f'<i style="background:{colors[name]}"></i>{_e(name)}{tag}</button>'
        )
    return '<div class="legend">' + "".join(items) + "</div>"


def _timeline(
    run: RunLog, run_id: str, axis: charts.TimeAxis, verdict: Verdict, colors: dict[str, str]
) -> str:
    if not run.stage_names:
        return ""
    per_stage, outputs, window = charts.throughput_series(run, axis)
    lo, hi = verdict.window
    steady = (
        f"steady part used for the verdict: {fmt_duration(lo)} to {fmt_duration(hi)}"
        if len(run.times)
        else ""
    )
    gradient = ",".join(charts.heat_color(i / 10) for i in range(11))
    backlog = run.stage_names[0]
    blocks = [
        '<section class="timeline"><h2>Over time</h2>',
        f'<p class="hint">All charts share one time axis (seconds since the run started); '
        f"hover for values, click a stage to hide it. {_e(steady)}</p>",
        _legend(run, verdict, colors),
        '<h3>Busy fraction <small>share of the ready workers\' time spent on tasks — a dark '
        "row that stays dark is the bottleneck; hatched: idle with an empty input queue "
        "(starved)</small></h3>",
        '<div class="scale"><span>0%</span>'
        f'<i style="background:linear-gradient(to right,{gradient})"></i><span>100% busy</span>'
        '<i class="hatched"></i><span>starved</span><i class="noworker"></i>'
        "<span>no ready worker</span></div>",
        charts.busy_heatmap(run, run_id, axis, verdict),
        "<h3>Workers <small>ready workers (area), the autoscaler's target (dashed), its "
        "decisions (▲ more, ▼ fewer; hover for why), workers that died or timed out (✕)"
        "</small></h3>",
        charts.workers_panels(run, run_id, axis, verdict, colors),
        "<h3>Queue depth <small>tasks waiting in front of each stage — work piles up in front "
        "of the bottleneck; dashed: the source's backlog in front of the first stage</small></h3>",
        charts.line_chart(
            run, run_id, axis, colors, "queue", "queued",
            charts.queue_series(run, "queued"), charts.fmt_count, "queued tasks",
            verdict.bottleneck, backlog=backlog,
        ),
        "<h3>Queue depth in bytes <small>payload bytes those queued tasks hold</small></h3>",
        charts.line_chart(
            run, run_id, axis, colors, "queue_bytes", "queued_bytes",
            charts.queue_series(run, "queued_bytes"), charts.fmt_bytes, "queued bytes",
            verdict.bottleneck, backlog=backlog,
        ),
        f"<h3>Throughput <small>tasks completed per second by each stage (mean over "
        f"{window:.3g} s); black dashed: the pipeline's outputs/s</small></h3>",
        charts.line_chart(
            run, run_id, axis, colors, "throughput", "throughput", per_stage, charts.fmt_rate,
            "tasks/s", verdict.bottleneck,
            extra=[
                ("run:outputs", "pipeline outputs/s", outputs[0], outputs[1],
                 'stroke="#222" stroke-width="1.4" stroke-dasharray="2 3"'),
            ],
        ),
        _tooltip_data(run, run_id, axis, per_stage, outputs),
        "</section>",
    ]  # fmt: skip
    return "\n".join(blocks)


def _tooltip_data(
    run: RunLog,
    run_id: str,
    axis: charts.TimeAxis,
    per_stage: dict[str, tuple[np.ndarray, np.ndarray]],
    outputs: tuple[np.ndarray, np.ndarray],
) -> str:
    """Per stage values on a coarse grid, for the hover read-out (JSON, script-safe)."""
    edges = bucket_edges(axis.lo, axis.hi, TOOLTIP_POINTS)
    centers = (edges[:-1] + edges[1:]) / 2

    def col(values: np.ndarray) -> list[float | None]:
        return [None if math.isnan(v) else round(float(v), 3) for v in values]

    def at(t: np.ndarray, v: np.ndarray) -> np.ndarray:
        if not len(t):
            return np.full(len(centers), np.nan)
        out = np.interp(centers, t, v)
        out[(centers < t[0]) | (centers > t[-1])] = np.nan
        return out

    stages = []
    for name in run.stage_names:
        stage = run.stages[name]
        stages.append(
            {
                "name": name,
                "ready": col(bucket_mean(run.times, stage["ready"], edges)),
                "target": col(bucket_mean(run.times, stage["target"], edges)),
                "busy": col(bucket_mean(run.times, stage["busy"], edges)),
                "queued": col(bucket_mean(run.times, stage["queued"], edges)),
                "rate": col(at(*per_stage[name])),
            }
        )
    data = {"lo": axis.lo, "hi": axis.hi, "n": TOOLTIP_POINTS, "stages": stages,
            "outputs": col(at(*outputs))}  # fmt: skip
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" class="tipdata" id="{run_id}-data">{text}</script>'


def _table(headers: list[str], rows: list[str], cls: str, total: int | None = None) -> str:
    """``rows`` are ready ``<tr>`` strings; beyond MAX_ROWS the middle ones are left out."""
    shown = rows
    if len(rows) > MAX_ROWS:
        half = MAX_ROWS // 2
        skipped = len(rows) - 2 * half
        gap = (
            f'<tr class="gap"><td colspan="{len(headers)}">… {skipped:,} rows not shown '
            f"(events.jsonl has them all) …</td></tr>"
        )
        shown = [*rows[:half], gap, *rows[-half:]]
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return (
        f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>'
        + "".join(shown)
        + "</tbody></table>"
    )


def _swatch(name: str, colors: dict[str, str]) -> str:
    color = colors.get(name, "#999")
    return f'<i class="sw" style="background:{color}"></i>{_e(name)}'


def _megabytes(value: Any) -> str:
    """A worker's measured peak footprint ("—" where the backend measured none)."""
    if not isinstance(value, (int, float)) or value <= 0:
        return "—"
    return f"{value / 2**20:,.0f} MB"


def _stage_table(run: RunLog, verdict: Verdict, colors: dict[str, str]) -> str:
    config = {str(s.get("name")): s for s in run.start.get("stages") or [] if isinstance(s, dict)}
    final = (run.end or {}).get("stages") or {}
    rows = []
    for name in run.stage_names:
        c = config.get(name, {})
        f = final.get(name) or {}
        if not f and len(run.times):  # no run_end: the last snapshot's counters
            stage = run.stages[name]
            f = {k: _last(stage[k]) for k in ("tasks_in", "tasks_out", "filtered", "failed",
                                              "retried")}  # fmt: skip
            f["peak_workers"] = charts._nanmax(stage["ready"])
        s = verdict.stages.get(name)
        resources = ", ".join(
            part
            for part in (
                f"{_num_text(c.get('cpus'))} CPU" if c.get("cpus") else "",
                f"{_num_text(c.get('gpus'))} GPU" if c.get("gpus") else "",
                f"{_num_text(c.get('gpu_memory_gb'))} GB GPU mem" if c.get("gpu_memory_gb") else "",
                f"{_num_text(c.get('memory_gb'))} GB mem" if c.get("memory_gb") else "",
            )
            if part
        )
        state = s.state if s else ""
        cls = {"bottleneck": "bn", "starved": "st"}.get(state, "")
        cells = [
            _swatch(name, colors),
            f'<span class="state {cls}">{_e("held back" if state == "blocked" else state)}</span>',
            _e(resources or "—"),
            _e(c.get("batch_size", "—")),
            _e("auto" if c.get("num_workers") is None else c.get("num_workers")),
            _e("—" if c.get("timeout_s") is None else f"{c['timeout_s']} s"),
            _e(_num_text(f.get("peak_workers"))),
            _e(_megabytes(f.get("worker_memory_bytes"))),
            _e("—" if s is None or math.isnan(s.busy) else f"{s.busy:.0%}"),
            _e("—" if s is None or math.isnan(s.rate) else f"{s.rate:.3g}"),
            _e(_num_text(f.get("tasks_in"))),
            _e(_num_text(f.get("tasks_out"))),
            _e(_num_text(f.get("filtered"))),
            _e(_num_text(f.get("failed"))),
            _e(_num_text(f.get("retried"))),
            _e(_num_text(f.get("worker_deaths"))),
            _e(_num_text(f.get("timeouts"))),
            _e(fmt_duration(f.get("busy_s")) if f.get("busy_s") is not None else "—"),
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    headers = ["stage", "state", "resources", "batch", "workers", "timeout", "peak workers",
               "memory / worker", "busy (steady)", "tasks/s (steady)", "tasks in", "out",
               "filtered", "failed", "retried", "deaths", "timeouts", "busy time"]  # fmt: skip
    return (
        '<section class="stages"><h2>Stages</h2><div class="scroll">'
        + _table(headers, rows, "stats")
        + "</div></section>"
    )


def _num_text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float) and value.is_integer():
        return f"{int(value):,}"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _decisions_table(run: RunLog, colors: dict[str, str]) -> str:
    rows = []
    for decision in run.decisions:
        t = decision.get("t")
        for change in decision["changes"]:
            before, after = change.get("before"), change.get("after")
            arrow = "up" if _n(after) > _n(before) else "down" if _n(after) < _n(before) else ""
            rows.append(
                f'<tr><td class="num">{_e(fmt_duration(t))}</td>'
                f"<td>{_swatch(str(change.get('stage')), colors)}</td>"
                f'<td class="change {arrow}">{_e(before)} → {_e(after)}</td>'
                f"<td>{_e(change.get('reason') or '')}</td></tr>"
            )
    body = (
        _table(["when", "stage", "workers", "why"], rows, "decisions")
        if rows
        else "<p>No decisions: the autoscaler never changed a worker target.</p>"
    )
    return (
        f'<section class="decisions-section"><h2>Autoscaler decisions <small>{len(rows):,} '
        f"changes in {len(run.decisions):,} decisions</small></h2>{body}</section>"
    )


def _n(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _failures_table(run: RunLog, colors: dict[str, str]) -> str:
    failures = run.failures
    if not failures:
        return '<section class="failures-section"><h2>Failures</h2><p>No failures.</p></section>'
    kinds = Counter((str(f.get("stage")), str(f.get("error_type"))) for f in failures)
    summary = ""
    if len(kinds) > 1 or len(failures) > 5:
        summary = _table(
            ["stage", "error", "count"],
            [
                f"<tr><td>{_swatch(stage, colors)}</td><td>{_e(err)}</td>"
                f'<td class="num">{n:,}</td></tr>'
                for (stage, err), n in kinds.most_common(50)
            ],
            "failure-kinds",
        )
    rows = []
    listed: Counter[tuple[str, str]] = Counter()
    for f in failures:
        kind = (str(f.get("stage")), str(f.get("error_type")))
        listed[kind] += 1
        if listed[kind] > MAX_FAILURE_ROWS:
            continue
        tb = f.get("traceback")
        tb_html = ""
        if tb:
            text = _shortened(str(tb), MAX_TRACEBACK)
            tb_html = f"<details><summary>traceback</summary><pre>{_e(text)}</pre></details>"
        rows.append(
            f'<tr><td class="num">{_e(fmt_duration(f.get("t")))}</td>'
            f"<td>{_swatch(str(f.get('stage')), colors)}</td>"
            f'<td class="task">{_e(f.get("task"))}</td>'
            f'<td class="err">{_e(f.get("error_type"))}</td>'
            f'<td class="msg">{_e(_shortened(str(f.get("message") or ""), MAX_MESSAGE))}'
            f"{tb_html}</td>"
            f'<td class="num">{_e(f.get("attempts") or "")}</td></tr>'
        )
    for (stage, err), n in kinds.items():
        if n > MAX_FAILURE_ROWS:
            rows.append(
                f'<tr class="more"><td></td><td>{_swatch(stage, colors)}</td>'
                f'<td colspan="4">… and {n - MAX_FAILURE_ROWS:,} more {_e(err)} '
                "(each in events.jsonl)</td></tr>"
            )
    bad = sum(1 for f in failures if f.get("kind") == "input")
    what = f"{len(failures) - bad:,} inputs failed for good" if bad < len(failures) else ""
    if bad:
        # found bad by the pipeline itself (a video that cannot be decoded), not retried
        what += f"{', ' if what else ''}{bad:,} bad inputs"
    return (
        f'<section class="failures-section"><h2>Failures <small>{what}</small></h2>{summary}'
        + _table(["when", "stage", "task", "error", "message", "attempts"], rows, "failures")
        + "</section>"
    )


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n… ({len(text) - limit:,} more chars)"


def _workers_table(run: RunLog, colors: dict[str, str]) -> str:
    kinds = ("start", "ready", "stop", "died", "timeout")
    counts: dict[str, Counter[str]] = {name: Counter() for name in run.stage_names}
    setup: dict[str, list[float]] = {name: [] for name in run.stage_names}
    nodes: dict[str, set[str]] = {name: set() for name in run.stage_names}
    trouble = []
    for event in run.workers:
        stage = str(event.get("stage"))
        counts.setdefault(stage, Counter())[str(event.get("event"))] += 1
        if isinstance(event.get("setup_s"), (int, float)):
            setup.setdefault(stage, []).append(float(event["setup_s"]))
        if event.get("node"):
            nodes.setdefault(stage, set()).add(str(event["node"]))
        if event.get("event") in ("died", "timeout"):
            trouble.append(event)
    if not run.workers:
        return '<section class="workers-section"><h2>Workers</h2><p>No worker events.</p></section>'
    rows = []
    for stage, counter in counts.items():
        times = setup.get(stage) or []
        mean_setup = fmt_duration(sum(times) / len(times)) if times else "—"
        cells = [_swatch(stage, colors)]
        cells += [_e(f"{counter.get(k, 0):,}") for k in kinds]
        cells += [_e(mean_setup), _e(len(nodes.get(stage) or ()))]
        bad = counter.get("died", 0) + counter.get("timeout", 0)
        rows.append(
            f"<tr{' class=bad' if bad else ''}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        )
    table = _table(
        ["stage", "started", "ready", "stopped", "died", "timed out", "mean setup", "nodes"],
        rows,
        "worker-summary",
    )
    detail = ""
    if trouble:
        detail = "<h3>Workers that died or timed out</h3>" + _table(
            ["when", "stage", "worker", "event", "node", "reason"],
            [
                f'<tr><td class="num">{_e(fmt_duration(ev.get("t")))}</td>'
                f"<td>{_swatch(str(ev.get('stage')), colors)}</td><td>{_e(ev.get('worker'))}</td>"
                f"<td>{_e(ev.get('event'))}</td><td>{_e(ev.get('node') or '')}</td>"
                f"<td>{_e(ev.get('reason') or '')}</td></tr>"
                for ev in trouble
            ],
            "worker-trouble",
        )
    return f'<section class="workers-section"><h2>Workers</h2>{table}{detail}</section>'


def _kv_table(items: dict[str, Any], cls: str) -> str:
    rows = "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(_plain(v))}</td></tr>" for k, v in sorted(items.items())
    )
    return f'<table class="kv {cls}"><tbody>{rows}</tbody></table>'


def _plain(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return "null" if value is None else str(value)


def _setup_section(run: RunLog) -> str:
    start = run.start
    settings = start.get("settings") or {}
    cluster = start.get("cluster") or {}
    host = start.get("host") or {}
    nodes = [n for n in cluster.get("nodes") or [] if isinstance(n, dict)]
    node_rows = [
        f"<tr><td>{_e(n.get('node_id'))}</td><td class=num>{_e(_num_text(n.get('cpus')))}</td>"
        f"<td class=num>{_e(_num_text(n.get('gpus')))}</td>"
        f"<td class=num>{_e(_num_text(n.get('gpu_memory_gb')))}</td></tr>"
        for n in nodes
    ]
    totals = (
        f"{len(nodes)} node(s), {_num_text(cluster.get('cpus'))} CPUs, "
        f"{_num_text(cluster.get('gpus'))} GPUs"
    )
    parts = ['<section class="setup"><h2>Settings and machine</h2><div class="cols">']
    parts.append(
        "<div><h3>Settings</h3>"
        + (_kv_table(settings, "settings") if isinstance(settings, dict) and settings else
           "<p>None recorded.</p>")
        + "</div>"
    )  # fmt: skip
    parts.append(
        f"<div><h3>Cluster <small>{_e(totals)}</small></h3>"
        + _table(["node", "CPUs", "GPUs", "GPU mem (GB)"], node_rows, "nodes")
        + "<h3>Host</h3>"
        + (_kv_table(host, "host") if isinstance(host, dict) and host else "<p>—</p>")
        + "</div>"
    )
    parts.append("</div></section>")
    return "".join(parts)


def _footer(events: RunEvents) -> str:
    files = ", ".join(p.name for p in events.files)
    extra = ""
    if events.unknown_events:
        extra = f" · {events.unknown_events:,} events of unknown types ignored"
    return (
        f"<footer>Written by <code>conveyor report</code> from {_e(files)} "
        f"in {_e(str(events.path.parent))}{_e(extra)}.</footer>"
    )


CSS = """
:root{--fg:#1d2330;--muted:#5f6b7a;--line:#d9dee5;--bg:#fff;--soft:#f5f7fa;--bn:#b3141c}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
 background:var(--bg);margin:0;padding:20px 28px 40px;max-width:1180px}
h1{font-size:24px;margin:0 0 6px}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid
 var(--line);padding-bottom:4px}h3{font-size:14px;margin:18px 0 4px}
small{font-weight:normal;color:var(--muted);font-size:12px}
.desc{color:var(--muted);margin:0 0 8px;max-width:900px}
.status{font-size:12px;font-weight:600;padding:2px 8px;border-radius:10px;vertical-align:middle}
.status.ok{background:#e3f4e6;color:#1c6b2c}.status.bad{background:#fde2e1;color:#a3150f}
.status.warn{background:#fff1d6;color:#8a5a00}.pass{color:var(--muted);font-weight:normal}
.notices p{background:#fff6e0;border-left:4px solid #e0a100;margin:6px 0;padding:6px 10px}
.figures{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0 4px}
.fig{background:var(--soft);border-radius:6px;padding:6px 12px;min-width:92px}
.fig span{display:block;font-size:18px;font-weight:600}.fig label{color:var(--muted);font-size:12px}
.fig.fail span{color:var(--bn)}.meta{color:var(--muted);margin:4px 0}
.verdict{background:#f0f5ff;border:1px solid #c9d8f5;border-radius:8px;padding:4px 16px 8px;
 margin:14px 0}
.verdict h2{border:0;margin:8px 0 2px;font-size:16px}.verdict ul{margin:4px 0;padding-left:20px}
.verdict li:first-child{font-weight:600}
.hint{color:var(--muted);margin:2px 0 6px;font-size:12px}
.legend{display:flex;flex-wrap:wrap;gap:6px;margin:6px 0}
.key{font:inherit;border:1px solid var(--line);background:#fff;border-radius:14px;
 padding:2px 10px;cursor:pointer}
.key i,.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;
 vertical-align:-1px}
.key.off{opacity:.4;text-decoration:line-through}.key em{font-style:normal;font-size:11px;
 padding:0 5px;border-radius:8px;margin-left:4px}
em.bn{background:var(--bn);color:#fff}em.st{background:#dfe7f3;color:#33507a}
.scale{display:flex;align-items:center;gap:6px;font-size:11px;color:var(--muted);margin:2px 0}
.scale i{display:inline-block;width:140px;height:10px;border:1px solid var(--line)}
.scale i.hatched{width:22px;background:repeating-linear-gradient(45deg,#fff 0 2px,#5b6b86 2px 3px)}
.scale i.noworker{width:22px;background:#fff;border-style:dashed}
svg.chart{display:block;width:100%;height:auto;max-width:1100px;overflow:visible}
svg .grid{stroke:#eceff3;stroke-width:1}svg .axis{stroke:#9aa4b1}
svg .tick{font-size:11px;fill:var(--muted)}svg .axis-label{font-size:12px;fill:var(--muted)}
svg .stage-label{font-size:12.5px;fill:var(--fg)}svg .stage-label.bn{font-weight:700;fill:var(--bn)}
svg .stage-state{font-size:10.5px;fill:var(--muted)}svg .badge-bn{fill:var(--bn);font-weight:700}
svg .badge-st{fill:#33507a;font-weight:700}
svg .row-bg{fill:#fff;stroke:#e3e7ed;stroke-dasharray:2 2}svg .panel-bg{fill:#fbfcfd;stroke:#eceff3}
svg .panel-bg.bn{fill:#fff5f4;stroke:#f3c4c1}
svg .bn-frame{fill:none;stroke:var(--bn);stroke-width:1.5}
svg .hatch{stroke:#5b6b86;stroke-width:1.6}
svg .death{stroke:#c4161c;stroke-width:2}svg .empty-note{fill:#aab2bd;font-size:12px}
svg .hidden{display:none}svg .xhair{stroke:#333;stroke-width:1;stroke-dasharray:3 3;
 display:none;pointer-events:none}
svg .marker{stroke:#fff;stroke-width:.6}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}td.num{text-align:right;white-space:nowrap}
table.stats td{white-space:nowrap}.scroll{overflow-x:auto;max-width:100%}
table.stats th{font-size:12px}svg .scale-note{font-size:11px;fill:var(--muted)}
.state.bn{color:var(--bn);font-weight:700}
.state.st{color:#33507a;font-weight:700}
td.change.up{color:#1c6b2c}td.change.down{color:#8a5a00}td.change{white-space:nowrap}
tr.gap td{color:var(--muted);text-align:center;font-style:italic}
tr.bad td{background:#fff6f5}
td.msg{max-width:520px;word-break:break-word}td.task{word-break:break-all;max-width:220px}
td.err{color:var(--bn);white-space:nowrap}
details summary{cursor:pointer;color:var(--muted);font-size:12px}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:360px;font-size:12px;margin:4px 0}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:24px}
table.kv th{font-weight:normal;color:var(--muted);background:none;white-space:nowrap}
table.kv td{word-break:break-word;font-family:ui-monospace,monospace;font-size:12px}
nav.runs{background:var(--soft);padding:8px 14px;border-radius:8px}
section.run+section.run{border-top:3px solid var(--line);margin-top:36px;padding-top:12px}
footer{margin-top:30px;color:var(--muted);font-size:12px}
.tip{position:fixed;z-index:10;background:rgba(255,255,255,.97);border:1px solid #b8c0cc;
 border-radius:6px;padding:6px 8px;font-size:12px;pointer-events:none;
 box-shadow:0 2px 8px rgba(0,0,0,.12)}
.tip table{margin:2px 0 0;font-size:11.5px}.tip td,.tip th{padding:1px 6px;border:0}
"""

JS = r"""
(function () {
  "use strict";
  var tip = document.getElementById("tip");
  function fmtT(t) {
    if (t < 60) return t.toFixed(1) + " s";
    var s = Math.round(t), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    s = s % 60;
    return (h ? h + "h" + (m < 10 ? "0" : "") : "") + m + "m" + (s < 10 ? "0" : "") + s + "s";
  }
  function num(v, pct) {
    if (v === null || v === undefined) return "-";
    if (pct) return Math.round(v * 100) + "%";
    return Math.abs(v) >= 100 ? Math.round(v).toString() : (+v.toFixed(2)).toString();
  }
  function cell(row, text, tag) {
    var c = document.createElement(tag || "td");
    c.textContent = text;
    row.appendChild(c);
  }
  document.querySelectorAll("section.run").forEach(function (run) {
    var dataEl = run.querySelector("script.tipdata");
    var data = dataEl ? JSON.parse(dataEl.textContent) : null;
    var hidden = {};
    run.querySelectorAll(".legend .key").forEach(function (key) {
      key.addEventListener("click", function () {
        var name = key.getAttribute("data-stage");
        var off = key.classList.toggle("off");
        hidden[name] = off;
        run.querySelectorAll("svg [data-stage]").forEach(function (el) {
          if (el.getAttribute("data-stage") === name) el.classList.toggle("hidden", off);
        });
      });
    });
    var svgs = run.querySelectorAll("svg.chart");
    function hide() {
      tip.hidden = true;
      svgs.forEach(function (s) { s.querySelector(".xhair").style.display = "none"; });
    }
    svgs.forEach(function (svg) {
      svg.addEventListener("mouseleave", hide);
      svg.addEventListener("mousemove", function (ev) {
        var ctm = svg.getScreenCTM();
        if (!ctm || !data) return;
        var pt = svg.createSVGPoint();
        pt.x = ev.clientX; pt.y = ev.clientY;
        var x = pt.matrixTransform(ctm.inverse()).x;
        var L = %LEFT%, W = %PLOT_W%;
        if (x < L || x > L + W) { hide(); return; }
        svgs.forEach(function (s) {
          var l = s.querySelector(".xhair");
          l.setAttribute("x1", x); l.setAttribute("x2", x); l.style.display = "block";
        });
        var f = (x - L) / W, t = data.lo + f * (data.hi - data.lo);
        var i = Math.min(data.n - 1, Math.max(0, Math.floor(f * data.n)));
        tip.textContent = "";
        var head = document.createElement("b");
        head.textContent = "t = " + fmtT(t);
        tip.appendChild(head);
        var table = document.createElement("table");
        var hr = document.createElement("tr");
        ["stage", "workers", "target", "busy", "queued", "tasks/s"].forEach(function (h) {
          cell(hr, h, "th");
        });
        table.appendChild(hr);
        data.stages.forEach(function (s) {
          if (hidden[s.name]) return;
          var r = document.createElement("tr");
          cell(r, s.name); cell(r, num(s.ready[i])); cell(r, num(s.target[i]));
          cell(r, num(s.busy[i], true)); cell(r, num(s.queued[i])); cell(r, num(s.rate[i]));
          table.appendChild(r);
        });
        tip.appendChild(table);
        tip.hidden = false;
        var w = tip.offsetWidth, left = ev.clientX + 14;
        if (left + w > window.innerWidth - 8) left = ev.clientX - w - 14;
        tip.style.left = left + "px";
        tip.style.top = Math.max(4, ev.clientY - tip.offsetHeight - 10) + "px";
      });
    });
  });
})();
""".replace("%LEFT%", str(charts.LEFT)).replace("%PLOT_W%", str(charts.PLOT_W))
