"""A live per-stage table in the terminal, built from the controller's snapshots.

It answers the question one asks while a pipeline runs: which stage is the bottleneck (its
queue grows, its workers are all busy) and is the autoscaler doing something about it (target
above ready). Without a terminal it prints a line of totals now and then and one final table
at the end, so logs of batch jobs and CI get the numbers without a wall of redraws.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from conveyor.engine.events import RunSnapshot, StageSnapshot
    from conveyor.result import RunResult

_DASH = "-"


def format_duration(seconds: float | None) -> str:
    """``0.42 ms``, ``12.3 ms``, ``1.25 s``, ``2m05s``; a dash when unknown."""
    if seconds is None:
        return _DASH
    if seconds < 0.01:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def format_rate(per_second: float | None) -> str:
    """Tasks per second with precision that suits the magnitude; a dash when unknown."""
    if per_second is None:
        return _DASH
    if per_second >= 100:
        return f"{per_second:,.0f}"
    if per_second >= 10:
        return f"{per_second:.1f}"
    return f"{per_second:.2f}"


class LiveView:
    """Monitor that shows, per stage: workers (ready/starting/target), queued, in flight, done,
    out, filtered, failed, throughput (tasks/s) and mean task time, with elapsed time and totals.

    ``live=None`` animates only on a real terminal; ``False`` never animates (the final table is
    still printed); ``True`` forces animation. Live throughput is measured over the last
    ``window_s`` seconds of snapshots, so it follows the run instead of averaging it away; the
    final table shows whole-run averages from the ``RunResult``. Redraws are limited to
    ``refresh_per_second`` because the monitor runs on the controller's loop.

    The controller calls ``on_end`` also when a run fails or is stopped early; ``close()`` (or
    using the view as a context manager) restores the terminal if it never started.
    ``extra`` returns one more line to show under the table (a pipeline's own progress, such
    as clips written). Not animating, it prints the totals (and ``extra``) as one line every
    ``progress_s`` seconds (None: never): a job's log said nothing for 13 minutes.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        live: bool | None = None,
        refresh_per_second: float = 4.0,
        window_s: float = 3.0,
        transient: bool = False,
        extra: Callable[[], str] | None = None,
        progress_s: float | None = 30.0,
    ) -> None:
        if refresh_per_second <= 0:
            raise ValueError(f"LiveView: refresh_per_second must be > 0, got {refresh_per_second}")
        if progress_s is not None and not progress_s > 0:
            raise ValueError(f"LiveView: progress_s must be None or > 0, got {progress_s}")
        if window_s <= 0:
            raise ValueError(f"LiveView: window_s must be > 0, got {window_s}")
        self.console = console or Console()
        self.animate = (
            live
            if live is not None
            else self.console.is_terminal and not self.console.is_dumb_terminal
        )
        self.refresh_s = 1.0 / refresh_per_second
        self.window_s = window_s
        self.transient = transient
        self.extra = extra
        self.progress_s = progress_s
        self._last_line = 0.0
        self.pipeline = ""
        self.stages: list[str] = []
        self.snapshot: RunSnapshot | None = None
        self.result: RunResult | None = None
        self._history: dict[str, deque[tuple[float, int]]] = {}
        self._live: Live | None = None
        self._last_draw = float("-inf")

    # -- the Monitor protocol -------------------------------------------------------------
    def on_start(self, pipeline: str, stages: list[str]) -> None:
        self.close()
        self.pipeline = pipeline
        self.stages = list(stages)
        self.snapshot = None
        self.result = None
        self._history = {name: deque() for name in stages}
        self._last_draw = float("-inf")
        self._last_line = 0.0
        if self.animate:
            self._live = Live(
                self._waiting(),
                console=self.console,
                auto_refresh=False,
                transient=self.transient,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start(refresh=True)

    def on_tick(self, snapshot: RunSnapshot) -> None:
        self.snapshot = snapshot
        for stage in snapshot.stages:
            history = self._history.setdefault(stage.name, deque())
            history.append((snapshot.elapsed_s, stage.tasks_in))
            while len(history) > 2 and snapshot.elapsed_s - history[1][0] >= self.window_s:
                history.popleft()
        if self._live is not None and snapshot.elapsed_s - self._last_draw >= self.refresh_s:
            self._last_draw = snapshot.elapsed_s
            self._live.update(self.render(), refresh=True)
        elif (
            not self.animate
            and self.progress_s is not None
            and snapshot.elapsed_s - self._last_line >= self.progress_s
        ):
            self._last_line = snapshot.elapsed_s
            line = " | ".join(t.plain for t in self._lines(self._totals_line(snapshot), ""))
            self.console.print(f"{snapshot.pipeline}: {line}", soft_wrap=True, highlight=False)

    def on_end(self, result: RunResult) -> None:
        self.result = result
        final = self.render()
        if self._live is not None:
            if self.transient:
                self.close()
                self.console.print(final)
            else:
                self._live.update(final, refresh=True)
                self.close()
        else:
            self.console.print(final)

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop animating (idempotent); needed only when a run ends without ``on_end``."""
        live, self._live = self._live, None
        if live is not None:
            live.stop()

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rendering ------------------------------------------------------------------------
    def throughput(self, stage: str) -> float | None:
        """Inputs completed per second over the recent window (whole run before that)."""
        history = self._history.get(stage)
        if not history:
            return None
        (t0, n0), (t1, n1) = history[0], history[-1]
        if t1 - t0 > 0:
            return (n1 - n0) / (t1 - t0)
        return n1 / t1 if t1 > 0 else None

    def render(self) -> RenderableType:
        """The table for the latest snapshot, or the final table once the run has ended."""
        if self.snapshot is None and self.result is None:
            return self._waiting()
        if self.result is not None:
            return self._final_table(self.result)
        assert self.snapshot is not None
        return self._live_table(self.snapshot)

    def _waiting(self) -> RenderableType:
        return Text(f"{self.pipeline or 'pipeline'}: starting {len(self.stages)} stages...")

    def _table(self, title: str, workers_header: str) -> Table:
        table = Table(
            title=title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=0,
        )
        table.add_column("", no_wrap=True, min_width=1)  # state: waiting, working, done
        # only the stage name may shrink (with an ellipsis): numbers must never be cut
        table.add_column("stage", overflow="ellipsis", min_width=8)
        headers = [workers_header, "queued", "in\nflight", "done", "out", "filtered", "failed"]
        for header in [*headers, "tasks/s", "task\ntime"]:
            width = max(len(line) for line in header.split("\n"))
            table.add_column(header, justify="right", no_wrap=True, min_width=width)
        return table

    def _state(self, done: bool, working: bool) -> Text:
        """One character: done, working (a worker is ready), or waiting for workers or input."""
        utf = (self.console.encoding or "").lower().startswith("utf")
        if done:
            return Text("\u2713" if utf else "+", style="green")
        if working:
            return Text("\u25b6" if utf else ">", style="yellow")
        return Text("\u00b7" if utf else ".", style="dim")

    def _live_table(self, snap: RunSnapshot) -> RenderableType:
        table = self._table(f"{snap.pipeline}  running {snap.elapsed_s:.1f}s", "workers\nr/s/t")
        for stage in snap.stages:
            table.add_row(
                self._state(stage.done, stage.workers_ready > 0),
                stage.name,
                f"{stage.workers_ready}/{stage.workers_starting}/{stage.target}",
                f"{stage.queued:,}",
                f"{stage.in_flight:,}",
                f"{stage.tasks_in:,}",
                f"{stage.tasks_out:,}",
                f"{stage.filtered:,}",
                _failed(stage.failed),
                format_rate(self.throughput(stage.name)),
                format_duration(stage.task_time_s),
            )
        return Group(table, *self._lines(self._totals_line(snap), "dim"))

    def _lines(self, totals: str, style: str) -> list[Text]:
        lines = [Text(totals, style=style)]
        if self.extra is not None:
            lines.append(Text(self.extra(), style="dim"))
        return lines

    def _totals_line(self, snap: RunSnapshot) -> str:
        admitted = f"{snap.inputs_admitted:,}" + ("" if snap.source_exhausted else "+")
        filtered = sum(s.filtered for s in snap.stages)
        failed = sum(s.failed for s in snap.stages)
        return (
            f"elapsed {snap.elapsed_s:.1f}s | inputs {admitted} | outputs {snap.outputs:,} | "
            f"filtered {filtered:,} | failed {failed:,}"
        )

    def _final_table(self, result: RunResult) -> RenderableType:
        snap = self.snapshot
        by_name: dict[str, StageSnapshot] = {s.name: s for s in snap.stages} if snap else {}
        names = list(result.stats) or self.stages
        wall = result.wall_s
        table = self._table(f"{self.pipeline}  finished in {wall:.2f}s", "workers\npeak")
        for name in names:
            stats = result.stats.get(name)
            last = by_name.get(name)
            if stats is None:
                continue
            table.add_row(
                self._state(last.done if last else True, False),
                name,
                f"{stats.peak_workers}",
                f"{last.queued:,}" if last else _DASH,
                f"{last.in_flight:,}" if last else _DASH,
                f"{stats.tasks_in:,}",
                f"{stats.tasks_out:,}",
                f"{stats.filtered:,}",
                _failed(stats.failed),
                format_rate(stats.tasks_in / wall if wall > 0 else None),
                format_duration(stats.mean_service_s if stats.tasks_in else None),
            )
        c = result.counts
        line = (
            f"wall {wall:.2f}s | startup {result.startup_s:.2f}s | first output "
            f"{format_duration(result.first_output_s)} | inputs {c.get('inputs', 0):,} | "
            f"outputs {c.get('outputs', 0):,} | filtered {c.get('filtered', 0):,} | "
            f"failed {c.get('failed', 0):,}"
        )
        return Group(table, *self._lines(line, "red" if result.failures else "dim"))


def _failed(count: int) -> Text:
    return Text(f"{count:,}", style="bold red" if count else "")
