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
    #: host memory left for workers in bytes (``None``: unknown, not a limit)
    memory: float | None = None
    #: NVDEC and NVENC units left on each device (``None``: unknown, not a limit), and how
    #: many each device has
    nvdec_free: list[float] | None = None
    nvenc_free: list[float] | None = None
    engines_per_gpu: tuple[float | None, float | None] = (None, None)
    group: tuple[object, ...] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, node: NodeInfo) -> NodeFree:
        decs, encs = node.nvdecs_per_gpu, node.nvencs_per_gpu
        return cls(
            node.node_id,
            node.cpus,
            [1.0] * node.gpus,
            node.gpu_memory_gb,
            node.cpus,
            None if node.memory_bytes is None else float(node.memory_bytes),
            None if decs is None else [float(decs)] * node.gpus,
            None if encs is None else [float(encs)] * node.gpus,
            (decs, encs),
        )

    def fits_memory(self, resources: Resources) -> bool:
        return self.memory is None or resources.memory_bytes <= self.memory + _EPS

    def engines_fit(self, device: int, resources: Resources) -> bool:
        """Whether ``device`` has the NVDEC and NVENC units ``resources`` asks for free."""
        for free, want in (
            (self.nvdec_free, resources.nvdecs),
            (self.nvenc_free, resources.nvencs),
        ):
            if want > 0 and free is not None and free[device] + _EPS < want:
                return False
        return True

    def engines_untouched(self, device: int) -> bool:
        """No worker holds any of ``device``'s NVDEC or NVENC units."""
        return all(
            free is None or free[device] >= total - _EPS
            for free, total in zip(
                (self.nvdec_free, self.nvenc_free), self.engines_per_gpu, strict=True
            )
            if total is not None
        )


def gpu_share(resources: Resources, node: NodeFree) -> float:
    """The GPU request of one worker on this node: whole count, or a fraction of one device."""
    if resources.gpus >= 1:
        return float(resources.whole_gpus)
    if resources.gpu_memory_gb > 0:
        return resources.gpu_fraction(node.gpu_memory_gb)
    return resources.gpus


_Choice = tuple[NodeFree, tuple[int, ...], float]
_Key = tuple[float, float, float]


def choose(
    nodes: Iterable[NodeFree],
    resources: Resources,
    overcommit_cpus: bool = False,
    gpu_cpu_reserve: float = 0.0,
    overcommit_memory: bool = False,
) -> WorkerPlacement | None:
    """Best node and devices for one worker, or ``None`` when it fits nowhere.

    ``overcommit_cpus`` lets the worker exceed a node's free CPUs (GPUs still must fit): a
    stage's *first* worker is placed that way, because a stage without a worker stalls the
    whole stream, while a CPU shared by one more process only slows down.

    ``gpu_cpu_reserve`` CPUs per free GPU are kept away from CPU-only workers, so CPU-hungry
    stages never take the CPUs that GPU workers need to land next to their GPUs.

    A worker's ``memory_gb`` must fit the node's memory left, unless ``overcommit_memory``
    (again a stage's first worker: one worker too many is slower, a stalled stream is stuck).

    - whole GPUs: the node with the fewest untouched devices that still has enough (keeps large
      holes for large requests);
    - fractional GPUs: best fit, the most-used device that still has room (packing);
    - CPU-only: the node with the fewest GPUs and most free CPUs, so GPU nodes keep their CPUs
      for the GPU stages that need them.
    """
    best, _, _ = _rank(nodes, resources, overcommit_cpus, gpu_cpu_reserve, overcommit_memory)
    if best is None:
        return None
    node, devices, share = best
    return WorkerPlacement(node.node_id, devices, share)


#: added to a CPU worker's key on a node that has not its CPUs to spare: any node that has
#: them comes first, whatever its GPUs
_SHORT = 1e6


