"""Subscribers to the controller's snapshots and events (the ``Monitor`` protocol in
``engine.events``): the live terminal view, the event log a run report is made from, and
Prometheus metrics. Imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr

_EXPORTS = {
    "EventLog": "conveyor.monitor.event_log",
    "InputFailure": "conveyor.monitor.event_log",
    "LiveView": "conveyor.monitor.live",
    "PrometheusMonitor": "conveyor.monitor.prometheus",
}

__all__ = ["EventLog", "InputFailure", "LiveView", "PrometheusMonitor"]

if TYPE_CHECKING:
    from conveyor.monitor.event_log import EventLog, InputFailure
    from conveyor.monitor.live import LiveView
    from conveyor.monitor.prometheus import PrometheusMonitor

__getattr__ = lazy_getattr("conveyor.monitor", _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted(__all__)
