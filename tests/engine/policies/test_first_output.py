"""While a run fills, a stage starts a batch only where it and the stages after it leave room."""

from __future__ import annotations

import pytest

from conveyor.engine.policies.first_output import may_start


@pytest.mark.parametrize(
    ("own", "node", "held", "expected"),
    [
        (1, 2, 0, True),  # nothing held from here on: always
        (1, 2, 1, True),  # one core held by this stage or a later one, one left
        (1, 2, 2, False),  # later work holds both cores
        (1, 2, 1.25, False),  # a quarter core more than is left
        (0.25, 2, 1.75, True),  # a light stage fits what is left exactly
        (4, 2, 0, True),  # a stage wanting more than the node: the run must move
        (4, 2, 0.5, False),
    ],
)
def test_a_batch_starts_only_where_later_work_leaves_room(
    own: float, node: float, held: float, expected: bool
) -> None:
    assert may_start(own, node, held) is expected


def test_sums_of_quarter_cores_are_not_undone_by_rounding() -> None:
    held = sum([0.1] * 10)  # 0.9999999999999999
    assert may_start(1, 2, held)
