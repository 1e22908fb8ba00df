"""The results issue 4 asks the shipped scenarios to reproduce, on the simulated backend.

Each test runs the real controller and policies on a virtual clock. Where a required result
does not hold yet because of a policy shortcoming, the test is a strict xfail whose reason
gives the numbers measured when it was written; it starts failing (XPASS) once it holds.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest

from conveyor.sim import SimRun, resolve_scenario, simulate
from conveyor.sim.scenario import ReportSpec, Scenario, SourceSpec


@cache
def run(name: str, executor: str | None = None, seed: int | None = None) -> SimRun:
    """Each scenario runs once per session, whatever the number of tests reading it."""
    return simulate(resolve_scenario(name), executor=executor, seed=seed)


def window_ticks(sim: SimRun) -> list:
    lo, hi = sim.report.window
    return [t for t in sim.ticks if lo <= t.elapsed_s < hi]


def live(stage) -> int:  # type: ignore[no-untyped-def]
    return stage.workers_ready + stage.workers_starting


# -- the auto-balancing docs' example: per-GPU rates 4, 1 and 2 tasks/s ------------------
def test_docs_example_one_gpu_each_delivers_one_task_per_second_with_bounded_queue() -> None:
    sim = run("docs_3stage_1gpu_each")
    report = sim.report
    assert report.outputs == 300
    steady = window_ticks(sim)
    assert all([live(s) for s in t.stages] == [1, 1, 1] for t in steady)
    assert report.stage("medium").throughput == pytest.approx(1.0, rel=0.03)
    # without backpressure the fast stage (4/s) would queue 3 tasks/s for the slow one:
    # ~800 by the end of the window; it is held at a handful of tasks instead (measured: 5,
    # before the first measurements tighten the edge to two batches per consumer worker)
    assert max(t.stages[1].queued for t in sim.ticks) <= 8
    assert sim.result.stats["slow"].queue_hwm_tasks <= 8
    assert max(t.stages[1].queued for t in window_ticks(sim)) <= 2
    assert report.stage("fast").busy_after_warmup == pytest.approx(0.25, abs=0.02)


def test_docs_example_seven_gpus_finds_one_four_two() -> None:
    sim = run("docs_3stage_7gpu")
    steady = window_ticks(sim)
    assert steady
    assert all([s.target for s in t.stages] == [1, 4, 2] for t in steady)
    assert all([live(s) for s in t.stages] == [1, 4, 2] for t in steady)
    assert sim.report.stage("medium").throughput >= 3.9
    assert sim.report.source_tasks_per_s >= 3.9


# -- two GPU stages, X 20x faster than Y ---------------------------------------------------
XY = [
    # GPUs, allowed allocations (X, Y), best throughput (tasks/s)
    (8, {(1, 7)}, 7.0),
    (32, {(2, 30)}, 30.0),
    # equal throughput: min(20*3, 61) = min(20*4, 60) = 60; and (3, 60), as good, is the
    # snapshot of a move between them while the GPU a Y worker gives up passes to X
    (64, {(3, 61), (4, 60), (3, 60)}, 60.0),
]


@pytest.mark.parametrize(("gpus", "allowed", "best"), XY)
def test_xy_allocation_and_busy_fraction(gpus: int, allowed: set, best: float) -> None:
    sim = run(f"xy_20x_{gpus}gpu")
    report = sim.report
    allocations = {tuple(live(s) for s in t.stages) for t in window_ticks(sim)}
    assert allocations <= allowed, allocations
    assert report.stage("Y").throughput >= 0.985 * best
    # The bottleneck's workers (the stage the autoscaler sizes the pipeline by) are never
    # starved after warm-up; measured 100.0% at 8, 32 and 64 GPUs.
    bottleneck = "X" if (3, 61) in allocations else "Y"
    assert report.stage(bottleneck).busy_after_warmup >= 0.995
    # Every GPU, share-weighted, cannot beat the granularity bound: throughput x GPU-seconds
    # per task (0.05 + 1.0) / GPUs = 91.9% at 8, 98.4% at 32 and at 64 (measured: the same).
    bound = best * 1.05 / gpus
    assert report.gpu_busy_fraction == pytest.approx(bound, abs=0.01)


def test_xy_bottleneck_busy_is_not_lower_with_more_gpus() -> None:
    busy = [run(f"xy_20x_{g}gpu").report.stage("Y").busy_after_warmup for g in (32, 64)]
    assert busy[1] >= busy[0] >= 0.995


def _short(name: str, duration_s: float, warmup_s: float) -> Scenario:
    return dataclasses.replace(
        resolve_scenario(name),
        source=SourceSpec(duration_s=duration_s),
        report=ReportSpec(warmup_s=warmup_s),
    )


@pytest.mark.slow
def test_xy_allocation_is_optimal_for_every_seed() -> None:
    bad = []
    for gpus, allowed, _ in XY[1:]:
        scenario = _short(f"xy_20x_{gpus}gpu", 150, 30)
        for seed in range(6):
            sim = simulate(scenario, seed=seed, diagnose=False)
            allocations = {tuple(live(s) for s in t.stages) for t in window_ticks(sim)}
            if not allocations <= allowed:
                bad.append((gpus, seed, sorted(allocations)))
    assert bad == []


# -- streaming vs stage-at-a-time -----------------------------------------------------------
def test_streaming_is_at_least_1_8x_faster_than_batch_on_video4() -> None:
    streaming = run("video4_streaming_vs_batch", "streaming").report
    batch = run("video4_streaming_vs_batch", "batch").report
    assert streaming.outputs == batch.outputs == 12_000
    assert batch.virtual_s / streaming.virtual_s >= 1.8


def test_streaming_and_batch_do_the_same_work_on_video4() -> None:
    streaming = run("video4_streaming_vs_batch", "streaming")
    batch = run("video4_streaming_vs_batch", "batch")
    assert streaming.report.outputs == batch.report.outputs == 12_000
    assert streaming.report.virtual_s < batch.report.virtual_s
    # stage-at-a-time: each stage ran alone, with the whole budget
    order = [min(t for t, s, _ in batch.backend.usage.starts if s == n) for n in STAGES4]
    assert order == sorted(order)
    assert batch.report.stage("shot_detection").peak_workers == 16


STAGES4 = ["download", "shot_detection", "clip_extraction", "transcode"]


# -- nine stages on a multi-node cluster -------------------------------------------------
def test_video9_never_overcommits_a_node() -> None:
    sim = run("video9_multinode")
    usage = sim.backend.usage
    for node in sim.backend.sim_nodes:
        assert usage.peak_cpus.get(node.node_id, 0.0) <= node.cpus + 1e-9, node
        assert usage.peak_gpu_share.get(node.node_id, 0.0) <= node.gpus + 1e-9, node
    assert sim.report.max_node_cpu_load <= 1.0 and sim.report.max_node_gpu_load <= 1.0


def test_video9_pinned_stage_keeps_its_count() -> None:
    sim = run("video9_multinode")
    writer = [t.stages[-1] for t in sim.ticks if not t.stages[-1].done]
    assert writer and all(s.target == 4 and live(s) == 4 for s in writer)
    assert sim.report.stage("writer").stops == 0 or all(
        t >= max(x.elapsed_s for x in sim.ticks if not x.stages[-1].done)
        for t, stage, _ in sim.backend.usage.stops
        if stage == "writer"
    )


def test_video9_multi_gpu_stage_is_placed_whole_on_one_node() -> None:
    sim = run("video9_multinode")
    placed = sim.backend.usage.multi_gpu
    assert placed and all(stage == "captioning" for stage, _, _ in placed)
    gpus = {n.node_id: n.gpus for n in sim.backend.sim_nodes}
    for _, node, ids in placed:
        assert len(ids) == 4 and len(set(ids)) == 4 and max(ids) < gpus[node]
    assert sim.report.stage("captioning").peak_workers >= 5


def test_video9_cpu_stages_never_block_gpu_placement() -> None:
    # "cpus": a GPU stage short of its target while some node had the GPUs for one more
    # worker but not the CPUs (taken by CPU-only stages), at any of ~5,000 snapshots
    report = run("video9_multinode").report
    for stage in report.stages:
        if stage.gpu_share:
            assert stage.short_ticks.get("cpus", 0) == 0, (stage.name, stage.short_ticks)


def test_video9_every_stage_with_work_has_a_worker() -> None:
    sim = run("video9_multinode")
    for stage in sim.report.stages:
        assert stage.ticks_with_work_and_no_worker == 0, stage.name
    for tick in sim.ticks:
        for s in tick.stages:
            if (s.queued or s.in_flight) and not s.done:
                assert live(s) >= 1, (tick.elapsed_s, s)


def test_video9_fractional_workers_do_not_fragment_the_multi_gpu_stage() -> None:
    sim = run("video9_multinode")
    short = sim.report.stage("captioning").short_ticks.get("fragmented", 0)
    assert short <= 0.05 * len(sim.ticks)


# -- a bursty, rate-limited source ----------------------------------------------------------
def _live_between(sim: SimRun, stage: str, lo: float, hi: float) -> list[int]:
    index = [s.name for s in sim.report.stages].index(stage)
    return [live(t.stages[index]) for t in sim.ticks if lo <= t.elapsed_s < hi]


def test_bursty_source_scales_up_to_demand_without_filling_the_cluster() -> None:
    sim = run("bursty_source")
    usage = sim.backend.usage
    # the burst (40 items/s from t=150 to 300) is absorbed: after a short ramp the decode and
    # embed stages complete ~40 items/s
    burst_done = sum(v for k, v in usage.done["embed"].items() if 170 <= k < 300)
    assert burst_done / 130 >= 0.95 * 40
    # the input never needs more than 40 decoders (1 s each) and 16 embedders (4 per 1.6 s):
    # the autoscaler stays far from the 256 CPUs and 64 half-GPU slots it could take
    assert max(_live_between(sim, "embed", 0, 480)) <= 1.5 * 16
    assert max(_live_between(sim, "decode", 0, 480)) <= 1.5 * 40
    # (GPU workers are packed onto as few nodes as possible, so one node may be full while
    # the cluster is mostly idle: the bound is on the stage sizes above)


def test_bursty_source_gives_resources_back() -> None:
    sim = run("bursty_source")
    assert max(_live_between(sim, "decode", 360, 480)) <= 8
    assert max(_live_between(sim, "embed", 360, 480)) <= 4


# -- a model with a 90 s setup and a transient starvation ---------------------------------
def test_big_model_is_not_dropped_on_a_transient_starvation() -> None:
    sim = run("big_model_setup")
    report = sim.report
    # the scenario must really starve the model stage: less than half busy while the feed
    # stalls (its queue may still hold a partial batch that waits for a full one)
    dip = sum(v for k, v in sim.backend.usage.busy_s["caption"].items() if 310 <= k < 330)
    assert dip < 0.5 * 20 * 8
    lo, hi = report.window
    assert (lo, hi) == (200, 900)
    # steady state: zero adds and removes of any stage per cycle, through the starvation
    # the model is never reloaded; the cheap feed may answer the stall (its tasks really did
    # take 30 s) but is steady before it and once it is over: zero adds and removes per cycle
    assert report.stage("caption").starts_in_window == 0
    assert report.stage("caption").stops_in_window == 0
    usage = sim.backend.usage
    for start, stop in ((lo, 300), (400, hi)):
        moves = [t for t, _, _ in usage.starts + usage.stops if start <= t < stop]
        assert moves == [], (start, stop, moves)
    drain = min(t.elapsed_s for t in sim.ticks if t.source_exhausted)
    assert [t for t, s, _ in sim.backend.usage.stops if s == "caption" and t < drain] == []
    assert report.stage("caption").starts == 8  # one load per GPU, ever


# -- determinism ----------------------------------------------------------------------------
def test_same_seed_gives_the_same_report() -> None:
    scenario = _short("bursty_source", 200, 20)
    a = simulate(scenario, seed=3).report
    b = simulate(scenario, seed=3).report
    c = simulate(scenario, seed=4).report
    assert a.deterministic_dict() == b.deterministic_dict()
    assert a.deterministic_dict() != c.deterministic_dict()


# -- the 2,000-GPU scenario, first ten minutes ----------------------------------------------
@pytest.mark.slow
def test_hour_scenario_first_ten_minutes_keeps_the_gpus_busy() -> None:
    scenario = dataclasses.replace(resolve_scenario("hour_2000gpu"), stop_at_s=600.0)
    sim = simulate(scenario, diagnose=False)
    report = sim.report
    assert report.window == pytest.approx((300, 600), abs=1)
    assert report.gpu_busy_fraction >= 0.97
    assert report.max_node_cpu_load <= 1.0 and report.max_node_gpu_load <= 1.0
    assert report.stage("shot_detection").busy_after_warmup >= 0.97


# -- the video pipeline at cluster scale, from the costs benchmarks/video.py measured -------
def test_measured_video_pipeline_keeps_the_gpus_busy_on_32_gpus() -> None:
    sim = simulate(_short("video_curation_measured", 150, 60), diagnose=False)
    report = sim.report
    assert report.failed == 0 and report.outputs > 1000
    assert report.max_node_gpu_load <= 1.0
    # the bottleneck gets the cluster: the GPU shares are spent, not left idle
    assert report.gpu_busy_fraction is not None and report.gpu_busy_fraction >= 0.8


def test_gpu_measured_video_pipeline_gives_the_cpus_to_decoding_and_encoding() -> None:
    """Every cost measured on an H200, which has no video encoder: the models leave its GPUs
    nearly idle, the transcoder encodes on the CPUs, and the cluster's CPUs are the limit.
    The controller must reach that limit, not park CPUs on idle GPU stages."""
    scenario = _short("video_curation_gpu_measured", 150, 60)
    cpu_s_per_video, inputs = 0.0, 1.0
    for stage in scenario.stages:
        cpu_s_per_video += stage.model.service.mean * inputs * stage.resources.cpus
        inputs *= stage.model.output_ratio
    cpus = sum(group.cpus * group.count for group in scenario.cluster)
    report = simulate(scenario, diagnose=False).report
    assert report.failed == 0
    assert report.max_node_gpu_load <= 1.0
    assert report.source_tasks_per_s is not None
    assert report.source_tasks_per_s >= 0.9 * cpus / cpu_s_per_video
    assert report.stage("ClipTranscoder").busy_after_warmup >= 0.95


def test_video_engines_bound_the_encoders_to_the_gpus_that_have_them() -> None:
    """``video_engines``: NVENC only on the two L40S nodes (4 GPUs x 3 units each), none on
    the H100s: the encoding bottleneck grows to the 24 units and never past them (the H100s,
    with no unit, take none of them); decoders ask NVDEC, which every GPU has."""
    sim = run("video_engines")
    stages = {s.name: s for s in sim.report.stages}
    encode = stages["encode_nvenc"]
    assert encode.peak_workers == 24
    assert encode.busy_after_warmup is not None and encode.busy_after_warmup > 0.95
    assert max(n for _, n in encode.live) <= 24
    assert encode.failed == 0 and encode.tasks_in > 0
