"""The streaming engine end to end on the local backend: results, batching, backpressure."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import Pipeline, ProcessingStage, Resources, processing_stage
from conveyor.backends import LocalBackend
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.tasks import Task


class AddOne(ProcessingStage[int, int]):
    resources = Resources(cpus=0.25)

    def process(self, task: int) -> int:
        return task + 1


class Sleep(ProcessingStage[Any, Any]):
    resources = Resources(cpus=0.25)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def process(self, task: Any) -> Any:
        time.sleep(self.seconds)
        return task


class BatchSizes(ProcessingStage[int, int]):
    """Returns the size of every batch it receives, so the test can check batching."""

    resources = Resources(cpus=0.25)

    def process_batch(self, tasks: list[int]) -> list[int]:
        return [len(tasks)]


def streaming(**kwargs: Any) -> StreamingExecutor:
    return StreamingExecutor(LocalBackend(num_cpus=2), **kwargs)


def test_run_returns_every_output_with_counts_and_stats() -> None:
    result = Pipeline("p", [AddOne(), AddOne().with_(name="again")]).run(
        streaming(), initial_tasks=range(50)
    )
    assert sorted(result.outputs) == [i + 2 for i in range(50)]
    assert result.counts == {"inputs": 50, "outputs": 50, "filtered": 0, "failed": 0, "skipped": 0}
    assert set(result.stats) == {"AddOne", "again"}
    for stats in result.stats.values():
        assert stats.tasks_in == 50 and stats.tasks_out == 50
        assert stats.peak_workers >= 1
        assert stats.queue_hwm_tasks >= 1 and stats.queue_hwm_bytes > 0
        assert stats.busy_s >= 0 and stats.mean_service_s >= 0
    assert result.first_output_s is not None and result.first_output_s < result.wall_s + 1e-9
    assert result.completed


def test_default_run_starts_from_one_empty_task() -> None:
    @processing_stage(name="source", resources=Resources(cpus=0.5))
    def source(task: Any) -> list[int]:
        return list(range(5))

    result = Pipeline("p", [source]).run(streaming())
    assert sorted(result.outputs) == [0, 1, 2, 3, 4]
    assert result.counts["inputs"] == 1


def test_filtering_and_fan_out_are_counted() -> None:
    @processing_stage(resources=Resources(cpus=0.5))
    def fan(task: int) -> list[int] | None:
        if task % 3 == 0:
            return None
        if task % 3 == 1:
            return []
        return [task, task]

    result = Pipeline("p", [fan]).run(streaming(), initial_tasks=range(30))
    assert sorted(result.outputs) == sorted([t for t in range(30) if t % 3 == 2] * 2)
    assert result.counts["filtered"] == 20
    assert result.stats["fan"].filtered == 20
    assert result.stats["fan"].tasks_out == 20


@pytest.mark.parametrize("executor_type", [StreamingExecutor, BatchExecutor])
def test_batches_are_full_except_one_remainder(executor_type: type) -> None:
    stage = BatchSizes().with_(batch_size=5)
    result = Pipeline("p", [AddOne(), stage]).run(
        executor_type(LocalBackend(num_cpus=2)), initial_tasks=range(23)
    )
    assert sorted(result.outputs) == [3, 5, 5, 5, 5]


def test_fan_out_2000_into_batch_of_2000_does_not_deadlock() -> None:
    @processing_stage(resources=Resources(cpus=0.5))
    def explode(task: int) -> list[bytes]:
        return [b"x" * 100] * 2000

    gather = BatchSizes().with_(batch_size=2000)
    result = Pipeline("p", [explode, gather]).run(
        streaming(edge_max_tasks=50, edge_max_bytes=10_000), initial_tasks=range(3)
    )
    assert sorted(result.outputs) == [2000, 2000, 2000]


def test_lazy_source_is_consumed_only_as_fast_as_the_pipeline_takes_it() -> None:
    pulled = 0

    def source() -> Iterator[int]:
        nonlocal pulled
        for i in range(200):
            pulled += 1
            yield i

    pipeline = Pipeline("p", [AddOne(), Sleep(0.01).with_(num_workers=1)])
    seen = 0
    max_lead = 0
    with pipeline.stream(streaming(edge_max_tasks=8), initial_tasks=source()) as run:
        for _ in run:
            seen += 1
            max_lead = max(max_lead, pulled - seen)
    assert seen == 200
    # two edges of 8 plus what is in flight: never the whole dataset ahead of the consumer
    assert max_lead <= 40, max_lead


def test_stream_yields_outputs_before_the_run_ends(tmp_path: Any) -> None:
    gate = tmp_path / "go"

    class Gated(ProcessingStage[int, int]):
        """Task 0 passes at once; the others wait until the test has seen an output."""

        resources = Resources(cpus=0.5)

        def process(self, task: int) -> int:
            while task and not gate.exists():
                time.sleep(0.005)
            return task

    run = Pipeline("p", [Gated()]).stream(streaming(), initial_tasks=range(20))
    first = next(run)  # would hang here if outputs were only handed out at the end
    gate.touch()
    rest = list(run)
    assert first == 0 and sorted(rest) == list(range(1, 20))
    assert run.result.counts["outputs"] == 20


def test_closing_a_stream_early_stops_everything() -> None:
    run = Pipeline("p", [Sleep(0.01)]).stream(streaming(), initial_tasks=range(1000))
    assert next(run) is not None
    run.close()
    # the autouse fixture checks that no worker or host process is left


def test_typed_tasks_get_lineage_ids_and_stage_records() -> None:
    @processing_stage(resources=Resources(cpus=0.5))
    def split(task: Task) -> list[Task]:
        return [Task(data=task.data), Task(data=task.data)]

    result = Pipeline("p", [AddOneTask(), split]).run(
        streaming(), initial_tasks=[Task(data=i) for i in range(3)]
    )
    ids = sorted(t.task_id for t in result.outputs)
    assert ids == ["0.0", "0.1", "1.0", "1.1", "2.0", "2.1"]
    assert [p.stage for p in result.outputs[0].stage_perf] == ["split"]


class AddOneTask(ProcessingStage[Task, Task]):
    resources = Resources(cpus=0.5)

    def process(self, task: Task) -> Task:
        task.data += 1
        return task


def test_autoscaler_moves_workers_to_the_bottleneck() -> None:
    pipeline = Pipeline("p", [Sleep(0.005).with_(name="fast"), Sleep(0.05).with_(name="slow")])
    result = pipeline.run(streaming(autoscale_interval_s=0.2), initial_tasks=range(120))
    assert len(result.outputs) == 120
    assert result.stats["slow"].peak_workers > result.stats["fast"].peak_workers
    assert result.stats["slow"].peak_workers >= 4


def test_pinned_stage_keeps_its_count() -> None:
    pipeline = Pipeline("p", [Sleep(0.005).with_(name="pinned", num_workers=3), Sleep(0.02)])
    result = pipeline.run(streaming(), initial_tasks=range(60))
    assert result.stats["pinned"].peak_workers == 3


def test_batch_executor_runs_one_stage_at_a_time() -> None:
    class Stamp(ProcessingStage[Any, Any]):
        resources = Resources(cpus=0.25)

        def process(self, task: Any) -> Any:
            return (*task, (self.name, time.monotonic()))

    pipeline = Pipeline("p", [Stamp().with_(name="a"), Stamp().with_(name="b")])
    result = pipeline.run(BatchExecutor(LocalBackend(num_cpus=2)), initial_tasks=[()] * 20)
    last_a = max(t[0][1] for t in result.outputs)
    first_b = min(t[1][1] for t in result.outputs)
    assert last_a <= first_b
    streamed = pipeline.run(streaming(), initial_tasks=[()] * 20)
    assert len(streamed.outputs) == len(result.outputs) == 20


#: a script's own stage, as a user writes one (no ``if __name__ == "__main__"`` guard)
SQUARE = (
    "from conveyor import Pipeline, ProcessingStage, Resources\n"
    "from conveyor.backends import LocalBackend\n"
    "from conveyor.executors import StreamingExecutor\n"
    "class Square(ProcessingStage):\n"
    "    resources = Resources(cpus=0.5)\n"
    "    def process(self, x):\n"
    "        return x * x\n"
)


def test_stage_defined_in_a_script_main_without_guard(tmp_path: Any) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        SQUARE + "result = Pipeline('s', [Square()]).run(\n"
        "    StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(5))\n"
        "print(sorted(result.outputs))\n"
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == ["[0, 1, 4, 9, 16]"]


def test_streaming_runs_stages_that_only_fit_one_at_a_time_on_cpus() -> None:
    stages = [
        processing_stage(lambda x: x + 1, name=f"s{i}", resources=Resources(cpus=1))
        for i in range(3)
    ]
    result = Pipeline("p", stages).run(streaming(), initial_tasks=range(20))
    assert sorted(result.outputs) == [i + 3 for i in range(20)]


def test_an_executor_runs_one_pipeline_at_a_time() -> None:
    """A second run on an executor whose stream was still open took the backend from under
    it: the first then died on an AssertionError, its outputs lost."""
    executor = StreamingExecutor(LocalBackend(num_cpus=1))
    pipeline = Pipeline("p", [AddOne()])
    with pipeline.stream(executor, range(20)) as first:
        assert next(first) in range(1, 21)
        with pytest.raises(RuntimeError, match="still running pipeline 'p'"):
            pipeline.run(executor, range(3))
        assert len([next(first), *first]) == 19  # the first run goes on, whole
    assert sorted(pipeline.run(executor, range(3)).outputs) == [1, 2, 3]  # then the next


def test_a_stream_dropped_unfinished_stops_its_workers_and_frees_its_executor() -> None:
    """The executor kept it alive: its workers ran until the interpreter exited, and the
    next run on that executor was refused as if the stream were still in use."""
    import gc

    import psutil

    executor = StreamingExecutor(LocalBackend(num_cpus=1))
    pipeline = Pipeline("p", [AddOne()])
    stream = pipeline.stream(executor, range(200))
    assert next(stream) in range(1, 201)
    workers = psutil.Process().children(recursive=True)
    assert workers
    del stream
    gc.collect()
    time.sleep(0.5)
    assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert sorted(pipeline.run(executor, range(3)).outputs) == [1, 2, 3]


def test_a_script_leaving_a_stream_open_exits_cleanly(tmp_path: Path) -> None:
    """Its stream was closed as the interpreter tore its modules down: a traceback
    ("Exception ignored in: <generator object Controller._run ...>") on every such exit."""
    import subprocess
    import sys

    script = tmp_path / "open.py"
    script.write_text(
        SQUARE + "executor = StreamingExecutor(LocalBackend(num_cpus=2))\n"
        "stream = Pipeline('s', [Square()]).stream(executor, initial_tasks=range(1000))\n"
        "print(next(stream) >= 0)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True" and "Exception ignored" not in out.stderr, out.stderr


class IterOut(ProcessingStage[int, int]):
    def process(self, task: int) -> Iterator[int]:
        return iter(range(task))  # an iterator, not a generator


class MapBatch(ProcessingStage[int, int]):
    batch_size = 4

    def process_batch(self, tasks: list[int]) -> Iterator[int]:
        return map(lambda t: t * 10, tasks)


def test_a_stage_returning_any_iterator_gives_its_items() -> None:
    """The hints say an iterator; only generators were unrolled: ``iter(...)`` from
    ``process`` went on as one output, ``map(...)`` from ``process_batch`` failed."""
    assert IterOut().process_batch([2, 3]) == [0, 1, 0, 1, 2]
    result = Pipeline("p", [IterOut(), MapBatch()]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=[2, 3]
    )
    assert result.ok, result.failures
    assert sorted(result.outputs) == [0, 0, 10, 10, 20]


class FileOut(ProcessingStage[int, Any]):
    def process(self, task: int) -> Any:
        import io

        return io.BytesIO(b"line1\nline2\n")  # an iterator of lines, and one output


def test_a_file_a_stage_returns_is_one_output_not_its_lines() -> None:
    assert len(FileOut().process_batch([1])) == 1
    result = Pipeline("p", [FileOut()]).run(
        StreamingExecutor(LocalBackend(num_cpus=1)), initial_tasks=[1, 2]
    )
    assert result.ok and [o.read() for o in result.outputs] == [b"line1\nline2\n"] * 2
