"""Placement: pack fractional GPU workers, whole GPUs on one node, CPU-only off GPU nodes."""

from __future__ import annotations

import itertools

import pytest

from conveyor import Resources
from conveyor.cluster import NodeInfo
from conveyor.engine.messages import WorkerPlacement
from conveyor.engine.policies.placement import Ledger, NodeFree, choose, fits_nowhere, gpu_share

_ids = itertools.count()


def node(node_id: str, cpus: float = 64, gpus: int = 0, memory: float | None = 80.0) -> NodeInfo:
    return NodeInfo(node_id, cpus=cpus, gpus=gpus, gpu_memory_gb=memory if gpus else None)


def place(ledger: Ledger, resources: Resources) -> WorkerPlacement | None:
    return ledger.allocate(f"w{next(_ids)}", resources)


def check_not_overcommitted(ledger: Ledger) -> None:
    for free in ledger.nodes.values():
        assert free.cpus >= -1e-9, free
        assert 0 <= free.cpus <= free.total_cpus + 1e-9, free
        for share in free.gpu_free:
            assert -1e-9 <= share <= 1.0 + 1e-9, free


# -- NodeFree / gpu_share -----------------------------------------------------------------
def test_node_free_starts_untouched() -> None:
    free = NodeFree.of(node("n", cpus=16, gpus=2, memory=40))
    assert free == NodeFree("n", 16, [1.0, 1.0], 40, 16)


def test_gpu_share_per_request_kind() -> None:
    on80 = NodeFree.of(node("n", gpus=1, memory=80))
    assert gpu_share(Resources(gpus=2), on80) == 2.0
    assert gpu_share(Resources(gpus=0.3), on80) == pytest.approx(0.3)
    assert gpu_share(Resources(gpu_memory_gb=20), on80) == pytest.approx(0.25)
    assert gpu_share(Resources(cpus=1), on80) == 0.0


# -- fractional GPUs ----------------------------------------------------------------------
def test_quarter_gpu_workers_fill_one_device_before_the_next() -> None:
    ledger = Ledger.of([node("n", gpus=2)])
    placements = [place(ledger, Resources(cpus=1, gpus=0.25)) for _ in range(5)]
    assert [p.gpu_ids for p in placements if p] == [(0,), (0,), (0,), (0,), (1,)]
    assert all(p is not None and p.gpu_fraction == 0.25 for p in placements)
    assert ledger.nodes["n"].gpu_free == pytest.approx([0.0, 0.75])


def test_fractional_worker_goes_to_the_most_used_device_that_fits() -> None:
    ledger = Ledger.of([node("n", gpus=2)])
    assert place(ledger, Resources(gpus=0.5)) == WorkerPlacement("n", (0,), 0.5)
    assert place(ledger, Resources(gpus=0.25)) == WorkerPlacement("n", (0,), 0.25)
    # device 0 has 0.25 left: a half does not fit there, so it opens device 1
    assert place(ledger, Resources(gpus=0.5)) == WorkerPlacement("n", (1,), 0.5)
    # a quarter fits both; device 0 is the tighter fit
    assert place(ledger, Resources(gpus=0.25)) == WorkerPlacement("n", (0,), 0.25)
    assert ledger.nodes["n"].gpu_free == pytest.approx([0.0, 0.5])


def test_fractional_worker_prefers_the_partly_used_node() -> None:
    ledger = Ledger.of([node("a", gpus=1), node("b", gpus=1)])
    first = place(ledger, Resources(gpus=0.5))
    assert first is not None
    # the second half goes next to the first, leaving the other node's GPU whole
    assert place(ledger, Resources(gpus=0.5)) == first


def test_tenth_gpu_workers_fit_ten_to_a_device_despite_rounding() -> None:
    ledger = Ledger.of([node("n", cpus=100, gpus=2)])
    placements = [place(ledger, Resources(cpus=0, gpus=0.1)) for _ in range(11)]
    assert [p.gpu_ids[0] for p in placements if p] == [0] * 10 + [1]


