"""How many CPU threads a batch may use: its stage's CPUs, or more while cores sit idle.

A stage's workers are sized for the steady state, when every core is busy with some stage.
At the start of a run (one video in flight, the stages behind it still empty), at its end,
and between bursts, cores of the budget are idle while a model or an encoder that could use
them runs on one thread; the first clip of a run then takes as long as the slowest stage's
single-threaded time. A batch sent to an idle worker therefore gets the node's cores that
no busy worker holds, up to what its stage says it can use (``ProcessingStage.max_threads``).
Once the other stages have work they hold their cores again, so the steady state is as
before; a batch already running with more threads finishes with them (the cores are then
briefly shared, which the operating system's time slices absorb).
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
