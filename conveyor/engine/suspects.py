"""Suspect nodes: nodes that lost a stored payload, avoided for a while.

A payload that cannot be read because its node's store is gone is most often the first sign
of a node leaving the cluster: a cluster manager may take tens of seconds to declare a node
dead, and until then its workers look alive and idle, so work sent there (a recomputation
above all) would be lost again. A suspect node's workers get work only where no other worker
can take it, and new workers go elsewhere (the ``avoid`` of ``Pool`` and ``Ledger``), until
the node leaves the backend's node list or ``SUSPECT_NODE_S`` after its last loss.
"""

from __future__ import annotations

import logging
from collections.abc import Container

log = logging.getLogger(__name__)

#: a node that lost a payload is avoided this long at most (or until it leaves the node list)
SUSPECT_NODE_S = 60.0


class Suspects:
    """The suspect nodes, each with the time of its last loss (``since``), and their set
    (``avoid``: empty nearly always, so that the choices that take it cost nothing more)."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}
        self.avoid: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.since)

    def suspect(self, node: str, now: float) -> None:
        """A payload stored on ``node`` was lost at ``now``."""
        if node not in self.since:
            log.warning(
                "a payload stored on node %s was lost: its workers get work only where no "
                "other worker can take it, until it leaves or for %g s",
                node[:12],
                SUSPECT_NODE_S,
            )
        self.since[node] = now
        self.avoid = frozenset(self.since)

    def keep_present(self, nodes: Container[str]) -> None:
        """The node list changed: a suspect that left it is suspect no more."""
        if self.since:
            self._forget([node for node in self.since if node not in nodes])

    def expire(self, now: float) -> None:
        """Forget the nodes whose last loss is ``SUSPECT_NODE_S`` old at ``now``."""
        if self.since:
            self._forget([n for n, t in self.since.items() if now - t >= SUSPECT_NODE_S])

    def _forget(self, nodes: list[str]) -> None:
        if nodes:
            for node in nodes:
                del self.since[node]
            self.avoid = frozenset(self.since)
