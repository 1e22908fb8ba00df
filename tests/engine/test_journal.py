"""The journal: finished source tasks are recorded once, and a re-run skips exactly them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor import (
    DeferredError,
    JournalError,
    PermanentError,
    Pipeline,
    ProcessingStage,
    Resources,
)
from conveyor.engine.journal import Journal, key_label, source_key
from conveyor.executors import StreamingExecutor
from conveyor.tasks import FileGroupTask
from tests.engine.virtual_backend import VirtualBackend


class Step(ProcessingStage[Any, Any]):
    resources = Resources(cpus=1)

    def __init__(self, name: str, fanout: int = 1, drop: int | None = None) -> None:
        self.name = name
        self.fanout = fanout
        self.drop = drop

    def process(self, task: Any) -> Any:
        if self.drop is not None and task == self.drop:
            return None
        if self.fanout == 1:
            return task
        return [(task, j) for j in range(self.fanout)]


class Poison(ProcessingStage[Any, Any]):
    resources = Resources(cpus=1)
    name = "poison"

    def process(self, task: Any) -> Any:
        if task == 3:
            raise PermanentError("3 is bad data")
        return task


class Pairs(ProcessingStage[Any, Any]):
    """Merges a batch into one output (not one per input)."""

    resources = Resources(cpus=1)
    name = "pairs"
    batch_size = 2

    def process_batch(self, tasks: list[Any]) -> list[Any]:
        return [tuple(tasks)]


def executor() -> StreamingExecutor:
    return StreamingExecutor(VirtualBackend(cpus=2, service_s={"a": 0.01, "b": 0.02}))


def records(path: Path) -> list[Any]:
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["conveyor_journal"] == 1
    return [json.loads(line)["k"] for line in lines[1:]]


def test_a_rerun_skips_every_finished_source(tmp_path: Path) -> None:
    journal = tmp_path / "run.journal"
    pipeline = Pipeline("p", [Step("a", fanout=3), Step("b")])
    first = pipeline.run(executor(), range(20), journal=journal)
    assert first.counts["skipped"] == 0 and len(first.outputs) == 60
    assert sorted(records(journal)) == list(range(20))  # one record per source, not per output

    again = pipeline.run(executor(), range(25), journal=journal)
    assert again.counts["skipped"] == 20 and again.counts["inputs"] == 5
    assert sorted(again.outputs) == [(i, j) for i in range(20, 25) for j in range(3)]
    assert sorted(records(journal)) == list(range(25))


def test_without_a_journal_nothing_is_skipped() -> None:
    result = Pipeline("p", [Step("a")]).run(executor(), range(5))
    assert result.counts["skipped"] == 0


def test_a_stopped_run_is_finished_by_the_next_with_every_output_once(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    pipeline = Pipeline("p", [Step("a", fanout=2), Step("b")])
    seen: list[Any] = []
    with pipeline.stream(executor(), range(30), journal=journal) as run:
        for output in run:
            seen.append(output)
            if len(seen) == 17:
                break  # the 17th was handed out but the caller never came back for more
    done = set(records(journal))
    assert 0 < len(done) < 30
    # a source is finished only once every one of its outputs was taken by the caller
    delivered = {i for i, _ in seen[:16]}
    assert done <= delivered
    again = pipeline.run(executor(), range(30), journal=journal)
    assert again.counts["skipped"] == len(done)
    outputs = [o for o in seen if o[0] in done] + again.outputs
    assert sorted(outputs) == [(i, j) for i in range(30) for j in range(2)]


def test_filtered_and_permanently_failed_sources_are_finished(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    pipeline = Pipeline("p", [Step("a", drop=5), Poison()])
    result = pipeline.run(executor(), range(8), journal=journal)
    assert [f.error_type for f in result.failures] == ["PermanentError"]
    assert sorted(records(journal)) == list(range(8))
    assert pipeline.run(executor(), range(8), journal=journal).counts["skipped"] == 8


class Flaky(ProcessingStage[Any, Any]):
    """Fails an input holding a number listed in ``bad`` (a file, so a later run can heal)."""

    resources = Resources(cpus=1)
    name = "flaky"

    def __init__(self, bad: Path) -> None:
        self.bad = bad

    def process(self, task: Any) -> Any:
        bad = {int(n) for n in self.bad.read_text().split()}
        numbers = task if isinstance(task, tuple) else (task,)
        if bad & set(numbers):
            raise OSError(f"the store was away for {task}")
        return task


def test_a_failed_source_is_tried_again_by_the_next_run_until_it_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure was finished for good: a video whose write met a full disk stayed
    unwritten however often the command was run again (only --overwrite redid it)."""
    journal, bad = tmp_path / "j", tmp_path / "bad"
    pipeline = Pipeline("p", [Step("a", fanout=2), Flaky(bad)])
    bad.write_text("3 6")
    first = pipeline.run(executor(), range(8), journal=journal)
    assert len(first.failures) == 4 and len(first.outputs) == 12
    assert sorted(records(journal)) == list(range(8))  # each finished for this run
    bad.write_text("6")  # 3 works now; 6 fails again, and is tried again the time after
    with caplog.at_level("WARNING", logger="conveyor.engine.journal"):
        second = pipeline.run(executor(), range(8), journal=journal)
    assert "2 source task(s) that failed in an earlier run are tried again" in caplog.text
    assert second.counts["skipped"] == 6 and sorted(second.outputs) == [(3, 0), (3, 1)]
    bad.write_text("")
    third = pipeline.run(executor(), range(8), journal=journal)
    assert third.counts["skipped"] == 7 and sorted(third.outputs) == [(6, 0), (6, 1)]
    assert pipeline.run(executor(), range(8), journal=journal).counts["skipped"] == 8


