"""Scenario files: every shipped one loads, and a malformed one fails naming file and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conveyor.sim import ScenarioError, load_scenario, parse_scenario_text, resolve_scenario
from conveyor.sim.scenario import shipped_scenarios

MINIMAL = """
name: tiny
cluster:
  - {name: n, cpus: 4, gpus: 1}
stages:
  - name: a
    model: {service: {mean: 0.1}}
source: {tasks: 10}
"""

SHIPPED = [
    "big_model_setup",
    "bursty_source",
    "docs_3stage_1gpu_each",
    "docs_3stage_7gpu",
    "hour_2000gpu",
    "video4_streaming_vs_batch",
    "video9_multinode",
    "video_curation_gpu_measured",
    "video_curation_measured",
    "video_engines",
    "xy_20x_32gpu",
    "xy_20x_64gpu",
    "xy_20x_8gpu",
]


def test_every_shipped_scenario_loads() -> None:
    assert sorted(shipped_scenarios()) == SHIPPED
    for name in SHIPPED:
        scenario = resolve_scenario(name)
        assert scenario.name == name
        assert len(scenario.pipeline().build()) == len(scenario.stages)


def test_shipped_scenarios_are_package_data() -> None:
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"sim/scenarios/*.yaml"' in pyproject


def test_defaults_and_shapes() -> None:
    s = parse_scenario_text(MINIMAL)
    assert s.executor.kind == "streaming" and s.seed == 0 and s.report.warmup_s == 0
    assert s.total_gpus == 1 and s.total_cpus == 4
    assert s.models()["a"].service.mean == 0.1
    assert [n.node_id for n in s.nodes()] == ["n-0"]


def test_load_from_a_file_and_by_name(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(MINIMAL)
    assert load_scenario(path).name == "tiny"
    assert resolve_scenario(str(path)).origin == str(path)
    with pytest.raises(ScenarioError, match=r"did you mean docs_3stage_7gpu"):
        resolve_scenario("docs_3stage_7gpus")


def _error(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario_text(text, "bad.yaml")
    return str(info.value)


PHASES = "phases: [{at: 5, service: {mean: 1}}, {at: 2, service: {mean: 1}}]"
CASES = [
    # (text replaced in MINIMAL, replacement, regular expression the message must match)
    (
        "name: tiny",
        "name: tiny\nseeed: 3",
        r"^bad.yaml: seeed: unknown field \(did you mean 'seed'",
    ),
    (
        "mean: 0.1",
        "mean: fast",
        r"^bad.yaml: stages\[0\].model.service.mean: must be a number, got a",
    ),
    ("mean: 0.1", "mean: -1", r"stages\[0\].model.service: Distribution.mean must be >= 0"),
    (
        "mean: 0.1}",
        "mean: 0.1, kind: gamma}",
        r"stages\[0\].model.service.kind: must be one of const",
    ),
    ("model: {service: {mean: 0.1}}", "model: {}", r"stages\[0\].model.service: is required"),
    ("{tasks: 10}", "{}", r"^bad.yaml: source: give tasks"),
    ("{tasks: 10}", "{tasks: 2.5}", r"source.tasks: must be a whole number, got float 2.5"),
    ("gpus: 1}", "gpus: 1, count: 0}", r"cluster\[0\].count: must be >= 1"),
    ("- name: a", "- name: a\n    resources: {gpus: 1.5}", r"resources: Resources.gpus above 1"),
    (
        "- name: a",
        "- name: a\n    resources: {gpus: 2}",
        r"stages\[0\].resources: one worker of stage 'a' \(cpus=1, gpus=2\) fits on no node "
        r"group \(n: 4 CPUs, 1 GPUs\)",
    ),
    ("- name: a", "- name: a\n    num_workers: 0", r"stages\[0\].num_workers: must be >= 1"),
    (
        "source:",
        "autoscale: {min_gian: 0.1}\nsource:",
        r"autoscale.min_gian: unknown field; allowed",
    ),
    (
        "source:",
        "autoscale: {min_gain: -1}\nsource:",
        r"autoscale: AutoscaleConfig.min_gain must be",
    ),
    (
        "source:",
        "executor: {kind: ray}\nsource:",
        r"executor.kind: must be one of streaming, batch",
    ),
    (
        "source:",
        "report: {warmup_s: 9, until_s: 5}\nsource:",
        r"report.until_s: must be after warm",
    ),
    ("stages:", "stages: []\nx:", r"^bad.yaml: x: unknown field"),
    (
        "gpus: 1}",
        "gpus: 1, joins_at: 5}",
        r"cluster: at least one node group must be present at t=0",
    ),
    ("{mean: 0.1}}", "{mean: 0.1}, " + PHASES + "}", r"model.phases: phase times must be >= 0 and"),
    ("{tasks: 10}", "{tasks: 10}\nstop_at_s: 0", r"stop_at_s: must be after report.warmup_s"),
]


@pytest.mark.parametrize(("old", "new", "expected"), CASES)
def test_bad_fields_are_named(old: str, new: str, expected: str) -> None:
    assert old in MINIMAL
    message = _error(MINIMAL.replace(old, new, 1))
    assert re.search(expected, message), message


def test_duplicate_stage_names_and_non_mapping() -> None:
    text = MINIMAL + "  - name: a\n    model: {service: {mean: 0.1}}\n"
    text = text.replace("source: {tasks: 10}\n", "") + "source: {tasks: 10}\n"
    assert "stages[1].name: stage 'a' appears twice" in _error(text)
    assert _error("- 1\n- 2\n") == "bad.yaml: a scenario is a mapping, got a list"


def test_yaml_syntax_error_names_line() -> None:
    assert _error("name: [unclosed\n").startswith("bad.yaml: not valid YAML (line 2")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"nope\.yaml: cannot read the scenario file"):
        load_scenario(tmp_path / "nope.yaml")