def _rank(
    nodes: Iterable[NodeFree],
    resources: Resources,
    overcommit_cpus: bool,
    gpu_cpu_reserve: float,
    overcommit_memory: bool = False,
) -> tuple[_Choice | None, _Key | None, _Key | None]:
    """The best choice for ``choose``, its key, and the runner-up's key (lower is better)."""
    whole = resources.gpus >= 1
    fractional = not whole and resources.requires_gpu
    engines_only = not whole and not fractional and resources.video_engines
    need = resources.whole_gpus
    cpus = resources.cpus
    best_key: _Key | None = None
    second_key: _Key | None = None
    best: _Choice | None = None
    for node in nodes:
        if not overcommit_cpus and node.cpus + _EPS < cpus:
            continue
        if not overcommit_memory and not node.fits_memory(resources):
            continue
        if whole:
            # a worker of whole GPUs holds their decoder and encoder units too
            free = [
                i
                for i, f in enumerate(node.gpu_free)
                if f >= 1.0 - _EPS and node.engines_untouched(i) and node.engines_fit(i, resources)
            ]
            if len(free) < need:
                continue
            key = (float(len(free)), 0.0, -node.cpus)
            choice = (node, tuple(free[:need]), 1.0)
        elif fractional:
            try:
                share = gpu_share(resources, node)
            except ValueError:
                continue
            fits = [
                (f, i)
                for i, f in enumerate(node.gpu_free)
                if f + _EPS >= share and node.engines_fit(i, resources)
            ]
            if not fits:
                continue
            left, device = min(fits)
            # best fit; opening a fresh device, prefer the node with the fewest untouched
            # GPUs, so whole nodes stay free for multi-GPU workers
            untouched = sum(1 for f in node.gpu_free if f >= 1.0 - _EPS)
            key = (left - share, float(untouched), -node.cpus)
            choice = (node, (device,), share)
        elif engines_only:
            # the device without a share of its compute: best fit on its decoder units
            # (then encoder units), so that GPUs with many free stay free for large asks
            room = [
                (_engine_room(node, i, resources), i)
                for i in range(len(node.gpu_free))
                if node.engines_fit(i, resources)
            ]
            if not room:
                continue
            left, device = min(room)
            key = (left, 0.0, -node.cpus)
            choice = (node, (device,), 0.0)
        else:
            usable = node.cpus - gpu_cpu_reserve * sum(node.gpu_free)
            short = usable + _EPS < cpus
            if not overcommit_cpus and short:
                continue
            # a node where it fits first: CPUs shared (``share_cpus``) piled every CPU worker
            # on a GPU-less head while a GPU node's spare CPUs idled; then the fewest GPUs
            key = (float(len(node.gpu_free)) + (_SHORT if short else 0.0), 0.0, -usable)
            choice = (node, (), 0.0)
        if best_key is None or key < best_key:
            second_key = best_key
            best_key, best = key, choice
        elif second_key is None or key < second_key:
            second_key = key
    return best, best_key, second_key


def _engine_room(node: NodeFree, device: int, resources: Resources) -> float:
    """Decoder and encoder units ``device`` would have left (unknown counts as plenty)."""
    left = 0.0
    for free, want in ((node.nvdec_free, resources.nvdecs), (node.nvenc_free, resources.nvencs)):
        left += 1e6 if free is None else free[device] - want
    return left


def _state(node: NodeFree) -> tuple[object, ...]:
    """Nodes in the same state are interchangeable for placement (shares to 1e-6)."""

    def micro(values: list[float]) -> list[int]:
        return [int(v * 1e6 + 0.5) for v in values]

    if node.nvdec_free is None and node.nvenc_free is None:
        devices: tuple[object, ...] = tuple(sorted(micro(node.gpu_free)))
    else:  # each device's compute share with its units: they travel together
        units = [
            micro(free) if free is not None else [-1] * len(node.gpu_free)
            for free in (node.nvdec_free, node.nvenc_free)
        ]
        devices = tuple(sorted(zip(micro(node.gpu_free), *units, strict=True)))
    return (int(node.cpus * 1e6 + 0.5), devices, node.gpu_memory_gb, node.memory)


