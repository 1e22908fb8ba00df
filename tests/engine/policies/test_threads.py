"""Elastic threads: a batch sent while cores idle may use them, up to what its stage can."""

from __future__ import annotations

from conveyor.engine.policies.threads import batch_threads


def test_a_stage_that_declares_no_more_gets_its_own_cpus() -> None:
    assert batch_threads(1.0, None, node_cpus=16, busy_cpus=0) == 1
    assert batch_threads(2.0, None, node_cpus=16, busy_cpus=0) == 2
    assert batch_threads(0.25, None, node_cpus=16, busy_cpus=0) == 1  # one thread at least
    assert batch_threads(2.0, 2, node_cpus=16, busy_cpus=0) == 2  # max_threads no higher


def test_idle_cores_are_given_up_to_the_stage_maximum() -> None:
    assert batch_threads(1.0, 4, node_cpus=2, busy_cpus=0) == 2  # the node's other core
    assert batch_threads(1.0, 4, node_cpus=16, busy_cpus=0) == 4  # no more than it can use
    assert batch_threads(1.0, 4, node_cpus=16, busy_cpus=13) == 3  # two idle cores left


def test_busy_cores_are_not_given() -> None:
    assert batch_threads(1.0, 4, node_cpus=2, busy_cpus=1) == 1
    assert batch_threads(1.0, 4, node_cpus=2, busy_cpus=2) == 1  # oversubscribed: own only
    assert batch_threads(1.0, 4, node_cpus=2, busy_cpus=5) == 1


def test_a_light_stage_holding_a_fraction_leaves_the_core_counted_idle() -> None:
    # a probe declaring a quarter of a core does not keep the transcoder off the second core
    assert batch_threads(1.0, 4, node_cpus=2, busy_cpus=0.25) == 2
    # but two half-busy cores are one busy core
    assert batch_threads(1.0, 4, node_cpus=3, busy_cpus=1.0) == 2
    assert batch_threads(1.0, 4, node_cpus=2, busy_cpus=0.75) == 1