def test_fractional_request_does_not_fit_a_node_without_gpus() -> None:
    assert Ledger.of([node("cpu", gpus=0)]).allocate("w", Resources(gpus=0.5)) is None


def test_fractional_worker_never_shares_a_device_held_whole() -> None:
    ledger = Ledger.of([node("n", gpus=2)])
    assert place(ledger, Resources(gpus=1)) is not None
    placement = place(ledger, Resources(gpus=0.5))
    assert placement is not None
    assert placement.gpu_ids == (1,)


# -- whole GPUs ---------------------------------------------------------------------------
def test_whole_gpu_workers_get_distinct_devices_on_one_node() -> None:
    ledger = Ledger.of([node("n", gpus=4)])
    first = place(ledger, Resources(gpus=2))
    second = place(ledger, Resources(gpus=2))
    assert first == WorkerPlacement("n", (0, 1), 1.0)
    assert second == WorkerPlacement("n", (2, 3), 1.0)
    assert place(ledger, Resources(gpus=1)) is None
    assert ledger.nodes["n"].gpu_free == [0.0, 0.0, 0.0, 0.0]


def test_four_gpu_request_is_never_split_across_nodes() -> None:
    ledger = Ledger.of([node("a", gpus=2), node("b", gpus=2)])
    assert place(ledger, Resources(gpus=4)) is None
    assert ledger.held == {}
    assert ledger.nodes["a"].gpu_free == [1.0, 1.0]


def test_four_gpu_request_goes_to_the_node_that_still_has_four() -> None:
    ledger = Ledger.of([node("a", gpus=4), node("b", gpus=4)])
    assert place(ledger, Resources(gpus=1)) is not None
    placement = place(ledger, Resources(gpus=4))
    assert placement is not None
    assert len(set(placement.gpu_ids)) == 4
    single = [p for r, p in ledger.held.values() if r.gpus == 1]
    assert placement.node_id != single[0].node_id


def test_whole_gpu_prefers_the_node_with_the_fewest_free_devices() -> None:
    ledger = Ledger.of([node("big", gpus=8), node("small", gpus=2)])
    assert place(ledger, Resources(gpus=1)) == WorkerPlacement("small", (0,), 1.0)
    # keeps the big node's 8 devices free for an 8-GPU request
    assert place(ledger, Resources(gpus=8)) == WorkerPlacement("big", tuple(range(8)), 1.0)


def test_whole_gpu_skips_partly_used_devices() -> None:
    ledger = Ledger.of([node("n", gpus=2)])
    assert place(ledger, Resources(gpus=0.25)) is not None
    assert place(ledger, Resources(gpus=1)) == WorkerPlacement("n", (1,), 1.0)
    assert place(ledger, Resources(gpus=1)) is None


# -- CPU-only -----------------------------------------------------------------------------
def test_cpu_only_workers_prefer_nodes_without_gpus() -> None:
    ledger = Ledger.of([node("gpu", cpus=128, gpus=8), node("cpu", cpus=4)])
    for _ in range(4):
        assert place(ledger, Resources(cpus=1)) == WorkerPlacement("cpu", (), 0.0)
    # the CPU node is full: now the GPU node's CPUs are used
    assert place(ledger, Resources(cpus=1)) == WorkerPlacement("gpu", (), 0.0)


def test_cpu_only_workers_prefer_the_fewest_gpus_then_the_most_free_cpus() -> None:
    ledger = Ledger.of(
        [node("g8", gpus=8), node("g2", gpus=2), node("c8", cpus=8), node("c16", cpus=16)]
    )
    assert place(ledger, Resources(cpus=4)) == WorkerPlacement("c16", (), 0.0)
    assert place(ledger, Resources(cpus=4)) == WorkerPlacement("c16", (), 0.0)
    # c16 now has 8 free, like c8: equal keys keep the node listed first
    assert place(ledger, Resources(cpus=4)) == WorkerPlacement("c8", (), 0.0)
    assert place(ledger, Resources(cpus=4)) == WorkerPlacement("c16", (), 0.0)
    assert place(ledger, Resources(cpus=4)) == WorkerPlacement("c8", (), 0.0)
    assert place(ledger, Resources(cpus=4)) == WorkerPlacement("c16", (), 0.0)
    # both CPU-only nodes are full: the node with fewer GPUs comes next
    assert place(ledger, Resources(cpus=4)) == WorkerPlacement("g2", (), 0.0)