@dataclass
class Ledger:
    """Free resources per node, updated as workers are placed and released.

    Nodes are grouped by state (free CPUs, free share of each GPU, GPU memory): placement
    compares one node per group, so a decision on a 1,000-node cluster of a few node types
    costs little more than on one node. ``gpu_cpu_reserve`` is passed to ``choose``.
    """

    nodes: dict[str, NodeFree] = field(default_factory=dict)
    held: dict[str, tuple[Resources, WorkerPlacement]] = field(default_factory=dict)
    #: what ``held`` adds up to (``reserved``), kept as workers come and go: summing
    #: thousands of workers at every decision cost more than the decision
    _held_totals: list[float] = field(default_factory=lambda: [0.0, 0.0], repr=False)
    gpu_cpu_reserve: float = 0.0
    #: CPUs are time-shared (``AutoscaleConfig.share_cpus``): any worker may exceed a node's
    #: free CPUs, and CPU-only workers go where the most are free
    share_cpus: bool = False
    _groups: dict[tuple[object, ...], dict[str, None]] = field(default_factory=dict)
    _totals: tuple[float, float] | None = field(default=None, repr=False)

    def _ungroup(self, node: NodeFree) -> None:
        key = node.group
        group = self._groups.get(key) if key is not None else None
        if group is not None:
            group.pop(node.node_id, None)
            if not group:
                del self._groups[key]  # type: ignore[arg-type]
        node.group = None

    def _group(self, node: NodeFree) -> None:
        node.group = _state(node)
        self._groups.setdefault(node.group, {})[node.node_id] = None

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
            self._totals = None
        for node_id, node in current.items():
            if node_id not in self.nodes:
                self._totals = None
                fresh = NodeFree.of(node)
                for resources, placement in self.held.values():
                    if placement.node_id == node_id:
                        self._apply(fresh, resources, placement, -1)
                self.nodes[node_id] = fresh
                self._group(fresh)
        return gone

    def totals(self) -> tuple[float, float]:
        """CPUs and GPUs of all nodes (kept until the node list changes: asked at every
        tick, of hundreds of nodes)."""
        if self._totals is None:
            cpus = float(sum(n.total_cpus for n in self.nodes.values()))
            gpus = float(sum(len(n.gpu_free) for n in self.nodes.values()))
            self._totals = cpus, gpus
        return self._totals

    def engine_totals(self) -> tuple[float | None, float | None]:
        """NVDEC and NVENC units of all GPUs (``None``: some GPU's count is unknown)."""
        found: list[float | None] = []
        for index in (0, 1):
            total: float | None = 0.0
            for node in self.nodes.values():
                per_gpu = node.engines_per_gpu[index]
                if node.gpu_free and per_gpu is None:
                    total = None
                    break
                total += (per_gpu or 0.0) * len(node.gpu_free)  # type: ignore[operator]
            found.append(total)
        return found[0], found[1]

    def total_memory(self) -> float | None:
        """Host memory of all nodes for workers (``None`` if any node's is unknown)."""
        total = 0.0
        for node in self.nodes.values():
            if node.memory is None:
                return None
            total += node.memory
        for resources, placement in self.held.values():
            if placement.node_id in self.nodes:
                total += resources.memory_bytes
        return total

    def resize(self, worker_id: str, resources: Resources) -> None:
        """A placed worker turned out to need other resources (its memory was measured):
        its node's books change, the worker stays where it is."""
        held = self.held.get(worker_id)
        if held is None:
            return
        old, placement = held
        node = self.nodes.get(placement.node_id)
        if node is not None:
            self._ungroup(node)
            self._apply(node, old, placement, +1)
            self._apply(node, resources, placement, -1)
            self._group(node)
        self._hold(worker_id, resources, placement)

    def reserved(self) -> tuple[float, float]:
        """CPUs and GPUs (fractions summed) the placed workers hold."""
        cpus, gpus = self._held_totals
        return max(0.0, cpus), max(0.0, gpus)

    def _hold(self, worker_id: str, resources: Resources, placement: WorkerPlacement) -> None:
        """Book ``worker_id`` as holding ``resources`` at ``placement`` (instead of what it
        held before)."""
        self._unhold(worker_id)
        self.held[worker_id] = (resources, placement)
        self._count(resources, placement, +1)

    def _unhold(self, worker_id: str) -> tuple[Resources, WorkerPlacement] | None:
        held = self.held.pop(worker_id, None)
        if held is not None:
            self._count(*held, -1)
        return held

    def _count(self, resources: Resources, placement: WorkerPlacement, sign: int) -> None:
        fractional = len(placement.gpu_ids) == 1 and resources.gpus < 1
        self._held_totals[0] += sign * resources.cpus
        self._held_totals[1] += sign * (
            placement.gpu_fraction if fractional else len(placement.gpu_ids)
        )

    def _move(
        self, node: NodeFree, resources: Resources, placement: WorkerPlacement, sign: int
    ) -> None:
        self._ungroup(node)
        self._apply(node, resources, placement, sign)
        self._group(node)

    @staticmethod
    def _apply(node: NodeFree, resources: Resources, placement: WorkerPlacement, sign: int) -> None:
        node.cpus += sign * resources.cpus
        if node.memory is not None:
            node.memory += sign * resources.memory_bytes
        fractional = len(placement.gpu_ids) == 1 and resources.gpus < 1
        share = placement.gpu_fraction if fractional else 1.0
        for device in placement.gpu_ids:
            node.gpu_free[device] += sign * share
        for free, want, per_gpu in (
            (node.nvdec_free, resources.nvdecs, node.engines_per_gpu[0]),
            (node.nvenc_free, resources.nvencs, node.engines_per_gpu[1]),
        ):
            if free is None:
                continue
            for device in placement.gpu_ids:
                # whole GPUs hold all their units; a share of one, the units it asked for
                held = want if fractional else (per_gpu or 0.0)
                free[device] += sign * held

    def allocate(
        self, worker_id: str, resources: Resources, overcommit_cpus: bool = False
    ) -> WorkerPlacement | None:
        placed = self.allocate_many([worker_id], resources, overcommit_cpus)
        return placed[0] if placed else None

    def _candidates(self, avoid: frozenset[str]) -> list[NodeFree]:
        """One node per group, a node not in ``avoid`` where the group has one."""
        nodes = []
        for group in self._groups.values():
            if avoid:
                pick = next((n for n in group if n not in avoid), None)
                if pick is None:
                    continue
            else:
                pick = next(iter(group))
            nodes.append(self.nodes[pick])
        return nodes

    def allocate_many(
        self,
        worker_ids: list[str],
        resources: Resources,
        overcommit_first: bool = False,
        avoid: frozenset[str] = frozenset(),
    ) -> list[WorkerPlacement]:
        """Place workers of one shape in turn, as repeated ``allocate`` calls would.

        Stops at the first that fits nowhere. Consecutive workers usually land on the node
        just used (packing); that node is re-ranked alone while it still beats the runner-up
        of the last full comparison, so a cold start that places thousands of workers does
        not compare every node group for each of them. Nodes in ``avoid`` (suspected of
        losing what they store) get a worker only where no other node can take it.
        """
        placed: list[WorkerPlacement] = []
        last: NodeFree | None = None
        bar: _Key | None = None  # the runner-up's key: ``last`` must stay at least as good
        for index, worker_id in enumerate(worker_ids):
            first = overcommit_first and index == 0
            overcommit = self.share_cpus or first
            choice = None
            if last is not None and not overcommit and last.node_id not in avoid:
                alone, key, _ = _rank([last], resources, False, self.gpu_cpu_reserve)
                if alone is not None and (bar is None or (key is not None and key <= bar)):
                    choice = alone
            if choice is None:
                for shunned in (avoid, frozenset()) if avoid else (avoid,):
                    choice, best_key, bar = _rank(
                        self._candidates(shunned),
                        resources,
                        overcommit,
                        self.gpu_cpu_reserve,
                        first,
                    )
                    if choice is not None:
                        break
                if choice is None:
                    break
                if best_key is not None and len(self._groups[choice[0].group]) > 1:  # type: ignore[index]
                    # twins of the chosen node keep its old rank
                    bar = best_key if bar is None else min(bar, best_key)
            node, devices, share = choice
            placement = WorkerPlacement(node.node_id, devices, share)
            self._move(node, resources, placement, -1)
            self._hold(worker_id, resources, placement)
            placed.append(placement)
            last = node
        return placed

    def release(self, worker_id: str) -> None:
        held = self._unhold(worker_id)
        if held is None:
            return
        resources, placement = held
        node = self.nodes.get(placement.node_id)
        if node is not None:
            self._move(node, resources, placement, +1)


