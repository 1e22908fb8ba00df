"""``conveyor simulate``: runs a scenario, prints the per-stage table, writes PNG and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from conveyor.cli import app

runner = CliRunner()


def test_simulate_prints_the_table_and_writes_chart_and_json(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["simulate", "docs_3stage_1gpu_each", "--out", str(tmp_path), "--seed", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "scenario docs_3stage_1gpu_each · streaming · seed 3" in result.output
    for stage in ("fast", "slow", "medium"):
        assert any(line.startswith(stage) for line in result.output.splitlines())
    png = tmp_path / "docs_3stage_1gpu_each-streaming-seed3.png"
    data = json.loads(png.with_suffix(".json").read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert data["seed"] == 3 and data["outputs"] == 300
    assert [s["name"] for s in data["stages"]] == ["fast", "slow", "medium"]


def test_simulate_a_file_with_the_batch_executor(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        "name: two\ncluster: [{name: n, cpus: 4}]\nstages:\n"
        "  - {name: a, model: {service: {mean: 0.1}}}\n"
        "  - {name: b, model: {service: {mean: 0.2}}}\nsource: {tasks: 40}\n"
    )
    result = runner.invoke(
        app, ["simulate", str(path), "--out", str(tmp_path), "--executor", "batch", "--no-chart"]
    )
    assert result.exit_code == 0, result.output
    assert "· batch ·" in result.output
    assert (tmp_path / "two-batch-seed0.json").exists()
    assert not (tmp_path / "two-batch-seed0.png").exists()


def test_the_batch_executor_on_a_source_bound_by_duration_is_refused(tmp_path: Path) -> None:
    """It took tasks in while the virtual clock stood still, until memory ran out (24 GB,
    then the kernel killed it): the batch executor takes the whole input first."""
    import pytest

    from conveyor.sim import ScenarioError, parse_scenario_text, resolve_scenario, simulate

    out = tmp_path / "out"
    result = runner.invoke(
        app, ["simulate", "xy_20x_8gpu", "--executor", "batch", "--out", str(out)]
    )
    assert result.exit_code == 2
    assert "error: scenario 'xy_20x_8gpu': the batch executor takes in the whole input" in (
        result.output
    )
    assert "needs a number of source tasks (source.tasks)" in result.output
    assert not out.exists()
    with pytest.raises(ScenarioError, match="duration_s \\(300 s\\), which only the streaming"):
        simulate(resolve_scenario("xy_20x_8gpu"), executor="batch")
    text = (
        "name: d\ncluster: [{name: n, cpus: 4}]\n"
        "stages: [{name: a, model: {service: {mean: 1}}}]\n"
        "source: {duration_s: 10}\nexecutor: {kind: batch}\n"
    )
    with pytest.raises(ScenarioError, match="source: the batch executor takes in the whole"):
        parse_scenario_text(text, "d")


def test_simulate_lists_shipped_scenarios() -> None:
    result = runner.invoke(app, ["simulate", "--list"])
    assert result.exit_code == 0
    assert "hour_2000gpu" in result.output and "xy_20x_64gpu" in result.output


def test_bad_scenario_file_is_a_clear_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ncluster: [{name: n, cpus: 4}]\nstages: []\nsource: {tasks: 1}\n")
    result = runner.invoke(app, ["simulate", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert f"error: {path}: stages: needs at least one stage" in result.output
    assert not list(tmp_path.glob("*.json"))
    missing = runner.invoke(app, ["simulate"])
    assert missing.exit_code == 2


def _scenario(tmp_path: Path, name: str, stage: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: {name}\ncluster: [{{name: n, cpus: 4}}]\n"
        f"stages: [{{name: a, model: {{service: {{mean: 0.1}}}}{stage}}}]\nsource: {{tasks: 5}}\n"
    )
    return path


def test_the_output_files_keep_a_dotted_name_whole(tmp_path: Path) -> None:
    """``Path.with_suffix`` cut ``v1.5-streaming-seed0`` to ``v1``: runs overwrote each other."""
    path = _scenario(tmp_path, "v1.5")
    out = tmp_path / "out"
    result = runner.invoke(app, ["simulate", str(path), "--out", str(out), "--no-report"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "v1.5-streaming-seed0.json",
        "v1.5-streaming-seed0.png",
    ]


def test_a_name_that_is_no_file_name_is_refused_before_the_run(tmp_path: Path) -> None:
    """``a/b`` ran, then crashed writing into a folder that was not there; ``../../escape``
    wrote outside --out."""
    out = tmp_path / "one" / "two" / "out"
    for name, shown in [("a/b", "'a/b'"), ('"../../escape"', "'../../escape'")]:
        path = _scenario(tmp_path, name)
        result = runner.invoke(app, ["simulate", str(path), "--out", str(out)])
        assert result.exit_code == 2, result.output
        assert result.output == (
            f"error: {path}: name: must not contain a path separator ('/' or '\\') "
            f"(it names the output files), got {shown}\n"
        )
    assert not list(tmp_path.rglob("*.json")) and not out.exists()


def test_bad_stage_settings_and_binary_files_are_one_line_errors(tmp_path: Path) -> None:
    """Both were tracebacks: a PipelineBuildError when the run started, a UnicodeDecodeError."""
    path = _scenario(tmp_path, "t", ", timeout_s: -1")
    result = runner.invoke(app, ["simulate", str(path), "--out", str(tmp_path)])
    assert (result.exit_code, result.output) == (
        2,
        f"error: {path}: stages[0].timeout_s: must be > 0 (or left out), got -1\n",
    )
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    result = runner.invoke(app, ["simulate", str(binary), "--out", str(tmp_path)])
    assert (result.exit_code, result.output) == (
        2,
        f"error: {binary}: not UTF-8 text (byte 0xff at offset 0); a scenario is a YAML file\n",
    )
    assert not list(tmp_path.glob("*.json"))


def test_an_output_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "t")
    out = tmp_path / "out"
    (out / "t-streaming-seed0.json").mkdir(parents=True)  # a folder where the report goes
    args = ["simulate", str(path), "--out", str(out), "--no-chart", "--no-report"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        f"error: --out: cannot write {out / 't-streaming-seed0.json'} (Is a directory)"
    )


def test_existing_commands_still_listed() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "demo" in result.output and "simulate" in result.output


def test_simulate_serves_metrics_and_writes_a_run_report(tmp_path: Path) -> None:
    args = ["simulate", "docs_3stage_1gpu_each", "--out", str(tmp_path), "--no-chart"]
    result = runner.invoke(app, [*args, "--metrics-port", "0"])
    assert result.exit_code == 0, result.output
    assert "metrics: http://127.0.0.1:" in result.output
    assert f"html:   {tmp_path / 'report.html'}" in result.output
    events = (tmp_path / "events.jsonl").read_text().splitlines()
    assert json.loads(events[0])["pipeline"] == "docs_3stage_1gpu_each"
    (tmp_path / "report.html").unlink()
    again = runner.invoke(app, ["report", str(tmp_path)])  # the report, again from the log
    assert again.exit_code == 0 and (tmp_path / "report.html").exists()
    quiet = tmp_path / "quiet"
    assert runner.invoke(app, ["simulate", "docs_3stage_1gpu_each", "--out", str(quiet),
                               "--no-chart", "--no-report"]).exit_code == 0  # fmt: skip
    assert not (quiet / "events.jsonl").exists() and not (quiet / "report.html").exists()


def test_a_metrics_port_in_use_is_a_usage_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["simulate", "docs_3stage_1gpu_each", "--out", str(tmp_path), "--no-chart"]
        result = runner.invoke(app, [*args, "--metrics-port", str(port)])
    assert result.exit_code == 2
    assert f"--metrics-port {port}" in result.output
