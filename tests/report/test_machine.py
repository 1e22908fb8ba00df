"""The verdict when the machine itself was full: measured host CPU (and GPU) use against the
stages' own busy fractions, on hand-built logs and on a real run of CPU-burning stages."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.report import load_events, write_report
from conveyor.report.analysis import Verdict, analyse
from conveyor.report.machine import MachineLoad
from tests.report.events import (
    shared_cores_run,
    three_stage_run,
    with_host,
    write_events,
)


def _verdict(tmp_path: Path, events: list[dict]) -> Verdict:
    write_events(tmp_path / "events.jsonl", events)
    return analyse(load_events(tmp_path).run)


# -- hand-built logs ------------------------------------------------------------------------
def test_full_cores_with_no_saturated_stage_are_the_limit(tmp_path: Path) -> None:
    verdict = _verdict(tmp_path, with_host(shared_cores_run(), cores=2, busy=1.9, run=1.85))
    assert verdict.bottleneck is None and verdict.saturated == []
    assert verdict.limits == ("cpus",)
    first = verdict.lines[0]
    assert first.startswith(
        "The machine's CPUs were the limit: 1.90 of 2 cores busy on average (2.0 s to 1m00s). "
        "No stage was saturated by itself (none ≥ 80% busy). The stages share the cores by "
        "time"
    ), first
    assert first.endswith("more cores (a larger machine, or more nodes) would speed it up.")
    assert "other programs" not in first
    (cpus,) = [line for line in verdict.lines if line.startswith("CPUs:")]
    assert cpus == (
        "CPUs: the workers held 7.18 on average — more than the 2 there are, because a worker "
        "holds a share of the cores' time, not a core of its own (every stage's first worker "
        "runs on the same cores); measured: 1.90 of 2 cores busy (95%), 1.85 of them by this "
        "run's processes."
    )
    assert not any("source or the start-up" in line for line in verdict.lines)


def test_stages_busy_waiting_for_a_core_are_not_the_bottleneck(tmp_path: Path) -> None:
    """Busy 95% but computing a fifth of that time: the workers waited for a core."""
    events = shared_cores_run(busy=(0.95, 0.6, 0.5), computing=0.2)
    verdict = _verdict(tmp_path, with_host(events, cores=2, busy=1.98, run=1.0))
    assert verdict.bottleneck is None and verdict.waiting == ["decode"]
    assert verdict.stages["decode"].state == "saturated"
    first = verdict.lines[0]
    assert first.startswith("The machine's CPUs were the limit: 1.98 of 2 cores busy")
    assert ", 0.98 of them by other programs than this run." in first
    assert (
        "No stage was saturated by its own work: decode was 95% busy but computing only 20% "
        "of that time, waiting for a core." in first
    )
    assert "or fewer other programs on this one" in first


@pytest.mark.parametrize("others", [False, True])
def test_a_stage_computing_on_cores_the_run_filled_is_not_the_bottleneck(
    others: bool, tmp_path: Path
) -> None:
    """decode 95% busy and computing nearly all of it: where the run's own work filled the
    cores, giving decode more workers would only take cores from the other stages, so the
    cores are the limit; where other programs filled them, decode is the bottleneck and
    the full cores are said next to it."""
    events = shared_cores_run(busy=(0.95, 0.6, 0.5), computing=0.9)
    verdict = _verdict(tmp_path, with_host(events, cores=2, busy=1.95, run=1.0 if others else 1.9))
    assert verdict.limits == ("cpus",)
    if others:
        assert verdict.bottleneck == "decode" and verdict.waiting == []
        assert verdict.lines[1].startswith("The machine's CPUs were full too")
        return
    assert verdict.bottleneck is None and verdict.waiting == ["decode"]
    assert verdict.stages["decode"].state == "saturated"
    assert verdict.lines[0].startswith(
        "The machine's CPUs were the limit: 1.95 of 2 cores busy on average (2.0 s to 1m00s). "
        "Its own processes used 1.90 of them: the stages' work filled the cores (decode 95% "
        "busy), so no one stage was the limit. The stages share the cores by time"
    ), verdict.lines[0]


def test_a_stage_bound_run_keeps_its_bottleneck_verdict(tmp_path: Path) -> None:
    """infer (a GPU stage) is the bottleneck and the cores are half idle: nothing new."""
    plain = _verdict(tmp_path / "plain", three_stage_run())
    measured = _verdict(tmp_path / "measured", with_host(three_stage_run(), cores=8, busy=3.1))
    assert measured.bottleneck == plain.bottleneck == "infer" and measured.limits == ()
    assert measured.lines[0] == plain.lines[0]
    assert measured.lines[0].startswith("Bottleneck: infer — 97% busy")
    assert not any("limit" in line or "full too" in line for line in measured.lines)
    assert (
        "measured: 3.10 of 8 cores busy (39%), 3.10 of them by this run's processes."
        in (measured.lines[1])
    )


def test_a_bottleneck_on_full_cores_says_both(tmp_path: Path) -> None:
    """A GPU stage busy waiting is waiting for its GPU, not for a core: it stays the
    bottleneck, and the full cores are said next to it."""
    verdict = _verdict(tmp_path, with_host(three_stage_run(), cores=8, busy=7.6))
    assert verdict.bottleneck == "infer" and verdict.limits == ("cpus",)
    assert verdict.lines[0].startswith("Bottleneck: infer")
    assert verdict.lines[1] == (
        "The machine's CPUs were full too (7.60 of 8 cores busy on average): more infer "
        "workers would have to share cores that are already busy; more cores (a larger "
        "machine, or more nodes) would speed the run up."
    )


def test_an_idle_source_keeps_todays_wording(tmp_path: Path) -> None:
    events = shared_cores_run(busy=(0.3, 0.2, 0.1))
    verdict = _verdict(tmp_path, with_host(events, cores=2, busy=0.4, run=0.35))
    assert verdict.limits == ()
    assert verdict.lines[0] == (
        "No stage was saturated (none ≥ 80% busy, 2.0 s to 1m00s): the source or the start-up "
        "limited the run."
    )


def test_a_log_without_host_measures_explains_what_is_held(tmp_path: Path) -> None:
    verdict = _verdict(tmp_path, shared_cores_run())
    assert verdict.limits == () and "source or the start-up" in verdict.lines[0]
    assert verdict.lines[1] == (
        "CPUs: the workers held 7.18 on average — more than the 2 there are, because a worker "
        "holds a share of the cores' time, not a core of its own (every stage's first worker "
        "runs on the same cores)."
    )
    held = _verdict(tmp_path / "gpu", three_stage_run())
    assert "CPUs: the workers held 5 of 8 on average." in held.lines


def test_the_cpus_given_to_the_run_can_be_the_limit(tmp_path: Path) -> None:
    """2 CPUs given on a 16-core machine, all of them used: the budget, not the machine."""
    verdict = _verdict(tmp_path, with_host(shared_cores_run(), cores=16, busy=2.4, run=1.95))
    assert verdict.limits == ("budget",)
    assert verdict.lines[0].startswith(
        "The run's CPUs were the limit: its processes used 1.95 CPUs on average, all of the 2 "
        "it was given (2.0 s to 1m00s), while the machine's 16 cores were 15% busy."
    )
    assert "--cpus" in verdict.lines[0]


def test_full_gpus_are_the_limit(tmp_path: Path) -> None:
    events = three_stage_run()
    for event in events:
        for row in event.get("stages") or []:
            if isinstance(row, dict) and "busy" in row:
                row["busy"] = 0.5
                row["queued"] = 1
    verdict = _verdict(tmp_path, with_host(events, cores=8, busy=3, gpus=8, gpu_busy=7.5))
    assert verdict.bottleneck is None and verdict.limits == ("gpus",)
    assert verdict.lines[0].startswith(
        "The GPUs were the limit: 7.50 of 8 GPUs busy on average (2.0 s to 1m41s)."
    )
    assert (
        "GPUs: the workers held" in verdict.lines[2] and "measured: 7.50 of 8" in (verdict.lines[2])
    )


def test_several_nodes_leave_the_host_measures_out(tmp_path: Path) -> None:
    events = with_host(shared_cores_run(), cores=2, busy=1.9)
    nodes = [{"node_id": n, "cpus": 1.0, "gpus": 0.0} for n in ("a", "b")]
    events[0]["cluster"] = {**events[0]["cluster"], "nodes": nodes}
    verdict = _verdict(tmp_path, events)
    assert verdict.limits == () and "measured" not in " ".join(verdict.lines)


def test_machine_load_limits() -> None:
    assert MachineLoad().limits == ()
    assert MachineLoad(cores=4, cores_busy=3.7).limits == ("cpus",)
    assert MachineLoad(cores=4, cores_busy=3.7, cpus=2, run_cpus=2).limits == ("cpus",)
    assert MachineLoad(cores=4, cores_busy=2.1, cpus=2, run_cpus=1.9).limits == ("budget",)
    assert MachineLoad(cores=4, cores_busy=2.1, cpus=4, run_cpus=1.9).limits == ()
    assert MachineLoad(gpus=2, gpus_busy=1.9, cores=4, cores_busy=4).limits == ("cpus", "gpus")


def test_the_page_shows_the_machine_verdict(tmp_path: Path) -> None:
    write_events(
        tmp_path / "events.jsonl", with_host(shared_cores_run(), cores=2, busy=1.9, run=1.85)
    )
    html = write_report(tmp_path).read_text()
    assert 'data-limit="cpus"' in html
    assert "<li>The machine&#x27;s CPUs were the limit: 1.90 of 2 cores busy" in html


# -- a real run -----------------------------------------------------------------------------
def _burn(x: int) -> int:
    end = time.thread_time() + 0.004
    while time.thread_time() < end:
        pass
    return x


@pytest.fixture
def two_cpus() -> Iterator[None]:
    """This process and the workers it starts on two CPUs, whatever the machine has."""
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("needs two CPUs")
    os.sched_setaffinity(0, sorted(before)[:2])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.usefixtures("two_cpus")
def test_cpu_burning_stages_on_two_cpus_are_machine_bound(tmp_path: Path) -> None:
    """Four stages that only compute, on 2 CPUs: the cores are full, no stage is the limit
    by itself, and the report says the machine's CPUs were."""
    from conveyor import Pipeline, Resources, processing_stage
    from conveyor.backends.local import LocalBackend
    from conveyor.executors import StreamingExecutor
    from conveyor.monitor import EventLog

    pipeline = Pipeline("burn", description="four stages burning CPU")
    for i in range(4):
        pipeline.add_stage(processing_stage(_burn, name=f"burn{i}", resources=Resources(cpus=1)))
    log = EventLog(tmp_path, report=True)
    result = pipeline.run(StreamingExecutor(LocalBackend(), monitors=[log]), range(400))
    assert result.counts["outputs"] == 400
    run = load_events(tmp_path).run
    assert run.start["host"]["cpus"] == 2 and run.start["cluster"]["cpus"] == 2
    verdict = analyse(run)
    assert verdict.limits == ("cpus",), (verdict.machine, verdict.lines)
    assert verdict.bottleneck is None, verdict.lines
    assert verdict.lines[0].startswith("The machine's CPUs were the limit: "), verdict.lines
    # the run's own processes did the work it needed: 400 tasks x 4 stages x 4 ms
    used = run.end["run_cpu_s"] if run.end else 0.0
    assert used >= 0.9 * 400 * 4 * 0.004, used
    assert log.report_path is not None
    assert "The machine&#x27;s CPUs were the limit" in log.report_path.read_text()


def test_a_large_cluster_is_counted_in_whole_numbers() -> None:
    """A 2,000-GPU cluster read "the workers held 6.65e+03 of 1.6e+04"."""
    from conveyor.report.machine import _n

    assert [_n(v) for v in (7.18, 5, 999.4, 6650.4, 16000, 2000)] == [
        "7.18", "5", "999", "6,650", "16,000", "2,000",
    ]  # fmt: skip
