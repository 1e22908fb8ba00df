"""While a run fills, the work nearest the end of the pipeline gets the cores first.

At the start of a run every stage has a worker, and the stages upstream have far more work
queued than the ones behind them: left alone, their next batches keep the cores busy while
the first item on its way to the end waits for a share of them. Nice values only tilt that
share, so on a machine with fewer cores than busy stages the first output comes long after
a sequential loop, which spends the whole machine on one item, would have made it. So until
the last stage has seen its first task, a batch starts on an idle worker only where the CPUs
held by its own stage and the stages after it leave room for it: a stage nearer the end is
never held back by one before it, and one before it gets only what is left. Batches already
running are not stopped; they just get no successor while later work needs the cores.
Once an output has come through, every stage runs as the autoscaler sized it.
"""

from __future__ import annotations

#: CPU counts are sums of fractions (0.25 CPU stages): this much over still fits
SLACK = 1e-6


def may_start(own_cpus: float, node_cpus: float, held_from_here: float) -> bool:
    """Whether a batch may start on an idle worker of a stage declaring ``own_cpus``.

    ``held_from_here`` is what workers of this stage and of the stages after it hold on
    the node (running batches, their extra threads included); ``node_cpus`` the node's CPU
    budget. With nothing held there it always may (the run must move, even for a stage
    declaring more CPUs than the node has).
    """
    if held_from_here <= 0:
        return True
    return held_from_here + own_cpus <= node_cpus + SLACK
