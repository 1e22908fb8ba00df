"""The controller's table of backend events: each kind to its handler, a subclass handled as
its kind, an unknown kind ignored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor import Pipeline, ProcessingStage, Resources
from conveyor.engine.messages import BatchesDone, WorkerReady
from conveyor.executors import StreamingExecutor
from tests.engine.virtual_backend import VirtualBackend


class Pass(ProcessingStage[Any, Any]):
    resources = Resources(cpus=1)

    def __init__(self, name: str) -> None:
        self.name = name

    def process(self, task: Any) -> Any:
        return task


@dataclass(frozen=True, slots=True)
class LateReady(WorkerReady):
    """A backend's own kind of ready event."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """An event no controller knows."""

    worker_id: str


class Chatty(VirtualBackend):
    """Reports every worker ready as ``LateReady`` and a heartbeat with every batch done."""

    def poll(self, timeout: float) -> list[Any]:
        events: list[Any] = []
        for event in super().poll(timeout):
            if type(event) is WorkerReady:
                event = LateReady(event.worker_id, event.setup_s, event.memory_bytes)
            events.append(event)
            if isinstance(event, BatchesDone):
                events.append(Heartbeat(event.worker_id))
        return events


def test_subclassed_and_unknown_events_leave_the_run_as_it_was() -> None:
    pipeline = Pipeline("p", [Pass("a"), Pass("b")])
    plain = pipeline.run(StreamingExecutor(VirtualBackend(cpus=4)), initial_tasks=range(30))
    chatty = pipeline.run(StreamingExecutor(Chatty(cpus=4)), initial_tasks=range(30))
    assert sorted(chatty.outputs) == sorted(plain.outputs) == list(range(30))
    assert chatty.failures == [] and chatty.counts == plain.counts
    assert chatty.wall_s == plain.wall_s  # the same run on the virtual clock
