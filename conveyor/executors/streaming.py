"""StreamingExecutor: every stage runs at once, autoscaled toward the bottleneck."""

from __future__ import annotations

from conveyor.executors.base import Executor


class StreamingExecutor(Executor):
    """All stages run concurrently as worker pools; queues between them are bounded."""

    stage_at_a_time = False
