"""Payloads lost with a node: the inputs they were are made again from their source tasks.

Deterministic on the virtual clock: ``VirtualBackend(lose=...)`` makes chosen outputs vanish
once, as a node leaving the cluster takes its object store along; a worker reading one fails
with ``ErrorInfo.lost``. ``node_fails`` loses everything a node stores from a given time on,
before it is seen to leave.
"""

from __future__ import annotations

import math
from typing import Any

from conveyor import Pipeline, ProcessingStage, Resources
from conveyor.engine.controller import FORGIVEN_LOSSES, SUSPECT_NODE_S
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.result import RunResult
from tests.engine.virtual_backend import VirtualBackend


class Times(ProcessingStage[int, int]):
    resources = Resources(cpus=1)

    def __init__(self, name: str, factor: int) -> None:
        self.name = name
        self.factor = factor

    def process(self, task: int) -> int:
        return task * self.factor


SEEN: set[int] = set()  # inputs Split has had, by any of its workers (all in this process)


class Split(ProcessingStage[int, int]):
    """Fan-out: three children per input; ``unsteady`` gives one child on a second sight."""

    resources = Resources(cpus=1)

    def __init__(self, name: str = "split", unsteady: bool = False) -> None:
        self.name = name
        self.unsteady = unsteady
        SEEN.clear()

    def process(self, task: int) -> list[int]:
        again = task in SEEN
        SEEN.add(task)
        if self.unsteady and again:
            return [task]
        return [task, task + 1, task + 2]


class LosingBackend(VirtualBackend):
    payloads_can_be_lost = True


def stages(unsteady: bool = False) -> list[ProcessingStage[Any, Any]]:
    return [Times("ten", 10), Split(unsteady=unsteady), Times("one", 1)]


def expected(n: int) -> list[int]:
    return sorted(y for x in range(n) for y in (10 * x, 10 * x + 1, 10 * x + 2))


def run(backend: VirtualBackend, n: int = 10, **kw: Any) -> RunResult:
    return Pipeline("p", stages(**kw)).run(StreamingExecutor(backend), initial_tasks=range(n))


def test_lost_inputs_are_made_again_from_their_sources() -> None:
    # "3" is ten's output (split's input); "5.1" a fan-out child (one's input)
    backend = LosingBackend(cpus=3, lose={("ten", "3"), ("split", "5.1")})
    result = run(backend)
    assert sorted(result.outputs) == expected(10)  # nothing lost, nothing twice
    assert result.failures == []
    stats = result.stats
    assert stats["split"].recovered == 1 and stats["one"].recovered == 1
    assert stats["ten"].recovered == 0
    # the source of each lost input ran again through the stages before it, alone
    assert stats["ten"].tasks_in == 10 + 2
    assert stats["split"].tasks_in == 10 + 1
    assert stats["one"].tasks_in == 30
    assert stats["split"].tasks_out == 30  # the children a recomputation dropped are not counted
    assert result.counts["outputs"] == 30 and result.counts["failed"] == 0


def test_a_finished_stage_takes_work_again_for_a_late_loss() -> None:
    """The last input of a fast stage is lost while a slow stage is still far behind: the
    fast stage, done and without workers by then, gets a worker back to make it again."""
    backend = LosingBackend(
        cpus=3, service_s={"ten": 0.01, "split": 0.5, "one": 0.01}, lose={("ten", "9")}
    )
    result = run(backend)
    assert sorted(result.outputs) == expected(10)
    assert result.failures == []
    ten_starts = [t for t, name in backend.starts if name == "ten"]
    assert len(ten_starts) >= 2  # a new worker for the recomputation
    assert result.stats["split"].recovered == 1


def test_the_same_holds_stage_at_a_time() -> None:
    backend = LosingBackend(cpus=3, lose={("ten", "4"), ("split", "7.2")})
    result = Pipeline("p", stages()).run(BatchExecutor(backend), initial_tasks=range(10))
    assert sorted(result.outputs) == expected(10)
    assert result.failures == []


def test_a_recomputation_that_makes_something_else_is_a_recorded_failure() -> None:
    """A stage that answers differently the second time cannot make the lost child again:
    that one input is recorded (named, with the reason); every other one comes through."""
    backend = LosingBackend(cpus=3, lose={("split", "5.2")})
    result = run(backend, unsteady=True)
    assert len(result.failures) == 1
    failure = result.failures[0]
    assert (failure.stage, failure.task, failure.error_type) == ("one", "5.2", "PayloadLost")
    assert "did not make it" in failure.message
    assert sorted(result.outputs) == sorted(set(expected(10)) - {52})


def test_without_lineage_a_lost_input_fails_at_once() -> None:
    """A backend that does not keep sources (none of the single-machine ones loses payloads):
    the lost input is recorded at its first failure alone, not retried in vain."""
    backend = VirtualBackend(cpus=3, lose={("ten", "3")})
    result = run(backend)
    assert [(f.stage, f.task, f.attempts) for f in result.failures] == [("split", "3", 1)]
    assert len(result.outputs) == 27