def test_shared_cpus_go_to_a_node_that_has_them_before_the_fewest_gpus() -> None:
    """With CPUs time-shared, every CPU worker went to the full GPU-less head while the GPU
    node's spare CPUs idled (a 2-node cluster: 5 workers on 2 CPUs)."""
    ledger = Ledger.of([node("head", cpus=2), node("gpu", cpus=4, gpus=2)])
    ledger.share_cpus = True
    where = [place(ledger, Resources(cpus=1)) for _ in range(6)]
    assert [p.node_id for p in where if p] == ["head", "head", "gpu", "gpu", "gpu", "gpu"]
    # both full: shared where the fewest GPUs are, as before
    assert place(ledger, Resources(cpus=1)) == WorkerPlacement("head", (), 0.0)


def test_identical_nodes_are_chosen_deterministically() -> None:
    nodes = [NodeFree.of(node(n, cpus=8)) for n in ("x", "y", "z")]
    assert choose(nodes, Resources(cpus=1)) == WorkerPlacement("x", (), 0.0)


# -- no over-commit -----------------------------------------------------------------------
def test_cpus_are_never_overcommitted() -> None:
    ledger = Ledger.of([node("n", cpus=4, gpus=8)])
    placed = [place(ledger, Resources(cpus=1, gpus=0.25)) for _ in range(6)]
    assert sum(p is not None for p in placed) == 4
    assert ledger.nodes["n"].cpus == 0
    assert place(ledger, Resources(cpus=0.5)) is None


def test_gpu_worker_needs_cpus_as_well() -> None:
    ledger = Ledger.of([node("n", cpus=2, gpus=4)])
    assert place(ledger, Resources(cpus=4, gpus=1)) is None


def test_fractional_cpus_pack_exactly() -> None:
    ledger = Ledger.of([node("n", cpus=1)])
    assert [place(ledger, Resources(cpus=0.25)) is not None for _ in range(5)] == [
        True,
        True,
        True,
        True,
        False,
    ]


def test_mixed_requests_never_overcommit_and_release_restores_everything() -> None:
    nodes = [node("a", cpus=16, gpus=4), node("b", cpus=8, gpus=2, memory=40), node("c", cpus=8)]
    ledger = Ledger.of(nodes)
    shapes = [
        Resources(cpus=1, gpus=0.25),
        Resources(cpus=2, gpus=1),
        Resources(cpus=0.5),
        Resources(cpus=1, gpu_memory_gb=20),
        Resources(cpus=1, gpus=2),
        Resources(cpus=3),
    ]
    placed: list[str] = []
    for i in range(60):
        worker = f"mixed-{i}"
        if ledger.allocate(worker, shapes[i % len(shapes)]) is not None:
            placed.append(worker)
        check_not_overcommitted(ledger)
        if i % 7 == 6 and placed:
            ledger.release(placed.pop(0))
            check_not_overcommitted(ledger)
    assert placed  # some fitted, some did not
    assert len(placed) < 60
    for worker in placed:
        ledger.release(worker)
    assert ledger.held == {}
    for n in nodes:
        free = ledger.nodes[n.node_id]
        assert free.cpus == pytest.approx(n.cpus)
        assert free.gpu_free == pytest.approx([1.0] * n.gpus)


# -- release ------------------------------------------------------------------------------
def test_release_returns_whole_gpus_and_cpus() -> None:
    ledger = Ledger.of([node("n", cpus=4, gpus=1)])
    assert ledger.allocate("w", Resources(cpus=4, gpus=1)) is not None
    assert ledger.allocate("v", Resources(cpus=1, gpus=1)) is None
    ledger.release("w")
    assert ledger.nodes["n"].cpus == 4
    assert ledger.nodes["n"].gpu_free == [1.0]
    assert ledger.allocate("v", Resources(cpus=1, gpus=1)) == WorkerPlacement("n", (0,), 1.0)


