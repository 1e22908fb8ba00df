"""``max_batches_per_worker``: a worker runs that many batches, then a fresh one follows."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from conveyor import Pipeline, ProcessingStage
from conveyor.executors import BatchExecutor, StreamingExecutor
from tests.engine.virtual_backend import VirtualBackend


class Work(ProcessingStage[int, int]):
    name = "work"

    def process(self, task: int) -> int:
        if task == 7:
            raise ValueError("seven")
        return task


@pytest.mark.parametrize("executor_type", [StreamingExecutor, BatchExecutor])
@pytest.mark.parametrize(("service", "batch_size"), [(0.001, 1), (0.001, 3), (0.5, 2)])
def test_no_worker_runs_more_batches_than_allowed_and_nothing_is_lost(
    executor_type: Any, service: float, batch_size: int
) -> None:
    """Fast stages send many batches per message: the limit caps what one may carry."""
    backend = VirtualBackend(cpus=3, service_s={"work": service})
    stage = Work().with_(batch_size=batch_size, max_batches_per_worker=4)
    result = Pipeline("p", [stage]).run(executor_type(backend, max_attempts=2), range(300))
    assert sorted(result.outputs) == [i for i in range(300) if i != 7]
    [failure] = result.failures
    assert (failure.task, failure.attempts) == ("7", 2)  # its retry was sent alone, counted
    batches = collections.Counter(worker for _, worker in backend.batch_starts)
    assert max(batches.values()) <= 4
    assert len(backend.starts) >= len(backend.batch_starts) / 4
    assert result.stats["work"].worker_deaths == 0  # a planned stop is no death


def test_without_a_limit_workers_live_for_the_run() -> None:
    backend = VirtualBackend(cpus=3, service_s={"work": 0.001})
    Pipeline("p", [Work()]).run(StreamingExecutor(backend), range(300))
    assert len(backend.starts) <= 3


def test_the_limit_is_validated_and_described() -> None:
    stage = Work().with_(max_batches_per_worker=100)
    assert "max_batches_per_worker: 100 (then a fresh worker)" in Pipeline("p", [stage]).describe()
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="max_batches_per_worker must be None or an int >= 1"):
            Work().with_(max_batches_per_worker=bad)  # type: ignore[arg-type]
