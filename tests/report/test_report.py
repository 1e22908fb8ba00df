"""The run report: reading events.jsonl, the page's content, and ``conveyor report``."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from conveyor.cli_report import report
from conveyor.report import ReportError, load_events, write_report
from conveyor.report.analysis import analyse
from tests.report.events import (
    ODD_LOGS,
    STAGES,
    run_end,
    run_start,
    snapshot,
    three_stage_run,
    write_events,
    write_rotated,
)


def _charts(html: str) -> dict[str, str]:
    return dict(re.findall(r'<svg class="chart" data-chart="(\w+)"(.*?)</svg>', html, flags=re.S))


# -- reading the log ------------------------------------------------------------------------
def test_load_events_reads_a_whole_run(tmp_path: Path) -> None:
    write_events(tmp_path / "events.jsonl", three_stage_run())
    events = load_events(tmp_path)  # the folder or the file
    assert load_events(tmp_path / "events.jsonl").run.stage_names == list(STAGES)
    run = events.run
    assert len(events.runs) == 1 and run.pipeline == "clips" and run.completed
    assert len(run.times) == 120 and run.times[0] == 1.0 and run.times[-1] == 120.0
    assert list(run.stages["infer"]["target"][[0, 20, 60]]) == [1, 3, 6]
    assert [len(run.decisions), len(run.failures), len(run.workers)] == [4, 2, 8]
    assert run.end is not None and run.end["counts"]["failed"] == 2
    assert events.skipped_lines == 0 and events.dropped == 0


def test_load_events_tolerates_a_torn_line_unknown_types_and_keys(tmp_path: Path) -> None:
    events = three_stage_run(end=False)
    events.insert(5, {"type": "gpu_sample", "t": 3.0, "util": 0.5})  # a type from the future
    events[10] = {**events[10], "new_key": [1, 2]}
    write_events(tmp_path / "events.jsonl", events, tail='{"type": "snapshot", "t": 121.0, "sta')
    loaded = load_events(tmp_path)
    run = loaded.run
    assert loaded.skipped_lines == 1 and loaded.unknown_events == 1
    assert run.end is None and not run.completed and len(run.times) == 120
    assert run.duration_s == 120.0


def test_rotated_parts_are_read_oldest_first_as_one_run(tmp_path: Path) -> None:
    events = three_stage_run()
    write_rotated(tmp_path, events, parts=3)
    (tmp_path / "events.1.jsonl").write_text(
        (tmp_path / "events.1.jsonl").read_text() + json.dumps({"type": "capped", "t": 50.0,
                                                                 "dropped": 17}) + "\n"
    )  # fmt: skip
    loaded = load_events(tmp_path)
    assert [p.name for p in loaded.files] == ["events.2.jsonl", "events.1.jsonl", "events.jsonl"]
    assert len(loaded.runs) == 1  # the repeated run_start at each part's head continues it
    run = loaded.run
    assert list(run.times) == [float(t) for t in range(1, 121)]
    assert len(run.failures) == 2 and run.completed and run.dropped == 17


def test_a_second_run_start_begins_a_new_run(tmp_path: Path) -> None:
    first = three_stage_run(seconds=20)
    second = [run_start("pass-2", time=1.7e9 + 60), snapshot(1.0), snapshot(2.0), run_end(2.0)]
    write_events(tmp_path / "events.jsonl", first + second)
    runs = load_events(tmp_path).runs
    assert [r.pipeline for r in runs] == ["clips", "pass-2"]
    assert [len(r.times) for r in runs] == [20, 2]
    html = write_report(tmp_path).read_text()
    assert "pass 1 of 2" in html and "pass 2 of 2" in html
    assert 'id="run1-workers"' in html


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "no event log"),
        ("", "empty"),
        ("hello world\nnot json either\n", "not a Conveyor event log"),
        ('{"type": "something"}\n[1, 2]\n', "not a Conveyor event log"),
    ],
)
def test_unreadable_logs_are_a_report_error_naming_the_file(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    if content is not None:
        (tmp_path / "events.jsonl").write_text(content)
    with pytest.raises(ReportError, match=reason) as info:
        load_events(tmp_path)
    assert str(tmp_path / "events.jsonl") in str(info.value)


@pytest.mark.parametrize("name", list(ODD_LOGS))
def test_odd_logs_still_make_a_report(tmp_path: Path, name: str) -> None:
    write_events(tmp_path / "events.jsonl", ODD_LOGS[name])
    html = write_report(tmp_path).read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")


# -- the verdict ----------------------------------------------------------------------------
def test_the_verdict_names_the_bottleneck_the_starved_stage_and_the_rebalancing(
    tmp_path: Path,
) -> None:
    write_events(tmp_path / "events.jsonl", three_stage_run())
    verdict = analyse(load_events(tmp_path).run)
    assert verdict.bottleneck == "infer"
    assert verdict.starved == ["write"]
    assert verdict.blocked == ["read"]  # idle with work queued: held back by infer
    assert verdict.decisions == 4 and verdict.changes_up == 5 and verdict.changes_down == 1
    assert verdict.lines[0].startswith("Bottleneck: infer")
    assert any(line.startswith("Starved") and "write" in line for line in verdict.lines)


# -- the page -------------------------------------------------------------------------------
def test_the_report_has_every_section(tmp_path: Path) -> None:
    write_events(tmp_path / "events.jsonl", three_stage_run())
    path = write_report(tmp_path)
    assert path == tmp_path / "report.html"
    html = path.read_text()
    charts = _charts(html)
    assert set(charts) == {"busy", "workers", "queue", "queue_bytes", "throughput"}
    metrics = {"busy": ["busy"], "workers": ["ready", "target", "decisions"],
               "queue": ["queued"], "queue_bytes": ["queued_bytes"],
               "throughput": ["throughput"]}  # fmt: skip
    for chart, names in metrics.items():
        for stage in STAGES:
            for metric in names:
                assert f'data-series="{stage}:{metric}"' in charts[chart], (chart, stage, metric)
    assert 'data-series="infer:worker_deaths"' in charts["workers"]
    assert 'data-series="run:outputs"' in charts["throughput"]
    # header, verdict, tables, settings, machine
    for text in ("clips", "Decode videos, embed them", "completed", "2m00s", "1,298",
                 "Bottleneck: infer", "Starved", "Autoscaler decisions",
                 "bottleneck: 6.0 tasks/s vs 9.8 upstream", "3 → 6", "Failures",
                 "CUDA out of memory while decoding frame 17", "OSError: [Errno 122]",
                 "exit code -9 (killed: OOM)", "edge_max_tasks", "node-a", "box",
                 "LocalBackend", "streaming", "memory / worker",
                 "<td>1,536 MB</td>"):  # fmt: skip
        assert text in html, text
    assert html.count("<details>") == 2  # the tracebacks
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html and "src=" not in html  # nothing to load


def test_a_killed_run_says_it_did_not_finish(tmp_path: Path) -> None:
    write_events(tmp_path / "events.jsonl", three_stage_run(end=False), tail='{"type": "sna')
    html = write_report(tmp_path, tmp_path / "elsewhere.html").read_text()
    assert "run did not finish (no run_end event)" in html
    assert "1 unreadable line(s) skipped" in html
    assert not (tmp_path / "report.html").exists()


def test_everything_from_the_log_is_escaped(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>"
    stages = ("read", evil, "write")
    events: list[dict] = [
        {**run_start(evil, stages), "description": evil, "settings": {evil: evil}}
    ]
    events += [snapshot(float(t), stages) for t in range(1, 30)]
    events.append(
        {"type": "failure", "t": 3.0, "stage": evil, "task": evil, "error_type": evil,
         "message": evil + "&amp;", "traceback": "</pre>" + evil, "attempts": 1}
    )  # fmt: skip
    events.append(
        {"type": "decision", "t": 4.0,
         "changes": [{"stage": evil, "before": 1, "after": 2, "reason": evil}]}
    )  # fmt: skip
    write_events(tmp_path / "events.jsonl", events)
    html = write_report(tmp_path).read_text()
    assert "<script>alert" not in html and "</script>alert" not in html
    assert html.count("<script") == 2  # the page's own: its data and its code
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&amp;amp;" in html
    assert 'data-series="&lt;script&gt;alert(1)&lt;/script&gt;:busy"' in html


def test_many_failures_make_a_bounded_page(tmp_path: Path) -> None:
    """Every failure was a row with its whole message: 500 failures of 100 KB messages made
    a report of 43 MB. Each kind lists its first rows, the rest are counted; a long message
    is cut as its traceback is."""
    from conveyor.report.html import MAX_FAILURE_ROWS, MAX_MESSAGE

    events: list[dict] = [run_start()] + [snapshot(float(t)) for t in range(1, 30)]
    for i in range(MAX_FAILURE_ROWS + 150):
        events.append(
            {"type": "failure", "t": 3.0, "stage": "infer", "task": f"t{i}",
             "error_type": "ValueError", "message": f"bad {i} " + "x" * 100_000,
             "traceback": "Traceback\n" + "y" * 100_000, "attempts": 1}
        )  # fmt: skip
    events.append(
        {"type": "failure", "t": 4.0, "stage": "write", "task": "rare", "error_type": "OSError",
         "message": "disk full", "traceback": "", "attempts": 1}
    )  # fmt: skip
    write_events(tmp_path / "events.jsonl", events)
    html = write_report(tmp_path).read_text()
    assert len(html) < 5_000_000, len(html)
    assert f"bad {MAX_FAILURE_ROWS - 1} " in html and f"bad {MAX_FAILURE_ROWS} " not in html
    assert "… and 150 more ValueError (each in events.jsonl)" in html
    assert "disk full" in html  # a rarer kind after them is listed still
    assert f"({100_000 + len('bad 0 ') - MAX_MESSAGE:,} more chars)" in html


def test_a_long_run_is_downsampled(tmp_path: Path) -> None:
    """50,000 snapshots (14 hours at one a second): a bounded page, written in seconds."""
    lines = [json.dumps(run_start())]
    for i in range(50_000):
        t = float(i)
        wave = (i // 600) % 4
        rows = [
            {"name": s, "ready": 1 + wave * (k + 1), "starting": 0, "target": 1 + wave * (k + 1),
             "queued": (i * 7 + k) % 50, "queued_bytes": ((i * 13) % 97) * 1024, "in_flight": 1,
             "tasks_in": i * (k + 1), "tasks_out": i * (k + 1), "filtered": 0, "failed": 0,
             "retried": 0, "busy": ((i + k) % 10) / 10, "task_time_s": 0.5, "done": False}
            for k, s in enumerate(STAGES)
        ]  # fmt: skip
        lines.append(json.dumps({"type": "snapshot", "t": t, "inputs": i, "outputs": i,
                                 "source_exhausted": False, "cpus_reserved": 4,
                                 "gpus_reserved": 1, "stages": rows}))  # fmt: skip
        if i % 500 == 0:
            lines.append(
                json.dumps(
                    {
                        "type": "decision",
                        "t": t,
                        "changes": [
                            {"stage": "infer", "before": 1, "after": 2, "reason": "bottleneck"}
                        ],
                    }
                )
            )
    lines.append(json.dumps(run_end(50_000.0)))
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    html = write_report(tmp_path).read_text()
    elapsed = time.monotonic() - started
    print(f"50,000 snapshots: {len(html):,} bytes in {elapsed:.2f} s")
    assert len(html) < 3_000_000, len(html)
    assert elapsed < 15, elapsed
    queue = _charts(html)["queue"]
    for stage in STAGES:
        path = re.search(rf'data-series="{stage}:queued"[^>]* d="([^"]+)"', queue)
        assert path is not None
        points = len(re.findall(r"[ML]", path.group(1)))
        assert 100 < points <= 600, points  # bounded, and still the shape
    assert ">12h<" in _charts(html)["workers"]  # the time axis reads in hours


# -- the command ----------------------------------------------------------------------------
def _app() -> typer.Typer:
    try:
        from conveyor.cli import app
    except ImportError:  # pragma: no cover - the CLI module is broken: test the command alone
        app = None
    if app is not None and any(
        (c.name or getattr(c.callback, "__name__", "")) == "report" for c in app.registered_commands
    ):
        return app
    local = typer.Typer()
    local.command()(report)

    @local.callback()
    def _main() -> None:  # a group, so the command is called by name as on the real app
        """conveyor"""

    return local


def test_cli_writes_the_report(tmp_path: Path) -> None:
    write_events(tmp_path / "events.jsonl", three_stage_run(seconds=30))
    result = CliRunner().invoke(_app(), ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.html").is_file()
    assert str(tmp_path / "report.html") in result.output


@pytest.mark.parametrize("content", [None, "garbage\n"])
def test_cli_exits_2_with_one_line_when_there_is_no_log(
    tmp_path: Path, content: str | None
) -> None:
    if content is not None:
        (tmp_path / "events.jsonl").write_text(content)
    result = CliRunner().invoke(_app(), ["report", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(tmp_path) in lines[0]
    assert not (tmp_path / "report.html").exists()


def test_stages_saturated_alike_are_no_single_bottleneck(tmp_path: Path) -> None:
    events = three_stage_run()
    for event in events:
        if event["type"] == "snapshot":
            for row in event["stages"]:
                row["busy"] = 0.97
                if row["name"] != "read":
                    row["queued"] = 1
    write_events(tmp_path / "events.jsonl", events)
    verdict = analyse(load_events(tmp_path).run)
    assert verdict.bottleneck is None and verdict.saturated == list(STAGES)
    assert verdict.lines[0].startswith("No single bottleneck: 3 stages are saturated")


# -- from a real event log ------------------------------------------------------------------
SCENARIO = """
name: simulated
cluster:
  - {name: n, cpus: 8, gpus: 2}
stages:
  - name: read
    model: {service: {mean: 0.05}}
  - name: infer
    resources: {cpus: 1, gpus: 0.5}
    batch_size: 4
    model: {service: {mean: 0.5}, setup_s: 2}
source: {tasks: 200}
"""


def test_an_event_log_written_by_a_run_makes_a_report(tmp_path: Path) -> None:
    from conveyor.monitor import EventLog
    from conveyor.sim import parse_scenario_text, simulate

    log = EventLog(tmp_path, report=True)
    simulate(parse_scenario_text(SCENARIO), monitors=[log])
    assert log.report_path == tmp_path / "report.html"
    html = log.report_path.read_text()
    charts = _charts(html)
    for stage in ("read", "infer"):
        assert f'data-series="{stage}:busy"' in charts["busy"]
        assert f'data-series="{stage}:ready"' in charts["workers"]
    assert "Bottleneck: infer" in html and "completed" in html
    assert "cores busy" not in html  # the simulator's time is virtual: no machine measures