def test_release_returns_fractions_so_a_whole_gpu_fits_again() -> None:
    ledger = Ledger.of([node("n", cpus=8, gpus=1)])
    for i in range(3):
        assert ledger.allocate(f"t{i}", Resources(cpus=1, gpus=1 / 3)) is not None
    assert ledger.allocate("whole", Resources(cpus=1, gpus=1)) is None
    for i in range(3):
        ledger.release(f"t{i}")
    assert ledger.allocate("whole", Resources(cpus=1, gpus=1)) is not None


def test_release_of_unknown_or_released_worker_is_a_no_op() -> None:
    ledger = Ledger.of([node("n", cpus=4)])
    ledger.allocate("w", Resources(cpus=1))
    ledger.release("w")
    ledger.release("w")
    ledger.release("never")
    assert ledger.nodes["n"].cpus == 4


# -- refresh ------------------------------------------------------------------------------
def test_refresh_adds_new_nodes_and_drops_vanished_ones() -> None:
    ledger = Ledger.of([node("a", cpus=8), node("b", cpus=8, gpus=2)])
    assert ledger.totals() == (16, 2)
    gone = ledger.refresh([node("b", cpus=8, gpus=2), node("c", cpus=4, gpus=1)])
    assert gone == ["a"]
    assert sorted(ledger.nodes) == ["b", "c"]
    assert ledger.totals() == (12, 3)
    assert ledger.refresh([node("b", cpus=8, gpus=2), node("c", cpus=4, gpus=1)]) == []


def test_refresh_keeps_the_accounting_of_known_nodes() -> None:
    ledger = Ledger.of([node("a", cpus=8, gpus=1)])
    ledger.allocate("w", Resources(cpus=2, gpus=0.5))
    ledger.refresh([node("a", cpus=8, gpus=1), node("b", cpus=8)])
    assert ledger.nodes["a"].cpus == 6
    assert ledger.nodes["a"].gpu_free == [0.5]
    assert ledger.nodes["b"].cpus == 8


def test_new_node_is_used_after_refresh() -> None:
    ledger = Ledger.of([node("a", cpus=1)])
    assert ledger.allocate("w1", Resources(cpus=1)) is not None
    assert ledger.allocate("w2", Resources(cpus=1)) is None
    ledger.refresh([node("a", cpus=1), node("b", cpus=1)])
    assert ledger.allocate("w2", Resources(cpus=1)) == WorkerPlacement("b", (), 0.0)


def test_vanished_node_is_never_chosen_and_release_there_is_safe() -> None:
    ledger = Ledger.of([node("a", cpus=2, gpus=1), node("b", cpus=2)])
    ledger.allocate("on-a", Resources(cpus=1, gpus=1))
    ledger.refresh([node("b", cpus=2)])
    assert ledger.allocate("gpu", Resources(cpus=1, gpus=1)) is None
    ledger.release("on-a")
    assert "on-a" not in ledger.held
    assert "a" not in ledger.nodes


def test_node_that_returns_still_counts_workers_held_there() -> None:
    ledger = Ledger.of([node("a", cpus=4, gpus=1)])
    ledger.allocate("w", Resources(cpus=3, gpus=1))
    ledger.refresh([])
    ledger.refresh([node("a", cpus=4, gpus=1)])
    assert ledger.nodes["a"].cpus == 1
    assert ledger.nodes["a"].gpu_free == [0.0]


# -- gpu_memory_gb ------------------------------------------------------------------------
def test_gpu_memory_resolves_against_the_node_gpu() -> None:
    ledger = Ledger.of([node("n", gpus=2, memory=80)])
    placements = [place(ledger, Resources(cpus=1, gpu_memory_gb=20)) for _ in range(5)]
    assert all(p is not None and p.gpu_fraction == pytest.approx(0.25) for p in placements)
    assert [p.gpu_ids for p in placements if p] == [(0,)] * 4 + [(1,)]


