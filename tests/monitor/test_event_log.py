"""EventLog: what a run's history holds, on the simulator (deterministic) and a real backend."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor import Pipeline, Resources, processing_stage
from conveyor.backends.local import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.monitor import EventLog
from conveyor.monitor.event_log import part_path
from conveyor.sim import parse_scenario_text, simulate

SCENARIO = """
name: logged
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
source: {tasks: 600}
"""


def _lines(run_dir: Path, index: int = 0) -> list[dict[str, Any]]:
    text = part_path(run_dir, index).read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_a_simulated_run_is_logged_from_start_to_end(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    sim = simulate(parse_scenario_text(SCENARIO), monitors=[log])
    events = _lines(tmp_path)
    types = [e["type"] for e in events]
    assert types[0] == "run_start" and types[-1] == "run_end"
    start = events[0]
    assert start["pipeline"] == "logged" and start["executor"] == "streaming"
    assert start["backend"].endswith("Backend")
    assert [s["name"] for s in start["stages"]] == ["read", "infer"]
    assert start["stages"][1]["gpus"] == 0.5 and start["stages"][1]["timeout_s"] == 30
    assert start["cluster"]["cpus"] == 8 and start["cluster"]["gpus"] == 2
    assert start["settings"]["max_attempts"] == 3
    # snapshots about once a second of (virtual) run time, and counters that only grow
    snaps = [e for e in events if e["type"] == "snapshot"]
    assert len(snaps) >= sim.result.wall_s * 0.8
    done = [s["stages"][1]["tasks_in"] for s in snaps]
    assert done == sorted(done) and done[-1] == sim.result.stats["infer"].tasks_in
    assert all(0.0 <= s["busy"] <= 1.0 for snap in snaps for s in snap["stages"])
    assert max(snap["stages"][1]["busy"] for snap in snaps) > 0.5  # the GPU stage works
    # the autoscaler's decisions, each with a reason
    decisions = [c for e in events if e["type"] == "decision" for c in e["changes"]]
    assert any(c["stage"] == "infer" and c["after"] > c["before"] for c in decisions)
    assert all(c["reason"] for c in decisions)
    assert any(c["reason"].startswith("finished") for c in decisions)
    # workers: starts, ready with setup time, timeouts of the hung batches
    workers = [e for e in events if e["type"] == "worker"]
    timeouts = [w for w in workers if w["event"] == "timeout"]
    assert len(timeouts) == sim.result.stats["infer"].timeouts > 0
    assert all("timeout_s" in w["reason"] for w in timeouts)
    ready = [w for w in workers if w["event"] == "ready" and w["stage"] == "infer"]
    assert ready and all(w["setup_s"] >= 5 for w in ready)
    failures = [e for e in events if e["type"] == "failure"]
    assert len(failures) == len(sim.result.failures)
    # the simulator's time is virtual: the machine's use says nothing about it, and the log
    # stops measuring it as soon as the run's clock parts from the wall clock
    measured = [e["t"] for e in events if "host_cpu_s" in e or "run_cpu_s" in e]
    assert max(measured, default=0.0) < 1.0, measured
    end = events[-1]
    assert end["completed"] is True
    assert end["counts"] == sim.result.counts
    assert end["stages"]["infer"]["timeouts"] == sim.result.stats["infer"].timeouts


LONG_BATCHES = """
name: long
cluster:
  - {name: n, cpus: 4}
stages:
  - name: slow
    num_workers: 2
    model: {service: {mean: 12}}