class Quota(ProcessingStage[Any, Any]):
    """Refuses the inputs listed in ``refused`` for this run (a spent quota), counting calls."""

    resources = Resources(cpus=1)
    name = "quota"

    def __init__(self, refused: Path, calls: Path) -> None:
        self.refused, self.calls = refused, calls

    def process(self, task: Any) -> Any:
        with self.calls.open("a") as f:
            f.write(f"{task}\n")
        if str(task) in self.refused.read_text().split():
            raise DeferredError(f"quota spent before {task}")
        return task


def test_a_deferred_failure_is_tried_once_now_and_again_by_the_next_run(tmp_path: Path) -> None:
    journal, refused, calls = tmp_path / "j", tmp_path / "refused", tmp_path / "calls"
    pipeline = Pipeline("p", [Step("a"), Quota(refused, calls)])
    refused.write_text("2 5")
    first = pipeline.run(executor(), range(8), journal=journal)
    labels = sorted(key_label(source_key(n)) for n in (2, 5))
    assert sorted(f.task for f in first.failures) == labels
    assert [(f.error_type, f.attempts) for f in first.failures] == [("DeferredError", 1)] * 2
    assert calls.read_text().split().count("2") == 1  # no second attempt in this run
    assert sorted(first.outputs) == [0, 1, 3, 4, 6, 7]
    refused.write_text("")
    second = pipeline.run(executor(), range(8), journal=journal)
    assert second.counts["skipped"] == 6 and sorted(second.outputs) == [2, 5]
    assert pipeline.run(executor(), range(8), journal=journal).counts["skipped"] == 8


def test_every_source_of_a_failed_merged_output_is_tried_again(tmp_path: Path) -> None:
    journal, bad = tmp_path / "j", tmp_path / "bad"
    pipeline = Pipeline("p", [Step("a"), Pairs(), Flaky(bad)])
    bad.write_text("4")
    first = pipeline.run(executor(), range(6), journal=journal)
    assert len(first.failures) == 1 and len(first.outputs) == 2
    pair = set(range(6)) - {n for p in first.outputs for n in p}
    assert 4 in pair and len(pair) == 2
    bad.write_text("")
    second = pipeline.run(executor(), range(6), journal=journal)
    assert second.counts["skipped"] == 4
    assert [set(p) for p in second.outputs] == [pair]


