"""Generator stages on a virtual clock: outputs go on as they are made, a paused generator
bounds memory, a retry sends nothing twice, the journal waits for every descendant, and
``timeout_s`` bounds the gaps between outputs (real stage code, virtual time)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import Pipeline, ProcessingStage, Resources
from conveyor.engine.journal import Journal
from conveyor.executors import BatchExecutor, StreamingExecutor
from tests.engine.virtual_backend import VirtualBackend

#: (stage name, input) -> attempts so far: stage code runs in this process on the virtual
#: backend, so a module-level count sees every attempt whichever worker makes it
ATTEMPTS: Counter[tuple[str, Any]] = Counter()


@pytest.fixture(autouse=True)
def _fresh_attempts() -> Iterator[None]:
    ATTEMPTS.clear()
    yield
    ATTEMPTS.clear()


class Spread(ProcessingStage[int, tuple[int, int]]):
    """Makes ``count`` outputs per input, one at a time; with ``fail_after``, the first
    attempt at an input raises after that many."""

    resources = Resources(cpus=1)

    def __init__(self, count: int, fail_after: int | None = None, name: str = "spread") -> None:
        self.name = name
        self.count = count
        self.fail_after = fail_after

    def process(self, task: int) -> Iterator[tuple[int, int]]:
        ATTEMPTS[(self.name, task)] += 1
        for j in range(self.count):
            if j == self.fail_after and ATTEMPTS[(self.name, task)] == 1:
                raise RuntimeError(f"input {task} failed after {j} outputs")
            yield task, j


class Seen(ProcessingStage[Any, Any]):
    """Passes its input on and notes when (on the virtual clock) it was given it."""

    resources = Resources(cpus=1)
    seen: list[tuple[float, Any]] = []  # shared on purpose: one process
    clock: VirtualBackend | None = None

    def __init__(self, name: str = "seen") -> None:
        self.name = name

    def process(self, task: Any) -> Any:
        Seen.seen.append((Seen.clock.clock if Seen.clock else 0.0, task))
        return task


class Pairs(ProcessingStage[int, tuple[int, int]]):
    """Yields each pair of neighbouring inputs of its batch (outputs of no one input); the
    first attempt at a batch fails after its first pair."""

    name = "pairs"
    batch_size = 3

    def process_batch(self, tasks: list[int]) -> Iterator[tuple[int, int]]:
        key = tuple(tasks)
        ATTEMPTS[("pairs", key)] += 1
        for j, (a, b) in enumerate(itertools.pairwise(tasks)):
            if j == 1 and ATTEMPTS[("pairs", key)] == 1:
                raise RuntimeError("part way")
            yield a, b


class Marks(ProcessingStage[dict, dict]):
    """Marks each input of its batch in place and yields it; input 5 always fails."""

    name = "marks"
    batch_size = 4

    def process_batch(self, tasks: list[dict]) -> Iterator[dict]:
        for task in tasks:
            ATTEMPTS[("marks", task["n"])] += 1
            if task["n"] == 5:
                raise ValueError("input 5 is poison")
            task["marked"] = True
            yield task


def _run(
    stages: list[ProcessingStage[Any, Any]],
    tasks: list[Any],
    service: dict[str, float],
    executor: type[StreamingExecutor] | type[BatchExecutor] = StreamingExecutor,
    **kwargs: Any,
) -> tuple[Any, VirtualBackend]:
    backend = VirtualBackend(cpus=4, service_s=service)
    Seen.seen = []
    Seen.clock = backend
    journal = kwargs.pop("journal", None)
    result = Pipeline("p", stages).run(executor(backend, **kwargs), tasks, journal=journal)
    return result, backend


def test_outputs_go_on_while_the_generator_still_runs() -> None:
    result, _ = _run([Spread(5), Seen()], [0], {"spread": 1.0, "seen": 0.01})
    assert sorted(result.outputs) == [(0, j) for j in range(5)]
    first_seen = Seen.seen[0][0]
    # the generator takes 5 s; its first output was taken downstream after about 1
    assert first_seen < 2.0
    assert result.stats["spread"].tasks_out == 5
    assert result.first_output_s is not None and result.first_output_s < 2.0


def test_a_generator_ahead_of_a_slow_stage_is_paused_and_memory_stays_bounded() -> None:
    result, backend = _run(
        [Spread(10_000), Seen()], [0], {"spread": 0.0001, "seen": 0.01}, edge_max_tasks=16
    )
    assert len(result.outputs) == 10_000
    assert len(set(result.outputs)) == 10_000
    # what waited in front of the slow stage stayed near its budget, not 10,000
    assert result.stats["seen"].queue_hwm_tasks <= 24
    assert backend.resumes  # it was paused and allowed more, many times over


def test_a_generator_that_fails_part_way_is_retried_and_sends_nothing_twice() -> None:
    result, _ = _run([Spread(6, fail_after=3), Seen()], list(range(4)), {"spread": 0.5})
    assert result.counts["failed"] == 0
    assert sorted(result.outputs) == [(i, j) for i in range(4) for j in range(6)]
    assert Counter(task for _, task in Seen.seen).most_common(1)[0][1] == 1
    assert result.stats["spread"].retried == 4
    assert result.stats["spread"].tasks_out == 24


def test_an_input_whose_every_attempt_fails_keeps_what_it_sent_and_fails_once() -> None:
    class Poison(Spread):
        def process(self, task: int) -> Iterator[tuple[int, int]]:
            yield task, 0
            if task == 1:
                raise ValueError("bad input")
            yield task, 1

    result, _ = _run([Poison(2, name="poison"), Seen()], [0, 1, 2], {"poison": 0.5})
    assert [f.task for f in result.failures] == ["1"]
    assert result.failures[0].attempts == 3
    # its first output went on once, however often it was made again
    assert sorted(result.outputs) == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]


def test_a_batch_generator_that_fails_is_tried_again_as_a_whole() -> None:
    result, _ = _run([Pairs(), Seen()], list(range(6)), {"pairs": 0.5})
    assert result.counts["failed"] == 0
    assert sorted(result.outputs) == [(0, 1), (1, 2), (3, 4), (4, 5)]
    assert max(Counter(task for _, task in Seen.seen).values()) == 1
    # the retry ran the same three inputs together (a split would have made other pairs)
    assert {key: n for (name, key), n in ATTEMPTS.items() if name == "pairs"} == {
        (0, 1, 2): 2,
        (3, 4, 5): 2,
    }


def test_a_batch_generator_that_fails_part_way_fails_only_its_culprit() -> None:
    """Outputs that are their inputs (changed in place) are known to be theirs: the batch's
    other inputs are tried again alone, nothing is sent twice, and only the poison fails."""

    result, _ = _run([Marks(), Seen()], [{"n": i} for i in range(8)], {"marks": 0.5})
    assert [f.message for f in result.failures] == ["input 5 is poison"]
    assert sorted(t["n"] for t in result.outputs) == [0, 1, 2, 3, 4, 6, 7]
    assert all(t["marked"] for t in result.outputs)
    assert max(Counter(t["n"] for _, t in Seen.seen).values()) == 1
    assert result.counts["failed"] == 1 and result.stats["marks"].tasks_out == 7
    # 4 was sent on before 5 failed: tried again alone, its output dropped, not sent twice
    assert ATTEMPTS[("marks", 4)] == 2 and ATTEMPTS[("marks", 6)] >= 1


def test_inputs_tried_again_as_a_whole_fail_together_saying_so() -> None:
    class Sums(ProcessingStage[int, int]):
        name = "sums"
        batch_size = 3

        def process_batch(self, tasks: list[int]) -> Iterator[int]:
            yield sum(tasks)
            if 4 in tasks:
                raise ValueError("4 is poison")
            yield max(tasks)

    result, _ = _run([Sums(), Seen()], list(range(6)), {"sums": 0.5})
    assert sorted(f.task for f in result.failures) == ["3", "4", "5"]
    assert all(
        f.message.startswith("4 is poison (failed together with the 3 inputs of its batch")
        for f in result.failures
    )
    assert sorted(result.outputs) == [2, 3, 12]


def test_the_journal_records_a_source_only_when_every_descendant_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded: dict[str, float] = {}
    original = Journal.record

    def record(self: Journal, key: str, failed: bool = False) -> None:
        recorded[key] = Seen.clock.clock if Seen.clock else 0.0
        original(self, key, failed)

    monkeypatch.setattr(Journal, "record", record)
    result, _ = _run(
        [Spread(4, fail_after=2), Seen()],
        [10, 11, 12],
        {"spread": 1.0, "seen": 2.0},
        journal=tmp_path / "journal",
    )
    assert len(result.outputs) == 12
    assert len(recorded) == 3
    for key, when in recorded.items():
        source = next(t for t in (10, 11, 12) if key == str(t) or key.endswith(f":{t}"))
        last = max(t for t, (src, _) in Seen.seen if src == source)
        assert when >= last  # not before its last output was taken
    # a second run skips all three
    again, _ = _run([Spread(4), Seen()], [10, 11, 12], {}, journal=tmp_path / "journal")
    assert again.counts["skipped"] == 3


class Gaps(ProcessingStage[int, int]):
    """Yields outputs after the virtual gaps its backend's clock is told (see ``_Slow``)."""

    name = "gaps"
    timeout_s = 2.0

    def process(self, task: int) -> Iterator[int]:
        yield from range(task)


