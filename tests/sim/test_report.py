"""The report's own logic: placement diagnosis, steady window, text table and chart."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from conveyor.engine.messages import WorkerPlacement, WorkerStopped
from conveyor.resources import Resources
from conveyor.sim import format_report, parse_scenario_text, simulate
from conveyor.sim import report as report_module
from conveyor.sim.chart import write_chart
from conveyor.sim.report import TrackingBackend
from conveyor.sim.scenario import ReportSpec

TWO = """
name: two
cluster:
  - {name: g, cpus: 4, gpus: 2}
stages:
  - {name: a, resources: {cpus: 1, gpus: 0.5}, model: {service: {mean: 0.1}}}
  - {name: b, resources: {cpus: 1}, model: {service: {mean: 0.2}}}
source: {tasks: 100}
report: {warmup_s: 2}
"""


def test_why_short_tells_full_fragmented_and_cpus() -> None:
    scenario = parse_scenario_text(TWO)
    backend = scenario.backend(backend_class=TrackingBackend)
    assert isinstance(backend, TrackingBackend)
    half, cpu = scenario.pipeline().build()
    whole = Resources(cpus=1, gpus=1)
    assert backend.why_short(whole) == "fits"
    backend.start_worker("h0", half, WorkerPlacement("g-0", (0,), 0.5))
    backend.start_worker("h1", half, WorkerPlacement("g-0", (1,), 0.5))
    # one GPU's worth is free, but as two halves: a whole-GPU worker cannot land
    assert backend.why_short(whole) == "fragmented"
    assert backend.why_short(Resources(cpus=1, gpus=0.5)) == "fits"
    backend.start_worker("c0", cpu, WorkerPlacement("g-0"))
    backend.start_worker("c1", cpu, WorkerPlacement("g-0"))
    # the halves still fit GPU-wise, but the CPUs are taken
    assert backend.why_short(Resources(cpus=1, gpus=0.5)) == "cpus"
    assert backend.why_short(Resources(cpus=1)) == "full"
    assert backend.why_short(Resources(cpus=0, gpus=2)) == "full"
    backend.stop_worker("c0")
    events = backend.poll(1.0)
    assert any(isinstance(e, WorkerStopped) for e in events)
    assert backend.held_cpus["g-0"] == 3
    assert backend.why_short(Resources(cpus=1, gpus=0.5)) == "fits"
    # a CPU-only worker may not take the CPU kept for the free GPU share (1 GPU x 1 CPU)
    assert backend.why_short(Resources(cpus=1)) == "fits"
    assert backend.why_short(Resources(cpus=1), gpu_cpu_reserve=1.0) == "reserved"


def test_report_window_rates_and_text(tmp_path: Path) -> None:
    # workers hold their CPUs whole: no worker waits for a CPU, so rates follow service times
    scenario = parse_scenario_text(
        TWO.replace("source:", "autoscale: {share_cpus: false}\nsource:")
    )
    sim = simulate(scenario)
    report = sim.report
    assert report.outputs == report.inputs == 100
    lo, hi = report.window
    assert lo == 2 and hi == pytest.approx(min(t.elapsed_s for t in sim.ticks if t.stages[0].done))
    b = report.stage("b")
    assert b.busy_after_warmup is not None and 0.9 <= b.busy_after_warmup <= 1.0
    assert b.throughput == pytest.approx(b.mean_workers / 0.2, rel=0.1)
    assert len(b.workers) == len(b.busy) >= int(report.virtual_s)
    assert b.live[0] == (0.0, 1) and b.targets[0] == (0.0, 1)
    text = format_report(report)
    assert "scenario two · streaming · seed 0" in text
    assert any(line.startswith("a ") and "gpus=0.5" in line for line in text.splitlines())
    assert report.stage("a").gpu_share == 0.5
    png = write_chart(report, tmp_path / "sub" / "two.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2_000


def test_until_and_an_empty_window() -> None:
    scenario = parse_scenario_text(TWO)
    until = dataclasses.replace(scenario, report=ReportSpec(warmup_s=1, until_s=3))
    assert simulate(until).report.window == (1, 3)
    late = dataclasses.replace(scenario, report=ReportSpec(warmup_s=1_000))
    report = simulate(late).report
    assert report.stage("b").busy_after_warmup is None and report.source_tasks_per_s is None
    assert report.notes and "no steady window" in report.notes[0]
    assert "note: no steady window" in format_report(report)


def test_duration_source_and_stop_at() -> None:
    scenario = parse_scenario_text(TWO.replace("{tasks: 100}", "{duration_s: 30}"))
    report = simulate(scenario).report
    assert report.window[1] <= 30
    assert report.inputs >= 100  # admitted lazily until t=30 s, then drained
    stopped = dataclasses.replace(scenario, stop_at_s=10.0)
    short = simulate(stopped).report
    assert 10 <= short.virtual_s < 11 and short.outputs < report.outputs


def test_scenario_knobs_reach_the_executor_and_backend() -> None:
    scenario = parse_scenario_text(
        TWO.replace("source:", "autoscale: {max_workers_per_stage: 1}\nsource:")
        .replace("source:", "executor: {edge_max_tasks: 3, autoscale_interval_s: 5}\nsource:")
        .replace("source:", "memory_budget_bytes: 4096\nsource:")
    )
    assert scenario.autoscale_config().max_workers_per_stage == 1
    sim = simulate(scenario)
    assert all(s.peak_workers == 1 for s in sim.report.stages)
    assert sim.backend.memory_budget_bytes == 4096
    assert sim.result.stats["b"].queue_hwm_tasks <= 3
    # decisions every 5 s instead of every second: fewer target changes are even possible
    assert sim.report.target_changes <= sim.report.virtual_s / 5 + 2


def with_spot(lifetime: str) -> str:
    """``TWO`` with a CPU node ``spot`` that lives as ``lifetime`` says (joins_at/leaves_at)."""
    return TWO.replace(
        "  - {name: g, cpus: 4, gpus: 2}",
        f"  - {{name: g, cpus: 4, gpus: 2}}\n  - {{name: spot, cpus: 4, {lifetime}}}",
    )


def test_failures_and_a_node_that_leaves_are_simulated() -> None:
    scenario = parse_scenario_text(
        with_spot("joins_at: 5, leaves_at: 12")
        .replace("{service: {mean: 0.2}}", "{service: {mean: 0.2}, failure_rate: 0.05}")
        .replace("{tasks: 100}", "{tasks: 400}")
    )
    sim = simulate(scenario)
    report = sim.report
    assert report.worker_deaths >= 1  # the spot node's workers died with it
    assert any(w for _, _, w in sim.backend.usage.deaths)
    assert sim.result.stats["b"].retried > 0
    assert report.virtual_s > 12
    assert report.inputs == 400
    assert report.outputs + report.failed == 400


def test_no_worker_is_placed_on_a_node_after_it_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deaths refresh the controller's view of the cluster at once: replacements for the
    workers of a node that left go elsewhere, not to the gone node until the next cycle."""
    starts: list[tuple[float, str]] = []

    class Recording(TrackingBackend):
        def start_worker(self, worker_id: str, stage: Any, placement: WorkerPlacement) -> None:
            starts.append((self.clock.now, placement.node_id))
            super().start_worker(worker_id, stage, placement)

    monkeypatch.setattr(report_module, "TrackingBackend", Recording)
    scenario = parse_scenario_text(
        with_spot("joins_at: 5, leaves_at: 25")
        .replace("source:", "executor: {autoscale_interval_s: 10}\nsource:")
        .replace("{tasks: 100}", "{tasks: 1000}")
    )
    sim = simulate(scenario)
    spot = {node for _, node in starts if node.startswith("spot")}
    assert spot and any(t < 25 for t, node in starts if node in spot)  # it was used
    assert [t for t, node in starts if node in spot and t >= 25] == []
    assert sim.report.worker_deaths >= 1
    assert sim.report.outputs + sim.report.failed == 1000


def test_a_worker_started_on_a_gone_node_dies_at_once() -> None:
    """As on Ray: a start placed from a view older than the node's departure is reported
    dead, never run on a node that no longer exists."""
    scenario = parse_scenario_text(with_spot("leaves_at: 5"))
    backend = scenario.backend()
    _, cpu = scenario.pipeline().build()
    assert backend.poll(6.0) == []  # the node left (no worker was on it)
    backend.start_worker("late", cpu, WorkerPlacement("spot-0", (), 0.0))
    events = backend.poll(1.0)
    assert [type(e).__name__ for e in events] == ["WorkerDied"]
    assert "spot-0" in events[0].reason
    assert [w for _, _, w in backend.usage.deaths] == ["late"]
