"""What a run's numbers say: per-stage summaries over the steady part of the run, the
bottleneck, starved stages, whether the machine itself was full (``report.machine``), the
autoscaler's rebalancing; and series reduced for drawing."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from conveyor.report.load import RunLog
from conveyor.report.machine import MachineLoad, also_full_lines, limit_lines, resource_lines

#: busy fraction from which a stage counts as saturated
SATURATED = 0.8
#: busy fraction from which a stage with work piling up in front of it is the bottleneck
PRESSURED = 0.6
#: busy fraction under which a stage counts as idle
IDLE = 0.5
#: share of their busy time a stage's workers computed under which, while the machine's
#: cores were full, they were mostly waiting for a core rather than saturated by their work
COMPUTING = 0.5


@dataclass
class StageSummary:
    name: str
    busy: float = math.nan  # mean busy fraction over the window (time-weighted)
    queued: float = math.nan  # mean input queue over the window (tasks)
    workers: float = math.nan  # mean ready workers over the window
    rate: float = math.nan  # tasks/s completed over the window
    starved_share: float = 0.0  # share of the window idle with an empty input queue
    computing: float = math.nan  # CPU time over busy time of its workers (whole run)
    state: str = ""  # "bottleneck", "saturated", "starved", "blocked", "ok", "idle"


@dataclass
class Verdict:
    window: tuple[float, float]
    stages: dict[str, StageSummary]
    bottleneck: str | None
    saturated: list[str]
    starved: list[str]
    blocked: list[str]
    #: stages busy enough to look saturated whose workers mostly waited for a core, or
    #: whose work filled the cores with the other stages' (the machine's CPUs were full):
    #: not bottlenecks of their own
    waiting: list[str]
    decisions: int
    changes_up: int
    changes_down: int
    machine: MachineLoad = field(default_factory=MachineLoad)
    lines: list[str] = field(default_factory=list)

    @property
    def limits(self) -> tuple[str, ...]:
        """What of the machine was full (``MachineLoad.limits``): ``"cpus"``, ``"budget"``,
        ``"gpus"``; empty when nothing was, or the host was not measured."""
        return self.machine.limits


def steady_window(run: RunLog) -> tuple[float, float]:
    """From the first output (or the end of start-up) until the source ran dry; the whole
    run where that leaves too little."""
    times = run.times
    if len(times) < 2:
        return (0.0, float(times[-1]) if len(times) else 0.0)
    begin = float(times[0])
    end = float(times[-1])
    if run.end is not None:
        first = run.end.get("first_output_s")
        startup = run.end.get("startup_s")
        for candidate in (first, startup):
            if isinstance(candidate, (int, float)) and begin <= candidate < end:
                begin = float(candidate)
                break
    else:  # no end: the first snapshot with an output
        outputs = run.run_values.get("outputs")
        if outputs is not None and len(outputs):
            hits = np.nonzero(np.nan_to_num(outputs) > 0)[0]
            if len(hits):
                begin = float(times[hits[0]])
    exhausted = run.run_values.get("source_exhausted")
    if exhausted is not None and len(exhausted):
        hits = np.nonzero(np.nan_to_num(exhausted) > 0)[0]
        if len(hits) and float(times[hits[0]]) > begin:
            end = float(times[hits[0]])
    inside = (times >= begin) & (times <= end)
    if end - begin < 0.2 * (times[-1] - times[0]) or inside.sum() < 3:
        return (float(times[0]), float(times[-1]))
    return (begin, end)


def _weighted_mean(times: np.ndarray, values: np.ndarray, lo: float, hi: float) -> float:
    """Mean of a step series over [lo, hi]; each sample holds until the next."""
    if len(times) == 0:
        return math.nan
    if len(times) == 1:
        return float(values[0]) if not math.isnan(values[0]) else math.nan
    widths = np.diff(np.append(times, times[-1]))
    widths[-1] = np.median(widths[:-1]) if len(widths) > 1 else 1.0
    mask = (times >= lo) & (times <= hi) & ~np.isnan(values)
    total = widths[mask].sum()
    if total <= 0:
        picked = values[mask]
        return float(picked.mean()) if len(picked) else math.nan
    return float((values[mask] * widths[mask]).sum() / total)


def _rate(times: np.ndarray, counts: np.ndarray, lo: float, hi: float) -> float:
    ok = ~np.isnan(counts)
    if ok.sum() < 2 or hi <= lo:
        return math.nan
    t, c = times[ok], counts[ok]
    span_lo, span_hi = max(lo, t[0]), min(hi, t[-1])
    if span_hi <= span_lo:
        return math.nan
    return float((np.interp(span_hi, t, c) - np.interp(span_lo, t, c)) / (span_hi - span_lo))


def starved_mask(run: RunLog, name: str) -> np.ndarray:
    """Per snapshot: ready workers idle (busy < IDLE) with an empty input queue, while the
    stage is not done — waiting for upstream."""
    stage = run.stages[name]
    ready = np.nan_to_num(stage["ready"])
    busy = stage["busy"]
    queued = np.nan_to_num(stage["queued"])
    done = np.nan_to_num(stage["done"]) > 0
    with np.errstate(invalid="ignore"):
        return (ready > 0) & (busy < IDLE) & (queued < 1) & ~done


def analyse(run: RunLog) -> Verdict:
    lo, hi = steady_window(run)
    times = run.times
    summaries: dict[str, StageSummary] = {}
    for name, stage in run.stages.items():
        s = StageSummary(name)
        if len(times):
            busy = stage["busy"].copy()
            busy[np.nan_to_num(stage["ready"]) <= 0] = np.nan  # no worker: no busy fraction
            s.busy = _weighted_mean(times, busy, lo, hi)
            s.queued = _weighted_mean(times, stage["queued"], lo, hi)
            s.workers = _weighted_mean(times, stage["ready"], lo, hi)
            s.rate = _rate(times, stage["tasks_in"], lo, hi)
            starved = starved_mask(run, name).astype(float)
            starved[np.nan_to_num(stage["ready"]) <= 0] = np.nan
            share = _weighted_mean(times, starved, lo, hi)
            s.starved_share = 0.0 if math.isnan(share) else share
        s.computing = _computing(run, name)
        summaries[name] = s

    machine = machine_load(run, (lo, hi))
    names = list(summaries)
    measured = [s for s in summaries.values() if not math.isnan(s.busy)]
    waiting = []
    if "cpus" in machine.limits:
        # the cores were full: a stage busy mostly waiting for one is not saturated by its
        # own work, and where the run's own work filled them no CPU stage is (its workers
        # take turns on them with the other stages'); a GPU stage's workers may be waiting
        # for their GPU instead
        gpus = _stage_gpus(run)
        waiting = [
            s
            for s in measured
            if (machine.run_filled_cores or s.computing < COMPUTING)
            and not gpus.get(s.name, 0.0) > 0
        ]
    candidates = [s for s in measured if s not in waiting]
    saturated = [s for s in candidates if s.busy >= SATURATED]
    bottleneck = _bottleneck(saturated, names)
    if bottleneck is None and not saturated:
        # nothing at full load, but a busy stage with work piling up in front of it
        pressured = [
            s
            for s in candidates
            if s.busy >= PRESSURED and _waiting(s) >= max(4.0, 2 * np.nan_to_num(s.workers))
        ]
        if pressured:
            bottleneck = max(pressured, key=lambda s: _waiting(s) / max(s.workers, 1.0)).name
    starved: list[str] = []
    blocked: list[str] = []
    for s in measured:
        if s.name == bottleneck:
            s.state = "bottleneck"
        elif s.busy >= SATURATED:
            s.state = "saturated"
        elif s.busy >= IDLE:
            s.state = "ok"
        elif s.starved_share >= 0.5:
            s.state = "starved"  # idle with nothing to do: waiting for upstream
            starved.append(s.name)
        elif bottleneck is not None and names.index(s.name) < names.index(bottleneck):
            s.state = "blocked"  # idle with work queued: held back by a full queue downstream
            blocked.append(s.name)
        else:
            s.state = "idle"

    changes = [c for d in run.decisions for c in d["changes"]]
    up = sum(1 for c in changes if _int(c.get("after")) > _int(c.get("before")))
    down = sum(1 for c in changes if _int(c.get("after")) < _int(c.get("before")))
    verdict = Verdict(
        window=(lo, hi),
        stages=summaries,
        bottleneck=bottleneck,
        saturated=[s.name for s in saturated],
        starved=starved,
        blocked=blocked,
        waiting=[s.name for s in waiting if s.busy >= SATURATED],
        decisions=len(run.decisions),
        changes_up=up,
        changes_down=down,
        machine=machine,
    )
    verdict.lines = _verdict_lines(run, verdict)
    return verdict


def machine_load(run: RunLog, window: tuple[float, float]) -> MachineLoad:
    """What the workers held and, where the log measured the host, what the machine did over
    ``window``. The host is this machine only: on a cluster of several nodes its measures
    say nothing about the others, and they are left out."""
    cluster = run.start.get("cluster") or {}
    host = run.start.get("host") or {}
    values = run.run_values
    times = run.times

    def held(key: str) -> float:
        column = values.get(f"{key}_reserved")
        if column is None or not len(column):
            return math.nan
        return _weighted_mean(times, column, *window)

    def rate(key: str) -> float:
        """Growth per second over the window, where the counter covers most of it (a log
        stops measuring a run whose clock turns out virtual)."""
        column = values.get(key)
        if column is None or not len(column):
            return math.nan
        lo, hi = window
        inside = times[(times >= lo) & (times <= hi) & ~np.isnan(column)]
        if len(inside) < 2 or inside[-1] - inside[0] < 0.5 * (hi - lo):
            return math.nan
        return _rate(times, column, *window)

    nodes = cluster.get("nodes")
    one_machine = isinstance(nodes, list) and len(nodes) == 1
    measured = {
        "cores": _num(host.get("cpus")),
        "cores_busy": rate("host_cpu_s"),
        "run_cpus": rate("run_cpu_s"),
        "gpus": _num(host.get("gpus")),
        "gpus_busy": rate("host_gpu_s"),
    }
    if not one_machine:
        measured = {}
    return MachineLoad(
        cpus=_num(cluster.get("cpus")),
        cpus_held=held("cpus"),
        cluster_gpus=_num(cluster.get("gpus")),
        gpus_held=held("gpus"),
        **measured,
    )


def _computing(run: RunLog, name: str) -> float:
    """The share of its workers' busy time a stage spent computing (its CPU time over its
    busy time, from the run's end; more than 1 with several threads)."""
    stats = ((run.end or {}).get("stages") or {}).get(name)
    if not isinstance(stats, dict):
        return math.nan
    cpu, busy = _num(stats.get("cpu_s")), _num(stats.get("busy_s"))
    return cpu / busy if busy > 0 else math.nan


