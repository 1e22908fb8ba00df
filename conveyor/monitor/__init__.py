"""Subscribers to the controller's snapshots (the ``Monitor`` protocol in ``engine.events``)."""

from conveyor.monitor.live import LiveView

__all__ = ["LiveView"]