source: {tasks: 20}
"""


def test_a_stage_whose_batches_outlast_a_snapshot_is_busy_in_every_one(tmp_path: Path) -> None:
    """Busy time counted when a batch ended: 12 s batches made 0 % and 100 % snapshots in
    turn, and the report called a saturated stage idle."""
    simulate(parse_scenario_text(LONG_BATCHES), monitors=[EventLog(tmp_path)])
    events = _lines(tmp_path)
    assert events[0]["backend"] == "SimulatedBackend"  # not the simulator's own class
    snaps = [e for e in events if e["type"] == "snapshot"]
    working = [s["stages"][0] for s in snaps if 15 < s["t"] < 100]
    assert len(working) > 50
    assert all(s["busy"] > 0.95 for s in working), [s["busy"] for s in working]


@processing_stage(resources=Resources(cpus=0.5))
def _work(x: int) -> int:
    if x == 13:
        raise ValueError(f"input {x} is unlucky")
    time.sleep(0.002)
    return x


def test_a_local_run_logs_its_failures_with_tracebacks(tmp_path: Path) -> None:
    log = EventLog(tmp_path, settings={"input": "numbers"})
    pipeline = Pipeline("numbers", description="a test").add_stage(_work)
    result = pipeline.run(
        StreamingExecutor(LocalBackend(num_cpus=2), monitors=[log], max_attempts=1), range(50)
    )
    assert result.counts["failed"] == 1
    events = _lines(tmp_path)
    assert events[0]["settings"]["input"] == "numbers"
    assert events[0]["description"] == "a test"
    (failure,) = [e for e in events if e["type"] == "failure"]
    assert failure["stage"] == "_work" and failure["error_type"] == "ValueError"
    assert "unlucky" in failure["message"] and "Traceback" in failure["traceback"]
    kinds = {e["event"] for e in events if e["type"] == "worker"}
    assert {"start", "ready", "stop"} <= kinds
    assert events[-1]["type"] == "run_end" and events[-1]["counts"]["outputs"] == 49
    # the machine's use, measured: counters since the start that only grow
    assert events[0]["host"]["cpus"] == len(os.sched_getaffinity(0))
    assert events[0]["host"]["gpus"] == 0  # the cluster has none: GPUs are not asked for
    measured = [e for e in events if e["type"] in ("snapshot", "run_end")]
    for key in ("host_cpu_s", "run_cpu_s"):
        values = [e[key] for e in measured]
        assert values == sorted(values) and values[-1] > 0, key
    assert not any("host_gpu_s" in e for e in measured)


def test_measuring_the_host_can_be_turned_off(tmp_path: Path) -> None:
    log = EventLog(tmp_path, measure_host=False)
    pipeline = Pipeline("numbers").add_stage(_work)
    pipeline.run(StreamingExecutor(LocalBackend(num_cpus=2), monitors=[log]), range(5))
    events = _lines(tmp_path)
    assert "cpus" not in events[0]["host"]
    assert not any("host_cpu_s" in e for e in events)


def test_the_log_rotates_and_says_what_it_dropped(tmp_path: Path) -> None:
    log = EventLog(tmp_path, max_part_bytes=8192, max_parts=2, snapshot_interval_s=0.25)
    simulate(parse_scenario_text(SCENARIO), monitors=[log])
    parts = sorted(p.name for p in tmp_path.iterdir())
    assert parts == ["events.1.jsonl", "events.jsonl"]
    for index in (0, 1):
        assert part_path(tmp_path, index).stat().st_size <= 8192 + 4096
        assert _lines(tmp_path, index)[0]["type"] == "run_start"  # each part stands alone
    newest = _lines(tmp_path)
    capped = [e for e in _lines(tmp_path, 1) + newest if e["type"] == "capped"]
    assert capped and all(e["dropped"] > 0 for e in capped)
    assert newest[-1]["type"] == "run_end"


def test_a_new_run_replaces_the_old_log(tmp_path: Path) -> None:
    (tmp_path / "events.3.jsonl").write_text("old\n")
    simulate(parse_scenario_text(SCENARIO), monitors=[EventLog(tmp_path)])
    assert not (tmp_path / "events.3.jsonl").exists()
    assert _lines(tmp_path)[0]["type"] == "run_start"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"snapshot_interval_s": 0}, "snapshot_interval_s"),
        ({"max_part_bytes": 10}, "max_part_bytes"),
        ({"max_parts": 0}, "max_parts"),
    ],
)
def test_bad_settings_are_named(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EventLog(tmp_path, **kwargs)


def test_the_runs_of_one_job_share_a_log(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    scenario = parse_scenario_text(SCENARIO)
    simulate(scenario, monitors=[log])
    simulate(scenario, monitors=[log])
    types = [e["type"] for e in _lines(tmp_path)]
    assert types.count("run_start") == 2 and types.count("run_end") == 2
    assert types[0] == "run_start" and types[-1] == "run_end"


def test_failures_found_in_the_data_are_added_after_the_run(tmp_path: Path) -> None:
    """A pipeline that keeps bad inputs as data tells the log afterwards: the lines follow
    the run's end, are marked as input failures, and the report is written again."""
    from conveyor.monitor import InputFailure
    from conveyor.report import load_events

    bad = [InputFailure("VideoProbe", "a.mp4", "bad video", "truncated: stops at 2.00 s")]
    log = EventLog(tmp_path, report=True)
    log.add_failures(bad)  # no run yet: nothing to add to
    assert not part_path(tmp_path, 0).exists()
    simulate(parse_scenario_text(SCENARIO.replace("tasks: 600", "tasks: 20")), monitors=[log])
    first = log.report_path
    assert first is not None
    first.unlink()
    log.add_failures(bad)
    events = _lines(tmp_path)
    assert events[-2]["type"] == "run_end"
    added = events[-1]
    assert added["type"] == "failure" and added["kind"] == "input"
    assert (added["stage"], added["task"], added["message"]) == (
        "VideoProbe", "a.mp4", "truncated: stops at 2.00 s"
    )  # fmt: skip
    assert log.report_path == first and first.exists()
    assert "1 bad inputs" in first.read_text()
    assert load_events(tmp_path).runs[-1].failures[-1]["task"] == "a.mp4"


def test_a_source_failing_at_once_is_logged(tmp_path: Path) -> None:
    """Its first item is taken before the backend starts: the run's start went unlogged, so
    the event log (and report) of a run whose listing failed at once was not written."""

    def listing() -> Any:
        raise OSError("the bucket refused the listing")
        yield  # a generator

    double = processing_stage(lambda x: 2 * x, name="double", resources=Resources(cpus=0.5))
    log = EventLog(tmp_path, report=True)
    executor = StreamingExecutor(LocalBackend(num_cpus=1), monitors=[log])
    with pytest.raises(OSError, match="refused the listing"):
        Pipeline("listed", [double]).run(executor, listing())
    types = [e["type"] for e in _lines(tmp_path)]
    assert types[0] == "run_start" and types[-1] == "run_end"
    assert (tmp_path / "report.html").exists()
