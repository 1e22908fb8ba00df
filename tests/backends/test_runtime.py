"""What every backend's workers do around a stage's code: tidying memory, timing batches."""

from __future__ import annotations

import gc
import itertools
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any

import pytest

from conveyor.backends import core_wait, runtime
from conveyor.backends.runtime import COLLECT_AGAIN_BYTES, BatchClock, Tidier, collect_cycles
from conveyor.tasks.base import Task


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@dataclass
class Num(Task[list[int]]):
    """A plain task for the lineage-id tests."""


def test_tidying_frees_the_cycles_a_task_left_behind() -> None:
    tidier = Tidier()
    try:
        for _ in range(2):  # after the first task (which also freezes) and after later ones
            a, b = Node(), Node()
            a.other, b.other = b, a
            alive = weakref.ref(a)
            del a, b
            tidier.after(10.0)
            assert alive() is None
    finally:
        gc.unfreeze()


def test_what_the_first_task_built_to_stay_is_frozen_after_it() -> None:
    """A module the first task imported (here: a cache it filled) is left out of every later
    collection; what it left as garbage is freed, not frozen."""
    tidier = Tidier()
    cache = [Node() for _ in range(1000)]  # kept by the stage, as a lazily imported module
    garbage = Node()
    garbage.other = garbage
    gone = weakref.ref(garbage)
    del garbage
    before = gc.get_freeze_count()
    try:
        tidier.after(0.1)
        assert gone() is None
        assert gc.get_freeze_count() >= before + len(cache)
        frozen = gc.get_freeze_count()
        tidier.after(0.1)  # only once
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_each_step_takes_a_bounded_share_of_the_busy_time() -> None:
    runs: list[str] = []

    def slow() -> None:  # costs at least 10 ms: runs again only after 10 ms / SHARE busy
        runs.append("slow")
        time.sleep(0.01)

    tidier = Tidier([slow, lambda: runs.append("quick")])
    for _ in range(5):
        tidier.after(0.3)  # 1.5 s busy in all: under 10 ms / 0.005 = 2 s
    assert runs.count("slow") == 1
    assert runs.count("quick") == 4  # after each task but the first, which froze the heap
    tidier.after(100.0)
    assert runs.count("slow") == 2


def test_a_step_that_found_its_work_worth_it_runs_after_the_next_task_whatever_it_cost():
    runs: list[bool] = []
    worth = iter([True, True, False, True])

    def freeing() -> bool:  # costs 10 ms, as freeing a large cycle's memory may
        runs.append(found := next(worth))
        time.sleep(0.01)
        return found

    tidier = Tidier([freeing])
    for _ in range(5):
        tidier.after(0.3)  # 1.5 s busy: under 10 ms / SHARE, so a budgeted step runs once
    # after each task while it frees a lot (from the second: the first froze the heap), then
    # budgeted: not after the 5th task
    assert runs == [True, True, False]
    tidier.after(100.0)
    assert runs == [True, True, False, True]


def test_collecting_cycles_says_whether_it_freed_enough_to_run_again() -> None:
    gc.collect()
    big = {"data": bytearray(b"\x01") * (2 * COLLECT_AGAIN_BYTES)}  # pages touched
    big["self"] = big
    del big
    assert collect_cycles() is True  # freed 16 MB (what malloc holds, else resident)
    small = Node()
    small.other = small
    del small
    assert collect_cycles() is False
    assert collect_cycles(lambda: None) is False  # nothing to read: budgeted by its time


def test_freezing_leaves_what_setup_built_out_of_later_collections() -> None:
    tidier = Tidier()
    built = [Node() for _ in range(1000)]
    try:
        tidier.freeze()
        assert gc.get_freeze_count() >= len(built)
    finally:
        gc.unfreeze()


