"""Where a worker goes: pack fractional GPU workers, give whole GPUs on one node, keep CPUs free.

``choose`` is pure. ``Ledger`` is the bookkeeping the controller keeps of what it has placed
(no I/O); nodes that disappear are dropped and nodes that join are added by ``refresh``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from conveyor.cluster import NodeInfo
from conveyor.engine.messages import WorkerPlacement
from conveyor.resources import Resources

_EPS = 1e-9


@dataclass
class NodeFree:
    node_id: str
    cpus: float
    gpu_free: list[float]  # free share of each device, 1.0 = untouched
    gpu_memory_gb: float | None = None
    total_cpus: float = 0.0

    @classmethod
    def of(cls, node: NodeInfo) -> NodeFree:
        return cls(node.node_id, node.cpus, [1.0] * node.gpus, node.gpu_memory_gb, node.cpus)


def gpu_share(resources: Resources, node: NodeFree) -> float:
    """The GPU request of one worker on this node: whole count, or a fraction of one device."""
    if resources.gpus >= 1:
        return float(resources.whole_gpus)
    if resources.gpu_memory_gb > 0:
        return resources.gpu_fraction(node.gpu_memory_gb)
    return resources.gpus


def choose(
    nodes: Iterable[NodeFree], resources: Resources, overcommit_cpus: bool = False
) -> WorkerPlacement | None:
    """Best node and devices for one worker, or ``None`` when it fits nowhere.

    ``overcommit_cpus`` lets the worker exceed a node's free CPUs (GPUs still must fit): a
    stage's *first* worker is placed that way, because a stage without a worker stalls the
    whole stream, while a CPU shared by one more process only slows down.

    - whole GPUs: the node with the fewest untouched devices that still has enough (keeps large
      holes for large requests);
    - fractional GPUs: best fit, the most-used device that still has room (packing);
    - CPU-only: the node with the fewest GPUs and most free CPUs, so GPU nodes keep their CPUs
      for the GPU stages that need them.
    """
    best: tuple[tuple[float, ...], WorkerPlacement] | None = None
    for node in nodes:
        if not overcommit_cpus and node.cpus + _EPS < resources.cpus:
            continue
        if resources.gpus >= 1:
            need = resources.whole_gpus
            free = [i for i, f in enumerate(node.gpu_free) if f >= 1.0 - _EPS]
            if len(free) < need:
                continue
            key: tuple[float, ...] = (len(free), -node.cpus)
            placement = WorkerPlacement(node.node_id, tuple(free[:need]), 1.0)
        elif resources.requires_gpu:
            try:
                share = gpu_share(resources, node)
            except ValueError:
                continue
            fits = [(f, i) for i, f in enumerate(node.gpu_free) if f + _EPS >= share]
            if not fits:
                continue
            left, device = min(fits)
            key = (left - share, -node.cpus)
            placement = WorkerPlacement(node.node_id, (device,), share)
        else:
            key = (len(node.gpu_free), -node.cpus)
            placement = WorkerPlacement(node.node_id, (), 0.0)
        if best is None or key < best[0]:
            best = (key, placement)
    return best[1] if best else None


@dataclass
class Ledger:
    """Free resources per node, updated as workers are placed and released."""

    nodes: dict[str, NodeFree] = field(default_factory=dict)
    held: dict[str, tuple[Resources, WorkerPlacement]] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Iterable[NodeInfo]) -> Ledger:
        ledger = cls()
        ledger.refresh(nodes)
        return ledger

    def refresh(self, nodes: Iterable[NodeInfo]) -> list[str]:
        """Adopt the current node list; returns ids of nodes that vanished."""
        current = {n.node_id: n for n in nodes}
        gone = [node_id for node_id in self.nodes if node_id not in current]
        for node_id in gone:
            del self.nodes[node_id]
        for node_id, node in current.items():
            if node_id not in self.nodes:
                fresh = NodeFree.of(node)
                for resources, placement in self.held.values():
                    if placement.node_id == node_id:
                        self._apply(fresh, resources, placement, -1)
                self.nodes[node_id] = fresh
        return gone

    def totals(self) -> tuple[float, float]:
        cpus = sum(n.total_cpus for n in self.nodes.values())
        gpus = float(sum(len(n.gpu_free) for n in self.nodes.values()))
        return cpus, gpus

    @staticmethod
    def _apply(node: NodeFree, resources: Resources, placement: WorkerPlacement, sign: int) -> None:
        node.cpus += sign * resources.cpus
        fractional = len(placement.gpu_ids) == 1 and resources.gpus < 1
        share = placement.gpu_fraction if fractional else 1.0
        for device in placement.gpu_ids:
            node.gpu_free[device] += sign * share

    def allocate(
        self, worker_id: str, resources: Resources, overcommit_cpus: bool = False
    ) -> WorkerPlacement | None:
        placement = choose(self.nodes.values(), resources, overcommit_cpus)
        if placement is not None:
            self._apply(self.nodes[placement.node_id], resources, placement, -1)
            self.held[worker_id] = (resources, placement)
        return placement

    def release(self, worker_id: str) -> None:
        held = self.held.pop(worker_id, None)
        if held is None:
            return
        resources, placement = held
        node = self.nodes.get(placement.node_id)
        if node is not None:
            self._apply(node, resources, placement, +1)
