"""``PrometheusMonitor``: the run's live figures on ``/metrics``, for Prometheus or a curl.

A scrape reads the latest snapshot (kept by reference, so the controller's loop pays nothing
per scrape and next to nothing per tick): counters come from the run's cumulative totals, so
they are exact whatever the scrape interval. Served by ``prometheus-client`` on a thread from
construction until ``close()``, so the final values can still be scraped after the run ends.
One monitor may watch several runs (e.g. the passes of a text job): series carry a
``pipeline`` label.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from conveyor.engine.events import SERVICE_TIME_BUCKETS_S, RunEvent, RunSnapshot, RunStarted

if TYPE_CHECKING:
    from conveyor.result import RunResult

#: busy fraction is measured over about this many seconds of run time
BUSY_WINDOW_S = 5.0


class PrometheusMonitor:
    """Serves ``/metrics`` on ``addr:port`` (``port=0``: a free one; ``url`` says where).

    Per stage: ``conveyor_stage_tasks_total{outcome=in|out|filtered|failed|retried}``,
    ``conveyor_stage_workers{state=ready|starting|target}``, ``conveyor_stage_busy_ratio``,
    ``conveyor_stage_busy_seconds_total``, ``conveyor_stage_queue_tasks``,
    ``conveyor_stage_queue_bytes``, ``conveyor_stage_in_flight_tasks``,
    ``conveyor_stage_service_seconds`` (a histogram, one observation per batch),
    ``conveyor_stage_worker_deaths_total``, ``conveyor_stage_timeouts_total``. Per run:
    ``conveyor_run_inputs_total``, ``conveyor_run_outputs_total``, ``conveyor_run_wall_seconds``,
    ``conveyor_run_startup_seconds``, ``conveyor_run_first_output_seconds``,
    ``conveyor_run_running``, ``conveyor_run_info``. Per backend: ``conveyor_cluster_cpus``,
    ``conveyor_cluster_gpus``, ``conveyor_cluster_cpus_reserved``,
    ``conveyor_cluster_gpus_reserved``.
    """

    def __init__(self, port: int = 0, addr: str = "127.0.0.1") -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:  # pragma: no cover - an extra of the package
            raise ImportError(
                "PrometheusMonitor needs prometheus-client: pip install 'conveyor[metrics]'"
            ) from exc
        self._lock = threading.Lock()
        self._snapshot: RunSnapshot | None = None
        self._running = False
        self._info: dict[str, str] = {}
        self._busy: dict[str, float] = {}
        self._history: dict[str, deque[tuple[float, float]]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise OSError(f"PrometheusMonitor: cannot serve on {addr}:{port}: {exc}") from None
        host, bound = self._server.server_address[:2]
        self.port: int = int(bound)
        shown = f"[{host}]" if ":" in str(host) else host
        #: where the metrics are served, e.g. ``http://127.0.0.1:40123/metrics``
        self.url = f"http://{shown}:{self.port}/metrics"

    # -- the Monitor protocol -------------------------------------------------------------
    def on_start(self, pipeline: str, stages: list[str]) -> None:
        with self._lock:
            self._snapshot = None
            self._running = True
            self._info = {"pipeline": pipeline, "executor": "", "backend": ""}
            self._busy = {}
            self._history = {name: deque() for name in stages}

    def on_event(self, event: RunEvent) -> None:
        if isinstance(event, RunStarted):
            with self._lock:
                self._info = {
                    "pipeline": event.pipeline,
                    "executor": event.executor,
                    "backend": event.backend,
                }

    def on_tick(self, snapshot: RunSnapshot) -> None:
        busy = {}
        for stage in snapshot.stages:
            history = self._history.setdefault(stage.name, deque())
            worked = stage.occupied_s  # a long batch counts as it goes, not when it ends
            history.append((snapshot.elapsed_s, worked))
            while len(history) > 2 and snapshot.elapsed_s - history[1][0] >= BUSY_WINDOW_S:
                history.popleft()
            then, busy_then = history[0]
            span = snapshot.elapsed_s - then
            ready = stage.workers_ready
            value = (worked - busy_then) / (span * ready) if span > 0 and ready else 0.0
            busy[stage.name] = min(1.0, max(0.0, value))
        with self._lock:
            self._snapshot = snapshot
            self._busy = busy

    def on_end(self, result: RunResult) -> None:
        with self._lock:
            self._running = False

    def close(self) -> None:
        """Stop serving (idempotent)."""
        server = getattr(self, "_server", None)
        if server is not None:
            self._server = None
            server.shutdown()
            server.server_close()

    def __enter__(self) -> PrometheusMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state(self) -> tuple[RunSnapshot | None, bool, dict[str, str], dict[str, float]]:
        with self._lock:
            return self._snapshot, self._running, dict(self._info), dict(self._busy)


class _Collector:
    """Builds the metric families from the monitor's latest snapshot at each scrape."""

    def __init__(self, monitor: PrometheusMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        snap, running, info, busy = self.monitor.state()
        pipeline = info.get("pipeline", "")
        run = GaugeMetricFamily(
            "conveyor_run_info", "The run being watched", labels=["pipeline", "executor", "backend"]
        )
        if info:
            run.add_metric([pipeline, info.get("executor", ""), info.get("backend", "")], 1)
        yield run
        # before a run has started there is no pipeline to name: a series with an empty
        # label would stay beside the run's own
        yield _gauge(
            "conveyor_run_running",
            "1 while a run is going",
            [pipeline],
            int(running) if info else None,
        )
        if snap is None:
            return
        # the last snapshot is taken before the run stops its workers: once it has ended
        # they hold nothing
        held = 1 if running else 0
        p = [pipeline]
        yield _counter("conveyor_run_inputs", "Source tasks admitted", p, snap.inputs_admitted)
        yield _counter("conveyor_run_outputs", "Last-stage outputs delivered", p, snap.outputs)
        yield _gauge("conveyor_run_wall_seconds", "Time since the run started", p, snap.elapsed_s)
        yield _gauge(
            "conveyor_run_startup_seconds",
            "Until every first worker was ready",
            p,
            snap.startup_s,
        )
        yield _gauge(
            "conveyor_run_first_output_seconds",
            "Until the first output",
            p,
            snap.first_output_s,
        )
        yield _gauge("conveyor_cluster_cpus", "CPUs in the cluster", p, snap.cpus)
        yield _gauge("conveyor_cluster_gpus", "GPUs in the cluster", p, snap.gpus)
        yield _gauge(
            "conveyor_cluster_cpus_reserved", "CPUs held by workers", p, snap.cpus_reserved * held
        )
        yield _gauge(
            "conveyor_cluster_gpus_reserved", "GPUs held by workers", p, snap.gpus_reserved * held
        )

        labels = ["pipeline", "stage"]
        tasks = CounterMetricFamily(
            "conveyor_stage_tasks",
            "Tasks of a stage: inputs done, outputs made, filtered, failed for good, retried",
            labels=[*labels, "outcome"],
        )
        workers = GaugeMetricFamily(
            "conveyor_stage_workers", "Workers of a stage", labels=[*labels, "state"]
        )
        busy_ratio = GaugeMetricFamily(
            "conveyor_stage_busy_ratio",
            f"Share of ready workers' time spent on batches (last {BUSY_WINDOW_S:g} s)",
            labels=labels,
        )
        busy_total = CounterMetricFamily(
            "conveyor_stage_busy_seconds", "Worker seconds spent on batches", labels=labels
        )
        queue_tasks = GaugeMetricFamily(
            "conveyor_stage_queue_tasks", "Tasks waiting for the stage", labels=labels
        )
        queue_bytes = GaugeMetricFamily(
            "conveyor_stage_queue_bytes", "Bytes of the tasks waiting for the stage", labels=labels
        )
        in_flight = GaugeMetricFamily(
            "conveyor_stage_in_flight_tasks", "Tasks sent to workers, not done", labels=labels
        )
        deaths = CounterMetricFamily(
            "conveyor_stage_worker_deaths", "Workers of the stage that died", labels=labels
        )
        timeouts = CounterMetricFamily(
            "conveyor_stage_timeouts", "Batches that ran past timeout_s", labels=labels
        )
        service = HistogramMetricFamily(
            "conveyor_stage_service_seconds", "Service time of a batch", labels=labels
        )
        for stage in snap.stages:
            key = [pipeline, stage.name]
            for outcome, value in (
                ("in", stage.tasks_in),
                ("out", stage.tasks_out),
                ("filtered", stage.filtered),
                ("failed", stage.failed),
                ("retried", stage.retried),
            ):
                tasks.add_metric([*key, outcome], value)
            workers.add_metric([*key, "ready"], stage.workers_ready * held)
            workers.add_metric([*key, "starting"], stage.workers_starting * held)
            workers.add_metric([*key, "target"], stage.target * held)
            busy_ratio.add_metric(key, busy.get(stage.name, 0.0) * held)
            busy_total.add_metric(key, stage.busy_s)
            queue_tasks.add_metric(key, stage.queued)
            queue_bytes.add_metric(key, stage.queued_bytes)
            in_flight.add_metric(key, stage.in_flight)
            deaths.add_metric(key, stage.worker_deaths)
            timeouts.add_metric(key, stage.timeouts)
            if stage.service_counts:
                cumulative, buckets = 0, []
                for bound, count in zip(
                    (*SERVICE_TIME_BUCKETS_S, math.inf), stage.service_counts, strict=True
                ):
                    cumulative += count
                    buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
                service.add_metric(key, buckets, stage.service_sum_s)
        yield from (tasks, workers, busy_ratio, busy_total, queue_tasks, queue_bytes, in_flight)
        yield from (deaths, timeouts, service)


def _gauge(name: str, doc: str, pipeline: list[str], value: float | None) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, doc, labels=["pipeline"])
    if value is not None:
        family.add_metric(pipeline, value)
    return family


def _counter(name: str, doc: str, pipeline: list[str], value: float) -> Any:
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, doc, labels=["pipeline"])
    family.add_metric(pipeline, value)
    return family
