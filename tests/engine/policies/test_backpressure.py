"""Backpressure: per-edge task and byte budgets, and the rule that breaks fan-in deadlocks."""

from __future__ import annotations

import dataclasses

import pytest

from conveyor.engine.policies.backpressure import EdgeBudget, EdgeState, edge_budget, may_feed

MB = 1 << 20


# -- edge_budget --------------------------------------------------------------------------
def test_memory_budget_is_split_evenly_across_edges() -> None:
    assert edge_budget(1000 * MB, 4, max_tasks=100) == EdgeBudget(100, 250 * MB)
    assert edge_budget(1000 * MB, 1, max_tasks=100) == EdgeBudget(100, 1000 * MB)


def test_split_rounds_down() -> None:
    assert edge_budget(10, 3, max_tasks=5).max_bytes == 3


def test_explicit_per_edge_cap_replaces_the_split() -> None:
    assert edge_budget(1000 * MB, 4, max_tasks=100, max_bytes=64 * MB) == EdgeBudget(100, 64 * MB)
    # even when larger than the even share
    assert edge_budget(1000 * MB, 4, max_tasks=100, max_bytes=900 * MB).max_bytes == 900 * MB


def test_degenerate_inputs_still_give_a_usable_budget() -> None:
    assert edge_budget(1000, 0, max_tasks=10) == EdgeBudget(10, 1000)
    assert edge_budget(0, 4, max_tasks=0) == EdgeBudget(1, 1)
    assert edge_budget(1000, 4, max_tasks=10, max_bytes=0).max_bytes == 1


def test_budget_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        edge_budget(1000, 1, 10).max_tasks = 3  # type: ignore[misc]


# -- may_feed -----------------------------------------------------------------------------
BUDGET = EdgeBudget(max_tasks=100, max_bytes=1000)


def test_under_both_budgets_may_feed() -> None:
    assert may_feed(EdgeState(queued_tasks=50, queued_bytes=500), BUDGET, consumer_batch_size=1)


def test_over_the_task_budget_may_not_feed() -> None:
    assert not may_feed(EdgeState(queued_tasks=100, queued_bytes=0), BUDGET, 1)
    assert not may_feed(EdgeState(queued_tasks=150, queued_bytes=0), BUDGET, 1)
    assert may_feed(EdgeState(queued_tasks=99, queued_bytes=0), BUDGET, 1)


def test_over_the_byte_budget_may_not_feed() -> None:
    assert not may_feed(EdgeState(queued_tasks=2, queued_bytes=1000), BUDGET, 1)
    assert not may_feed(EdgeState(queued_tasks=2, queued_bytes=5000), BUDGET, 1)
    assert may_feed(EdgeState(queued_tasks=2, queued_bytes=999), BUDGET, 1)


def test_expected_tasks_from_in_flight_work_count() -> None:
    assert may_feed(EdgeState(50, 0), BUDGET, 1)
    assert not may_feed(EdgeState(50, 0, expected_tasks=50.0), BUDGET, 1)
    assert may_feed(EdgeState(50, 0, expected_tasks=49.5), BUDGET, 1)


def test_expected_bytes_from_in_flight_work_count() -> None:
    assert may_feed(EdgeState(2, 400), BUDGET, 1)
    assert not may_feed(EdgeState(2, 400, expected_bytes=600.0), BUDGET, 1)
    assert may_feed(EdgeState(2, 400, expected_bytes=599.0), BUDGET, 1)


def test_large_fanout_counts_as_its_payloads() -> None:
    # one in-flight input expected to become 2,000 outputs of 1 KB each
    budget = EdgeBudget(max_tasks=10_000, max_bytes=1 * MB)
    edge = EdgeState(queued_tasks=1, queued_bytes=1024, expected_tasks=2000, expected_bytes=2e6)
    assert not may_feed(edge, budget, consumer_batch_size=1)


def test_consumer_that_cannot_form_a_batch_is_always_fed() -> None:
    # far over both budgets, but 9 queued tasks cannot make a batch of 10
    edge = EdgeState(queued_tasks=9, queued_bytes=10**9, expected_tasks=10**6, expected_bytes=1e12)
    assert may_feed(edge, BUDGET, consumer_batch_size=10)
    full = dataclasses.replace(edge, queued_tasks=10)
    assert not may_feed(full, BUDGET, consumer_batch_size=10)


def test_empty_edge_is_always_fed() -> None:
    tiny = EdgeBudget(max_tasks=1, max_bytes=1)
    assert may_feed(EdgeState(0, 0, expected_tasks=100, expected_bytes=100), tiny, 1)


