"""The run report: ``report.html`` from a run's ``events.jsonl``.

``load_events(path)`` reads the event log (rotated parts, several passes, a torn last line);
``write_report(run_dir)`` writes the self-contained page (inline SVG, no network needed).
"""

from __future__ import annotations

from conveyor.report.html import REPORT_FILE, render, write_report
from conveyor.report.load import EVENTS_FILE, ReportError, RunEvents, RunLog, load_events

__all__ = [
    "EVENTS_FILE",
    "REPORT_FILE",
    "ReportError",
    "RunEvents",
    "RunLog",
    "load_events",
    "render",
    "write_report",
]
