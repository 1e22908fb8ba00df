"""How many CPU threads a batch may use: its stage's CPUs, or more while cores sit idle.

A stage's workers are sized for the steady state, when every core is busy with some stage.
At the start of a run (a few items in flight, the stages behind them still empty) and at
its end, cores of the budget are idle while a stage that could use them (a model, an
encoder) runs on one thread; the first output then takes as long as the stages'
single-threaded time. So while the run fills and while a stage drains (the controller
decides when), a batch sent to an idle worker gets the node's cores that no busy worker
holds, up to what its stage says it can use (``ProcessingStage.max_threads``). Not in
between: a core idle at one dispatch is soon another stage's, and a library on two threads
often spends more CPU time per item than on one. A batch already running with more threads
finishes with them (the cores are then briefly shared).
"""

from __future__ import annotations

import math


def batch_threads(
    own_cpus: float, max_threads: int | None, node_cpus: float, busy_cpus: float
) -> int:
    """Threads for a batch sent to an idle worker of a stage declaring ``own_cpus``.

    ``node_cpus`` is the node's CPU budget and ``busy_cpus`` what the workers already
    running a batch there hold (this one not included). At least the stage's own CPUs
    (rounded, one at least); more only for a stage that declares ``max_threads``, never
    beyond it, and only the whole idle cores (a half-idle core rounds to one: light stages
    declare fractions of a core they only use in bursts).
    """
    own = max(1, round(own_cpus))
    if max_threads is None or max_threads <= own:
        return own
    spare = math.floor(node_cpus - busy_cpus - own_cpus + 0.5)
    return own + max(0, min(spare, max_threads - own))
