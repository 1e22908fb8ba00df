"""Task timeouts on a virtual clock: a hung batch costs its worker, never the innocent."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor import Pipeline, ProcessingStage, Resources, TaskTimeout
from conveyor.executors import StreamingExecutor
from tests.engine.virtual_backend import VirtualBackend

HUNG = 13


class Work(ProcessingStage[Any, Any]):
    resources = Resources(cpus=1)
    name = "work"
    timeout_s = 5.0

    def process(self, task: Any) -> Any:
        return task


def run(
    stage: ProcessingStage[Any, Any], n: int = 40, max_attempts: int = 3, service: float = 0.5
) -> tuple[Any, VirtualBackend]:
    backend = VirtualBackend(cpus=4, service_s={stage.name: service}, hangs=lambda t: t == HUNG)
    pipeline = Pipeline("p", [stage])
    result = pipeline.run(StreamingExecutor(backend, max_attempts=max_attempts), range(n))
    return result, backend


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("max_attempts", [1, 3])
def test_a_hung_input_fails_as_a_timeout_and_the_others_go_on(
    batch_size: int, max_attempts: int
) -> None:
    result, backend = run(Work().with_(batch_size=batch_size), max_attempts=max_attempts)
    assert sorted(result.outputs) == [i for i in range(40) if i != HUNG]
    [failure] = result.failures
    assert failure.error_type == TaskTimeout.__name__ == "TaskTimeout"
    assert failure.attempts == max_attempts
    assert "'work'" in failure.message and "timeout_s=5" in failure.message
    stats = result.stats["work"]
    # alone it timed out max_attempts times; in a batch of several, once more before that
    assert stats.timeouts == max_attempts + (batch_size > 1)
    assert len(backend.killed) == stats.timeouts == stats.worker_deaths
    assert result.completed


def test_the_worker_is_killed_soon_after_the_limit() -> None:
    _result, backend = run(Work(), max_attempts=1)
    [(killed_at, worker)] = backend.killed
    started = max(t for t, w in backend.batch_starts if w == worker)
    assert 5.0 < killed_at - started <= 5.0 + 0.26  # checked every tick (0.25 s)


def test_batches_queued_behind_a_hung_one_are_not_charged() -> None:
    # fast work: each worker holds a second message while the first runs
    result, _backend = run(Work(), n=400, max_attempts=1, service=0.001)
    assert len(result.outputs) == 399
    assert [f.error_type for f in result.failures] == ["TaskTimeout"]


def test_slow_work_without_a_timeout_is_left_alone() -> None:
    result, backend = run(Work().with_(timeout_s=None), n=6, service=60.0)
    assert sorted(result.outputs) == list(range(6))
    assert backend.killed == []


def long_batch_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "has no timeout_s" in r.getMessage()]


def test_a_batch_far_longer_than_its_stage_s_others_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without timeout_s a hung call held the run without a word: now it is said once."""
    backend = VirtualBackend(cpus=2, service_s={"work": lambda begin: 1000.0 if begin > 5 else 1.0})
    with caplog.at_level("WARNING", logger="conveyor.engine.controller"):
        result = Pipeline("p", [Work().with_(timeout_s=None)]).run(
            StreamingExecutor(backend), range(20)
        )
    assert sorted(result.outputs) == list(range(20))  # it waited, as the user asked
    [said] = long_batch_warnings(caplog)
    assert "a batch of stage 'work' (inputs " in said
    assert "has run for 30" in said and "its batches took 1 s on average" in said
    assert "with_(timeout_s=...)" in said


def test_a_first_batch_is_said_long_after_the_floor_and_usual_slow_work_never(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="conveyor.engine.controller"):
        run(Work().with_(timeout_s=None), n=2, service=400.0)
        [said] = long_batch_warnings(caplog)
        assert "none of its batches has finished yet" in said
        caplog.clear()
        # a minute per batch is this stage's usual pace: 20 times that is not reached
        run(Work().with_(timeout_s=None), n=12, service=60.0)
    assert long_batch_warnings(caplog) == []


def test_with_sets_the_timeout_and_bad_values_are_refused() -> None:
    assert Work().with_(timeout_s=2).timeout_s == 2
    for bad in (0, -1, float("inf"), "5", True):
        with pytest.raises(ValueError, match="timeout_s"):
            Work().with_(timeout_s=bad)  # type: ignore[arg-type]


def test_the_plan_shows_the_timeout() -> None:
    assert "timeout_s: 5 per batch" in Pipeline("p", [Work()]).describe()
