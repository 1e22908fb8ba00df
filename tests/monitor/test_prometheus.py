"""PrometheusMonitor: scraped with a real HTTP client during runs on each backend."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor import Pipeline, Resources, processing_stage
from conveyor.backends.local import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.monitor import PrometheusMonitor
from conveyor.sim import parse_scenario_text, simulate
from tests.monitor.scrape import scrape, scrape_during, value


@processing_stage(resources=Resources(cpus=0.5), batch_size=2)
def slow(x: int) -> int:
    time.sleep(0.03)
    if x == 7:
        raise ValueError("seven")
    return x


@processing_stage(resources=Resources(cpus=0.5))
def keep_even(x: int) -> int | None:
    return x if x % 2 == 0 else None


def test_metrics_move_as_a_local_run_does() -> None:
    with PrometheusMonitor(port=0) as metrics:
        assert metrics.url.startswith("http://127.0.0.1:") and metrics.url.endswith("/metrics")
        pipeline = Pipeline("counting").add_stage(slow).add_stage(keep_even)
        executor = StreamingExecutor(LocalBackend(num_cpus=2), monitors=[metrics], max_attempts=2)
        result, scrapes = scrape_during(metrics.url, lambda: pipeline.run(executor, range(120)))
    during = [s for s in scrapes if value(s, "conveyor_run_running", pipeline="counting") == 1]
    assert len(during) >= 3, "the run should have been scraped while it went"
    labels = {"pipeline": "counting", "stage": "slow"}
    done = [value(s, "conveyor_stage_tasks_total", outcome="in", **labels) or 0 for s in scrapes]
    # it moved: seen part-way at least once (on a busy machine the start may take most of
    # the scrapes, so not necessarily at the middle one)
    assert done == sorted(done) and any(0 < d < 120 for d in done)
    final = scrapes[-1]
    assert value(final, "conveyor_run_running", pipeline="counting") == 0
    assert value(final, "conveyor_run_inputs_total", pipeline="counting") == 120
    assert value(final, "conveyor_run_outputs_total", pipeline="counting") == len(result.outputs)
    assert value(final, "conveyor_stage_tasks_total", outcome="failed", **labels) == 1
    assert value(final, "conveyor_stage_tasks_total", outcome="retried", **labels) >= 1
    evens = {"pipeline": "counting", "stage": "keep_even"}
    filtered = value(final, "conveyor_stage_tasks_total", outcome="filtered", **evens)
    assert filtered == result.stats["keep_even"].filtered > 0
    # the service-time histogram: one observation per batch, buckets cumulative
    count = value(final, "conveyor_stage_service_seconds_count", **labels)
    assert count is not None and count >= 60
    inf = value(final, "conveyor_stage_service_seconds_bucket", le="+Inf", **labels)
    fast = value(final, "conveyor_stage_service_seconds_bucket", le="0.01", **labels)
    assert inf == count and fast is not None and fast < count  # 2 x 30 ms per batch
    assert value(final, "conveyor_stage_service_seconds_sum", **labels) >= 0.03 * count
    # workers, busy, queues, cluster, timings were all there while it ran
    mid = during[len(during) // 2]
    assert value(mid, "conveyor_stage_workers", state="target", **labels) >= 1
    assert max(value(s, "conveyor_stage_busy_ratio", **labels) or 0 for s in during) > 0.3
    assert value(mid, "conveyor_stage_queue_tasks", **labels) is not None
    assert value(mid, "conveyor_stage_queue_bytes", **labels) is not None
    assert value(final, "conveyor_cluster_cpus", pipeline="counting") == 2
    assert value(mid, "conveyor_cluster_cpus_reserved", pipeline="counting") > 0
    assert value(final, "conveyor_run_startup_seconds", pipeline="counting") > 0
    assert value(final, "conveyor_run_first_output_seconds", pipeline="counting") > 0
    assert value(final, "conveyor_run_wall_seconds", pipeline="counting") > 0
    info = {"pipeline": "counting", "executor": "streaming", "backend": "LocalBackend"}
    assert value(final, "conveyor_run_info", **info) == 1


def test_metrics_of_a_simulated_run() -> None:
    scenario = parse_scenario_text(
        """
name: simmed
cluster:
  - {name: n, cpus: 16, gpus: 4}
stages:
  - name: read
    model: {service: {mean: 0.05}}
  - name: infer
    resources: {cpus: 1, gpus: 1}
    model: {service: {mean: 0.4}, setup_s: 2}
source: {tasks: 400}
"""
    )
    with PrometheusMonitor(port=0) as metrics:
        before = scrape(metrics.url)
        sim = simulate(scenario, monitors=[metrics])
        final = scrape(metrics.url)
    # no series under an empty pipeline label before the run (it stayed beside the run's)
    assert not [key for key in before if ("pipeline", "") in key[1]]
    labels = {"pipeline": "simmed", "stage": "infer"}
    # once it has ended its workers hold nothing (the last snapshot was taken before they
    # were stopped)
    assert value(final, "conveyor_cluster_gpus_reserved", pipeline="simmed") == 0
    assert value(final, "conveyor_stage_workers", state="ready", **labels) == 0
    assert value(final, "conveyor_stage_tasks_total", outcome="in", **labels) == 400
    assert value(final, "conveyor_cluster_gpus", pipeline="simmed") == 4
    assert value(final, "conveyor_stage_service_seconds_count", **labels) == 400
    assert value(final, "conveyor_run_wall_seconds", pipeline="simmed") == pytest.approx(
        sim.result.wall_s, rel=0.05
    )


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            PrometheusMonitor(port=port)


def test_close_stops_serving(tmp_path: Path) -> None:
    metrics = PrometheusMonitor(port=0)
    scrape(metrics.url)
    metrics.close()
    metrics.close()  # idempotent
    with pytest.raises(OSError):
        scrape(metrics.url)


class _Busy(PrometheusMonitor):
    """Keeps the busy ratio it would serve at each tick."""

    def __init__(self) -> None:
        super().__init__(port=0)
        self.seen: list[tuple[float, float]] = []

    def on_tick(self, snapshot: Any) -> None:
        super().on_tick(snapshot)
        self.seen.append((snapshot.elapsed_s, self._busy.get("slow", 0.0)))


def test_a_stage_whose_batches_outlast_the_window_is_busy_throughout() -> None:
    """Busy time counted when a batch ended: a stage of 12 s batches read 0 in one window
    and 1 in the next."""
    from tests.monitor.test_event_log import LONG_BATCHES

    with _Busy() as metrics:
        simulate(parse_scenario_text(LONG_BATCHES), monitors=[metrics])
    working = [busy for t, busy in metrics.seen if 20 < t < 100]
    assert len(working) > 50 and min(working) > 0.95, working
