"""Which stage gets a contended CPU first: the ones nearer the end of the pipeline.

When a machine's cores are shared by more busy workers than it has (CPUs shared by time),
the operating system gives each its slice. Left equal, the stages upstream keep taking new
work while the items already in flight wait, so the first output comes late and work in
progress piles up. Lowering the priority of upstream workers
(``nice``) lets a task that has come far finish first; over a whole run every stage still
does all its work, so throughput stays what the cores allow.
"""

from __future__ import annotations

#: the largest nice increment given (the first stage of a long pipeline); the kernel gives a
#: nice-0 process about 1.25 times the CPU share of a nice-1 one, so 10 steps is about 9x
MAX_NICENESS = 10
#: the kernel's largest nice value
NICEST = 19


def stage_niceness(index: int, stages: int, spread: int = MAX_NICENESS) -> int:
    """The nice increment of stage ``index`` of ``stages``: ``spread`` for the first, 0 for
    the last, evenly between (rounded); 0 everywhere with ``spread`` 0 or a single stage."""
    if not 0 <= index < stages:
        raise ValueError(f"stage index {index} out of range for {stages} stages")
    if spread < 0:
        raise ValueError(f"spread must be >= 0, got {spread}")
    if stages < 2:
        return 0
    return round(spread * (stages - 1 - index) / (stages - 1))


def fit_niceness(niceness: int, current: int) -> int:
    """The increment that keeps stages apart in a process already at nice ``current``.

    Ray starts its workers at nice 15, which leaves room for 4 more: where the largest
    increment does not fit, every one is scaled into what is left, so the stages keep their
    order rather than all the upstream ones meeting at 19."""
    niceness = max(0, niceness)
    room = max(0, NICEST - current)
    if room >= MAX_NICENESS:
        return niceness
    return round(min(niceness, MAX_NICENESS) * room / MAX_NICENESS)
