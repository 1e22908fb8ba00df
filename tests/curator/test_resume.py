"""NeMo Curator's resumable runs: ``checkpoint_path``, source stages, and the markers a stage
gives for an input (``NoneTask`` filtered; ``TransientDrop`` and ``FailedTask`` dropped for
this run only, tried again by the next)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from conveyor.backends.local import LocalBackend
from conveyor.curator.backends.base import StageFailures
from conveyor.curator.backends.xenna import XennaExecutor
from conveyor.curator.pipeline import Pipeline
from conveyor.curator.stages.base import ProcessingStage
from conveyor.curator.stages.resources import Resources
from conveyor.curator.tasks import (
    DocumentBatch,
    EmptyTask,
    FailedTask,
    NoneTask,
    TransientDrop,
)
from conveyor.errors import JournalError


def part(i: int) -> DocumentBatch:
    return DocumentBatch(f"p{i}", "ds", pd.DataFrame({"n": [i]}), {"resumability_key": f"part-{i}"})


class Partition(ProcessingStage[EmptyTask, DocumentBatch]):
    """A source stage, as NeMo Curator's file partitioning: one task per partition."""

    name = "partition"
    resources = Resources(cpus=0.5)

    def __init__(self, parts: int = 6) -> None:
        self.parts = parts

    def is_source_stage(self) -> bool:
        return True

    def process(self, task: EmptyTask) -> list[DocumentBatch]:
        return [part(i) for i in range(self.parts)]


class Call(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Calls a service that refuses the partitions listed in ``refused`` for now; filters
    partition 5; writes down every partition it is called for."""

    name = "call"
    resources = Resources(cpus=0.5)

    def __init__(self, refused: Path, calls: Path) -> None:
        self.refused, self.calls = refused, calls

    def process(self, task: DocumentBatch) -> Any:
        n = int(task.to_pandas()["n"].iloc[0])
        with self.calls.open("a") as f:
            f.write(f"{n}\n")
        if str(n) in self.refused.read_text().split():
            return TransientDrop(f"rate limited at {n}")
        if n == 5:
            return NoneTask()
        return task


class CallBatch(ProcessingStage[DocumentBatch, DocumentBatch]):
    """``Call`` as a batch stage that marks a refused input with a ``FailedTask``."""

    name = "call_batch"
    resources = Resources(cpus=0.5)
    batch_size = 3

    def __init__(self, refused: Path, calls: Path) -> None:
        self.refused, self.calls = refused, calls

    def process(self, task: DocumentBatch) -> Any:
        raise AssertionError("process_batch is the one called")

    def process_batch(self, tasks: list[DocumentBatch]) -> list[Any]:
        out: list[Any] = []
        for task in tasks:
            n = int(task.to_pandas()["n"].iloc[0])
            with self.calls.open("a") as f:
                f.write(f"{n}\n")
            out.append(FailedTask() if str(n) in self.refused.read_text().split() else task)
        return out


def numbers(outputs: list[Any]) -> list[int]:
    return sorted(int(n) for t in outputs for n in t.to_pandas()["n"])


def executor() -> XennaExecutor:
    return XennaExecutor(backend=LocalBackend(num_cpus=2))


def test_a_transient_drop_is_dropped_for_this_run_and_done_by_the_next(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refused, calls, checkpoint = tmp_path / "refused", tmp_path / "calls", tmp_path / "ckpt"
    pipeline = Pipeline("resume", stages=[Partition(), Call(refused, calls)])
    refused.write_text("1 3")
    with caplog.at_level(logging.WARNING, logger="conveyor.curator"):
        first = pipeline.run(executor(), checkpoint_path=str(checkpoint))
    # no StageFailures: a drop is not a failure of the run, as in NeMo Curator
    assert numbers(first) == [0, 2, 4]
    assert "2 input(s) dropped for this run" in caplog.text and "rate limited at" in caplog.text
    assert sorted(calls.read_text().split()) == ["0", "1", "2", "3", "4", "5"]  # one try each
    refused.write_text("3")
    calls.write_text("")
    second = pipeline.run(executor(), checkpoint_path=str(checkpoint))
    assert numbers(second) == [1]  # 0, 2, 4 were written, 5 filtered: all finished
    assert sorted(calls.read_text().split()) == ["1", "3"]
    refused.write_text("")
    assert numbers(pipeline.run(executor(), checkpoint_path=str(checkpoint))) == [3]
    calls.write_text("")
    assert pipeline.run(executor(), checkpoint_path=str(checkpoint)) == []
    assert calls.read_text() == ""


def test_a_failed_task_in_a_batch_drops_only_its_own_input(tmp_path: Path) -> None:
    refused, calls, checkpoint = tmp_path / "refused", tmp_path / "calls", tmp_path / "ckpt"
    pipeline = Pipeline("batch", stages=[Partition(), CallBatch(refused, calls)])
    refused.write_text("4")
    assert numbers(pipeline.run(executor(), checkpoint_path=checkpoint)) == [0, 1, 2, 3, 5]
    # its batch's other inputs went on: the batch ran again one input at a time
    refused.write_text("")
    assert numbers(pipeline.run(executor(), checkpoint_path=checkpoint)) == [4]


def test_without_a_checkpoint_a_drop_is_a_warning_and_other_failures_still_raise(
    tmp_path: Path,
) -> None:
    refused, calls = tmp_path / "refused", tmp_path / "calls"
    refused.write_text("2")
    out = Pipeline("p", stages=[Partition(), Call(refused, calls)]).run(executor())
    assert numbers(out) == [0, 1, 3, 4]
    with pytest.raises(StageFailures, match=r"1 input.*KeyError"):  # a real failure
        Pipeline("p", stages=[Call(refused, calls)]).run(
            executor(), [DocumentBatch("x", "ds", pd.DataFrame({"m": [1]}))]
        )


def test_tasks_given_with_resumability_keys_are_journaled_without_a_source_stage(
    tmp_path: Path,
) -> None:
    refused, calls, checkpoint = tmp_path / "refused", tmp_path / "calls", tmp_path / "ckpt"
    refused.write_text("")
    pipeline = Pipeline("given", stages=[Call(refused, calls)])
    assert numbers(pipeline.run(executor(), [part(i) for i in range(3)], checkpoint)) == [0, 1, 2]
    assert numbers(pipeline.run(executor(), [part(i) for i in range(4)], checkpoint)) == [3]


def test_checkpoint_paths_that_cannot_work_are_said(tmp_path: Path) -> None:
    refused, calls = tmp_path / "refused", tmp_path / "calls"
    refused.write_text("")
    pipeline = Pipeline("p", stages=[Call(refused, calls)])
    with pytest.raises(JournalError, match=r"no _metadata\['resumability_key'\].*is_source_stage"):
        pipeline.run(executor(), checkpoint_path=tmp_path / "c")  # an EmptyTask has no key
    with pytest.raises(ValueError, match="object stores are not supported"):
        pipeline.run(executor(), checkpoint_path="s3://bucket/ckpt")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        pipeline.run(executor(), checkpoint_path=tmp_path / "file")
    assert not calls.exists()  # refused before anything ran
