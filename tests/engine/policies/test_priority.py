"""Stage priority: upstream workers run nicer, so clips already in flight get the CPU first."""

from __future__ import annotations

import pytest

from conveyor.engine.policies.priority import MAX_NICENESS, stage_niceness


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