def test_gpu_memory_fraction_differs_per_node() -> None:
    small = Ledger.of([node("n40", gpus=1, memory=40)])
    assert place(small, Resources(gpu_memory_gb=20)) == WorkerPlacement("n40", (0,), 0.5)
    assert place(small, Resources(gpu_memory_gb=20)) == WorkerPlacement("n40", (0,), 0.5)
    assert place(small, Resources(gpu_memory_gb=20)) is None


def test_node_with_unknown_gpu_memory_is_skipped() -> None:
    unknown = NodeInfo("unknown", cpus=64, gpus=8, gpu_memory_gb=None)
    known = node("known", cpus=64, gpus=1, memory=80)
    ledger = Ledger.of([unknown, known])
    assert place(ledger, Resources(gpu_memory_gb=20)) == WorkerPlacement("known", (0,), 0.25)
    assert Ledger.of([unknown]).allocate("w", Resources(gpu_memory_gb=20)) is None
    # other requests still use the node (0.9 no longer fits the known node's device)
    assert place(ledger, Resources(gpus=0.9)) == WorkerPlacement("unknown", (0,), 0.9)


def test_node_whose_gpu_is_too_small_is_skipped() -> None:
    ledger = Ledger.of([node("small", gpus=4, memory=24), node("large", gpus=1, memory=80)])
    assert place(ledger, Resources(gpu_memory_gb=40)) == WorkerPlacement("large", (0,), 0.5)


def test_release_of_a_memory_request_restores_its_fraction() -> None:
    ledger = Ledger.of([node("n", gpus=1, memory=80)])
    ledger.allocate("w", Resources(gpu_memory_gb=60))
    assert ledger.nodes["n"].gpu_free == pytest.approx([0.25])
    ledger.release("w")
    assert ledger.nodes["n"].gpu_free == pytest.approx([1.0])


# -- empty cluster ------------------------------------------------------------------------
def test_nothing_fits_an_empty_cluster() -> None:
    assert choose([], Resources(cpus=0)) is None
    assert Ledger().totals() == (0, 0)


def test_overcommit_places_a_cpu_worker_on_a_full_node_but_never_a_gpu_one() -> None:
    from conveyor.cluster import NodeInfo
    from conveyor.engine.policies.placement import Ledger
    from conveyor.resources import Resources

    ledger = Ledger.of([NodeInfo("n", cpus=2, gpus=1)])
    assert ledger.allocate("a", Resources(cpus=2)) is not None
    assert ledger.allocate("b", Resources(cpus=1)) is None
    assert ledger.allocate("b", Resources(cpus=1), overcommit_cpus=True) is not None
    assert ledger.nodes["n"].cpus == -1  # the debt is kept, so nothing else is added
    assert ledger.allocate("c", Resources(cpus=0.5), overcommit_cpus=False) is None
    assert ledger.allocate("g", Resources(cpus=1, gpus=1), overcommit_cpus=True) is not None
    assert ledger.allocate("h", Resources(cpus=0, gpus=1), overcommit_cpus=True) is None


def test_cpu_workers_leave_gpu_nodes_the_cpus_their_gpus_need() -> None:
    ledger = Ledger.of([node("g", cpus=8, gpus=4)])
    ledger.gpu_cpu_reserve = 1.0  # the GPU stage needs one CPU per GPU
    cpu_only = [ledger.allocate(f"c{i}", Resources(cpus=1)) for i in range(8)]
    assert sum(p is not None for p in cpu_only) == 4  # 4 CPUs stay for the 4 GPUs
    gpu = [ledger.allocate(f"g{i}", Resources(cpus=1, gpus=1)) for i in range(4)]
    assert all(p is not None for p in gpu)