def test_timeout_bounds_the_gap_between_outputs_not_the_whole_batch() -> None:
    # ten outputs a second apart: 10 s in all, never 2 s without an output
    result, backend = _run([Gaps()], [10], {"gaps": 1.0})
    assert len(result.outputs) == 10 and not result.failures
    assert not backend.killed


def test_a_generator_silent_for_longer_than_its_timeout_is_killed_and_fails() -> None:
    result, backend = _run([Gaps()], [3], {"gaps": 5.0}, max_attempts=2)
    assert [f.error_type for f in result.failures] == ["TaskTimeout"]
    assert "made no output for" in result.failures[0].message
    assert len(backend.killed) == 2


def test_time_paused_for_room_downstream_does_not_count_against_the_timeout() -> None:
    # the stage behind takes 5 s an output: the generator waits that long, again and again
    result, backend = _run([Gaps(), Seen()], [20], {"gaps": 0.1, "seen": 5.0}, edge_max_tasks=4)
    assert len(result.outputs) == 20 and not result.failures
    assert not backend.killed
    assert backend.resumes


def test_the_batch_executor_finishes_a_generator_stage_before_the_next_starts() -> None:
    result, _ = _run(
        [Spread(5), Seen()], [0, 1], {"spread": 1.0, "seen": 0.1}, executor=BatchExecutor
    )
    assert len(result.outputs) == 10
    assert min(t for t, _ in Seen.seen) >= 5.0  # after every output was made
