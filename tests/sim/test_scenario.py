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
    # the name becomes the output files' name: nothing that leaves --out or breaks a line
    ("name: tiny", 'name: ""', r"^bad.yaml: name: must not be empty$"),
    ("name: tiny", 'name: "  "', r"^bad.yaml: name: must not be empty$"),
    ("name: tiny", "name: a/b", r"^bad.yaml: name: must not contain a path separator .*'a/b'"),
    ("name: tiny", r'name: "a\\b"', r"^bad.yaml: name: must not contain a path separator"),
    ("name: tiny", 'name: "../../x"', r"name: must not contain a path separator"),
    ("name: tiny", "name: ..", r"^bad.yaml: name: must not contain '\.\.' \(it names the out"),
    (
        "name: tiny",
        'name: "x\\ny"',
        r"^bad.yaml: name: must have printable characters only .*'x\\ny' \(with U\+000A\)",
    ),
    ("name: tiny", 'name: "a\\0"', r"name: must have printable characters only"),
    ("name: tiny", "name: " + "x" * 201, r"name: must be at most 200 bytes .*, got 201$"),
    # what the engine would refuse when it builds the pipeline is refused at load
    ("- name: a", "- name: a\n    timeout_s: -1", r"stages\[0\].timeout_s: must be > 0 \(or left"),
    ("- name: a", "- name: a\n    timeout_s: 0", r"^bad.yaml: stages\[0\].timeout_s: must be > 0"),
    # a hung batch without a timeout: the run could never end (it ran for ever)
    (
        "{service: {mean: 0.1}}",
        "{service: {mean: 0.1}, hang_rate: 0.5}",
        r"stages\[0\].model.hang_rate: a hung batch never returns.*give the stage a timeout_s",
    ),
    ("- name: a", "- name: a\n    batch_size: 0", r"stages\[0\].batch_size: must be >= 1"),
    ("- name: a", "- name: a\n    batch_wait_s: -1", r"stages\[0\].batch_wait_s: must be >= 0"),
    ("{tasks: 10}", "{tasks: 10}\nexecutor: {max_attempts: 0}", r"max_attempts: must be >= 1"),
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


def test_a_name_with_dots_and_200_bytes_is_fine() -> None:
    assert parse_scenario_text(MINIMAL.replace("name: tiny", "name: v1.5")).name == "v1.5"
    long = "é" * 100  # 200 bytes of UTF-8
    assert parse_scenario_text(MINIMAL.replace("name: tiny", f"name: {long}")).name == long
    assert "got 201" in _error(MINIMAL.replace("name: tiny", f"name: {long}x"))


def test_whatever_the_engine_refuses_in_a_stage_names_the_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checks above miss nothing the engine checks today; what it checks tomorrow fails at
    load all the same, naming the stage, instead of as a traceback when the run starts."""
    from conveyor.errors import PipelineBuildError
    from conveyor.pipeline import Pipeline
    from conveyor.sim import scenario

    def refuse(stage: object) -> None:
        raise ValueError("stage 'a': something new is wrong")

    monkeypatch.setattr(scenario, "validate_stage", refuse)
    assert _error(MINIMAL) == "bad.yaml: stages[0]: stage 'a': something new is wrong"
    monkeypatch.undo()

    def refuse_build(self: Pipeline) -> None:
        raise PipelineBuildError("pipeline 'tiny': the stages do not fit together")

    monkeypatch.setattr(Pipeline, "build", refuse_build)
    assert _error(MINIMAL) == "bad.yaml: stages: pipeline 'tiny': the stages do not fit together"


def test_numbers_with_an_exponent_and_no_dot_are_numbers() -> None:
    """PyYAML (YAML 1.1) reads ``1e6`` as a string; YAML 1.2, and anyone writing it, a number."""
    text = MINIMAL.replace("{mean: 0.1}", "{mean: 1e-9}, output_ratio: 1e6, memory_gb: 2.5e1")
    model = parse_scenario_text(text).stages[0].model
    assert (model.service.mean, model.output_ratio, model.memory_gb) == (1e-9, 1e6, 25.0)
    assert parse_scenario_text(MINIMAL + "stop_at_s: 1E+3\n").stop_at_s == 1000.0
    assert parse_scenario_text(MINIMAL + "stop_at_s: 1e300\n").stop_at_s == 1e300
    assert "must be a finite number, got inf" in _error(MINIMAL + "stop_at_s: 1e400\n")
    assert "must be a whole number, got float 1000.0" in _error(MINIMAL.replace("10}", "1e3}"))
    assert parse_scenario_text(MINIMAL.replace("name: tiny", "name: '1e6'")).name == "1e6"
    assert "name: must be a string, got float" in _error(MINIMAL.replace("tiny", "1e6"))


def test_a_key_given_twice_is_an_error_naming_it_and_both_lines() -> None:
    message = _error("name: a\nseed: 1\nname: b\n")
    assert message == (
        "bad.yaml: not valid YAML (line 3, column 1): key 'name' appears twice "
        "(first at line 1, column 1)"
    )
    nested = _error(MINIMAL.replace("{tasks: 10}", "{tasks: 10, tasks: 20}"))
    assert "key 'tasks' appears twice (first at line 8, column 10)" in nested
    # a merge key brings keys in that the mapping may override: not a duplicate
    merged = MINIMAL + "executor:\n  <<: {kind: batch, max_attempts: 2}\n  max_attempts: 5\n"
    executor = parse_scenario_text(merged).executor
    assert (executor.kind, executor.max_attempts) == ("batch", 5)


def test_a_file_that_is_not_utf8_text(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert (
        str(info.value)
        == f"{path}: not UTF-8 text (byte 0xff at offset 0); a scenario is a YAML file"
    )
    path.write_bytes(MINIMAL.replace("tiny", "tïny").encode())  # UTF-8 whatever the locale
    assert load_scenario(path).name == "tïny"