def test_a_generator_stage_streams_its_outputs_with_positional_ids() -> None:
    from conveyor import ProcessingStage
    from conveyor.backends.runtime import StageRunner
    from conveyor.cluster import WorkerInfo
    from conveyor.stage import yields_outputs

    class Split(ProcessingStage[int, int]):
        def process(self, task: int) -> Any:
            yield from range(task)

    class Pairs(ProcessingStage[int, tuple[int, int]]):
        def process_batch(self, tasks: list[int]) -> Any:
            yield from itertools.pairwise(tasks)

    runner = StageRunner(Split(), "split", WorkerInfo("w", "split", "n"))
    assert runner.streams and yields_outputs(Split())
    made = runner.stream([2, 0, 1], ["a", "b", "c"])
    assert next(made) == (0, "a.0")  # the first output, before the rest are made
    assert list(made) == [(1, "a.1"), (0, "c.0")]
    assert runner.filtered == 1  # "b" gave nothing
    assert runner.run([2], ["a"]) == ([0, 1], ["a.0", "a.1"], 0)
    pairs = StageRunner(Pairs(), "pairs", WorkerInfo("w", "pairs", "n"))
    assert list(pairs.stream([1, 2, 3], ["x", "y", "z"])) == [((1, 2), "x*0"), ((2, 3), "x*1")]
    assert pairs.filtered == 1
    # a batch of one input: its outputs are its own, like a ``process`` generator's
    assert list(pairs.stream([7], ["x"])) == []
    assert pairs.filtered == 1

    class Twice(ProcessingStage[int, int]):
        def process_batch(self, tasks: list[int]) -> Any:
            for task in tasks:
                yield task
                yield task

    twice = StageRunner(Twice(), "twice", WorkerInfo("w", "twice", "n"))
    assert list(twice.stream([7], ["x"])) == [(7, "x.0"), (7, "x.1")]


def test_a_batch_s_outputs_are_labelled_as_the_input_they_were_made_from_where_known() -> None:
    """The input itself passed on, or a task carrying its input's ``task_id``, is that
    input's; anything else (a small int equal to an input, a new object) is the batch's."""
    from conveyor import ProcessingStage
    from conveyor.backends.runtime import Attribution, StageRunner
    from conveyor.cluster import WorkerInfo

    docs = [Num(data=[i], task_id=f"t{i}") for i in range(3)]
    attribution = Attribution(docs, ["a", "b", "c"])
    assert attribution.label(docs[2]) == "c.0"
    assert attribution.label(Num(data=[], task_id="t0")) == "a.0"
    assert attribution.label(docs[2]) == "c.1"
    assert attribution.filtered() == 1  # "b" gave nothing
    assert attribution.label(Num(data=[])) is None
    assert attribution.filtered() == 0  # 4 outputs of 3 inputs: none known to be filtered
    # two inputs sharing a task_id: an output carrying it is not known to be either's
    twins = [Num(data=[1], task_id="t"), Num(data=[2], task_id="t")]
    assert Attribution(twins, ["a", "b"]).label(Num(data=[], task_id="t")) is None
    # an int that equals an input (Python shares small ints) says nothing of its source
    assert Attribution([1, 2], ["a", "b"]).label(2) is None
    mutable = [{"n": 1}, {"n": 2}]
    assert Attribution(mutable, ["a", "b"]).label(mutable[1]) == "b.0"

    # a list: an input's only output keeps its id; several are numbered; filtered counted
    assert Attribution(docs, ["a", "b", "c"]).labels([docs[2], docs[0]]) == (["c", "a"], 1)
    assert Attribution(docs, ["a", "b", "c"]).labels([docs[1], docs[1]]) == (["b.0", "b.1"], 2)
    assert Attribution(docs, ["a", "b", "c"]).labels([docs[1], 5]) == (["a*0", "a*1"], 1)

    class KeepOdd(ProcessingStage[Num, Num]):
        def process_batch(self, tasks: list[Num]) -> list[Num]:
            return [t for t in tasks if t.data[0] % 2]

    runner = StageRunner(KeepOdd(), "odd", WorkerInfo("w", "odd", "n"))
    batch = [Num(data=[i]) for i in range(4)]
    outputs, labels, filtered = runner.run(batch, ["0", "1", "2", "3"])
    assert labels == ["1", "3"] and filtered == 2
    assert [t.task_id for t in outputs] == ["1", "3"]

    class PerInput(ProcessingStage[Num, Num]):
        def process_batch(self, tasks: list[Num]) -> Any:
            for task in tasks:
                for _ in range(task.data[0]):
                    yield Num(data=[], task_id=task.task_id)

    streamed = StageRunner(PerInput(), "per", WorkerInfo("w", "per", "n"))
    batch = [Num(data=[n], task_id=f"t{n}") for n in (2, 0, 1)]
    assert [label for _, label in streamed.stream(batch, ["x", "y", "z"])] == [
        "x.0",
        "x.1",
        "z.0",
    ]
    assert streamed.filtered == 1