def test_grouped_ledger_places_as_well_as_a_full_scan() -> None:
    import random

    from conveyor.engine.policies.placement import choose

    rng = random.Random(7)
    shapes = [
        Resources(cpus=1),
        Resources(cpus=2, gpus=0.25),
        Resources(cpus=1, gpus=1),
        Resources(cpus=4, gpus=4),
        Resources(cpus=0.5, gpus=0.5),
    ]
    nodes = [
        node(f"n{i}", cpus=rng.choice([16, 32, 64]), gpus=rng.choice([0, 4, 8])) for i in range(40)
    ]
    ledger = Ledger.of(nodes)
    for i in range(600):
        resources = rng.choice(shapes)
        expected = choose(list(ledger.nodes.values()), resources)
        got = ledger.allocate(f"w{i}", resources)
        assert (got is None) == (expected is None)
        if got is not None and expected is not None:
            a, b = ledger.nodes[got.node_id], ledger.nodes[expected.node_id]
            # the same quality of choice: same kind of node in the same state
            assert (len(a.gpu_free), a.total_cpus) == (len(b.gpu_free), b.total_cpus) or (
                got.gpu_fraction == expected.gpu_fraction
            )
        if rng.random() < 0.3 and ledger.held:
            ledger.release(rng.choice(list(ledger.held)))
    for n in ledger.nodes.values():
        assert n.cpus >= -1e-9 and all(-1e-9 <= f <= 1 + 1e-9 for f in n.gpu_free)


# -- host memory --------------------------------------------------------------------------
GB = 2**30


def memory_node(node_id: str, memory_gb: float | None, cpus: float = 64) -> NodeInfo:
    memory = None if memory_gb is None else int(memory_gb * GB)
    return NodeInfo(node_id, cpus=cpus, memory_bytes=memory)


def test_workers_go_where_their_memory_fits_and_stop_where_it_fits_nowhere() -> None:
    ledger = Ledger.of([memory_node("small", 2, cpus=64), memory_node("big", 5, cpus=8)])
    heavy = Resources(cpus=1, memory_gb=2)
    # CPU-only workers prefer the most free CPUs ("small"), as long as the memory fits
    assert [p.node_id for p in ledger.allocate_many(["a", "b", "c", "d"], heavy)] == [
        "small",
        "big",
        "big",
    ]
    assert ledger.nodes["small"].memory == 0
    assert ledger.nodes["big"].memory == pytest.approx(1 * GB)
    assert ledger.total_memory() == pytest.approx(7 * GB)


def test_a_stages_first_worker_is_placed_whatever_its_memory() -> None:
    ledger = Ledger.of([memory_node("n", 1)])
    heavy = Resources(cpus=1, memory_gb=4)
    assert ledger.allocate_many(["a", "b"], heavy, overcommit_first=True) == [
        WorkerPlacement("n", (), 0.0)
    ]
    assert ledger.nodes["n"].memory == pytest.approx(-3 * GB)
    assert choose(ledger.nodes.values(), heavy) is None
    assert choose(ledger.nodes.values(), heavy, overcommit_memory=True) is not None


def test_unknown_memory_is_no_limit() -> None:
    ledger = Ledger.of([memory_node("n", None)])
    placed = ledger.allocate_many([f"w{i}" for i in range(10)], Resources(memory_gb=100))
    assert len(placed) == 10
    assert ledger.total_memory() is None


def test_resize_books_a_measured_worker_at_its_new_size_and_release_returns_it() -> None:
    ledger = Ledger.of([memory_node("n", 4)])
    ledger.allocate("w", Resources(cpus=1))
    assert ledger.nodes["n"].memory == 4 * GB
    ledger.resize("w", Resources(cpus=1, memory_gb=3))
    assert ledger.nodes["n"].memory == pytest.approx(1 * GB)
    assert ledger.allocate("x", Resources(cpus=1, memory_gb=2)) is None
    ledger.resize("gone", Resources(memory_gb=1))  # unknown worker: nothing happens
    ledger.release("w")
    assert ledger.nodes["n"].memory == pytest.approx(4 * GB)
    assert ledger.total_memory() == pytest.approx(4 * GB)


