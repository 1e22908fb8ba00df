"""Failure handling on the local backend: retries, poison inputs, dead workers, bad setup."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from conveyor import Pipeline, ProcessingStage, Resources, StageSetupError, UnpicklablePayload
from conveyor.backends import LocalBackend
from conveyor.executors import BatchExecutor, StreamingExecutor
from tests.backends.ray_stages import FlakyOnce, Leaky, Poison

EXECUTORS = [StreamingExecutor, BatchExecutor]


@pytest.mark.parametrize("executor_type", EXECUTORS)
def test_transient_exceptions_are_retried(tmp_path: Path, executor_type: type) -> None:
    result = Pipeline("p", [FlakyOnce(tmp_path)]).run(
        executor_type(LocalBackend(num_cpus=2)), initial_tasks=range(20)
    )
    assert sorted(result.outputs) == list(range(20))
    assert result.failures == []
    assert result.stats["FlakyOnce"].retried == 4


@pytest.mark.parametrize("executor_type", EXECUTORS)
def test_persistent_exception_becomes_one_failure_record(executor_type: type) -> None:
    result = Pipeline("p", [Poison(13)]).run(
        executor_type(LocalBackend(num_cpus=2)), initial_tasks=range(30)
    )
    assert sorted(result.outputs) == [i for i in range(30) if i != 13]
    assert len(result.failures) == 1
    record = result.failures[0]
    assert (record.stage, record.task, record.error_type, record.attempts) == (
        "Poison",
        "13",
        "ValueError",
        3,
    )
    assert "cannot handle 13" in record.message and "cannot handle 13" in str(record)
    assert "raise ValueError" in record.traceback
    assert result.counts == {"inputs": 30, "outputs": 29, "filtered": 0, "failed": 1, "skipped": 0}


@pytest.mark.parametrize("executor_type", EXECUTORS)
def test_a_stage_s_own_max_attempts_wins_over_the_executor_s(
    tmp_path: Path, executor_type: type
) -> None:
    """A stage that calls a paid service tries each input once; its neighbours keep the
    executor's three attempts."""
    once = FlakyOnce(tmp_path / "once").with_(name="once", max_attempts=1)
    (tmp_path / "once").mkdir()
    (tmp_path / "again").mkdir()
    stages = [FlakyOnce(tmp_path / "again").with_(name="again"), once]
    result = Pipeline("p", stages).run(
        executor_type(LocalBackend(num_cpus=2)), initial_tasks=range(10)
    )
    assert sorted(result.outputs) == [i for i in range(10) if i % 5]
    assert sorted((f.stage, f.task, f.attempts) for f in result.failures) == [
        ("once", "0", 1),
        ("once", "5", 1),
    ]
    assert result.stats["again"].retried == 2 and result.stats["once"].retried == 0
    assert "max_attempts: 1" in Pipeline("p", stages).describe()
    with pytest.raises(ValueError, match="max_attempts must be None or an int >= 1, got 0"):
        once.with_(max_attempts=0)


class MarkEach(ProcessingStage[dict, dict]):
    """A generator ``process_batch`` that marks each input in place and yields it; input
    13 always fails, part way through its batch."""

    batch_size = 8

    def process_batch(self, tasks: list[dict]) -> Any:
        for task in tasks:
            if task["n"] == 13:
                raise ValueError("cannot mark 13")
            task["marked"] = True
            yield task


@pytest.mark.parametrize("executor_type", EXECUTORS)
def test_a_batch_generator_failing_part_way_keeps_its_innocent_batch_mates(
    executor_type: type,
) -> None:
    """Its outputs are its inputs, so each is known to be one input's: the batch-mates of
    the poison go on (their outputs sent once), and only the poison fails."""
    result = Pipeline("p", [MarkEach()]).run(
        executor_type(LocalBackend(num_cpus=2)), initial_tasks=[{"n": i} for i in range(20)]
    )
    assert sorted(t["n"] for t in result.outputs) == [i for i in range(20) if i != 13]
    assert [(f.task, f.message) for f in result.failures] == [("13", "cannot mark 13")]
    assert result.counts["failed"] == 1 and result.counts["outputs"] == 19