def test_the_heap_is_trimmed_only_once_the_resident_memory_has_grown() -> None:
    from conveyor.backends.runtime import HeapTrim

    resident, trims = [100], []

    def trim(pad: int) -> None:
        trims.append(pad)
        resident[0] -= 30  # what it handed back

    step = HeapTrim(trim, lambda: resident[0], above=50)
    step()  # a worker whose tasks reuse the same memory: nothing to hand back
    resident[0] = 140
    step()
    assert trims == []
    resident[0] = 160  # 60 above the last trim (here: the start)
    step()
    assert trims == [0] and resident[0] == 130
    resident[0] = 170  # 40 above the new base: left alone
    step()
    assert trims == [0]
    resident[0] = 90  # handed back by other means: the base follows it down
    step()
    resident[0] = 145
    step()
    assert trims == [0, 0]


def test_the_heap_is_trimmed_every_time_where_residency_cannot_be_read() -> None:
    from conveyor.backends.runtime import HeapTrim

    trims: list[int] = []
    step = HeapTrim(trims.append, lambda: None, above=50)
    step()
    step()
    assert trims == [0, 0]


def test_a_batch_s_wait_for_a_core_is_never_more_than_its_wall_time_less_its_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel's wait count once ran past the wall time (a niced Ray worker on a loaded
    machine); the work the thread did is kept."""
    waits = iter([10.0, 12.0])  # 2 s of waiting in a batch of about 30 ms
    monkeypatch.setattr(runtime, "core_wait_s", lambda: next(waits))
    clock = BatchClock()
    end = time.thread_time() + 0.02
    while time.thread_time() < end:
        pass
    time.sleep(0.01)
    busy, cpu, queued = clock.read()
    assert cpu >= 0.02 and busy >= 0.03
    assert 0.0 <= queued <= busy - 0.02  # the 20 ms the thread ran are work, not waiting


def test_a_batch_s_wait_for_a_core_as_the_kernel_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    waits = iter([10.0, 10.005])
    monkeypatch.setattr(runtime, "core_wait_s", lambda: next(waits))
    clock = BatchClock()
    time.sleep(0.02)
    assert clock.read()[2] == pytest.approx(0.005)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_reads_its_own_thread_s_wait() -> None:
    """The parent's open file names the parent's thread; a child (a local worker is forked
    from its host) must read its own."""
    core_wait.core_wait_s()  # the parent's file is open
    parent = core_wait._local.fd
    if parent < 0:
        pytest.skip("no /proc/thread-self/schedstat here")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report which task its file names
        try:
            core_wait.core_wait_s()
            os.write(write, os.readlink(f"/proc/self/fd/{core_wait._local.fd}").encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        named = pipe.read().decode()
    os.waitpid(pid, 0)
    assert named == f"/proc/{pid}/task/{pid}/schedstat"
    assert core_wait._local.fd == parent  # the parent's own is kept


def test_a_step_s_wait_for_a_core_is_not_its_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded machine a collection of a millisecond took tens of milliseconds of wall
    time, waiting for a core: budgeted by that, the next came 20 tasks later, and a worker
    whose tasks each left a 40 MB cycle grew to 450 MB."""
    runs: list[str] = []
    waits = iter([0.0, 10.0])  # the step waited 10 s for a core
    monkeypatch.setattr(runtime, "core_wait_s", lambda: next(waits))

    def waited() -> None:
        runs.append("step")
        time.sleep(0.02)  # 20 ms of wall time, all of it "waiting"

    tidier = Tidier([waited])
    tidier.after(0.1)  # the first task: the heap is frozen
    tidier.after(0.1)
    monkeypatch.setattr(runtime, "core_wait_s", lambda: 0.0)
    tidier.after(0.1)  # budgeted by what it cost besides the wait (none): runs again
    assert runs == ["step", "step"]