def test_a_returning_node_counts_the_memory_of_workers_held_there() -> None:
    ledger = Ledger.of([memory_node("n", 4)])
    ledger.allocate("w", Resources(cpus=1, memory_gb=3))
    ledger.refresh([])
    ledger.refresh([memory_node("n", 4)])
    assert ledger.nodes["n"].memory == pytest.approx(1 * GB)


# -- nodes to avoid -----------------------------------------------------------------------
def test_avoided_nodes_get_workers_only_when_nothing_else_fits() -> None:
    ledger = Ledger.of([node("big", cpus=8), node("small", cpus=2)])
    avoid = frozenset({"big"})
    one = Resources(cpus=1)
    placed = ledger.allocate_many(["a", "b", "c", "d"], one, avoid=avoid)
    # "big" has the most free CPUs, but is avoided while "small" has room
    assert [p.node_id for p in placed] == ["small", "small", "big", "big"]


def test_an_avoided_twin_is_passed_over_for_its_group_mate() -> None:
    ledger = Ledger.of([node("n0", cpus=4), node("n1", cpus=4)])
    placed = ledger.allocate_many(["a"], Resources(cpus=1), avoid=frozenset({"n0"}))
    assert [p.node_id for p in placed] == ["n1"]


# -- video engines (NVDEC, NVENC) ----------------------------------------------------------
def engine_node(node_id: str, gpus: int, nvdecs: float | None, nvencs: float | None) -> NodeInfo:
    return NodeInfo(node_id, 64, gpus, 80.0, nvdecs_per_gpu=nvdecs, nvencs_per_gpu=nvencs)


def test_no_gpus_decoders_are_oversubscribed() -> None:
    """An H100 has 7 NVDEC units and no NVENC: 14 workers of one decoder unit fill two of
    them, whatever compute share they ask; the 15th fits nowhere, and nothing asks NVENC."""
    ledger = Ledger.of([engine_node("h100", gpus=2, nvdecs=7, nvencs=0)])
    decode = Resources(cpus=1, gpus=0.05, nvdecs=1)
    placed = [place(ledger, decode) for _ in range(15)]
    assert all(p is not None for p in placed[:14]) and placed[14] is None
    assert sorted(p.gpu_ids[0] for p in placed[:14] if p) == [0] * 7 + [1] * 7
    assert ledger.nodes["h100"].nvdec_free == [0.0, 0.0]
    assert place(ledger, Resources(cpus=1, nvencs=1)) is None  # no encoder on an H100
    assert ledger.engine_totals() == (14.0, 0.0)


def test_engine_only_workers_get_a_device_and_no_compute_share() -> None:
    ledger = Ledger.of([engine_node("l40s", gpus=1, nvdecs=3, nvencs=3)])
    encode = Resources(cpus=1, nvencs=1.5)
    first, second = place(ledger, encode), place(ledger, encode)
    assert first == WorkerPlacement("l40s", (0,), 0.0) and second is not None
    assert ledger.nodes["l40s"].gpu_free == [1.0]  # the compute is left to the models
    assert place(ledger, encode) is None  # 3 NVENC units: two workers of 1.5
    assert place(ledger, Resources(cpus=1, gpus=1)) is None  # its units are taken
    ledger.release(next(iter(ledger.held)))
    assert place(ledger, encode) is not None


def test_whole_gpu_workers_hold_their_units() -> None:
    ledger = Ledger.of([engine_node("n", gpus=2, nvdecs=4, nvencs=2)])
    whole = place(ledger, Resources(cpus=1, gpus=1))
    assert whole is not None
    held = whole.gpu_ids[0]
    assert ledger.nodes["n"].nvdec_free[held] == 0.0  # type: ignore[index]
    decode = place(ledger, Resources(cpus=1, nvdecs=4))
    assert decode is not None and decode.gpu_ids[0] != held
    assert place(ledger, Resources(cpus=1, gpus=1)) is None  # the other GPU's units are held


