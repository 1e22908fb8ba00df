"""LiveView fed with synthetic snapshots, rendered into an in-memory rich Console."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from conveyor.engine.events import Monitor, RunSnapshot, StageSnapshot
from conveyor.monitor import LiveView
from conveyor.monitor.live import format_duration, format_rate
from conveyor.result import RunResult, StageStats

STAGES = ["read", "filter", "write"]


def _stage(name: str, **values: object) -> StageSnapshot:
    fields: dict[str, object] = {
        "name": name,
        "workers_ready": 1,
        "workers_starting": 0,
        "target": 1,
        "queued": 0,
        "queued_bytes": 0,
        "in_flight": 0,
        "tasks_in": 0,
        "tasks_out": 0,
        "filtered": 0,
        "failed": 0,
        "task_time_s": None,
        "done": False,
    }
    fields.update(values)
    return StageSnapshot(**fields)  # type: ignore[arg-type]


def _snap(elapsed: float, *stages: StageSnapshot, exhausted: bool = True) -> RunSnapshot:
    return RunSnapshot("demo", elapsed, 10, 3, tuple(stages), exhausted)


def _console(**kwargs: object) -> Console:
    return Console(file=io.StringIO(), width=120, **kwargs)  # type: ignore[arg-type]


def _text(console: Console) -> str:
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()


def _result() -> RunResult:
    stats = {
        "read": StageStats("read", tasks_in=10, tasks_out=10, busy_s=0.5, peak_workers=2),
        "filter": StageStats(
            "filter", tasks_in=10, tasks_out=7, filtered=3, busy_s=2.0, peak_workers=3
        ),
        "write": StageStats(
            "write", tasks_in=7, tasks_out=6, failed=1, busy_s=0.07, peak_workers=1
        ),
    }
    counts = {"inputs": 10, "outputs": 6, "filtered": 3, "failed": 1}
    return RunResult(counts=counts, stats=stats, wall_s=2.0, startup_s=0.4, first_output_s=0.9)


def _row(text: str, stage: str) -> list[str]:
    """The cells of the table row of ``stage`` (split on whitespace)."""
    for line in text.splitlines():
        cells = [cell for cell in re.split(r"[\s|]+", line) if cell]
        if stage in cells:
            return cells
    raise AssertionError(f"no row for {stage!r} in:\n{text}")


def _run_ticks(view: LiveView) -> None:
    view.on_start("demo", STAGES)
    for t, done in ((0.0, 0), (1.0, 4), (2.0, 10)):
        view.on_tick(
            _snap(
                t,
                _stage("read", tasks_in=done, tasks_out=done, done=done == 10),
                _stage(
                    "filter",
                    workers_ready=2,
                    workers_starting=1,
                    target=3,
                    queued=5,
                    in_flight=2,
                    tasks_in=done // 2,
                    filtered=1,
                    task_time_s=0.0123,
                ),
                _stage("write", workers_ready=0, target=1, failed=1),
            )
        )


def test_is_a_monitor() -> None:
    view: Monitor = LiveView(console=_console())
    assert callable(view.on_tick)


def test_without_a_terminal_ticks_are_silent_and_the_end_prints_one_table() -> None:
    console = _console()
    view = LiveView(console=console)
    assert view.animate is False
    _run_ticks(view)
    assert _text(console) == ""
    view.on_end(_result())
    out = _text(console)
    assert out.count("demo  finished in 2.00s") == 1
    for name in STAGES:
        assert name in out
    # state, name, peak workers, queued and in flight of the last snapshot, done, out,
    # filtered, failed, tasks/s over the whole run, mean task time from busy seconds
    assert _row(out, "filter")[2:] == ["3", "5", "2", "10", "7", "3", "0", "5.00", "200.0", "ms"]
    assert "wall 2.00s | startup 0.40s | first output 900.0 ms | inputs 10" in out
    assert "outputs 6 | filtered 3 | failed 1" in out


def test_without_a_terminal_a_line_of_totals_comes_every_progress_s() -> None:
    """A job's log (stdout not a terminal) said nothing for 13 minutes of a long run."""
    console = _console()
    view = LiveView(console=console, progress_s=30, extra=lambda: "clips made 12")
    view.on_start("demo", STAGES)
    for t in (0.0, 10.0, 29.0, 31.0, 45.0, 62.0, 70.0):
        view.on_tick(_snap(t, _stage("read", tasks_in=int(t), failed=int(t > 60))))
    assert _text(console).splitlines() == [
        "demo: elapsed 31.0s | inputs 10 | outputs 3 | filtered 0 | failed 0 | clips made 12",
        "demo: elapsed 62.0s | inputs 10 | outputs 3 | filtered 0 | failed 1 | clips made 12",
    ]
    quiet = _console()
    view = LiveView(console=quiet, progress_s=None)
    view.on_start("demo", STAGES)
    view.on_tick(_snap(100.0, _stage("read")))
    assert _text(quiet) == ""