# -- fan-in deadlock ----------------------------------------------------------------------
def simulate(
    fanouts: list[int],
    consumer_batch: int,
    budget: EdgeBudget,
    item_bytes: int = 100,
    producer_workers: int = 1,
) -> int:
    """A producer (input ``i`` -> ``fanouts[i]`` outputs, up to ``producer_workers`` inputs in
    flight) feeding a consumer that runs only full batches until the producer is done.

    Each step the in-flight inputs finish, the consumer drains full batches, and the producer
    takes inputs while ``may_feed`` allows. Returns the outputs consumed once no step makes
    progress: less than ``sum(fanouts)`` means the pipeline deadlocked.
    """
    pending = list(fanouts)
    queued, consumed = 0, 0
    in_flight: list[int] = []
    measured: float | None = None  # EWMA-free: the last observed fan-out
    for _ in range(100_000):
        progressed = False
        if in_flight:
            queued += sum(in_flight)
            measured = float(in_flight[-1])
            in_flight = []
            progressed = True
        while queued >= consumer_batch or (queued and not pending and not in_flight):
            take = min(queued, consumer_batch)
            queued -= take
            consumed += take
            progressed = True
        while pending and len(in_flight) < producer_workers:
            expected = len(in_flight) * (measured or 1.0)
            edge = EdgeState(queued, queued * item_bytes, expected, expected * item_bytes)
            if not may_feed(edge, budget, consumer_batch):
                break
            in_flight.append(pending.pop(0))
            progressed = True
        if not progressed:
            return consumed
    raise AssertionError("simulation did not settle")


def test_one_to_two_thousand_fanout_into_batch_of_two_thousand_never_deadlocks() -> None:
    # inputs of about 2,000 outputs each; the first falls one short of a batch, so the edge
    # holds 1,999 tasks, over the 1,000-task budget, and the consumer still cannot start
    fanouts = [1999, 2000, 2001, 2000, 1500, 2500]
    budget = EdgeBudget(max_tasks=1000, max_bytes=100 * MB)
    for workers in (1, 4):
        consumed = simulate(fanouts, 2000, budget, producer_workers=workers)
        assert consumed == sum(fanouts)


def test_small_fanout_into_a_batch_larger_than_the_budget_never_deadlocks() -> None:
    # 500 outputs per input, batches of 2,000, but only 1,000 tasks allowed on the edge:
    # without the rule the edge would stop at 1,000 and the consumer would wait forever
    budget = EdgeBudget(max_tasks=1000, max_bytes=100 * MB)
    assert simulate([500] * 9, 2000, budget) == 9 * 500


def test_byte_budget_smaller_than_a_batch_never_deadlocks() -> None:
    budget = EdgeBudget(max_tasks=100_000, max_bytes=1000)
    assert simulate([30] * 4, 64, budget, item_bytes=100) == 4 * 30


def test_budget_bounds_the_queue_when_batches_fit() -> None:
    budget = EdgeBudget(max_tasks=50, max_bytes=10 * MB)
    peak = 0
    queued, consumed = 0, 0
    for _ in range(200):
        if may_feed(EdgeState(queued, queued * 10), budget, consumer_batch_size=4):
            queued += 10  # one input becomes 10 outputs
        peak = max(peak, queued)
        if queued >= 4:
            queued -= 4
            consumed += 4
    assert consumed > 0
    # the producer is held back once the edge reaches the budget (one batch may overshoot)
    assert peak < budget.max_tasks + 10


def test_demand_budget_holds_about_a_second_of_the_consumers_pace() -> None:
    from conveyor.engine.policies.backpressure import QUEUE_S, demand_budget

    base = EdgeBudget(max_tasks=1024, max_bytes=10**9)
    assert demand_budget(base, None, 4, 1) == base  # unmeasured: the static budget
    assert demand_budget(base, 40.0, 4, 1).max_tasks == int(40 * QUEUE_S)
    assert demand_budget(base, 1.0, 4, 8).max_tasks == 2 * 8 * 4  # two batches per worker
    assert demand_budget(base, 1e6, 4, 1).max_tasks == 1024  # never above the static budget
    assert demand_budget(base, 40.0, 4, 1).max_bytes == base.max_bytes


def test_a_generators_window_is_two_of_its_consumers_batches_within_the_budget() -> None:
    from conveyor.engine.policies.backpressure import stream_window

    tight = EdgeBudget(max_tasks=16, max_bytes=10**9)
    assert stream_window(1, tight) == 2
    assert stream_window(16, tight) == 16  # never past the task budget
    roomy = EdgeBudget(max_tasks=1024, max_bytes=10**9)
    assert stream_window(1, roomy) == 128  # an eighth of the budget: few messages
    # outputs of 10 MB: an eighth of the byte budget is 12 of them
    assert stream_window(1, roomy, output_bytes=10e6) == 12
    assert stream_window(1, roomy, output_bytes=1e9) == 2  # two at least


def test_a_generator_is_allowed_more_only_past_half_its_window_and_with_room() -> None:
    from conveyor.engine.policies.backpressure import stream_grant

    budget = EdgeBudget(max_tasks=10, max_bytes=10 * MB)
    empty = EdgeState(0, 0)
    assert stream_grant(empty, budget, 1, outstanding=3, window=4) == 0  # not yet half used
    assert stream_grant(empty, budget, 1, outstanding=2, window=4) == 2  # topped up
    full = EdgeState(8, 800, expected_tasks=2)
    assert stream_grant(full, budget, 1, outstanding=0, window=4) == 0  # paused
    # however full by bytes, a consumer short of a batch is never starved (no deadlock)
    short = EdgeState(3, 100 * MB)
    assert stream_grant(short, budget, 4, outstanding=0, window=8) == 8