class Exits(ProcessingStage[int, int]):
    """Input 3 meets a missing file (an ``OSError``, like the worker's own connection
    errors); input 5 calls ``sys.exit(2)``; from a generator with ``stream``."""

    def __init__(self, stream: bool = False) -> None:
        self.stream = stream

    def process(self, task: int) -> int:
        if task == 3:
            open("/nonexistent/conveyor-test-input")  # noqa: SIM115
        if task == 5:
            sys.exit(2)
        return task


class ExitsStreaming(Exits):
    def process(self, task: int) -> Any:
        yield super().process(task)


@pytest.mark.parametrize("stage", [Exits(), ExitsStreaming()], ids=["returns", "yields"])
def test_a_stage_s_oserror_or_sys_exit_fails_its_task_with_what_happened(
    stage: ProcessingStage[int, int],
) -> None:
    """Both stopped the worker: the input failed as "worker stopped with work in flight",
    the missing file's name and the exit code lost."""
    result = Pipeline("p", [stage]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(8)
    )
    assert sorted(result.outputs) == [0, 1, 2, 4, 6, 7]
    failures = {f.task: f for f in result.failures}
    assert failures["3"].error_type == "FileNotFoundError"
    assert "/nonexistent/conveyor-test-input" in failures["3"].message
    assert failures["3"].attempts == 3
    assert failures["5"].error_type == "RuntimeError"
    assert f"stage {stage.name!r} called sys.exit(2) while processing" in failures["5"].message
    assert result.stats[stage.name].worker_deaths == 0


class ForgetsReturn(ProcessingStage[int, int]):
    batch_size = 4

    def process_batch(self, tasks: list[int]) -> list[int]:
        _ = [t * 2 for t in tasks]  # the slip: no return of it
        return None  # type: ignore[return-value]


def test_a_process_batch_that_returns_none_fails_rather_than_filters() -> None:
    """A forgotten ``return`` filtered every input silently; ``[]`` still filters."""
    result = Pipeline("p", [ForgetsReturn()]).run(
        StreamingExecutor(LocalBackend(num_cpus=2), max_attempts=1), initial_tasks=range(4)
    )
    assert result.outputs == [] and result.counts["failed"] == 4
    assert "process_batch must return a list, got NoneType (a missing return?" in str(
        result.failures[0]
    )


