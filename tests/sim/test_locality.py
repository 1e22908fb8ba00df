"""Batches go to a worker on the node that holds their input when one is free."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.backends.simulated import SimulatedBackend
from conveyor.engine.pool import Pool
from conveyor.engine.queues import EdgeQueue
from conveyor.executors import StreamingExecutor
from conveyor.sim import parse_scenario_text

FOUR_NODES = """
name: locality
cluster:
  - {name: n, count: 4, cpus: 8, gpus: 0}
stages:
  - {name: decode, resources: {cpus: 1}, model: {service: {mean: 0.2, kind: exponential}}}
  - {name: embed, resources: {cpus: 1}, model: {service: {mean: 0.2, kind: exponential}}}
source: {tasks: 2000}
"""


class CountingBackend(SimulatedBackend):
    """Counts inputs that a worker found on its own node."""

    local = 0
    remote = 0

    def submit(
        self, worker_id: str, batches: list[tuple[int, list[Any]]], threads: int | None = None
    ) -> None:
        node = self._workers[worker_id].node_id
        for _, handles in batches:
            for handle in handles:
                if handle.node is None:
                    continue
                if handle.node == node:
                    self.local += 1
                else:
                    self.remote += 1
        super().submit(worker_id, batches)


def local_share() -> float:
    scenario = parse_scenario_text(FOUR_NODES)
    backend = scenario.backend(backend_class=CountingBackend)
    assert isinstance(backend, CountingBackend)
    result = scenario.pipeline().run(StreamingExecutor(backend), initial_tasks=range(2000))
    assert result.counts["outputs"] == 2000
    return backend.local / (backend.local + backend.remote)


def test_most_inputs_are_consumed_where_they_were_produced() -> None:
    assert local_share() >= 0.75


def test_without_the_preference_it_would_be_about_one_in_four(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    feedable, take = Pool.feedable, EdgeQueue.take
    monkeypatch.setattr(
        Pool, "feedable", lambda self, depth, node=None, *avoid: feedable(self, depth, None, *avoid)
    )
    monkeypatch.setattr(EdgeQueue, "take", lambda self, count, node=None: take(self, count))
    assert local_share() < 0.4
