"""Stage priority: upstream workers run nicer, so clips already in flight get the CPU first."""

from __future__ import annotations

import pytest

from conveyor.engine.policies.priority import MAX_NICENESS, fit_niceness, stage_niceness


def test_first_stage_is_nicest_and_the_last_is_not_niced() -> None:
    values = [stage_niceness(i, 13) for i in range(13)]
    assert values[0] == MAX_NICENESS and values[-1] == 0
    assert values == sorted(values, reverse=True)


def test_short_pipelines_and_no_spread() -> None:
    assert stage_niceness(0, 1) == 0
    assert [stage_niceness(i, 2) for i in range(2)] == [MAX_NICENESS, 0]
    assert [stage_niceness(i, 3, spread=0) for i in range(3)] == [0, 0, 0]


@pytest.mark.parametrize(("index", "stages", "spread"), [(3, 3, 10), (-1, 3, 10), (0, 3, -1)])
def test_bad_arguments(index: int, stages: int, spread: int) -> None:
    with pytest.raises(ValueError):
        stage_niceness(index, stages, spread)


def test_increments_fit_what_is_left_below_the_nicest() -> None:
    assert [fit_niceness(n, 0) for n in (0, 3, 10)] == [0, 3, 10]  # room enough
    # a Ray worker starts at 15: the stages keep their order in the 4 steps left
    steps = [fit_niceness(n, 15) for n in range(MAX_NICENESS + 1)]
    assert steps[0] == 0 and steps[-1] == 4 and steps == sorted(steps)
    assert fit_niceness(2, 15) == 1  # scaled, though 2 would fit
    assert fit_niceness(10, 19) == 0  # no room at all