class InputsFromSetup(ProcessingStage[dict, dict]):
    """Declares its inputs from what setup made; with ``broken`` its inputs() raises."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken

    def setup(self, worker: Any) -> None:
        self.columns = ["text"]

    def inputs(self) -> list[str]:
        if self.broken:
            raise RuntimeError("no columns known")
        return self.columns

    def process(self, task: dict) -> dict:
        return task


def test_inputs_are_asked_after_setup_and_their_failure_is_said() -> None:
    """inputs() was asked as the worker started, before setup: raising there, the worker
    died and the run said only "worker process died during setup"."""
    executor = StreamingExecutor(LocalBackend(num_cpus=1))
    tasks = [{"text": "a"}, {"text": "b"}]
    assert Pipeline("p", [InputsFromSetup()]).run(executor, tasks).outputs == tasks
    result = Pipeline("p", [InputsFromSetup(broken=True)]).run(executor, tasks)
    assert result.outputs == [] and result.counts["failed"] == 2
    assert [(f.attempts, f.error_type) for f in result.failures] == [(1, "PermanentError")] * 2
    assert "inputs() raised RuntimeError: no columns known" in result.failures[0].message


def test_max_attempts_is_honoured() -> None:
    result = Pipeline("p", [Poison(3)]).run(
        StreamingExecutor(LocalBackend(num_cpus=2), max_attempts=1), initial_tasks=range(5)
    )
    assert [f.attempts for f in result.failures] == [1]
    assert result.stats["Poison"].retried == 0


@pytest.mark.parametrize("executor_type", EXECUTORS)
def test_an_output_that_cannot_be_pickled_fails_its_input_at_once(executor_type: type) -> None:
    """Pickling it again would fail again: one attempt, a message saying what and why,
    and its batch mate goes on."""
    result = Pipeline("p", [Poison(5, how="unpicklable", batch_size=2)]).run(
        executor_type(LocalBackend(num_cpus=2)), initial_tasks=range(10)
    )
    assert sorted(result.outputs) == [i for i in range(10) if i != 5]
    [record] = result.failures
    assert (record.task, record.error_type, record.attempts) == ("5", "UnpicklablePayload", 1)
    assert record.message.startswith("a _thread.lock cannot be pickled to pass it to another")
    assert "what goes between stages (a run's tasks, a stage's outputs) must be data" in (
        record.message
    )


def test_a_task_that_cannot_be_pickled_stops_the_run_saying_what_it_is() -> None:
    """A run's own input is the caller's to fix: the run stops at once, naming its type."""
    with pytest.raises(UnpicklablePayload, match=r"a _thread\.lock cannot be pickled") as caught:
        Pipeline("p", [Poison(-1)]).run(
            StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=[1, threading.Lock()]
        )
    assert caught.value.__notes__ == ["(initial task 1 of pipeline 'p')"]  # which one


def test_exception_in_a_batch_does_not_fail_its_batch_mates() -> None:
    result = Pipeline("p", [Poison(7, batch_size=4)]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(16)
    )
    assert sorted(result.outputs) == [i for i in range(16) if i != 7]
    assert [f.task for f in result.failures] == ["7"]


@pytest.mark.parametrize("executor_type", EXECUTORS)
def test_a_worker_killing_input_is_isolated(executor_type: type) -> None:
    stage = Poison(11, how="kill", batch_size=2)
    result = Pipeline("p", [stage]).run(
        executor_type(LocalBackend(num_cpus=2)), initial_tasks=range(40)
    )
    assert sorted(result.outputs) == [i for i in range(40) if i != 11]
    assert len(result.failures) == 1
    record = result.failures[0]
    assert record.task == "11" and record.error_type == "WorkerDied"
    assert "SIGKILL" in record.message
    # once in its batch of two (no attempt spent: it may have been the other input), then
    # three times alone
    assert result.stats["Poison"].worker_deaths == 4


def test_worker_killed_from_outside_is_replaced_and_nothing_is_lost() -> None:
    class Slow(ProcessingStage[int, int]):
        resources = Resources(cpus=0.5)
        num_workers = 2

        def process(self, task: int) -> int:
            time.sleep(0.05)
            return task

    backend = LocalBackend(num_cpus=2)
    run = Pipeline("p", [Slow()]).stream(StreamingExecutor(backend), initial_tasks=range(40))
    outputs = [next(run)]
    victims = list(backend.worker_pids().values())
    assert victims
    os.kill(victims[0], signal.SIGKILL)
    outputs.extend(run)
    assert sorted(outputs) == list(range(40))
    assert run.result.failures == []
    assert run.result.stats["Slow"].worker_deaths == 1


class BadSetup(ProcessingStage[int, int]):
    resources = Resources(cpus=0.5)

    def setup(self, worker: Any) -> None:
        raise OSError("model weights not found at /nowhere")

    def process(self, task: int) -> int:
        return task


@pytest.mark.parametrize("executor_type", EXECUTORS)
def test_setup_failure_ends_the_run_naming_the_stage(executor_type: type) -> None:
    started = time.monotonic()
    with pytest.raises(StageSetupError) as info:
        Pipeline("p", [ProcessingStageOk(), BadSetup()]).run(
            executor_type(LocalBackend(num_cpus=2)), initial_tasks=range(10)
        )
    assert time.monotonic() - started < 10
    err = info.value
    assert err.stage == "BadSetup"
    assert "model weights not found" in str(err)
    assert "raise OSError" in err.remote_traceback


class ProcessingStageOk(ProcessingStage[int, int]):
    resources = Resources(cpus=0.5)

    def process(self, task: int) -> int:
        return task


def test_unloadable_stage_is_a_setup_error() -> None:
    class Unpicklable(ProcessingStage[int, int]):
        resources = Resources(cpus=0.5)

        def __reduce__(self) -> Any:
            return (_raise_on_load, ())

        def process(self, task: int) -> int:
            return task

    with pytest.raises(StageSetupError, match="cannot be loaded here"):
        Pipeline("p", [Unpicklable()]).run(StreamingExecutor(LocalBackend(num_cpus=2)), [1])


def _raise_on_load() -> None:
    raise ImportError("cannot be loaded here")


def _ctrl_c_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _running(script: Path, *args: str, stderr: Any = None) -> subprocess.Popen[str]:
    """``script`` in a session of its own, started as a terminal starts it (Ctrl-C handled:
    a signal ignored or blocked in this pytest process, by a library an earlier test
    loaded, would be inherited, and Python then installs no KeyboardInterrupt at all: the
    run was seen going on untouched in full runs of the suite, never alone), once it has
    printed "running"."""
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc


def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    script = tmp_path / "long.py"
    script.write_text(
        textwrap.dedent("""
        import faulthandler, signal, sys, time
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where it hangs
        from conveyor import Pipeline, ProcessingStage, Resources
        from conveyor.backends import LocalBackend
        from conveyor.executors import StreamingExecutor

        class Slow(ProcessingStage):
            resources = Resources(cpus=0.25)
            out = sys.argv[1]
            def teardown(self):
                open(self.out + "/teardown-" + str(id(self)), "w").close()
            def process(self, x):
                time.sleep(0.2)
                return x

        run = Pipeline("p", [Slow()]).stream(
            StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(10_000))
        for i, _ in enumerate(run):
            if i == 0:
                print("running", flush=True)
    """)
    )
    stderr = tmp_path / "stderr"
    proc = _running(script, str(tmp_path), stderr=stderr.open("w"))
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert tree, "the run should have worker processes"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # say what was still there and where the driver waits (a slow exit was seen in
            # full runs of the suite on a busy machine, never alone)
            alive = []
            for p in [psutil.Process(proc.pid), *tree]:
                with contextlib.suppress(psutil.Error):
                    alive.append((p.pid, p.status(), " ".join(p.cmdline()[-2:])))
            torn = len(list(tmp_path.glob("teardown-*")))
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(1)
            pytest.fail(
                f"no exit 60 s after Ctrl-C; alive: {alive}; teardowns: {torn}; "
                f"the driver's threads:\n{stderr.read_text()[-6000:]}"
            )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    time.sleep(0.2)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert list(tmp_path.glob("teardown-*")), "workers should tear down on Ctrl-C"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_script_stopped_by_its_group_s_signal_leaves_no_shared_memory(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """A script that does not handle SIGTERM (or SIGHUP: its terminal closed) dies of it with
    every process of its group: the root process died with it, before it removed the run's
    payloads from /dev/shm, which stayed until another run swept them. It is the driver's
    to act on: the root outlives it and cleans up."""
    script = tmp_path / "long.py"
    script.write_text(
        textwrap.dedent("""
        import time
        from conveyor import Pipeline, ProcessingStage, Resources
        from conveyor.backends import LocalBackend
        from conveyor.executors import StreamingExecutor

        class Slow(ProcessingStage):
            resources = Resources(cpus=0.25)
            def process(self, x):
                time.sleep(0.2)
                return bytes(100_000)  # stored in shared memory, not inline

        run = Pipeline("p", [Slow()]).stream(
            StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(10_000))
        for i, _ in enumerate(run):
            if i == 0:
                print("running", flush=True)
    """)
    )
    proc = _running(script)
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert list(Path("/dev/shm").glob(f"conveyor-{proc.pid}-*")), "the run's payloads"
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -sig
    deadline = time.monotonic() + 30
    while list(Path("/dev/shm").glob(f"conveyor-{proc.pid}-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list(Path("/dev/shm").glob(f"conveyor-{proc.pid}-*"))
    # the root removes the payloads, then exits (a moment later under load)
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


class StopsItsOwnProcess(ProcessingStage[int, int]):
    """Starts a process where a stage may (setup_on_node in its host, setup and process in
    a worker) and tells it to stop, as a stage that runs a tool under a deadline does."""

    resources = Resources(cpus=0.5)

    def __init__(self, out: str) -> None:
        self.out = out

    def _stop_one(self, where: str) -> None:
        proc = subprocess.Popen(["sleep", "60"])
        proc.terminate()
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "ignored SIGTERM"
        Path(self.out, where).write_text(str(code))

    def setup_on_node(self, node: Any, worker: Any) -> None:
        self._stop_one("setup_on_node")

    def process(self, task: int) -> int:
        self._stop_one("process")
        return task


def test_what_a_stage_starts_stops_when_told(tmp_path: Path) -> None:
    """The local backend's root and hosts leave SIGTERM and SIGHUP to the driver: a process
    started in setup_on_node inherited the ignoring, and Popen.terminate() did nothing."""
    stage = StopsItsOwnProcess(str(tmp_path))
    Pipeline("p", [stage]).run(StreamingExecutor(LocalBackend(num_cpus=1)), [1])
    got = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert got == {"setup_on_node": str(-signal.SIGTERM), "process": str(-signal.SIGTERM)}


def test_permanent_error_fails_at_once_without_hurting_batch_mates() -> None:
    from conveyor import PermanentError

    class Strict(ProcessingStage[int, int]):
        resources = Resources(cpus=0.5)
        batch_size = 4

        def process(self, task: int) -> int:
            if task == 5:
                raise PermanentError(f"record {task} is malformed")
            return task

    result = Pipeline("p", [Strict()]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(12)
    )
    assert sorted(result.outputs) == [i for i in range(12) if i != 5]
    (record,) = result.failures
    # in its batch of 4 (not counted: it may have been another input's), then alone: known
    # to be its own, so final at its first attempt
    assert (record.task, record.error_type, record.attempts) == ("5", "PermanentError", 1)


def test_monitors_hear_the_end_of_a_run_that_was_stopped_early() -> None:
    ended = []

    class Recorder:
        def on_start(self, pipeline: str, stages: list[str]) -> None:
            pass

        def on_tick(self, snapshot: Any) -> None:
            pass

        def on_end(self, result: Any) -> None:
            ended.append(result)

    class Slow(ProcessingStage[int, int]):
        resources = Resources(cpus=0.5)

        def process(self, task: int) -> int:
            time.sleep(0.01)
            return task

    executor = StreamingExecutor(LocalBackend(num_cpus=2), monitors=[Recorder()])
    run = Pipeline("p", [Slow()]).stream(executor, initial_tasks=range(1000))
    next(run)
    run.close()
    assert len(ended) == 1 and ended[0].completed is False and ended[0] is run.result
    with pytest.raises(StageSetupError):
        Pipeline("p", [BadSetup()]).run(executor, initial_tasks=range(3))
    assert len(ended) == 2 and ended[1].completed is False


@pytest.mark.parametrize("executor_type", EXECUTORS)
def test_a_hung_input_times_out_and_its_batch_neighbours_go_on(executor_type: type) -> None:
    stage = Poison(5, how="hang", batch_size=3).with_(timeout_s=2)
    started = time.monotonic()
    result = Pipeline("p", [stage]).run(
        executor_type(LocalBackend(num_cpus=2), max_attempts=2), initial_tasks=range(12)
    )
    assert sorted(result.outputs) == [i for i in range(12) if i != 5]
    [failure] = result.failures
    assert (failure.task, failure.error_type, failure.attempts) == ("5", "TaskTimeout", 2)
    assert "'Poison'" in failure.message and "timeout_s=2" in failure.message
    stats = result.stats["Poison"]
    assert stats.timeouts == 3 and stats.worker_deaths == 3  # in its batch, then twice alone
    assert time.monotonic() - started < 30  # three timeouts of 2 s, not an hour's sleep


def _unpickle_fails() -> None:
    raise ValueError("unpickle boom")


class CannotBeReadBack:
    """Pickles, but its unpickling raises."""

    def __reduce__(self) -> Any:
        return (_unpickle_fails, ())


class PicklingRaises:
    def __reduce__(self) -> Any:
        raise RuntimeError("reduce boom")


class Unspeakable(Exception):
    def __str__(self) -> str:
        raise ZeroDivisionError("no words")


class OddFailures(ProcessingStage[int, Any]):
    """Input 1: an exception whose message cannot be made; 2: KeyboardInterrupt raised; 3: an
    output that cannot be read back; 4: an output whose pickling raises; 5: a 10 MB message;
    6: a forked child that returns (as the worker would) instead of exiting."""

    def process(self, task: int) -> Any:
        if task == 1:
            raise Unspeakable()
        if task == 2:
            raise KeyboardInterrupt("kbi")
        if task == 3:
            return CannotBeReadBack()
        if task == 4:
            return PicklingRaises()
        if task == 5:
            raise ValueError("m" * 10_000_000)
        if task == 6 and os.fork() == 0:
            return -task
        return task


class Passes(ProcessingStage[Any, Any]):
    def process(self, task: Any) -> Any:
        return task


@pytest.mark.parametrize("last", [True, False], ids=["last-stage", "then-another"])
def test_odd_failures_are_recorded_for_their_input_and_the_run_goes_on(last: bool) -> None:
    """Each of these killed the worker ("worker stopped with work in flight", the error lost),
    raised out of the run with every other output lost, answered for the worker, or kept
    megabytes per record."""
    stages: list[ProcessingStage[Any, Any]] = [OddFailures()] if last else [OddFailures(), Passes()]
    result = Pipeline("p", stages).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(8)
    )
    assert sorted(result.outputs) == [0, 6, 7]
    failures = {f.task: f for f in result.failures}
    assert sorted(failures) == ["1", "2", "3", "4", "5"]
    assert failures["1"].error_type == "Unspeakable"
    assert "could not be made: ZeroDivisionError('no words')" in failures["1"].message
    assert (failures["2"].error_type, failures["2"].message) == ("KeyboardInterrupt", "kbi")
    assert "could not be read back (unpickled)" in failures["3"].message
    assert "unpickle boom" in failures["3"].message and failures["3"].attempts == 1
    assert failures["3"].stage == ("OddFailures" if last else "Passes")
    assert "pickling output 4 (a PicklingRaises) raised RuntimeError: reduce boom" in (
        failures["4"].message
    )
    assert len(failures["5"].message) < 5_000 and "characters left out" in failures["5"].message
    # the traceback holds the message cut alike, not a second copy of 64 KiB
    assert len(failures["5"].traceback) < 10_000, len(failures["5"].traceback)
    assert result.stats["OddFailures"].worker_deaths == 0


class MutatesItsList(ProcessingStage[int, int]):
    batch_size = 4

    def process_batch(self, tasks: list[int]) -> list[int]:
        tasks.append(-1)
        return tasks


def test_a_process_batch_that_returns_its_own_list_grown_keeps_every_output() -> None:
    """Its list was the engine's: every input failed with "zip() argument 2 is shorter"."""
    result = Pipeline("p", [MutatesItsList()]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(8)
    )
    assert result.failures == []
    assert sorted(result.outputs) == [-1, -1, *range(8)]


