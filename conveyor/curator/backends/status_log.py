"""NeMo Curator's ``logging_interval``: a status table in the log every so many seconds."""

from __future__ import annotations

import logging

from conveyor.engine.events import RunSnapshot
from conveyor.result import RunResult

log = logging.getLogger("conveyor.curator")


class StatusLog:
    """A monitor that logs each stage's workers, queue and counts every ``interval_s``
    seconds of the run (at INFO, on the ``conveyor.curator`` logger), and once at the end."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next = interval_s
        self.pipeline = ""
        self.lines: list[str] = []  # what was logged last (for tests and callers)

    def on_start(self, pipeline: str, stages: list[str]) -> None:
        self._next = self.interval_s
        self.pipeline = pipeline

    def on_tick(self, snapshot: RunSnapshot) -> None:
        if snapshot.elapsed_s < self._next:
            return
        self._next = snapshot.elapsed_s + self.interval_s
        self.lines = [
            f"{snapshot.pipeline} at {snapshot.elapsed_s:.0f} s: {snapshot.outputs} outputs",
            *(
                f"  {s.name}: {s.workers_ready}/{s.target} workers, {s.queued} queued, "
                f"{s.in_flight} running, {s.tasks_in} done, {s.filtered} filtered, "
                f"{s.failed} failed"
                for s in snapshot.stages
            ),
        ]
        log.info("\n".join(self.lines))

    def on_end(self, result: RunResult) -> None:
        log.info(
            "%s finished in %.1f s: %s",
            self.pipeline,
            result.wall_s,
            result.summary().split("\n")[0],
        )