def test_unknown_engine_counts_are_no_limit() -> None:
    ledger = Ledger.of([node("n", gpus=1)])
    assert all(place(ledger, Resources(cpus=0.1, nvdecs=2)) for _ in range(20))
    assert ledger.engine_totals() == (None, None)
    cpu_only = Ledger.of([node("c")])
    assert cpu_only.engine_totals() == (0.0, 0.0)
    assert place(cpu_only, Resources(cpus=1, nvdecs=1)) is None  # engines live on GPUs


def test_engine_asks_are_validated() -> None:
    with pytest.raises(ValueError, match=r"Resources\.nvdecs must be >= 0"):
        Resources(nvdecs=-1)
    with pytest.raises(TypeError, match=r"Resources\.nvencs must be a number"):
        Resources(nvencs="1")  # type: ignore[arg-type]
    assert Resources(cpus=1, nvdecs=0.5).describe() == "cpus=1, nvdecs=0.5"


def test_reserved_totals_follow_every_allocation_resize_and_release() -> None:
    """``reserved`` is kept as workers come and go; it must equal the sum over ``held``."""

    def summed(ledger: Ledger) -> tuple[float, float]:
        cpus = gpus = 0.0
        for resources, placement in ledger.held.values():
            cpus += resources.cpus
            fractional = len(placement.gpu_ids) == 1 and resources.gpus < 1
            gpus += placement.gpu_fraction if fractional else len(placement.gpu_ids)
        return cpus, gpus

    ledger = Ledger.of([node("a", cpus=32, gpus=4), node("b", cpus=16)])
    shapes = [Resources(cpus=1, gpus=0.25), Resources(cpus=2, gpus=1), Resources(cpus=0.5)]
    ids = [f"r{i}" for i in range(12)]
    for i, worker in enumerate(ids):
        ledger.allocate(worker, shapes[i % 3])
    ledger.resize(ids[2], Resources(cpus=0.5, memory_gb=1))
    for worker in ids[::3]:
        ledger.release(worker)
    ledger.release("never-placed")
    assert ledger.reserved() == pytest.approx(summed(ledger))
    for worker in ids:
        ledger.release(worker)
    assert ledger.reserved() == (0.0, 0.0)


@pytest.mark.parametrize(
    ("resources", "nodes", "why"),
    [
        (Resources(cpus=64), [NodeInfo("a", cpus=2)], None),  # CPUs are shared by time
        (Resources(memory_gb=1e6), [NodeInfo("a", cpus=2, memory_bytes=2**30)], None),
        (Resources(gpus=0.5), [NodeInfo("a", cpus=2)], "needs a GPU and no node has one"),
        (Resources(nvdecs=1), [NodeInfo("a", cpus=2)], "needs a GPU and no node has one"),
        (
            Resources(gpus=4),
            [NodeInfo("a", cpus=8, gpus=2), NodeInfo("b", cpus=8, gpus=3)],
            "needs 4 GPUs on one node and no node has more than 3",
        ),
        (
            Resources(gpu_memory_gb=100),
            [NodeInfo("a", cpus=8, gpus=1, gpu_memory_gb=80), NodeInfo("b", cpus=8, gpus=1)],
            "the largest GPU has 80 GB",
        ),
        (
            Resources(gpu_memory_gb=10),
            [NodeInfo("a", cpus=8, gpus=1)],
            "no node says how much its GPUs have (declare it: gpu_memory_gb=80 on LocalBackend, "
            "RayBackend or RayDataExecutor)",
        ),
        (
            Resources(nvencs=1),
            [NodeInfo("a", cpus=8, gpus=1, nvdecs_per_gpu=7, nvencs_per_gpu=0)],
            "needs 1 NVENC units of one GPU and no GPU has more than 0",
        ),
        (Resources(nvencs=1), [NodeInfo("a", cpus=8, gpus=1)], None),  # unknown: not a limit
    ],
)
def test_what_a_lone_worker_cannot_fit_is_named(
    resources: Resources, nodes: list[NodeInfo], why: str | None
) -> None:
    found = fits_nowhere("s", resources, nodes)
    assert found == why if why is None else f"stage 's' ({resources.describe()}): it" in found
    assert found is None or why in found
