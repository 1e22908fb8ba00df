"""How much may queue on each edge between two stages, in tasks and in bytes.

An edge is the queue in front of a stage. Its producer may be given more input only while the
edge, counting what the producer's in-flight batches are expected to add, is under both budgets.
Bytes are what bound memory, so a fan-out of 1 -> 2,000 counts as 2,000 payloads, not one.
One rule breaks the classic fan-in deadlock: while the consumer cannot form a full batch from
what is queued, the producer is never held back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: seconds of its consumer's work an edge should hold: enough to ride out jitter, no more
QUEUE_S = 1.0


@dataclass(frozen=True, slots=True)
class EdgeBudget:
    max_tasks: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class EdgeState:
    queued_tasks: int
    queued_bytes: int
    #: outputs the producer's in-flight batches are expected to add (from measured fan-out)
    expected_tasks: float = 0.0
    expected_bytes: float = 0.0


def edge_budget(
    memory_budget_bytes: int, num_edges: int, max_tasks: int, max_bytes: int | None = None
) -> EdgeBudget:
    """Split the backend's memory budget evenly across edges unless a per-edge cap is given."""
    per_edge = max_bytes if max_bytes is not None else memory_budget_bytes // max(1, num_edges)
    return EdgeBudget(max_tasks=max(1, max_tasks), max_bytes=max(1, per_edge))


def demand_budget(
    budget: EdgeBudget,
    rate_tasks_s: float | None,
    consumer_workers: int,
    batch_size: int,
    producer_batch_s: float = 0.0,
) -> EdgeBudget:
    """Tighten an edge's task budget to what its consumer can use.

    A queue longer than about ``QUEUE_S`` seconds of the pipeline's measured rate at this edge
    only holds memory; at least two full batches per consumer worker keep every worker fed.
    What the producer has in flight at that rate (``rate x producer_batch_s``) is counted
    against the edge by ``may_feed``, so it is added here: a fan-out producer with hundreds
    of outputs in flight must not starve its consumer. Unmeasured edges keep the static
    budget.
    """
    if rate_tasks_s is None or not math.isfinite(rate_tasks_s):
        return budget
    floor = 2 * batch_size * max(1, consumer_workers)
    wanted = max(floor, math.ceil(rate_tasks_s * (QUEUE_S + max(0.0, producer_batch_s))))
    return EdgeBudget(max_tasks=min(budget.max_tasks, wanted), max_bytes=budget.max_bytes)


def may_feed(edge: EdgeState, budget: EdgeBudget, consumer_batch_size: int) -> bool:
    """Whether the producer of ``edge`` may start another batch."""
    if edge.queued_tasks < consumer_batch_size:
        return True
    return (
        edge.queued_tasks + edge.expected_tasks < budget.max_tasks
        and edge.queued_bytes + edge.expected_bytes < budget.max_bytes
    )


#: how far a running generator may get ahead of the controller's consent, in batches of the
#: stage it feeds (one being taken while the next is made) ...
STREAM_WINDOW_BATCHES = 2
#: ... or, where the edge's budgets leave room for more, this share of them: a quick
#: generator is then told to go on once per many outputs, not after each
STREAM_WINDOW_SHARE = 1 / 8


def stream_window(
    consumer_batch_size: int, budget: EdgeBudget, output_bytes: float | None = None
) -> int:
    """Outputs one running generator batch may make before it waits to be allowed more
    (``StageSpec.streams``): its consumer's next two batches, or an eighth of the edge's
    budgets where that is more (in tasks, and in bytes once ``output_bytes``, the measured
    size of one output, is known), and never past the edge's task budget. What a paused
    generator holds is one output at most (it waits at its ``yield``)."""
    share = budget.max_tasks * STREAM_WINDOW_SHARE
    if output_bytes:
        share = min(share, budget.max_bytes * STREAM_WINDOW_SHARE / output_bytes)
    wanted = max(STREAM_WINDOW_BATCHES * consumer_batch_size, int(share))
    return max(1, min(wanted, budget.max_tasks))


def stream_grant(
    edge: EdgeState,
    budget: EdgeBudget,
    consumer_batch_size: int,
    outstanding: int,
    window: int,
) -> int:
    """How many more outputs a running generator batch may make, given the ``outstanding``
    ones it is allowed and has not made yet: none while it has more than half its window
    left (one message per half window, not per output), none while ``edge`` — counting
    every running generator's outstanding outputs as expected — is full (``may_feed``, with
    its deadlock rule), else enough to fill its window again."""
    if outstanding > window // 2 or not may_feed(edge, budget, consumer_batch_size):
        return 0
    return window - outstanding
