"""How many workers each stage should have: measured speeds + queues + budget -> targets.

The model: a stage's worker handles ``1 / task_time`` tasks per second, and stage ``i`` sees
``r_i`` tasks per source task (the product of upstream fan-outs). Pipeline throughput is
limited by the stage with the least capacity ``n_i / (r_i * task_time_i)``; targets come from
water-filling: repeatedly give one worker to the current bottleneck while it fits the budget.
When the bottleneck cannot grow, nothing else is added: extra workers elsewhere would only
hold resources the pipeline cannot use.

Stability: a new plan is adopted only if it raises predicted throughput by ``min_gain`` (or a
correction is forced: an idle stage with work, a finished stage holding workers, a tail with
fewer batches left than workers). Removals wait ``scale_down_delay_s``, stretched by the stage's
measured setup time, so a stage whose workers are expensive to start is not shrunk on a
transient starvation and grown again. Starvation does not change task times, which is all the
model sizes by, so it rarely proposes such a removal in the first place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from conveyor.engine.policies import water_fill


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """Knobs of the autoscaler (each read below and covered by tests)."""

    #: smallest relative throughput gain worth moving workers for
    min_gain: float = 0.02
    #: how long a proposed removal must persist before it happens (cheap stages)
    scale_down_delay_s: float = 0.5
    #: removals of a stage wait at least this many times its measured setup time
    setup_cost_factor: float = 2.0
    #: upper bound on workers of one stage; ``None``: only the budget limits a stage, and a
    #: stage that reserves no CPU or GPU gets at most one worker per CPU of the cluster
    max_workers_per_stage: int | None = None
    #: CPUs are time-shared: every stage's first worker shares the cores (a pipeline of more
    #: stages than cores still streams), and workers are added to the bottleneck while the
    #: measured CPU time the plan needs fits the cluster's CPUs and the reservations of the
    #: workers beyond each stage's first fit them too. ``False``: every worker holds its
    #: ``cpus`` whole. GPUs are never shared beyond their reservations.
    share_cpus: bool = True

    def __post_init__(self) -> None:
        for name in ("min_gain", "scale_down_delay_s", "setup_cost_factor"):
            value = getattr(self, name)
            # NaN compares false with everything, so a plain ``< 0`` test would let it through
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or math.isnan(value)
                or value < 0
            ):
                raise ValueError(f"AutoscaleConfig.{name} must be a number >= 0, got {value!r}")
        workers = self.max_workers_per_stage
        if workers is not None and (
            isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
        ):
            raise ValueError(
                f"AutoscaleConfig.max_workers_per_stage must be an int >= 1, got {workers!r}"
            )


@dataclass(frozen=True, slots=True)
class StageObservation:
    name: str
    cpus: float
    gpus: float  # per worker: a fraction below 1, else whole GPUs
    batch_size: int = 1
    pinned: int | None = None
    workers: int = 0  # live workers, starting or ready, not being stopped
    task_time_s: float | None = None  # busy seconds per input task, None until measured
    #: CPU seconds per input task, where the backend measures them (else ``cpus`` times the
    #: task time is assumed: a worker uses its reservation while it works)
    cpu_time_s: float | None = None
    fanout: float | None = None  # outputs per input, None until measured
    backlog: int = 0  # tasks queued for or in flight at this stage
    upstream_done: bool = False  # no input beyond the backlog will arrive
    setup_s: float | None = None  # measured start-up of one worker (start to ready)
    #: host memory one worker takes at its peak: the larger of what the stage declares and
    #: what its workers have measured (``None``: nothing declared, no worker reported yet)
    memory_bytes: float | None = 0.0
    #: NVDEC and NVENC units one worker holds (``Resources.nvdecs``/``nvencs``)
    nvdecs: float = 0.0
    nvencs: float = 0.0

    @property
    def finished(self) -> bool:
        return self.upstream_done and self.backlog == 0


@dataclass(frozen=True, slots=True)
class Budget:
    cpus: float
    gpus: float
    #: host memory all workers together may take (``None``: unknown, not a limit)
    memory_bytes: float | None = None
    #: NVDEC and NVENC units of all GPUs (``None``: unknown, not a limit)
    nvdecs: float | None = None
    nvencs: float | None = None

    def engines_left(
        self, stages: Sequence[StageObservation], counts: Sequence[int]
    ) -> list[float]:
        """NVDEC and NVENC units left with ``counts`` workers per stage (infinite where
        unknown)."""
        left = []
        for total, name in ((self.nvdecs, "nvdecs"), (self.nvencs, "nvencs")):
            used = sum(n * getattr(s, name) for n, s in zip(counts, stages, strict=True))
            left.append(math.inf if total is None else total - used)
        return left

    def memory_room(self, stages: Sequence[StageObservation], counts: Sequence[int]) -> float:
        """Memory left with ``counts`` workers per stage (infinite without a limit)."""
        if self.memory_bytes is None:
            return math.inf
        used = sum(n * (s.memory_bytes or 0.0) for n, s in zip(counts, stages, strict=True))
        return self.memory_bytes - used


@dataclass
class AutoscaleState:
    """What the policy remembers between calls: since when each removal has been proposed."""

    down_since: dict[str, float] = field(default_factory=dict)


#: floor on a measured task time, so a stage measured at 0 s is very fast, not unmeasured
_MIN_TASK_TIME_S = 1e-9
_NO_CAP = 1 << 30  # "unlimited" that still compares as an int


def _weights(stages: Sequence[StageObservation]) -> list[float]:
    """Worker-seconds each stage needs per source task (relative load)."""
    measured = [s.task_time_s for s in stages if s.task_time_s is not None]
    default = max(measured) if measured and max(measured) > 0 else 1.0
    weights, reach = [], 1.0
    for s in stages:
        task_time = s.task_time_s if s.task_time_s is not None else default
        weights.append(reach * max(task_time, _MIN_TASK_TIME_S))
        reach *= s.fanout if s.fanout is not None else 1.0
        reach = max(reach, 1e-9)
    return weights


def stage_rates(stages: Sequence[StageObservation]) -> list[float | None]:
    """Tasks per second each stage sees at the pipeline's predicted pace (``None`` if unknown).

    The pace is the least capacity among unfinished stages with their current workers; a
    stage sees it multiplied by the fan-outs upstream of it.
    """
    if any(s.task_time_s is None for s in stages if not s.finished):
        return [None] * len(stages)
    weights = _weights(stages)
    active = [not s.finished and s.workers > 0 for s in stages]
    pace = throughput([s.workers for s in stages], weights, active)
    rates: list[float | None] = []
    reach = 1.0
    for s in stages:
        rates.append(pace * reach)
        reach *= s.fanout if s.fanout is not None else 1.0
    return rates


def throughput(counts: Sequence[int], weights: Sequence[float], active: Sequence[bool]) -> float:
    """Predicted source tasks per second: the least capacity among active stages."""
    rates = [c / w for c, w, a in zip(counts, weights, active, strict=True) if a and w > 0]
    return min(rates) if rates else math.inf


def cpu_bound_pace(
    stages: Sequence[StageObservation],
    weights: Sequence[float],
    active: Sequence[bool],
    budget: Budget,
) -> float:
    """Source tasks per second the cluster's CPUs can sustain when shared by time: its CPUs
    over the CPU-seconds one source task needs across the active stages.

    A stage's CPU-seconds are measured where the backend can (a worker that waits on a
    contended CPU, or on I/O, is busy longer than it computes); else its task time times
    its CPUs."""
    work = 0.0
    for w, s, a in zip(weights, stages, active, strict=True):
        if not a:
            continue
        if s.cpu_time_s is not None and s.task_time_s:
            work += w / s.task_time_s * s.cpu_time_s  # reach x CPU seconds per task
        else:
            work += w * s.cpus
    return budget.cpus / work if work > 0 else math.inf


def _remaining(stages: Sequence[StageObservation]) -> list[float] | None:
    """Tasks each stage will still see, once the source is exhausted (else ``None``)."""
    if not stages or not stages[0].upstream_done:
        return None
    remaining, carried = [], 0.0
    for s in stages:
        carried += s.backlog
        remaining.append(carried)
        carried *= s.fanout if s.fanout is not None else 1.0
    return remaining


def _caps(
    stages: Sequence[StageObservation], config: AutoscaleConfig, budget: Budget
) -> tuple[list[int], list[int]]:
    """Per stage: the most workers worth keeping, and the most worth *starting*.

    Without an end in sight the only limit is ``max_workers_per_stage`` (or, for a stage that
    reserves nothing and so is never stopped by the budget, the cluster's CPUs). Once the source is
    exhausted, a stage cannot use more workers than batches it will still see, and a new
    worker is worth starting only if the stage's remaining work outlasts one worker's setup.
    A stage not measured yet starts no more workers than it has batches waiting.
    """
    remaining = _remaining(stages)
    keep, start = [], []
    for i, s in enumerate(stages):
        if config.max_workers_per_stage is not None:
            cap = config.max_workers_per_stage
        elif s.cpus <= 0 and s.gpus <= 0:
            cap = max(1, math.ceil(budget.cpus))
        else:
            cap = _NO_CAP
        grow = cap
        if remaining is not None:
            left = remaining[i]
            cap = min(cap, math.ceil(left / s.batch_size))
            grow = cap
            if s.setup_s and s.task_time_s is not None:
                worth = math.ceil(left * s.task_time_s / s.setup_s)
                grow = min(cap, max(s.workers, worth))
        if s.task_time_s is None:
            # not measured yet: start no more workers than there are batches waiting for them
            grow = min(grow, max(1, s.workers, math.ceil(s.backlog / s.batch_size)))
        if s.memory_bytes is None and budget.memory_bytes is not None:
            # how much one more worker would take is unknown until a worker reports it (when
            # it is ready): starting many blind could exhaust the memory the limit protects
            grow = min(grow, max(1, s.workers))
        keep.append(cap)
        start.append(grow)
    return keep, start


def _give_back(
    target: list[int],
    current: list[int],
    weights: list[float],
    active: list[bool],
    pace: float,
    min_gain: float,
    slack: int = 1,
) -> list[int]:
    """Keep the current workers (a move is not worth its churn) but release a surplus.

    A stage keeps enough workers for the plan's pace with ``min_gain`` to spare, plus
    ``slack``: that dead band keeps cheap stages from flipping on measurement noise, while a
    stage that grew for a burst gives its workers back once the input slows down.
    """
    kept = []
    for t, c, w, a in zip(target, current, weights, active, strict=True):
        if t >= c or not a or not math.isfinite(pace):
            kept.append(c)
            continue
        need = math.ceil(pace * (1.0 + min_gain) * w - 1e-9)
        kept.append(c if c <= need + slack else max(t, need + slack))
    return kept


def plan(
    stages: Sequence[StageObservation],
    budget: Budget,
    config: AutoscaleConfig,
    now: float,
    state: AutoscaleState,
) -> list[int]:
    """Target worker count per stage for this cycle."""
    weights = _weights(stages)
    active = [not s.finished for s in stages]
    current = [s.workers for s in stages]
    keep, start = _caps(stages, config, budget)
    base, caps, grow = [], [], []
    for i, s in enumerate(stages):
        if s.finished:
            base.append(0)
            caps.append(0)
            grow.append(0)
        elif s.pinned is not None:
            base.append(s.pinned)
            caps.append(s.pinned)
            grow.append(s.pinned)
        else:
            base.append(1)
            caps.append(max(1, keep[i]))
            grow.append(max(1, start[i]))
    target = list(base)
    cpus = budget.cpus - sum(n * s.cpus for n, s in zip(target, stages, strict=True))
    gpus = budget.gpus - sum(n * s.gpus for n, s in zip(target, stages, strict=True))
    # every stage's first worker is kept whatever it weighs (without it the stream stalls);
    # the workers beyond it must fit the memory and the video engines that are left
    memory = budget.memory_room(stages, target)
    decoders, encoders = budget.engines_left(stages, target)
    # CPUs are shared by time once the cost of every stage with work is known. A stage that
    # has seen no input yet uses no CPU and is left out until it has some; but while one
    # with work waits for its first measurement, each worker holds its reservation (the
    # unknown stage might be the slow one)
    measured = [a and s.task_time_s is not None for s, a in zip(stages, active, strict=True)]
    share = config.share_cpus and all(
        m or s.backlog == 0 for s, m, a in zip(stages, measured, active, strict=True) if a
    )
    pace_cap = cpu_bound_pace(stages, weights, measured, budget) if share else math.inf
    # shared or not, the workers beyond each stage's first hold their CPUs in the books: a
    # stage whose work is mostly waiting (sleep, I/O) costs little CPU time but processes
    room = budget.cpus if share else cpus
    # Water-filling over "wanted" counts. A stage not measured yet may be unable to start
    # more workers (no work has reached it), but it still *reserves* its fair share of the
    # budget, so the first measured stage does not take everything on a cold start.
    limits = [caps[i] if s.task_time_s is None else grow[i] for i, s in enumerate(stages)]
    rooms = (room, gpus, memory, decoders, encoders)
    wanted = water_fill.fill(stages, weights, active, target, limits, rooms, pace_cap)
    target = [
        min(w, g) if a else t for w, g, a, t in zip(wanted, grow, active, target, strict=True)
    ]

    forced = budget.memory_room(stages, current) < 0 or any(
        (t > 0) != (c > 0)  # a stage gains its first worker or a finished one frees its last
        or c > caps[i]  # more workers than batches left, or a pin changed
        or (s.pinned is not None and not s.finished and c != s.pinned)
        for i, (s, t, c) in enumerate(zip(stages, target, current, strict=True))
    )
    # stages held back by a lack of work, not of workers, do not limit throughput; pinned
    # stages do (their capacity is fixed), once their speed is known or work waits for them
    # (an idle unmeasured stage weighs as much as the slowest by assumption only). A stage
    # that reaches its cap in the plan limited the pipeline before it (else a stage growing
    # to ``max_workers_per_stage`` would count for neither side and its growth be undone)
    limiting = [
        a
        and (s.pinned is not None or min(t, c) < g)
        and (s.task_time_s is not None or s.backlog > 0)
        for a, t, c, g, s in zip(active, target, current, grow, stages, strict=True)
    ]
    if not forced and any(limiting):
        before = max(min(throughput(current, weights, limiting), pace_cap), 1e-12)
        pace = min(throughput(target, weights, limiting), pace_cap)
        if pace / before < 1.0 + config.min_gain:
            # where shared CPUs let reservations outgrow the budget, nothing else reclaims
            # an idle worker (the budget would), so the dead band is the 2% margin alone
            reserved = sum(c * s.cpus for c, s in zip(current, stages, strict=True))
            slack = 0 if share and reserved > budget.cpus + 1e-9 else 1
            target = _give_back(target, current, weights, active, pace, config.min_gain, slack)
    if config.share_cpus and not share and not forced:
        # a stage with work not measured yet holds the plan to reservations, but what is
        # known still sized the measured stages: taking their workers now would only start
        # them again once it is measured (each downstream stage's first measurement would
        # shrink and regrow the upstream pools, every worker of them a fresh start)
        target = [max(t, c) if m else t for t, c, m in zip(target, current, measured, strict=True)]

    # hysteresis on removals: a stage shrinks only after the proposal has held long enough
    result = []
    for i, (s, t, c) in enumerate(zip(stages, target, current, strict=True)):
        must = s.finished or c > caps[i]
        if t < c and not must:
            since = state.down_since.setdefault(s.name, now)
            hold = max(config.scale_down_delay_s, config.setup_cost_factor * (s.setup_s or 0.0))
            if now - since < hold:
                t = c
        else:
            state.down_since.pop(s.name, None)
        result.append(t)
    return result


def explain(
    stages: Sequence[StageObservation],
    before: Sequence[int],
    after: Sequence[int],
    budget: Budget | None = None,
) -> list[str | None]:
    """Why each stage's target moved from ``before`` to ``after`` (``None`` where it did
    not), in words a person reading a run report understands: which stage limits the
    pipeline, at what pace, and what the others could do with their workers."""
    weights = _weights(stages)
    active = [not s.finished for s in stages]
    measured = all(s.task_time_s is not None for s, a in zip(stages, active, strict=True) if a)
    # each stage's pace with its old workers, in source tasks per second
    paces = [
        (b / w if w > 0 else math.inf) if a else math.inf
        for b, w, a in zip(before, weights, active, strict=True)
    ]
    over_memory = budget is not None and budget.memory_room(stages, before) < 0
    limiting = min(range(len(stages)), key=lambda i: paces[i]) if stages else 0
    pipeline = paces[limiting] if stages else math.inf
    reasons: list[str | None] = []
    for i, (s, b, a) in enumerate(zip(stages, before, after, strict=True)):
        if a == b:
            reasons.append(None)
        elif s.finished:
            reasons.append("finished: no input left")
        elif s.pinned is not None:
            reasons.append(f"pinned to {s.pinned} worker{'s' if s.pinned != 1 else ''}")
        elif not measured or s.task_time_s is None:
            reasons.append(
                "first worker of a stage with work"
                if b == 0
                else "start-up: not every stage measured yet"
            )
        elif a > b and i == limiting:
            reasons.append(
                f"bottleneck: {b} worker{'s' if b != 1 else ''} keep{'s' if b == 1 else ''} "
                f"up with {_pace(paces[i])}, {s.backlog} queued"
            )
        elif a > b:
            reasons.append(
                f"near the bottleneck: {_pace(paces[i])} vs {stages[limiting].name}'s "
                f"{_pace(pipeline)}, {s.backlog} queued"
            )
        elif over_memory and a < b:
            assert budget is not None and budget.memory_bytes is not None
            reasons.append(
                f"over the memory limit: {b} worker{'s' if b != 1 else ''} of "
                f"{(s.memory_bytes or 0) / 2**20:.0f} MB each, "
                f"{budget.memory_bytes / 2**30:.1f} GB for all workers"
            )
        elif s.backlog < b * s.batch_size:
            reasons.append(f"little work left: {s.backlog} queued for {b} workers")
        else:
            reasons.append(
                f"spare capacity: {_pace(paces[i])} while {stages[limiting].name} "
                f"limits the pipeline to {_pace(pipeline)}"
            )
    return reasons


def _pace(per_second: float) -> str:
    if math.isinf(per_second):
        return "unbounded"
    return f"{per_second:.3g} source tasks/s"
