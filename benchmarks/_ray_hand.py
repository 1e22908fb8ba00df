"""A Ray actor pipeline written by hand, told the best allocation in advance: a ceiling on Ray.

What an expert writes when they already know how many workers each stage needs: one actor
per worker asking for the stage's CPUs, created from the start (two at a time, round-robin
over the stages, so the first of every stage comes up first and the processes do not all
fight for the cores at once), two calls in flight per actor so it never waits for the
driver, and ObjectRefs passed from stage to stage. No measuring, no autoscaling, no retries.

It shows what Ray itself allows on this machine for a workload: an engine that must
*discover* the allocation (Conveyor's RayBackend) cannot expect to beat it, so its ratio to
this pipeline says how much the engine costs, apart from what Ray costs.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

#: actors being created at once (each is a new process importing Ray and the stage)
START_SLOTS = 2
#: calls queued at each actor
DEPTH = 2


class _HandActor:
    def __init__(self, blob: bytes, paths: list[str], name: str) -> None:
        sys.path[:0] = [p for p in paths if p not in sys.path]
        import cloudpickle

        from conveyor.cluster import WorkerInfo

        self.stage = cloudpickle.loads(blob)
        self.stage.setup(WorkerInfo(name, name, ""))

    def ready(self) -> bool:
        return True

    def run(self, items: list[Any]) -> list[Any]:
        return self.stage.process_batch(items)


def run_hand_pipeline(
    stages: Sequence[Any], allocation: Sequence[int], tasks: Sequence[Any]
) -> Iterator[Any]:
    """Yield the last stage's outputs of ``tasks`` (order not kept), ``allocation[i]``
    actors for stage ``i``. A call of stage 0 takes its ``batch_size`` inputs; a call of a
    later stage takes one upstream call's output list (one ObjectRef) as its batch."""
    import cloudpickle
    import ray

    actor_cls = ray.remote(_HandActor)
    paths = list(sys.path)
    order: list[int] = []
    left = list(allocation)
    while any(left):
        for index, count in enumerate(left):
            if count:
                order.append(index)
                left[index] -= 1
    blobs = [cloudpickle.dumps(stage) for stage in stages]
    pending = deque(order)
    starting: dict[Any, tuple[int, Any]] = {}
    actors: list[Any] = []
    free: list[deque[Any]] = [deque() for _ in stages]  # one entry per open call slot
    size = stages[0].batch_size
    queues: list[deque[Any]] = [deque() for _ in stages]
    queues[0].extend(list(tasks[i : i + size]) for i in range(0, len(tasks), size))
    remaining = len(queues[0])  # one chain of calls per batch of stage 0
    calls: dict[Any, tuple[int, Any]] = {}

    def launch() -> None:
        while pending and len(starting) < START_SLOTS:
            index = pending.popleft()
            stage = stages[index]
            actor = actor_cls.options(num_cpus=stage.resources.cpus).remote(
                blobs[index], paths, stage.name
            )
            actors.append(actor)
            starting[actor.ready.remote()] = (index, actor)

    launch()
    last = len(stages) - 1
    try:
        while remaining:
            for index in range(len(stages)):
                queue, slots = queues[index], free[index]
                while queue and slots:
                    actor = slots.popleft()
                    calls[actor.run.remote(queue.popleft())] = (index, actor)
            ready, _ = ray.wait([*starting, *calls], num_returns=1)
            for ref in ready:
                if ref in starting:
                    index, actor = starting.pop(ref)
                    free[index].extend([actor] * DEPTH)
                    launch()
                    continue
                index, actor = calls.pop(ref)
                free[index].append(actor)
                if index < last:
                    queues[index + 1].append(ref)  # Ray resolves it in the next actor
                    continue
                remaining -= 1
                yield from ray.get(ref)
    finally:
        for actor in actors:
            ray.kill(actor)