def fits_nowhere(
    stage: str, resources: Resources, nodes: Iterable[NodeInfo], share_cpus: bool = True
) -> str | None:
    """Why one worker of ``stage`` (asking for ``resources``) fits no node even with the
    cluster empty, as a sentence naming it; ``None`` when it fits some node.

    The engine lets a stage's first worker share CPUs and host memory (``choose``'s
    overcommit), so there only what cannot be shared stops it: GPUs, a GPU's memory, a GPU's
    video engines. Where CPUs are reserved, never shared (``share_cpus=False``: Ray Data's
    actors), CPUs stop it too. Said apart from a pipeline too large for the cluster as a
    whole, since the fix differs: the stage's ``Resources``, not the cluster or the executor.
    """
    why = _lacking(resources, list(nodes), share_cpus)
    if why is None:
        return None
    return f"no node can host a worker of stage {stage!r} ({resources.describe()}): {why}"


def _lacking(resources: Resources, nodes: list[NodeInfo], share_cpus: bool) -> str | None:
    empty = [NodeFree.of(node) for node in nodes]
    if _rank(empty, resources, share_cpus, 0.0, True)[0] is not None:
        return None
    most_cpus = max((node.cpus for node in nodes), default=0.0)
    if not share_cpus and resources.cpus > most_cpus:
        most = f"no node has more than {most_cpus:g}"
        return f"it needs {resources.cpus:g} CPUs on one node and {most}"
    gpu_nodes = [node for node in nodes if node.gpus]
    if not gpu_nodes:
        return "it needs a GPU and no node has one"
    if resources.whole_gpus > max(node.gpus for node in gpu_nodes):
        most = max(node.gpus for node in gpu_nodes)
        return f"it needs {resources.whole_gpus} GPUs on one node and no node has more than {most}"
    if resources.gpu_memory_gb > 0:
        known = [node.gpu_memory_gb for node in gpu_nodes if node.gpu_memory_gb]
        if not known:
            return (
                f"it needs {resources.gpu_memory_gb:g} GB of a GPU's memory and no node says "
                "how much its GPUs have (declare it: gpu_memory_gb=80 on LocalBackend, "
                "RayBackend or RayDataExecutor)"
            )
        if resources.gpu_memory_gb > max(known):
            return (
                f"it needs {resources.gpu_memory_gb:g} GB of one GPU's memory and the largest "
                f"GPU has {max(known):g} GB (ask for whole GPUs with Resources(gpus=N))"
            )
    for kind, want, attr in (
        ("NVDEC", resources.nvdecs, "nvdecs_per_gpu"),
        ("NVENC", resources.nvencs, "nvencs_per_gpu"),
    ):
        counts = [getattr(node, attr) for node in gpu_nodes]
        if want > 0 and None not in counts and want > max(counts):
            return (
                f"it needs {want:g} {kind} units of one GPU and no GPU has more than "
                f"{max(counts):g}"
            )
    return "no node has what it asks for"