# -- a node dying unseen ----------------------------------------------------------------
def test_a_node_that_lost_a_payload_gets_no_recomputation_until_it_leaves() -> None:
    """Node "b" dies at 0.1 s but is seen to leave only at 0.5 s (Ray takes tens of seconds
    to declare a node dead): meanwhile its workers look alive and everything stored there is
    lost when read. Once a loss names "b", work goes to "a": a recomputation sent to "b" would
    be lost again, and three such losses used to fail the input."""
    backend = LosingBackend(node_cpus={"a": 6, "b": 2}, node_fails={"b": (0.1, 0.5)})
    stream = Pipeline("p", stages()).stream(StreamingExecutor(backend), range(40))
    controller = stream._controller
    suspected: set[str] = set()
    outputs: list[int] = []
    with stream:
        for out in stream:
            outputs.append(out)
            suspected.update(controller._suspect_nodes)
    result = stream.result
    assert result.failures == []
    assert sorted(outputs) == expected(40)  # every input once
    assert suspected == {"b"}
    assert not controller._suspect_nodes  # forgotten once it left
    assert result.stats["one"].recovered >= 1  # payloads on "b" were lost and made again
    assert sum(s.worker_deaths for s in result.stats.values()) >= 1  # "b" left, seen late


class WatchedBackend(LosingBackend):
    """Notes, per worker started, its node and the nodes the controller suspected then."""

    controller: Any = None

    def start_worker(self, worker_id: str, stage: Any, placement: Any) -> None:
        suspects = set(self.controller._suspect_nodes) if self.controller else set()
        self.placed.append((placement.node_id, suspects))
        super().start_worker(worker_id, stage, placement)


def test_new_workers_go_elsewhere_while_a_node_is_suspect() -> None:
    """Node "b" has the most CPUs, so new workers would go there; once it lost a payload (and
    before it is seen to leave) they go to "a" instead."""
    backend = WatchedBackend(
        node_cpus={"a": 4, "b": 8},
        node_fails={"b": (0.3, 3.0)},
        service_s={"ten": 0.05, "split": 0.05, "one": 0.2},
    )
    backend.placed = []
    stream = Pipeline("p", stages()).stream(StreamingExecutor(backend), range(200))
    backend.controller = stream._controller
    with stream:
        outputs = list(stream)
    assert sorted(outputs) == expected(200) and stream.result.failures == []
    before = [node for node, suspects in backend.placed if not suspects]
    during = [node for node, suspects in backend.placed if "b" in suspects]
    assert "b" in before  # the preferred node while trusted
    assert during and set(during) == {"a"}


def test_a_loss_on_a_single_node_cluster_does_not_stall_it() -> None:
    """With no other node the suspect one still gets the work (it is all there is)."""
    backend = LosingBackend(node_cpus={"only": 3}, lose={("ten", "3"), ("split", "5.1")})
    result = run(backend)
    assert result.failures == []
    assert sorted(result.outputs) == expected(10)
    assert result.stats["split"].recovered == 1 and result.stats["one"].recovered == 1


def test_a_loss_blamed_on_its_node_spends_no_attempt() -> None:
    """The input is not at fault: even with ``max_attempts=1`` it is made again."""
    backend = LosingBackend(node_cpus={"a": 2, "b": 2}, lose={("ten", "3"), ("split", "5.1")})
    executor = StreamingExecutor(backend, max_attempts=1)
    result = Pipeline("p", stages()).run(executor, initial_tasks=range(10))
    assert result.failures == []
    assert sorted(result.outputs) == expected(10)


def test_a_node_that_keeps_losing_everything_ends_the_loop() -> None:
    """The only node loses all it stores and never leaves: each input is made again
    ``FORGIVEN_LOSSES`` times for free, then spends its attempts and is recorded."""
    backend = LosingBackend(node_cpus={"only": 3}, node_fails={"only": (0.0, math.inf)})
    result = run(backend, n=4)
    assert result.outputs == []
    assert [(f.stage, f.attempts) for f in result.failures] == [("split", 3)] * 4
    assert result.stats["ten"].tasks_in == 4 * (1 + FORGIVEN_LOSSES + 2)


def test_a_suspect_node_that_stays_is_trusted_again_after_a_while() -> None:
    """One loss, and the node never leaves: it is avoided for ``SUSPECT_NODE_S``, then fed
    again like any other."""
    backend = LosingBackend(
        node_cpus={"a": 2, "b": 2},
        service_s={"ten": 0.2, "split": 0.2, "one": 0.2},
        lose={("ten", "0")},
    )
    stream = Pipeline("p", stages()).stream(StreamingExecutor(backend), range(300))
    controller = stream._controller
    marked: dict[str, float] = {}
    cleared = None
    outputs: list[int] = []
    with stream:
        for out in stream:
            outputs.append(out)
            for node, t in controller._suspect_nodes.items():
                marked.setdefault(node, t)
            if marked and cleared is None and not controller._suspect_nodes:
                cleared = backend.clock
    assert sorted(outputs) == expected(300) and stream.result.failures == []
    [(node, since)] = marked.items()
    assert cleared is not None and SUSPECT_NODE_S <= cleared - since < SUSPECT_NODE_S + 1
    assert backend.clock > cleared + 10  # the run went on well past it ...
    there = {w for w, n in backend.worker_node.items() if n == node}
    later = [t for t, w in backend.batch_starts if w in there and t > cleared]
    assert len(later) > 100  # ... and the node had its share of the work again
