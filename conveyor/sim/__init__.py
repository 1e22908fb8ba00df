"""Scenarios on the simulated backend: the real controller and policies at cluster scale.

``load_scenario`` / ``resolve_scenario`` read a YAML scenario (see ``conveyor/sim/scenarios/``),
``simulate`` runs it and returns a ``SimRun`` whose ``report`` the CLI prints and charts.
"""

from conveyor.sim.report import Recorder, SimReport, SimRun, StageReport, format_report, simulate
from conveyor.sim.scenario import (
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
    parse_scenario_text,
    resolve_scenario,
    shipped_scenarios,
)

__all__ = [
    "Recorder",
    "Scenario",
    "ScenarioError",
    "SimReport",
    "SimRun",
    "StageReport",
    "format_report",
    "load_scenario",
    "parse_scenario",
    "parse_scenario_text",
    "resolve_scenario",
    "shipped_scenarios",
    "simulate",
]