class RunsOutOfMemoryOnce(ProcessingStage[int, int]):
    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def process(self, task: int) -> int:
        if task == 3 and not self.flag.exists():
            self.flag.touch()
            raise MemoryError()
        return task


def test_a_worker_that_ran_out_of_memory_is_replaced(tmp_path: Path) -> None:
    """It went on, and what the MemoryError left behind failed innocent inputs."""
    result = Pipeline("p", [RunsOutOfMemoryOnce(tmp_path / "once")]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(8)
    )
    assert sorted(result.outputs) == list(range(8)) and result.failures == []
    assert result.stats["RunsOutOfMemoryOnce"].worker_deaths == 1  # it left, and was replaced


def check_fresh_workers(result: Any, out: Path, limit: int, batch_size: int) -> None:
    """Each process ran at most ``limit`` batches and was torn down after them."""
    assert sorted(t for t, _, _ in result.outputs) == list(range(40))
    batches: dict[int, int] = {}
    for _, pid, calls in result.outputs:
        batches[pid] = max(batches.get(pid, 0), calls)
    assert max(batches.values()) <= limit
    assert len(batches) >= 40 / batch_size / limit
    torn = {int(p.name.split("-")[1]): int(p.read_text()) for p in out.glob("teardown-*")}
    # every worker, replaced or stopped at the end, tore down (a replacement started while
    # the last batches went elsewhere may have run none)
    assert {pid: calls for pid, calls in torn.items() if calls} == batches
    stats = result.stats["Leaky"]
    # a planned stop is no death, and what the worker ran before it is no loss (on Ray, its
    # stop was seen before its last call's records, and that batch was retried)
    assert stats.worker_deaths == stats.retried == 0


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_worker_is_replaced_after_max_batches_per_worker(tmp_path: Path, batch_size: int) -> None:
    result = Pipeline("p", [Leaky(tmp_path, limit=4, batch_size=batch_size)]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(40)
    )
    check_fresh_workers(result, tmp_path, 4, batch_size)


