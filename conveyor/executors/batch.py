"""BatchExecutor: one stage at a time over the whole dataset (the comparison baseline).

Same controller, same failure handling; the only differences are that a stage starts when the
previous one has finished everything, gets the whole budget, and queues are unbounded.
"""

from __future__ import annotations

from conveyor.executors.base import Executor


class BatchExecutor(Executor):
    """Stage-at-a-time execution: materializes every intermediate result."""

    stage_at_a_time = True