def test_live_table_shows_workers_queue_rates_and_totals() -> None:
    view = LiveView(console=_console(), live=False, window_s=3.0)
    _run_ticks(view)
    console = _console()
    console.print(view.render())
    out = _text(console)
    assert "demo  running 2.0s" in out
    # ready/starting/target, queued, in flight, done, out, filtered, failed, tasks/s, task time
    assert _row(out, "filter") == [
        "\u25b6",
        "filter",
        "2/1/3",
        "5",
        "2",
        "5",
        "0",
        "1",
        "0",
        "2.50",
        "12.3",
        "ms",
    ]
    read = _row(out, "read")
    assert read[0] == "\u2713"  # done
    assert read[-2:] == ["5.00", "-"]  # 10 tasks in 2 s; no task time measured
    assert _row(out, "write")[0] == "\u00b7"  # no worker ready yet
    assert "elapsed 2.0s | inputs 10 | outputs 3 | filtered 1 | failed 1" in out


def test_throughput_follows_the_recent_window() -> None:
    view = LiveView(console=_console(), window_s=2.0)
    view.on_start("demo", ["s"])
    assert view.throughput("s") is None
    view.on_tick(_snap(1.0, _stage("s", tasks_in=50)))
    assert view.throughput("s") == 50.0  # one sample: the run's average so far
    for t, n in ((2.0, 60), (3.0, 70), (4.0, 80), (5.0, 90)):
        view.on_tick(_snap(t, _stage("s", tasks_in=n)))
    assert view.throughput("s") == pytest.approx(10.0)  # not the early burst


def test_unfinished_source_is_marked() -> None:
    view = LiveView(console=_console())
    view.on_start("demo", ["s"])
    view.on_tick(_snap(0.5, _stage("s"), exhausted=False))
    console = _console()
    console.print(view.render())
    assert "inputs 10+" in _text(console)


def test_animates_on_a_terminal_and_leaves_the_final_table() -> None:
    console = _console(force_terminal=True, color_system=None)
    view = LiveView(console=console, refresh_per_second=1000)
    assert view.animate is True
    _run_ticks(view)
    assert "demo  running 2.0s" in _text(console)
    view.on_end(_result())
    out = _text(console)
    final = out[out.rindex("running 2.0s") :]
    assert "finished in 2.00s" in final
    assert "outputs 6 | filtered 3 | failed 1" in final
    view.close()  # idempotent after on_end


def test_transient_view_prints_the_final_table_after_clearing() -> None:
    console = _console(force_terminal=True, color_system=None)
    view = LiveView(console=console, transient=True)
    _run_ticks(view)
    view.on_end(_result())
    assert "finished in 2.00s" in _text(console)


def test_close_stops_a_view_whose_run_failed() -> None:
    console = _console(force_terminal=True, color_system=None)
    with LiveView(console=console) as view:
        _run_ticks(view)
        assert view._live is not None
    assert view._live is None


class _AsciiFile(io.StringIO):
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "ascii"


def test_ascii_console_gets_ascii_marks() -> None:
    console = Console(file=_AsciiFile(), width=120)
    view = LiveView(console=console)
    _run_ticks(view)
    view.on_end(_result())
    out = _text(console)
    assert "\u2713" not in out
    assert _row(out, "read")[0] == "+"


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="refresh_per_second must be > 0"):
        LiveView(refresh_per_second=0)
    with pytest.raises(ValueError, match="window_s must be > 0"):
        LiveView(window_s=-1)
    with pytest.raises(ValueError, match="progress_s must be None or > 0"):
        LiveView(progress_s=0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.00042, "0.42 ms"), (0.0123, "12.3 ms"), (1.254, "1.25 s"), (125, "2m05s")],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("rate", "text"), [(None, "-"), (2.5, "2.50"), (12.34, "12.3"), (12345.6, "12,346")]
)
def test_format_rate(rate: float | None, text: str) -> None:
    assert format_rate(rate) == text