def _stage_gpus(run: RunLog) -> dict[str, float]:
    return {
        str(c.get("name")): _num(c.get("gpus"))
        for c in run.start.get("stages") or []
        if isinstance(c, dict)
    }


def _num(value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def _bottleneck(saturated: list[StageSummary], names: list[str]) -> str | None:
    """The one saturated stage, or among several the one with clearly the most work queued
    in front of it; ``None`` when several are saturated alike (a balanced pipeline).

    The first stage's queue is the source's backlog (a source hands out work as fast as it
    is taken), so it is no evidence against the first stage when several are saturated."""
    if len(saturated) == 1:
        return saturated[0].name
    if not saturated:
        return None

    def waiting(s: StageSummary) -> float:
        if names and s.name == names[0]:
            return 0.0
        return 0.0 if math.isnan(s.queued) else s.queued

    ranked = sorted(saturated, key=lambda s: (waiting(s), s.busy), reverse=True)
    first, second = ranked[0], ranked[1]
    if waiting(first) >= 4 and waiting(first) >= 2 * waiting(second):
        return first.name
    return None


def _waiting(s: StageSummary) -> float:
    return 0.0 if math.isnan(s.queued) else s.queued


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _verdict_lines(run: RunLog, v: Verdict) -> list[str]:
    lines: list[str] = []
    window = f"{fmt_duration(v.window[0])} to {fmt_duration(v.window[1])}"
    config = {str(c.get("name")): c for c in run.start.get("stages") or [] if isinstance(c, dict)}
    if v.bottleneck is not None:
        s = v.stages[v.bottleneck]
        text = (
            f"Bottleneck: {v.bottleneck} — {s.busy:.0%} busy with {s.workers:.1f} workers "
            f"on average ({window})"
        )
        if not math.isnan(s.rate):
            text += f", {s.rate:.3g} tasks/s"
        if not math.isnan(s.queued) and s.queued >= 1:
            text += f", {s.queued:.0f} tasks waiting in front of it"
        others = [n for n in v.saturated if n != v.bottleneck]
        if others:
            text += f"; also saturated: {', '.join(others)}"
        pinned = config.get(v.bottleneck, {}).get("num_workers")
        if isinstance(pinned, int):
            text += (
                f". Its workers are pinned (num_workers={pinned}): the autoscaler cannot add any"
            )
        lines.append(text + ".")
        lines += also_full_lines(v.machine, v.bottleneck)
    elif v.limits:
        lines += limit_lines(v.machine, window, _stages_under_a_full_machine(v))
    elif v.saturated:
        lines.append(
            f"No single bottleneck: {len(v.saturated)} stages are saturated alike "
            f"({_busy(v, v.saturated)} busy, "
            f"{window}) — the workers are balanced between them; more resources would speed "
            "the run up."
        )
    elif v.stages and any(not math.isnan(s.busy) for s in v.stages.values()):
        lines.append(
            f"No stage was saturated (none ≥ {SATURATED:.0%} busy, {window}): "
            "the source or the start-up limited the run."
        )
    else:
        lines.append("No snapshots: the log holds no per-stage measurements.")
    lines += resource_lines(v.machine)
    if v.starved:
        parts = [f"{n} ({v.stages[n].starved_share:.0%} of the time)" for n in v.starved]
        lines.append(
            "Starved (workers idle with an empty input queue, waiting for upstream): "
            + ", ".join(parts)
            + "."
        )
    if v.blocked:
        lines.append(
            "Held back by backpressure (idle with work queued): " + ", ".join(v.blocked) + "."
        )
    if v.decisions:
        lines.append(
            f"Rebalancing: the autoscaler changed worker targets in "
            f"{_plural(v.decisions, 'decision')} ({_plural(v.changes_up, 'increase')}, "
            f"{_plural(v.changes_down, 'decrease')})."
        )
    else:
        lines.append("Rebalancing: none — the autoscaler never changed a worker target.")
    return lines


def _busy(v: Verdict, names: list[str]) -> str:
    """``decode 95%, encode 81%``: each stage's busy fraction."""
    return ", ".join(f"{n} {v.stages[n].busy:.0%}" for n in names)


def _stages_under_a_full_machine(v: Verdict) -> str:
    """How the stages looked while the machine was full: nothing saturated, several alike,
    busy stages whose work filled the cores together, or busy stages that mostly waited for
    a core."""
    if len(v.saturated) > 1:
        return f"{len(v.saturated)} stages were saturated alike ({_busy(v, v.saturated)} busy)"
    if v.waiting and v.machine.run_filled_cores:
        return (
            f"Its own processes used {v.machine.run_cpus:.2f} of them: the stages' work filled "
            f"the cores ({_busy(v, v.waiting)} busy), so no one stage was the limit"
        )
    if v.waiting:
        parts = [
            f"{n} was {v.stages[n].busy:.0%} busy but computing only "
            f"{v.stages[n].computing:.0%} of that time"
            for n in v.waiting
        ]
        return f"No stage was saturated by its own work: {', '.join(parts)}, waiting for a core"
    return f"No stage was saturated by itself (none ≥ {SATURATED:.0%} busy)"


# -- series for drawing ---------------------------------------------------------------------
def bucket_edges(lo: float, hi: float, buckets: int) -> np.ndarray:
    if hi <= lo:
        hi = lo + 1.0
    return np.linspace(lo, hi, buckets + 1)


def minmax(times: np.ndarray, values: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points keeping the shape: per time bucket, the minimum and the
    maximum in the order they happened (NaNs dropped)."""
    ok = ~np.isnan(values)
    t, v = times[ok], values[ok]
    if len(t) <= max_points:
        return t, v
    buckets = max(1, max_points // 2)
    index = np.minimum(((t - t[0]) / max(t[-1] - t[0], 1e-9) * buckets).astype(int), buckets - 1)
    starts = np.searchsorted(index, np.arange(buckets), side="left")
    ends = np.searchsorted(index, np.arange(buckets), side="right")
    keep: list[int] = []
    for a, b in zip(starts, ends, strict=True):
        if a >= b:
            continue
        chunk = v[a:b]
        i, j = a + int(np.argmin(chunk)), a + int(np.argmax(chunk))
        if i == j:
            keep.append(i)
        else:
            keep.extend(sorted((i, j)))
    sel = np.asarray(keep, dtype=int)
    return t[sel], v[sel]


def bucket_mean(times: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mean of the samples in each bucket (NaN where a bucket has none)."""
    ok = ~np.isnan(values)
    t, v = times[ok], values[ok]
    out = np.full(len(edges) - 1, np.nan)
    if not len(t):
        return out
    index = np.searchsorted(edges, t, side="right") - 1
    index = np.clip(index, 0, len(out) - 1)
    sums = np.bincount(index, weights=v, minlength=len(out))
    counts = np.bincount(index, minlength=len(out))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return out


def throughput(
    times: np.ndarray, counts: np.ndarray, points: int, window_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Tasks/s from a cumulative counter: its growth over the last ``window_s`` seconds,
    at ``points`` evenly spaced times (exact at any length of log)."""
    ok = ~np.isnan(counts)
    t, c = times[ok], counts[ok]
    if len(t) < 2:
        return np.zeros(0), np.zeros(0)
    c = np.maximum.accumulate(c)
    grid = np.linspace(t[0], t[-1], max(2, min(points, len(t))))
    back = np.maximum(grid - window_s, t[0])
    span = grid - back
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = (np.interp(grid, t, c) - np.interp(back, t, c)) / span
    rate[span <= 0] = np.nan
    if len(rate) > 1 and math.isnan(rate[0]):
        rate[0] = rate[1]
    return grid, rate


def fmt_duration(seconds: object) -> str:
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or math.isnan(seconds):
        return "—"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        m, s = divmod(int(seconds + 0.5), 60)
        return f"{m}m{s:02d}s"
    h, rest = divmod(int(seconds + 0.5), 3600)
    return f"{h}h{rest // 60:02d}m"
