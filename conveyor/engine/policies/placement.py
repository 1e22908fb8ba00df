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
    nodes: Iterable[NodeFree],
    resources: Resources,
    overcommit_cpus: bool = False,
    gpu_cpu_reserve: float = 0.0,
) -> WorkerPlacement | None:
    """Best node and devices for one worker, or ``None`` when it fits nowhere.

    ``overcommit_cpus`` lets the worker exceed a node's free CPUs (GPUs still must fit): a
    stage's *first* worker is placed that way, because a stage without a worker stalls the
    whole stream, while a CPU shared by one more process only slows down.

    ``gpu_cpu_reserve`` CPUs per free GPU are kept away from CPU-only workers, so CPU-hungry
    stages never take the CPUs that GPU workers need to land next to their GPUs.

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
            usable = node.cpus - gpu_cpu_reserve * sum(node.gpu_free)
            if not overcommit_cpus and usable + _EPS < resources.cpus:
                continue
            key = (len(node.gpu_free), -usable)
            placement = WorkerPlacement(node.node_id, (), 0.0)
        if best is None or key < best[0]:
            best = (key, placement)
    return best[1] if best else None


def _state(node: NodeFree) -> tuple[object, ...]:
    """Nodes in the same state are interchangeable for placement."""
    return (
        round(node.cpus, 6),
        tuple(sorted(round(f, 6) for f in node.gpu_free)),
        node.gpu_memory_gb,
    )


@dataclass
class Ledger:
    """Free resources per node, updated as workers are placed and released.

    Nodes are grouped by state (free CPUs, free share of each GPU, GPU memory): placement
    compares one node per group, so a decision on a 1,000-node cluster of a few node types
    costs little more than on one node. ``gpu_cpu_reserve`` is passed to ``choose``.
    """

    nodes: dict[str, NodeFree] = field(default_factory=dict)
    held: dict[str, tuple[Resources, WorkerPlacement]] = field(default_factory=dict)
    gpu_cpu_reserve: float = 0.0
    _groups: dict[tuple[object, ...], dict[str, None]] = field(default_factory=dict)

    def _ungroup(self, node: NodeFree) -> None:
        key = _state(node)
        group = self._groups.get(key)
        if group is not None:
            group.pop(node.node_id, None)
            if not group:
                del self._groups[key]

    def _group(self, node: NodeFree) -> None:
        self._groups.setdefault(_state(node), {})[node.node_id] = None

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
            self._ungroup(self.nodes.pop(node_id))
        for node_id, node in current.items():
            if node_id not in self.nodes:
                fresh = NodeFree.of(node)
                for resources, placement in self.held.values():
                    if placement.node_id == node_id:
                        self._apply(fresh, resources, placement, -1)
                self.nodes[node_id] = fresh
                self._group(fresh)
        return gone

    def totals(self) -> tuple[float, float]:
        cpus = sum(n.total_cpus for n in self.nodes.values())
        gpus = float(sum(len(n.gpu_free) for n in self.nodes.values()))
        return cpus, gpus

    def _move(
        self, node: NodeFree, resources: Resources, placement: WorkerPlacement, sign: int
    ) -> None:
        self._ungroup(node)
        self._apply(node, resources, placement, sign)
        self._group(node)

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
        candidates = [self.nodes[next(iter(group))] for group in self._groups.values()]
        placement = choose(candidates, resources, overcommit_cpus, self.gpu_cpu_reserve)
        if placement is not None:
            self._move(self.nodes[placement.node_id], resources, placement, -1)
            self.held[worker_id] = (resources, placement)
        return placement

    def release(self, worker_id: str) -> None:
        held = self.held.pop(worker_id, None)
        if held is None:
            return
        resources, placement = held
        node = self.nodes.get(placement.node_id)
        if node is not None:
            self._move(node, resources, placement, +1)
