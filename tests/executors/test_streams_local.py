"""Generator stages on the local backend: outputs leave as they are made, a paused generator
keeps shared memory flat, a failure part way sends nothing twice, the journal waits for every
descendant, and ``timeout_s`` bounds the gaps between outputs (real processes, real time)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conveyor import Pipeline, ProcessingStage
from conveyor.backends import LocalBackend
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.result import RunResult
from tests.backends.ray_stages import Arrivals, Stalls, Trickle

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("executor_type", [StreamingExecutor, BatchExecutor])
def test_outputs_leave_the_generator_as_they_are_made(tmp_path: Path, executor_type: type) -> None:
    stages = [Trickle(tmp_path, 5, gap_s=0.3), Arrivals(tmp_path)]
    result = Pipeline("p", stages).run(executor_type(LocalBackend(num_cpus=2)), [7])
    assert sorted(result.outputs) == [(7, j) for j in range(5)]
    first = Arrivals.seen(tmp_path)[0][1]
    if executor_type is StreamingExecutor:
        assert first < Trickle.ended(tmp_path, 7) - 0.5  # taken while four more were being made
    else:
        assert first >= Trickle.ended(tmp_path, 7)  # one stage at a time: after all of them


class Sizes:
    """Samples the bytes held in shared memory at every tick."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.peak = 0

    def on_start(self, pipeline: str, stages: list[str]) -> None:
        pass

    def on_tick(self, snapshot: Any) -> None:
        self.peak = max(self.peak, self.backend.shared_bytes())

    def on_end(self, result: RunResult) -> None:
        pass


def test_a_generator_of_10000_outputs_behind_a_slow_stage_keeps_memory_flat(
    tmp_path: Path,
) -> None:
    class Slow(ProcessingStage[Any, int]):
        name = "slow"

        def process(self, task: Any) -> int:
            time.sleep(0.001)
            return task[1]

    backend = LocalBackend(num_cpus=2)
    sizes = Sizes(backend)
    executor = StreamingExecutor(backend, monitors=[sizes], edge_max_tasks=32)
    # 10,000 outputs of 64 KiB: 625 MB had they all waited in shared memory
    stages = [Trickle(tmp_path, 10_000, size=64 * 1024), Slow()]
    result = Pipeline("p", stages).run(executor, [0])
    assert sorted(result.outputs) == list(range(10_000))
    assert result.stats["slow"].queue_hwm_tasks <= 48
    assert sizes.peak < 16 << 20


def test_a_generator_that_fails_part_way_sends_nothing_twice(tmp_path: Path) -> None:
    stages = [Trickle(tmp_path, 6, fail_once=(1, 3), fail_after=2), Arrivals(tmp_path)]
    result = Pipeline("p", stages).run(StreamingExecutor(LocalBackend(num_cpus=2)), range(4))
    assert result.failures == []
    assert sorted(result.outputs) == [(i, j) for i in range(4) for j in range(6)]
    counts = Counter(key for key, _ in Arrivals.seen(tmp_path))
    assert set(counts.values()) == {1}
    assert result.stats["trickle"].retried == 2


def test_the_journal_follows_every_output_of_a_generator(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    journal = tmp_path / "journal"
    stages = [Trickle(marks, 3, fail_once=(2,), fail_after=1), Arrivals(marks)]
    first = Pipeline("p", stages).run(StreamingExecutor(LocalBackend()), range(4), journal=journal)
    assert len(first.outputs) == 12
    again = Pipeline("p", stages).run(StreamingExecutor(LocalBackend()), range(4), journal=journal)
    assert again.counts["skipped"] == 4 and again.outputs == []


def test_timeout_bounds_each_gap_between_outputs_on_the_local_backend() -> None:
    # 8 outputs 0.4 s apart: 3.2 s in all, longer than timeout_s, but never a 1 s gap
    fine = Pipeline("p", [Stalls(0.4)]).run(StreamingExecutor(LocalBackend(num_cpus=2)), [8])
    assert sorted(fine.outputs) == list(range(8)) and not fine.failures
    late = Pipeline("p", [Stalls(3.0)]).run(
        StreamingExecutor(LocalBackend(num_cpus=2), max_attempts=1), [2]
    )
    assert [f.error_type for f in late.failures] == ["TaskTimeout"]
    assert "made no output for" in late.failures[0].message


def test_closing_a_run_while_a_generator_waits_for_room_ends_it_promptly(
    tmp_path: Path,
) -> None:
    stages = [Trickle(tmp_path, 100_000), Arrivals(tmp_path, cost_s=0.05)]
    run = Pipeline("p", stages).stream(StreamingExecutor(LocalBackend(num_cpus=2)), [0])
    next(iter(run))
    began = time.monotonic()
    run.close()
    assert time.monotonic() - began < 5.0  # not the 10 s a waiting worker would cost
