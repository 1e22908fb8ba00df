"""Source tasks given as an iterator are taken as the first stage has room for them: a run
whose sources are listed as it goes (a bucket of millions) starts on the first ones and holds
a bounded window, never the whole listing. Deterministic, on the virtual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import JournalError, Pipeline, ProcessingStage, Resources
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.sim import parse_scenario_text
from tests.engine.virtual_backend import VirtualBackend

EDGE_TASKS = 16


class Step(ProcessingStage[Any, Any]):
    resources = Resources(cpus=1)

    def __init__(self, name: str) -> None:
        self.name = name

    def process(self, task: Any) -> Any:
        return task


class Listing:
    """Source tasks ``0 .. count-1``, counting how many were taken."""

    def __init__(self, count: int, bad_at: int | None = None) -> None:
        self.count = count
        self.bad_at = bad_at
        self.taken = 0

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.count):
            self.taken += 1
            yield 1.5 if i == self.bad_at else f"v{i:06d}"


def pipeline() -> Pipeline:
    return Pipeline("listing", [Step("probe"), Step("write")])


def executor(kind: type[StreamingExecutor] = StreamingExecutor) -> StreamingExecutor:
    service = {"probe": 0.01, "write": 0.01}
    return kind(VirtualBackend(cpus=2, service_s=service), edge_max_tasks=EDGE_TASKS)


@pytest.mark.parametrize("journal", [False, True])
def test_sources_are_taken_a_bounded_window_ahead_of_the_outputs(
    tmp_path: Path, journal: bool
) -> None:
    listing = Listing(100_000)
    ahead = []
    run = pipeline().stream(executor(), listing, journal=tmp_path / "journal" if journal else None)
    with run:
        for done, _ in enumerate(run, start=1):
            ahead.append(listing.taken - done)
            if done == 3_000:
                break
    # the first output came after a few dozen sources were taken, not 100,000, and the run
    # never held more than the first stage's queue budget and what its workers had in hand
    assert ahead[0] <= 2 * EDGE_TASKS
    assert max(ahead) <= 2 * EDGE_TASKS


SCENARIO = """
name: listing
cluster:
  - {name: n, count: 2, cpus: 4, gpus: 0}
stages:
  - {name: probe, resources: {cpus: 1}, model: {service: {mean: 0.05, kind: exponential}}}
  - {name: write, resources: {cpus: 1}, model: {service: {mean: 0.02, kind: exponential}}}
source: {tasks: 10}
"""


@pytest.mark.parametrize("journal", [False, True])
def test_on_the_simulator_too(tmp_path: Path, journal: bool) -> None:
    scenario = parse_scenario_text(SCENARIO)
    listing = Listing(100_000)
    ahead = []
    run = scenario.pipeline().stream(
        StreamingExecutor(scenario.backend(), edge_max_tasks=EDGE_TASKS),
        listing,
        journal=tmp_path / "journal" if journal else None,
    )
    with run:
        for done, _ in enumerate(run, start=1):
            ahead.append(listing.taken - done)
            if done == 2_000:
                break
    assert max(ahead) <= 3 * EDGE_TASKS  # two nodes' workers hold more in hand


def test_a_journal_skips_finished_sources_as_they_are_listed(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    first = pipeline().run(executor(), Listing(50), journal=journal)
    assert len(first.outputs) == 50
    listing = Listing(200)
    again = pipeline().run(executor(), listing, journal=journal)
    assert again.counts["skipped"] == 50 and len(again.outputs) == 150
    assert listing.taken == 200


def test_a_source_without_a_key_met_mid_listing_stops_the_run_naming_it(tmp_path: Path) -> None:
    listing = Listing(1_000, bad_at=500)
    with pytest.raises(JournalError, match=r"float \(1\.5\)"):
        pipeline().run(executor(), listing, journal=tmp_path / "journal")
    assert listing.taken == 501  # nothing is listed after it


def test_a_listing_that_fails_mid_run_stops_the_run_with_its_error() -> None:
    def listing() -> Iterator[str]:
        yield from ("a", "b")
        raise OSError("the bucket went away")

    with pytest.raises(OSError, match="went away"):
        pipeline().run(executor(), listing())


def test_a_stage_at_a_time_takes_the_whole_listing_first() -> None:
    listing = Listing(500)
    result = pipeline().run(executor(BatchExecutor), listing)
    assert len(result.outputs) == 500 and listing.taken == 500


class NeverOpened(VirtualBackend):
    """A backend whose start is a mistake: the run has nothing to do."""

    def open(self) -> None:
        raise AssertionError("the backend was started for a run with nothing to do")


@pytest.mark.parametrize("kind", [StreamingExecutor, BatchExecutor])
def test_a_run_with_nothing_to_do_starts_no_backend(
    tmp_path: Path, kind: type[StreamingExecutor]
) -> None:
    """Every source finished by an earlier run, or none given: a private Ray cluster was
    started (9 s) to find that out."""
    journal = tmp_path / "journal"
    pipeline().run(executor(), Listing(20), journal=journal)
    idle = kind(NeverOpened(cpus=2, service_s={"probe": 0.01, "write": 0.01}))
    again = pipeline().run(idle, Listing(20), journal=journal)
    assert again.completed and again.counts["skipped"] == 20 and not again.outputs
    empty = pipeline().run(kind(NeverOpened(cpus=2, service_s={})), [])
    assert empty.completed and not empty.outputs and empty.counts["inputs"] == 0


def test_a_slow_source_runs_its_first_tasks_while_it_yields_the_next() -> None:
    """A source that takes its time per task (a paged API, a queue) was read until the
    first edge was full (16 tasks here, 3.2 s) before any of them ran."""
    backend = VirtualBackend(cpus=2, service_s={"probe": 0.01, "write": 0.01})

    def slow() -> Iterator[str]:
        for i in range(40):
            backend.clock += 0.2  # reading the next task takes 0.2 s
            yield f"v{i:06d}"

    seen = []
    with pipeline().stream(StreamingExecutor(backend, edge_max_tasks=EDGE_TASKS), slow()) as run:
        for output in run:
            seen.append((backend.clock, output))
    assert [o for _, o in seen] == [f"v{i:06d}" for i in range(40)]
    # the first comes once workers are up (the second stage's at the first autoscale, 1 s),
    # not once the edge's 16 tasks are read (3.2 s)
    assert seen[0][0] < 2.0