def test_a_journal_written_before_failures_were_marked_reads_as_before(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    journal.write_text('{"conveyor_journal": 1, "pipeline": "p"}\n{"k":1}\n{"k":2,"f":1}\n')
    opened = Journal(journal).open("p")
    assert source_key(1) in opened and source_key(2) not in opened and opened.retried == 1
    opened.record(source_key(2))
    opened.close()
    again = Journal(journal).open("p")
    assert source_key(2) in again and again.retried == 0
    again.close()


def test_sources_merged_into_one_output_finish_with_it(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    pipeline = Pipeline("p", [Step("a"), Pairs(), Step("b")])
    with pipeline.stream(executor(), range(10), journal=journal) as run:
        first = next(run)
        assert records(journal) == []
        next(run)  # the caller came back: the first pair is theirs
    assert len(first) == 2
    run_records = records(journal)
    assert sorted(run_records) == sorted(first)
    rest = pipeline.run(executor(), range(10), journal=journal)
    assert rest.counts["skipped"] == 2
    assert sorted(x for pair in [first, *rest.outputs] for x in pair) == list(range(10))


def test_labels_follow_keys_so_a_resumed_run_names_outputs_the_same(tmp_path: Path) -> None:
    class Label(ProcessingStage[FileGroupTask, str]):
        resources = Resources(cpus=1)

        def process(self, task: FileGroupTask) -> str:
            return task.task_id

    tasks = [FileGroupTask(data=[f"f{i}.jsonl"]) for i in range(4)]
    pipeline = Pipeline("p", [Label()])
    full = pipeline.run(executor(), tasks, journal=tmp_path / "a")
    assert sorted(full.outputs) == sorted(key_label(source_key(t)) for t in tasks)
    pipeline.run(executor(), tasks[2:], journal=tmp_path / "b")
    resumed = pipeline.run(executor(), tasks, journal=tmp_path / "b")
    assert resumed.counts["skipped"] == 2
    assert set(resumed.outputs) <= set(full.outputs)


def test_a_source_given_twice_runs_once(tmp_path: Path) -> None:
    result = Pipeline("p", [Step("a")]).run(executor(), ["x", "y", "x"], journal=tmp_path / "j")
    assert sorted(result.outputs) == ["x", "y"] and result.counts["skipped"] == 1


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("a.jsonl", '"a.jsonl"'),
        (7, "7"),
        (b"\x00k", '{"b64":"AGs="}'),
        (Path("in/v.mp4"), '"in/v.mp4"'),
        (FileGroupTask(data=["b", "a"]), '["b","a"]'),
    ],
)
def test_source_keys(task: Any, expected: str) -> None:
    assert source_key(task) == expected


def test_a_journal_key_callable_names_any_task() -> None:
    assert source_key({"id": 4}, lambda t: t["id"]) == "4"


@pytest.mark.parametrize("task", [{"id": 4}, 1.5, None, True, FileGroupTask(data=[])])
def test_a_task_without_a_stable_key_is_a_clear_error_before_the_run(
    tmp_path: Path, task: Any
) -> None:
    backend = VirtualBackend()
    with pytest.raises(JournalError, match="key"):
        Pipeline("p", [Step("a")]).run(
            StreamingExecutor(backend), ["ok", task], journal=tmp_path / "j"
        )
    assert backend.starts == []  # nothing ran


def test_a_task_without_a_key_from_a_generator_stops_the_run(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="dict"):
        Pipeline("p", [Step("a")]).run(
            executor(), (t for t in ["ok", {"x": 1}]), journal=tmp_path / "j"
        )


def test_a_journal_needs_source_tasks(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="initial_tasks"):
        Pipeline("p", [Step("a")]).run(executor(), journal=tmp_path / "j")


def test_a_torn_last_record_is_ignored_and_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_text('{"conveyor_journal": 1, "pipeline": "p"}\n{"k":1}\n{"k":2}\n{"k":')
    journal = Journal(path).open("p")
    assert len(journal) == 2 and "1" in journal and "2" in journal and "3" not in journal
    journal.record("3")
    journal.close()
    assert records(path) == [1, 2, 3]


def test_records_reach_the_disk_at_the_sync_interval(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = Journal(path, sync_s=3600).open("p")
    journal.sync()
    journal.record('"a"')
    journal.sync()
    assert records(path) == ["a"]  # the first sync after a quiet spell writes at once
    journal.record('"b"')
    journal.sync()
    assert records(path) == ["a"]  # then at most every sync_s
    journal.close()
    assert records(path) == ["a", "b"]


@pytest.mark.parametrize(
    ("content", "match"),
    [("hello\n", "not a Conveyor journal"), ('{"conveyor_journal": 1}\nnope\n', "line 2")],
)
def test_a_file_that_is_not_a_journal_is_refused(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "j"
    path.write_text(content)
    with pytest.raises(JournalError, match=match):
        Journal(path).open("p")
    assert path.read_text() == content  # never touched


def test_a_directory_is_not_a_journal(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="directory"):
        Journal(tmp_path).open("p")


def test_journal_key_without_a_journal_is_a_mistake() -> None:
    with pytest.raises(TypeError, match="journal=PATH"):
        Pipeline("p", [Step("a")]).run(executor(), [1], journal_key=str)


def test_a_journal_that_skips_nothing_runs_every_source_it_is_given(tmp_path: Path) -> None:
    """For pipelines whose sources leave out what their own records say is finished: a
    source given again (its record deleted) runs again, under the same label."""
    path = tmp_path / "j"
    pipeline = Pipeline("p", [Step("a")])
    first = pipeline.run(executor(), range(4), journal=path)
    again = pipeline.run(executor(), [1, 2], journal=Journal(path, skip_finished=False))
    assert again.counts["skipped"] == 0 and sorted(again.outputs) == [1, 2]
    assert pipeline.run(executor(), range(4), journal=path).counts["skipped"] == 4
    assert len(first.outputs) == 4