class StartsProcesses(ProcessingStage[int, int]):
    """Leaves a fork, a subprocess and one in a session of its own running (marked)."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def process(self, task: int) -> int:
        if task == 1 and os.fork() == 0:
            os.execvp("sleep", ["sleep", f"{self.mark}1"])
        if task == 2:
            subprocess.Popen(["sleep", f"{self.mark}2"])
        if task == 3:
            subprocess.Popen(["sleep", f"{self.mark}3"], start_new_session=True)
        return task


def test_processes_a_stage_starts_end_with_the_run() -> None:
    """They went to init, outlived the run and held the driver's stdout open."""
    mark = f"{10_000 + os.getpid() % 1000}"
    result = Pipeline("p", [StartsProcesses(mark)]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(5)
    )
    assert sorted(result.outputs) == list(range(5))
    deadline = time.monotonic() + 5
    while True:
        left = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[-1].startswith(mark)
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left == []


def test_initial_tasks_that_raise_end_the_run_saying_where_it_came_from() -> None:
    def tasks() -> Any:
        yield from range(5)
        raise ValueError("the listing broke")

    with pytest.raises(ValueError, match="the listing broke") as caught:
        Pipeline("p", [Passes()]).run(
            StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=tasks()
        )
    assert caught.value.__notes__ == ["(raised by the initial_tasks of pipeline 'p' after 5 tasks)"]


class TearsDownForever(ProcessingStage[int, int]):
    def process(self, task: int) -> int:
        return task

    def teardown(self) -> None:
        time.sleep(3600)


def test_a_worker_killed_in_its_teardown_is_said(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was killed without a word: a teardown that flushes buffered rows lost them."""
    monkeypatch.setattr(LocalBackend.shutdown, "__defaults__", (0.5,))  # its grace, shorter
    result = Pipeline("p", [TearsDownForever()]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), initial_tasks=range(3)
    )
    assert sorted(result.outputs) == [0, 1, 2]
    said = "did not stop within 0.5 s of the end of the run (its batch, setup or teardown"
    assert said in capfd.readouterr().err
