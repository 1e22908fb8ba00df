"""The autoscale policy: measured speeds + queues + budget -> target workers per stage.

Every ``AutoscaleConfig`` field has a test below that fails if the field is ignored
("no dead knobs"): see the ``# knob:`` comments.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from conveyor.engine.policies.autoscale import (
    AutoscaleConfig,
    AutoscaleState,
    Budget,
    StageObservation,
    plan,
    throughput,
)

#: an autoscaler without hysteresis or a gain threshold, to test the sizing alone
EAGER = AutoscaleConfig(min_gain=0.0, scale_down_delay_s=0.0, setup_cost_factor=0.0)


def gpu_stage(name: str, task_time_s: float | None = None, **kwargs: Any) -> StageObservation:
    """One stage whose workers each need one CPU and one GPU (so GPUs are the budget)."""
    values: dict[str, Any] = {"cpus": 1.0, "gpus": 1.0, "workers": 1, "backlog": 1000}
    values.update(kwargs)
    return StageObservation(name=name, task_time_s=task_time_s, **values)


def cpu_stage(name: str, task_time_s: float | None = None, **kwargs: Any) -> StageObservation:
    values: dict[str, Any] = {"cpus": 1.0, "gpus": 0.0, "workers": 1, "backlog": 1000}
    values.update(kwargs)
    return StageObservation(name=name, task_time_s=task_time_s, **values)


def run_plan(
    stages: list[StageObservation],
    gpus: float = 0.0,
    cpus: float = 1000.0,
    config: AutoscaleConfig = EAGER,
    now: float = 0.0,
    state: AutoscaleState | None = None,
) -> list[int]:
    return plan(stages, Budget(cpus=cpus, gpus=gpus), config, now, state or AutoscaleState())


# -- sizing by measured rates -------------------------------------------------------------
def test_three_stages_sized_by_their_rates() -> None:
    # per-worker rates 4, 1, 2 tasks/s; 7 GPUs -> capacities 4, 4, 4
    stages = [gpu_stage("a", 0.25), gpu_stage("b", 1.0), gpu_stage("c", 0.5)]
    assert run_plan(stages, gpus=7) == [1, 4, 2]


def test_three_stages_from_a_cold_start() -> None:
    stages = [gpu_stage(n, t, workers=0) for n, t in (("a", 0.25), ("b", 1.0), ("c", 0.5))]
    assert run_plan(stages, gpus=7, config=AutoscaleConfig()) == [1, 4, 2]


def test_fast_stage_gets_one_worker_and_slow_stage_the_rest() -> None:
    stages = [gpu_stage("x", 0.05), gpu_stage("y", 1.0)]  # x is 20x faster
    assert run_plan(stages, gpus=8) == [1, 7]


def test_targets_do_not_depend_on_stage_order() -> None:
    stages = [gpu_stage("y", 1.0), gpu_stage("x", 0.05)]
    assert run_plan(stages, gpus=8) == [7, 1]


def test_equal_stages_split_evenly_and_ties_go_to_the_earlier_stage() -> None:
    stages = [gpu_stage("a", 1.0), gpu_stage("b", 1.0)]
    assert run_plan(stages, gpus=10) == [5, 5]
    assert run_plan(stages, gpus=11) == [6, 5]


def test_cpu_budget_limits_cpu_stages() -> None:
    stages = [cpu_stage("a", 0.5, cpus=2.0), cpu_stage("b", 1.0, cpus=2.0)]
    # 12 CPUs = 6 workers of 2 CPUs; b needs twice a's workers
    assert run_plan(stages, cpus=12) == [2, 4]


def test_fractional_gpu_workers_pack_into_the_budget() -> None:
    stages = [gpu_stage("a", 1.0, gpus=0.25)]
    assert run_plan(stages, gpus=2) == [8]


#: every worker holds its CPUs whole (the reservation model, ``share_cpus=False``)
RESERVED = dataclasses.replace(EAGER, share_cpus=False)


def test_targets_fit_the_budget_when_the_minimum_does() -> None:
    for gpus in range(3, 12):
        stages = [gpu_stage("a", 0.3), gpu_stage("b", 0.7, gpus=0.5), cpu_stage("c", 0.2)]
        targets = run_plan(stages, gpus=gpus, cpus=9, config=RESERVED)
        used_gpus = targets[0] * 1.0 + targets[1] * 0.5
        used_cpus = sum(targets)
        assert used_gpus <= gpus
        assert used_cpus <= 9
        assert all(t >= 1 for t in targets)


def test_shared_cpus_fit_the_budget_in_cpu_time_and_gpus_stay_whole() -> None:
    # knob: share_cpus (True: a worker costs the CPU time its share of the work takes)
    for gpus in range(3, 12):
        stages = [gpu_stage("a", 0.3), gpu_stage("b", 0.7, gpus=0.5), cpu_stage("c", 0.2)]
        targets = run_plan(stages, gpus=gpus, cpus=9)
        assert targets[0] * 1.0 + targets[1] * 0.5 <= gpus
        weights = [0.3, 0.7, 0.2]
        cpu_bound = 9 / sum(weights)  # tasks/s the 9 CPUs carry, shared by time
        assert all(t >= 1 for t in targets)
        # no stage holds a worker it does not need to reach the CPU bound
        assert all(t == 1 or (t - 1) / w < cpu_bound for t, w in zip(targets, weights, strict=True))


def test_shared_cpus_balance_more_stages_than_cores() -> None:
    # three stages of 1 CPU on 2 CPUs: reserved, each keeps its one worker and the slow one
    # sets the pace (1 task/s); shared, the slow one grows until the CPUs are the limit
    stages = [cpu_stage("cheap", 0.1), cpu_stage("slow", 1.0), cpu_stage("mid", 0.2)]
    assert run_plan(stages, cpus=2, config=RESERVED) == [1, 1, 1]
    shared = run_plan(stages, cpus=2)
    assert shared == [1, 2, 1]
    # 2 CPUs over 1.3 CPU-s per task: 1.54 tasks/s, which two slow workers can carry
    assert throughput(shared, [0.1, 1.0, 0.2], [True] * 3) >= 2 / 1.3


def test_shared_cpus_wait_for_every_stage_with_work_to_be_measured() -> None:
    # an unmeasured stage with work may be the slow one: until it is known, reservations hold
    stages = [cpu_stage("cheap", 0.1), cpu_stage("slow", 1.0), cpu_stage("new")]
    assert run_plan(stages, cpus=2) == [1, 1, 1]
    # one that has seen no input yet uses no CPU: the stages that work share the cores
    idle = [cpu_stage("cheap", 0.1), cpu_stage("slow", 1.0), cpu_stage("new", backlog=0)]
    assert run_plan(idle, cpus=2) == [1, 2, 1]


def test_shared_cpus_release_surplus_the_budget_would_have_taken_back() -> None:
    # a cheap stage left with 3 workers by a cold start; a pinned slow stage sets the pace
    # (2 tasks/s), for which the cheap one needs a single worker
    stages = [
        cpu_stage("cheap", 0.25, workers=3),
        cpu_stage("slow", 1.0, workers=2, pinned=2),
    ]
    config = dataclasses.replace(EAGER, min_gain=0.02)
    # reservations (5 CPUs) above the budget (2): the dead band is the 2% margin alone
    assert run_plan(stages, cpus=2, config=config) == [1, 2]
    # within the budget the usual dead band of one worker holds
    assert run_plan(stages, cpus=64, config=config) == [2, 2]


def test_a_pinned_stage_that_has_seen_no_input_does_not_hold_the_bottleneck_back() -> None:
    # the splitter's weight, the slowest measured, is an assumption until input reaches it:
    # counted as limiting, it made every plan "no gain" and kept "slow" at one worker
    stages = [cpu_stage("cheap", 0.1), cpu_stage("slow", 1.0), cpu_stage("split", pinned=1)]
    stages[2] = dataclasses.replace(stages[2], backlog=0)
    config = dataclasses.replace(EAGER, min_gain=0.02)
    assert run_plan(stages, cpus=2, config=config) == [1, 2, 1]
    # with work waiting, its assumed weight is all there is to go on
    stages[2] = dataclasses.replace(stages[2], backlog=5)
    assert run_plan(stages, cpus=2, config=config) == [1, 1, 1]


def test_a_stage_waiting_for_its_first_measurement_takes_no_workers_away() -> None:
    # measured, "slow" has two workers on 2 CPUs shared by time; "new" then gets work: until
    # it is measured the plan holds reservations, but "slow" keeps its workers (taking them
    # would only start them again a few seconds later)
    stages = [cpu_stage("cheap", 0.1), cpu_stage("slow", 1.0, workers=2), cpu_stage("new")]
    assert run_plan(stages, cpus=2) == [1, 2, 1]
    config = dataclasses.replace(EAGER, share_cpus=False)
    assert run_plan(stages, cpus=2, config=config) == [1, 1, 1]  # reserved: the budget rules


def test_unmeasured_stages_get_a_fair_share() -> None:
    stages = [gpu_stage("a"), gpu_stage("b"), gpu_stage("c")]
    assert run_plan(stages, gpus=6) == [2, 2, 2]


def test_unmeasured_stage_is_assumed_as_slow_as_the_slowest_measured() -> None:
    # "unknown" weighs as much as "slow" (3 s), so the two share the budget evenly
    stages = [gpu_stage("fast", 0.1), gpu_stage("unknown"), gpu_stage("slow", 3.0)]
    assert run_plan(stages, gpus=8) == [1, 4, 3]


def test_stage_measured_at_zero_seconds_is_fast_not_unmeasured() -> None:
    # a 0 s task time (e.g. a trivial stage on a coarse clock) must not count as "unknown"
    stages = [gpu_stage("instant", 0.0), gpu_stage("slow", 1.0)]
    assert run_plan(stages, gpus=8) == [1, 7]
    assert run_plan([gpu_stage("a", 0.0), gpu_stage("b", 0.0)], gpus=4) == [2, 2]


def test_every_unfinished_stage_keeps_a_worker_even_over_budget() -> None:
    stages = [gpu_stage("a", 1.0), gpu_stage("b", 5.0), gpu_stage("c", 0.01)]
    assert run_plan(stages, gpus=1) == [1, 1, 1]
    assert run_plan(stages, gpus=0, cpus=0) == [1, 1, 1]


def test_empty_pipeline_plans_nothing() -> None:
    assert run_plan([], gpus=8) == []


# -- fan-out ------------------------------------------------------------------------------
def test_fanout_shifts_workers_downstream() -> None:
    even = [gpu_stage("split", 1.0), gpu_stage("work", 1.0)]
    assert run_plan(even, gpus=11) == [6, 5]
    fanned = [gpu_stage("split", 1.0, fanout=10.0), gpu_stage("work", 1.0)]
    assert run_plan(fanned, gpus=11) == [1, 10]


def test_fanout_multiplies_along_the_chain() -> None:
    stages = [
        gpu_stage("a", 1.0, fanout=2.0),
        gpu_stage("b", 1.0, fanout=3.0),
        gpu_stage("c", 1.0),
    ]
    # loads 1 : 2 : 6
    assert run_plan(stages, gpus=9) == [1, 2, 6]


def test_filtering_stage_reduces_downstream_load() -> None:
    stages = [gpu_stage("filter", 1.0, fanout=0.25), gpu_stage("after", 1.0)]
    assert run_plan(stages, gpus=10) == [8, 2]


# -- the bottleneck rule ------------------------------------------------------------------
def test_resources_stay_unused_when_the_bottleneck_cannot_grow() -> None:
    # the GPU stage is the bottleneck; once GPUs run out, idle CPUs are not given to the
    # CPU stage, whose extra workers could not raise throughput
    stages = [cpu_stage("read", 0.01), gpu_stage("model", 1.0)]
    assert run_plan(stages, gpus=2, cpus=100) == [1, 2]


def test_bottleneck_short_of_cpus_stops_growth_elsewhere() -> None:
    stages = [cpu_stage("light", 0.1, cpus=1.0), cpu_stage("heavy", 1.0, cpus=8.0)]
    # heavy needs 8 CPUs per worker; 1 CPU is left after 1 + 8 and is not handed to light
    assert run_plan(stages, cpus=10, config=RESERVED) == [1, 1]
    assert run_plan(stages, cpus=17, config=RESERVED) == [1, 2]
    # shared by time, 10 CPUs carry 10 / 8.1 = 1.23 tasks/s: a second heavy worker helps
    assert run_plan(stages, cpus=10) == [1, 2]


# -- pins and finished stages -------------------------------------------------------------
def test_pinned_stage_keeps_its_count() -> None:
    stages = [gpu_stage("pinned", 0.01, pinned=3, workers=3), gpu_stage("free", 1.0)]
    assert run_plan(stages, gpus=8) == [3, 5]


def test_pinned_slow_stage_is_not_grown() -> None:
    stages = [gpu_stage("pinned", 10.0, pinned=2, workers=2), gpu_stage("free", 1.0)]
    assert run_plan(stages, gpus=8)[0] == 2


def test_pinned_count_is_restored_at_once_whatever_the_hysteresis() -> None:
    slow = AutoscaleConfig(scale_down_delay_s=1e6)
    assert run_plan([gpu_stage("p", 1.0, pinned=2, workers=5)], gpus=8, config=slow) == [2]
    assert run_plan([gpu_stage("p", 1.0, pinned=4, workers=1)], gpus=8, config=slow) == [4]


def test_pin_above_the_worker_cap_is_kept() -> None:
    config = AutoscaleConfig(max_workers_per_stage=2)
    assert run_plan([cpu_stage("p", 1.0, pinned=5, workers=5)], config=config) == [5]


def test_finished_stage_goes_to_zero_at_once_and_frees_its_share() -> None:
    slow = AutoscaleConfig(scale_down_delay_s=1e6)
    stages = [
        gpu_stage("done", 1.0, workers=3, backlog=0, upstream_done=True),
        gpu_stage("busy", 1.0, workers=1),
    ]
    assert run_plan(stages, gpus=4, config=slow) == [0, 4]


def test_finished_pinned_stage_goes_to_zero() -> None:
    stage = gpu_stage("p", 1.0, pinned=2, workers=2, backlog=0, upstream_done=True)
    assert run_plan([stage], gpus=8) == [0]


def test_stage_with_backlog_is_not_finished_even_if_upstream_is_done() -> None:
    stage = gpu_stage("a", 1.0, workers=0, backlog=1, upstream_done=True)
    assert stage.finished is False
    assert run_plan([stage], gpus=8) == [1]
    assert gpu_stage("a", 1.0, backlog=0, upstream_done=False).finished is False


# -- the tail -----------------------------------------------------------------------------
def test_tail_cap_limits_workers_to_the_batches_left() -> None:
    # 5 tasks left in batches of 2: 3 batches, so at most 3 workers
    tail = gpu_stage("a", 1.0, workers=1, backlog=5, batch_size=2, upstream_done=True)
    assert run_plan([tail], gpus=16) == [3]
    streaming = gpu_stage("a", 1.0, workers=1, backlog=5, batch_size=2, upstream_done=False)
    assert run_plan([streaming], gpus=16) == [16]


def test_tail_cap_shrinks_at_once_whatever_the_hysteresis() -> None:
    slow = AutoscaleConfig(scale_down_delay_s=1e6, setup_cost_factor=100.0)
    tail = gpu_stage("a", 1.0, workers=8, backlog=5, batch_size=2, upstream_done=True, setup_s=90)
    assert run_plan([tail], gpus=16, config=slow) == [3]


def test_tail_cap_with_single_task_batches() -> None:
    tail = cpu_stage("a", 1.0, workers=10, backlog=4, upstream_done=True)
    assert run_plan([tail], cpus=64) == [4]


# -- hysteresis ---------------------------------------------------------------------------
def rebalance(setup_s: float | None = None) -> list[StageObservation]:
    """Stage "was" had 6 workers but is now measured 20x faster than "now", which has 1."""
    return [gpu_stage("was", 0.05, workers=6, setup_s=setup_s), gpu_stage("now", 1.0)]


def test_eager_config_removes_at_once() -> None:
    assert run_plan(rebalance(), gpus=7) == [1, 6]


def test_removal_waits_scale_down_delay() -> None:  # knob: scale_down_delay_s
    config = AutoscaleConfig(scale_down_delay_s=1.0, setup_cost_factor=0.0)
    state = AutoscaleState()
    assert run_plan(rebalance(), gpus=7, config=config, now=100.0, state=state)[0] == 6
    assert state.down_since == {"was": 100.0}
    assert run_plan(rebalance(), gpus=7, config=config, now=100.5, state=state)[0] == 6
    assert run_plan(rebalance(), gpus=7, config=config, now=101.0, state=state)[0] == 1

    zero = AutoscaleConfig(scale_down_delay_s=0.0, setup_cost_factor=0.0)
    assert run_plan(rebalance(), gpus=7, config=zero, now=100.0)[0] == 1


def test_longer_scale_down_delay_holds_longer() -> None:  # knob: scale_down_delay_s
    config = AutoscaleConfig(scale_down_delay_s=30.0, setup_cost_factor=0.0)
    state = AutoscaleState()
    for now in (0.0, 10.0, 29.9):
        assert run_plan(rebalance(), gpus=7, config=config, now=now, state=state)[0] == 6
    assert run_plan(rebalance(), gpus=7, config=config, now=30.0, state=state)[0] == 1


def test_expensive_setup_is_not_shrunk_on_a_short_transient() -> None:  # knob: setup_cost_factor
    # a 90 s setup stage: removals wait 3 x 90 = 270 s
    config = AutoscaleConfig(scale_down_delay_s=1.0, setup_cost_factor=3.0)
    state = AutoscaleState()
    for now in (0.0, 10.0, 100.0, 269.0):
        assert run_plan(rebalance(90.0), gpus=7, config=config, now=now, state=state)[0] == 6
    assert run_plan(rebalance(90.0), gpus=7, config=config, now=270.0, state=state)[0] == 1


def test_setup_cost_factor_scales_the_hold() -> None:  # knob: setup_cost_factor
    ignore_setup = AutoscaleConfig(scale_down_delay_s=1.0, setup_cost_factor=0.0)
    state = AutoscaleState()
    run_plan(rebalance(90.0), gpus=7, config=ignore_setup, now=0.0, state=state)
    assert run_plan(rebalance(90.0), gpus=7, config=ignore_setup, now=10.0, state=state)[0] == 1

    once = AutoscaleConfig(scale_down_delay_s=1.0, setup_cost_factor=1.0)
    state = AutoscaleState()
    run_plan(rebalance(90.0), gpus=7, config=once, now=0.0, state=state)
    assert run_plan(rebalance(90.0), gpus=7, config=once, now=89.0, state=state)[0] == 6
    assert run_plan(rebalance(90.0), gpus=7, config=once, now=90.0, state=state)[0] == 1


def test_unmeasured_setup_time_falls_back_to_the_delay() -> None:
    config = AutoscaleConfig(scale_down_delay_s=1.0, setup_cost_factor=3.0)
    state = AutoscaleState()
    run_plan(rebalance(None), gpus=7, config=config, now=0.0, state=state)
    assert run_plan(rebalance(None), gpus=7, config=config, now=1.0, state=state)[0] == 1


def test_transient_that_ends_resets_the_removal_clock() -> None:
    config = AutoscaleConfig(scale_down_delay_s=1.0, setup_cost_factor=3.0)
    state = AutoscaleState()
    run_plan(rebalance(90.0), gpus=7, config=config, now=0.0, state=state)
    # the transient ends: "was" is 6x slower than "now" again, so 6/1 is the plan itself
    steady = [gpu_stage("was", 6.0, workers=6, setup_s=90.0), gpu_stage("now", 1.0, workers=1)]
    assert run_plan(steady, gpus=7) == [6, 1]
    assert run_plan(steady, gpus=7, config=config, now=50.0, state=state)[0] == 6
    assert state.down_since == {}
    # a new proposal starts a new 270 s hold
    assert run_plan(rebalance(90.0), gpus=7, config=config, now=300.0, state=state)[0] == 6
    assert run_plan(rebalance(90.0), gpus=7, config=config, now=569.0, state=state)[0] == 6
    assert run_plan(rebalance(90.0), gpus=7, config=config, now=570.0, state=state)[0] == 1


def test_additions_are_not_delayed() -> None:
    config = AutoscaleConfig(scale_down_delay_s=1e6)
    stages = [gpu_stage("a", 1.0, workers=1), gpu_stage("b", 1.0, workers=1)]
    assert run_plan(stages, gpus=4, config=config) == [2, 2]


def test_policy_uses_the_given_time_only() -> None:
    config = AutoscaleConfig(scale_down_delay_s=5.0, setup_cost_factor=0.0)
    state = AutoscaleState()
    # the same "now" twice: no time has passed, however long the calls took
    assert run_plan(rebalance(), gpus=7, config=config, now=0.0, state=state)[0] == 6
    assert run_plan(rebalance(), gpus=7, config=config, now=0.0, state=state)[0] == 6
    assert run_plan(rebalance(), gpus=7, config=config, now=5.0, state=state)[0] == 1


# -- min_gain -----------------------------------------------------------------------------
def test_change_below_min_gain_is_not_applied() -> None:  # knob: min_gain
    # current 1/6 -> plan 1/7 raises throughput by 7/6 - 1 = 16.7 %
    stages = [gpu_stage("x", 0.05, workers=1), gpu_stage("y", 1.0, workers=6)]
    assert run_plan(stages, gpus=8, config=AutoscaleConfig(min_gain=0.2)) == [1, 6]
    assert run_plan(stages, gpus=8, config=AutoscaleConfig(min_gain=0.1)) == [1, 7]
    assert run_plan(stages, gpus=8, config=AutoscaleConfig(min_gain=0.0)) == [1, 7]


def test_change_without_any_gain_is_not_applied_by_default() -> None:
    # pinned bottleneck: more "free" workers cannot raise throughput
    stages = [gpu_stage("pinned", 10.0, pinned=1, workers=1), gpu_stage("free", 1.0, workers=1)]
    assert run_plan(stages, gpus=8, config=AutoscaleConfig()) == [1, 1]


def test_forced_corrections_ignore_min_gain() -> None:
    never = AutoscaleConfig(min_gain=math.inf)
    # a stage without workers gets its first one
    stages = [gpu_stage("a", 1.0, workers=2), gpu_stage("b", 1.0, workers=0)]
    assert run_plan(stages, gpus=4, config=never) == [2, 2]
    # a finished stage gives its workers back
    stages = [
        gpu_stage("a", 1.0, workers=2, backlog=0, upstream_done=True),
        gpu_stage("b", 1.0, workers=2),
    ]
    assert run_plan(stages, gpus=4, config=never) == [0, 4]
    # a steady change is not forced
    stages = [gpu_stage("a", 1.0, workers=1), gpu_stage("b", 1.0, workers=1)]
    assert run_plan(stages, gpus=4, config=never) == [1, 1]
    # nor after a pinned stage has finished (its pin no longer holds: forcing then turned
    # off min_gain for the rest of a run, and workers came and went on noise)
    done = gpu_stage("list", 0.1, pinned=1, workers=0, backlog=0, upstream_done=True)
    assert run_plan([done, *stages], gpus=4, config=never) == [0, 1, 1]


# -- max_workers_per_stage ----------------------------------------------------------------
def test_stage_with_zero_resources_is_capped() -> None:  # knob: max_workers_per_stage
    free = cpu_stage("free", 1.0, cpus=0.0)
    assert run_plan([free], cpus=8) == [8]  # by default: one worker per CPU of the cluster
    assert run_plan([free], cpus=8, config=AutoscaleConfig(max_workers_per_stage=5)) == [5]


def test_stages_that_reserve_resources_are_not_capped_by_default() -> None:
    stages = [gpu_stage("a", 1.0), gpu_stage("b", 1.0)]
    assert run_plan(stages, gpus=400, cpus=1000) == [200, 200]


def test_worker_cap_applies_to_any_stage() -> None:  # knob: max_workers_per_stage
    config = AutoscaleConfig(max_workers_per_stage=3, min_gain=0.0, scale_down_delay_s=0.0)
    stages = [gpu_stage("a", 1.0), gpu_stage("b", 1.0)]
    assert run_plan(stages, gpus=100, config=config) == [3, 3]


def test_worker_cap_lowered_shrinks_at_once() -> None:
    config = AutoscaleConfig(max_workers_per_stage=2, scale_down_delay_s=1e6)
    assert run_plan([cpu_stage("a", 1.0, workers=6)], config=config) == [2]


def test_a_bottleneck_grows_up_to_the_worker_cap_with_the_default_gain() -> None:
    # reaching its cap in the plan, the bottleneck no longer limits the planned pace; it did
    # limit the current one, so the gain is counted and the growth kept (it was undone: a
    # pinned source left as the only "limiting" stage showed no gain)
    config = AutoscaleConfig(max_workers_per_stage=2)
    source = cpu_stage("list", 0.0003, cpus=0.25, pinned=1, upstream_done=True, backlog=40)
    work = cpu_stage("encode", 0.031, backlog=40)
    assert run_plan([source, work], cpus=2, config=config) == [1, 2]
    assert run_plan([source, work], cpus=2, config=AutoscaleConfig()) == [1, 2]


# -- config validation --------------------------------------------------------------------
def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AutoscaleConfig().min_gain = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("field", ["min_gain", "scale_down_delay_s", "setup_cost_factor"])
@pytest.mark.parametrize("value", [-0.1, -1, math.nan, "1", None, True])
def test_invalid_float_knobs_raise(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"AutoscaleConfig\.{field} must be a number >= 0"):
        AutoscaleConfig(**{field: value})


@pytest.mark.parametrize("value", [0, -3, 2.5, "4", True])
def test_invalid_worker_cap_raises(value: Any) -> None:
    with pytest.raises(ValueError, match=r"max_workers_per_stage must be an int >= 1"):
        AutoscaleConfig(max_workers_per_stage=value)


def test_boundary_knob_values_are_accepted() -> None:
    config = AutoscaleConfig(
        min_gain=0, scale_down_delay_s=0, setup_cost_factor=0, max_workers_per_stage=1
    )
    assert config.max_workers_per_stage == 1
    AutoscaleConfig(scale_down_delay_s=math.inf)  # never shrink


# -- throughput ---------------------------------------------------------------------------
def test_throughput_is_the_least_capacity_of_active_stages() -> None:
    assert throughput([1, 4, 2], [0.25, 1.0, 0.5], [True, True, True]) == pytest.approx(4.0)
    assert throughput([1, 1, 2], [0.25, 1.0, 0.5], [True, True, True]) == pytest.approx(1.0)
    assert throughput([1, 1, 2], [0.25, 1.0, 0.5], [True, False, True]) == pytest.approx(4.0)
    assert throughput([0, 1], [1.0, 1.0], [True, True]) == 0.0
    assert throughput([1], [1.0], [False]) == math.inf


# -- limits that come from the work itself --------------------------------------------------
def test_a_pinned_bottleneck_stops_growth_elsewhere() -> None:
    stages = [cpu_stage("feed", 0.01), cpu_stage("model", 1.0, pinned=2)]
    # the pinned model caps throughput at 2 tasks/s: the feed needs no more than one worker
    assert run_plan(stages, cpus=16) == [1, 2]


def test_tail_does_not_start_workers_whose_setup_outlasts_the_work() -> None:
    # source exhausted; 10 tasks of 0.1 s left = 1 s of work, a worker takes 5 s to start
    stages = [
        cpu_stage("src", 0.001, backlog=0, upstream_done=True),
        cpu_stage("model", 0.1, backlog=10, setup_s=5.0, workers=2),
    ]
    assert run_plan(stages, cpus=16) == [0, 2]  # keeps what it has, starts nothing new
    cheap = [stages[0], dataclasses.replace(stages[1], setup_s=0.01)]
    assert run_plan(cheap, cpus=16) == [0, 10]  # cheap workers: one per remaining task


def test_tail_caps_downstream_stages_by_the_work_still_coming() -> None:
    # source exhausted: 4 tasks queued upstream, each fans out to 3 -> 12 tasks downstream
    stages = [
        cpu_stage("split", 0.5, backlog=4, fanout=3.0, upstream_done=True, workers=4),
        cpu_stage("encode", 1.0, backlog=0, workers=1),
    ]
    assert run_plan(stages, cpus=64) == [4, 12]


def test_stage_rates_follow_the_bottleneck_and_fan_out() -> None:
    from conveyor.engine.policies.autoscale import stage_rates

    stages = [
        cpu_stage("split", 0.1, workers=1, fanout=4.0),  # capacity 10 source tasks/s
        cpu_stage("encode", 0.5, workers=10),  # 20 tasks/s = 5 source tasks/s: the bottleneck
    ]
    assert stage_rates(stages) == [pytest.approx(5.0), pytest.approx(20.0)]
    assert stage_rates([cpu_stage("a", 0.1), cpu_stage("b", None)]) == [None, None]


# -- giving back what the pace cannot use ----------------------------------------------------
def test_surplus_is_released_down_to_the_dead_band() -> None:
    # a pinned source at 2 tasks/s; the decoder grew to 40 workers of 1 s for a burst
    config = AutoscaleConfig(scale_down_delay_s=0.0, setup_cost_factor=0.0)
    stages = [
        cpu_stage("source", 0.5, pinned=1),
        cpu_stage("decode", 1.0, workers=40),
    ]
    # pace 2/s needs ceil(2 x 1.02) = 3 decoders, plus one of dead band: 4 are kept
    assert run_plan(stages, cpus=64, config=config) == [1, 4]


def test_a_small_surplus_inside_the_dead_band_is_kept() -> None:
    config = AutoscaleConfig(scale_down_delay_s=0.0, setup_cost_factor=0.0)
    stages = [cpu_stage("source", 0.5, pinned=1), cpu_stage("decode", 1.0, workers=4)]
    assert run_plan(stages, cpus=64, config=config) == [1, 4]


def test_shared_cpus_count_measured_cpu_time_not_time_held() -> None:
    # the slow stage is busy 1 s per task but computes 0.5 s of it (it waits for a contended
    # CPU or for I/O the rest): the CPUs carry twice the pace the busy time suggests
    waiting = [cpu_stage("cheap", 0.1), cpu_stage("slow", 1.0, cpu_time_s=0.5)]
    computing = [cpu_stage("cheap", 0.1), cpu_stage("slow", 1.0, cpu_time_s=1.0)]
    assert run_plan(computing, cpus=2) == [1, 2]  # 2 / 1.1 s = 1.8 tasks/s
    # 2 / 0.6 s = 3.3 tasks/s would take 4 workers; beyond the first, workers hold their CPU
    # in the books, and 2 CPUs hold 2 more
    assert run_plan(waiting, cpus=2) == [1, 3]
    assert run_plan(waiting, cpus=3) == [1, 4]


def test_shared_cpus_do_not_multiply_workers_that_only_wait() -> None:
    # a stage that sleeps costs no CPU time, but every worker is a process: beyond each
    # stage's first, workers fit the budget in reservations (2 CPUs / 0.25 = 8 more)
    sleeper = [cpu_stage("sleep", 1.0, cpus=0.25, cpu_time_s=0.0)]
    assert run_plan(sleeper, cpus=2) == [9]


# -- host memory --------------------------------------------------------------------------
GB = 2**30


def memory_plan(stages: list[StageObservation], memory_gb: float | None) -> list[int]:
    """Plans on 5 CPUs shared by time (the CPU bound: 5 / (0.25 + 1.0) = 4 tasks/s)."""
    memory = None if memory_gb is None else memory_gb * GB
    budget = Budget(cpus=5.0, gpus=0.0, memory_bytes=memory)
    return plan(stages, budget, EAGER, 0.0, AutoscaleState())


def test_memory_budget_stops_the_bottleneck_from_growing() -> None:
    # b is 4x slower; its workers take 1 GB each, a's 0.5 GB: 3 GB hold a, b and two more b
    stages = [
        cpu_stage("a", 0.25, memory_bytes=0.5 * GB),
        cpu_stage("b", 1.0, memory_bytes=1.0 * GB),
    ]
    assert memory_plan(stages, None) == [1, 4]
    assert memory_plan(stages, 8) == [1, 4]
    assert memory_plan(stages, 3.5) == [1, 3]
    assert memory_plan(stages, 2.0) == [1, 1]


def test_a_full_memory_budget_adds_nothing_elsewhere() -> None:
    # the bottleneck (heavy) cannot grow: a light stage gains nothing from more workers
    stages = [
        cpu_stage("light", 0.5, memory_bytes=0.1 * GB),
        cpu_stage("heavy", 1.0, memory_bytes=2.0 * GB),
    ]
    assert memory_plan(stages, 2.5) == [1, 1]


def test_every_stage_keeps_its_first_worker_over_the_memory_budget() -> None:
    stages = [cpu_stage("a", 1.0, memory_bytes=3 * GB), cpu_stage("b", 1.0, memory_bytes=3 * GB)]
    assert memory_plan(stages, 1.0) == [1, 1]


def test_unmeasured_memory_does_not_limit() -> None:
    stages = [cpu_stage("a", 1.0, memory_bytes=0.0)]
    assert memory_plan(stages, 0.001) == [5]


def test_over_the_memory_budget_workers_are_given_back_past_the_dead_band() -> None:
    # measured memory grew after the workers started: 6 x 1 GB on 4 GB. The cut is forced
    # (no 2% gain needed) but still waits for the removal delay
    stages = [cpu_stage("a", 1.0, workers=6, memory_bytes=1.0 * GB)]
    state = AutoscaleState()
    slow = AutoscaleConfig(scale_down_delay_s=10.0)
    budget = Budget(cpus=1000.0, gpus=0.0, memory_bytes=4 * GB)
    assert plan(stages, budget, slow, 0.0, state) == [6]
    assert plan(stages, budget, slow, 11.0, state) == [4]


def test_a_stage_of_unknown_memory_adds_no_worker_until_one_reports() -> None:
    # nothing declared, no worker ready yet: under a memory limit it waits for a figure
    unknown = [cpu_stage("a", 0.25, memory_bytes=0.5 * GB), cpu_stage("b", 1.0, memory_bytes=None)]
    assert memory_plan(unknown, 64) == [1, 1]
    # without a limit, nothing to wait for
    assert memory_plan(unknown, None) == [1, 4]


def test_video_engines_bound_a_stage_like_any_resource() -> None:
    # one H100: 7 NVDEC units, no NVENC; a decoding bottleneck grows to 7 workers, no more
    decode = cpu_stage("decode", 1.0, nvdecs=1.0)
    budget = Budget(cpus=64, gpus=1, nvdecs=7, nvencs=0)
    assert plan([decode], budget, EAGER, 0.0, AutoscaleState()) == [7]
    # unknown counts are no limit; a stage that asks none is not bounded by them
    assert plan([decode], Budget(cpus=64, gpus=1), EAGER, 0.0, AutoscaleState()) == [64]
    assert plan([cpu_stage("cpu", 1.0)], budget, EAGER, 0.0, AutoscaleState()) == [64]
    # an encoder-bound stage on a GPU without NVENC keeps its one worker (placement says
    # it fits nowhere) and grows no further
    encode = cpu_stage("encode", 1.0, nvencs=1.0)
    assert plan([encode], budget, EAGER, 0.0, AutoscaleState()) == [1]
