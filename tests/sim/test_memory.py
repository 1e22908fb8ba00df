"""Host memory on the simulated cluster: the real controller keeps the workers' measured
peaks within the nodes' memory, and a stage declared too low is held to what it measured."""

from __future__ import annotations

import pytest

from conveyor.engine.events import DecisionEvent, RunEvent, RunSnapshot
from conveyor.result import RunResult
from conveyor.sim import parse_scenario_text, simulate
from conveyor.sim.scenario import ScenarioError


class Decisions:
    """A monitor that keeps the autoscaler's decisions."""

    def __init__(self) -> None:
        self.events: list[DecisionEvent] = []

    def on_start(self, pipeline: str, stages: list[str]) -> None: ...

    def on_tick(self, snapshot: RunSnapshot) -> None: ...

    def on_end(self, result: RunResult) -> None: ...

    def on_event(self, event: RunEvent) -> None:
        if isinstance(event, DecisionEvent):
            self.events.append(event)


SCENARIO = """
name: memory
cluster:
  - {name: n, cpus: 16, count: 2, memory_gb: 6}
stages:
  - name: read
    model: {service: {mean: 0.05}, memory_gb: 0.25}
  - name: infer
    resources: {cpus: 1, memory_gb: 0.5}
    model: {service: {mean: 1.0}, setup_s: 2, memory_gb: 2.0}
  - name: write
    model: {service: {mean: 0.02}, memory_gb: 0.25}
source: {tasks: 400}
"""


def test_the_bottleneck_grows_only_as_far_as_the_nodes_memory_holds() -> None:
    sim = simulate(
        parse_scenario_text(SCENARIO.replace("resources: {cpus: 1, memory_gb: 0.5}", ""))
    )
    infer = sim.result.stats["infer"]
    # 2 nodes x 6 GB = 12 GB; read and write keep one worker of 0.25 GB each, so infer's
    # 2 GB workers (measured when the first is ready; nothing declared) are at most 5
    assert infer.worker_memory_bytes == 2 * 2**30
    assert 4 <= infer.peak_workers <= 5
    assert sim.report.outputs == 400  # slower, nothing lost


def test_a_stage_declared_too_light_is_cut_back_once_measured() -> None:
    # declared 0.5 GB, the workers take 2 GB: the declaration is trusted until the first
    # worker reports, then the stage gives back what the memory cannot hold
    decisions = Decisions()
    sim = simulate(parse_scenario_text(SCENARIO), monitors=[decisions])
    infer = sim.result.stats["infer"]
    assert infer.peak_workers > 5
    cuts = [
        change
        for event in decisions.events
        for change in event.changes
        if change.stage == "infer" and change.reason.startswith("over the memory limit")
    ]
    assert cuts and cuts[0].after <= 5
    assert sim.report.outputs == 400


def test_without_a_memory_limit_the_cpus_bound_the_bottleneck() -> None:
    sim = simulate(parse_scenario_text(SCENARIO.replace(", memory_gb: 6", "")))
    assert sim.result.stats["infer"].peak_workers > 20
    assert sim.report.outputs == 400


def test_the_declared_memory_counts_where_nothing_is_measured() -> None:
    # no stage reports a figure: infer's declared 0.5 GB alone fills 2 nodes x 3 GB at 12
    text = SCENARIO.replace("memory_gb: 2.0", "memory_gb: 0").replace(
        "memory_gb: 0.25", "memory_gb: 0"
    )
    sim = simulate(parse_scenario_text(text.replace("memory_gb: 6", "memory_gb: 3")))
    infer = sim.result.stats["infer"]
    assert infer.worker_memory_bytes == 0
    assert infer.peak_workers == 12
    assert sim.report.outputs == 400


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("memory_gb: 6", "memory_gb: 0", "cluster[0].memory_gb"),
        ("memory_gb: 2.0", "memory_gb: -1", "stages[1].model.memory_gb"),
    ],
)
def test_bad_memory_figures_are_named(old: str, new: str, field: str) -> None:
    with pytest.raises(ScenarioError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario_text(SCENARIO.replace(old, new))
