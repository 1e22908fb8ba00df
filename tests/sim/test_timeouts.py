"""The simulator models hung tasks (the real controller kills their workers at timeout_s)
and batches that wait to fill (``batch_wait_s``)."""

from __future__ import annotations

import pytest

from conveyor.sim import ScenarioError, parse_scenario_text, simulate
from conveyor.sim.report import format_report

SCENARIO = """
name: hangs
cluster:
  - {name: n, cpus: 8, gpus: 2}
stages:
  - name: read
    model: {service: {mean: 0.05}}
  - name: infer
    resources: {cpus: 1, gpus: 0.5}
    batch_size: 4
    timeout_s: 30
    model: {service: {mean: 0.5, kind: lognormal, spread: 0.3}, hang_rate: 0.01, setup_s: 5}
source: {tasks: 2000}
"""


def test_hung_batches_are_killed_at_the_timeout_and_the_rest_finishes() -> None:
    sim = simulate(parse_scenario_text(SCENARIO))
    report, result = sim.report, sim.result
    infer = report.stage("infer")
    assert infer.timeouts > 0
    assert len(sim.backend.usage.deaths) == infer.timeouts
    # a modelled hang strikes an attempt, not an input: most inputs of a hung batch get
    # through when retried alone, and an input fails only if all its attempts hang
    failed = result.failures
    assert all(f.error_type == "TaskTimeout" and f.attempts == 3 for f in failed)
    assert report.outputs + len(failed) == 2000 == report.inputs  # nothing lost
    assert "timeouts" in format_report(report)


def test_without_hangs_nothing_times_out() -> None:
    sim = simulate(parse_scenario_text(SCENARIO.replace("hang_rate: 0.01", "hang_rate: 0")))
    assert sim.report.stage("infer").timeouts == 0 and sim.report.outputs == 2000


def test_the_simulated_backend_is_a_public_backend() -> None:
    from conveyor.backends import SimulatedBackend
    from conveyor.backends.simulated import SimulatedBackend as Defined

    assert SimulatedBackend is Defined


WRITER = """
name: writer
cluster:
  - {name: n, cpus: 4}
stages:
  - name: encode
    num_workers: 1
    model: {service: {mean: 0.02}}
  - name: write
    batch_size: 32
    batch_wait_s: 0.5
    model: {service: {mean: 0.01}, per_batch: true}
source: {tasks: 2000}
"""


def test_a_writer_that_pays_per_call_batches_what_trickles_in() -> None:
    # 50 inputs a second into a writer that costs 10 ms a call whatever the batch holds:
    # waiting 0.5 s gathers ~25 an input, so its calls cost a tenth of one per input
    waits = simulate(parse_scenario_text(WRITER)).result
    alone = simulate(parse_scenario_text(WRITER.replace("batch_wait_s: 0.5", "batch_wait_s: 0")))
    assert waits.counts["outputs"] == alone.result.counts["outputs"] == 2000
    assert waits.stats["write"].busy_s < alone.result.stats["write"].busy_s / 10


def test_batch_wait_s_in_a_scenario_is_checked() -> None:
    with pytest.raises(ScenarioError, match=r"stages\[1\].batch_wait_s: must be >= 0"):
        parse_scenario_text(WRITER.replace("batch_wait_s: 0.5", "batch_wait_s: -1"))
