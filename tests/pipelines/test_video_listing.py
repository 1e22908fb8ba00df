"""The videos of a run are listed as it takes them: the first video is done while a long
listing goes on, the driver holds a bounded window of sources, a listing that fails mid-run
stops the command with its reason, and the command lists once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conveyor.backends import LocalBackend
from conveyor.cli import app
from conveyor.executors import StreamingExecutor
from conveyor.pipelines.video import VideoConfig, default_journal, run_video
from conveyor.pipelines.video_summary import video_of_label
from conveyor.samples.video import Segment, write_video
from conveyor.stages.video import reader
from conveyor.stages.video.reader import VideoSource, VideoSources

runner = CliRunner()
#: the edge budget of the run below: what the engine may queue before each stage
EDGE_TASKS = 4
#: sources listed before their records are read together, in the run below
BATCH = 8
#: a batch being checked, plus what six stages' queues and two CPUs' workers hold (a
#: message of a fast stage carries up to 2 ms of its work: dozens of failed probes), and the
#: writer's batch of 32: the most sources the fast pipeline can have taken ahead of its
#: outputs (measured: 89-126, before the writer batched too)
WINDOW = 200
OPTIONS = ["--splitter", "fixed", "--no-quality", "--no-embed", "--no-tags", "--no-live"]


def fast(inputs: Path, output: Path) -> VideoConfig:
    return VideoConfig(
        str(inputs), str(output), splitter="fixed", quality=False, embed=False, tags=False
    )


class Counted:
    """``reader.iter_videos`` counting the sources it hands out, and the listings begun."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_after: int | None = None) -> None:
        self.taken = 0
        self.listings = 0
        self.fail_after = fail_after
        self.real = reader.iter_videos
        monkeypatch.setattr(reader, "iter_videos", self)

    def __call__(self, *args: Any, **kwargs: Any) -> Iterator[VideoSource]:
        self.listings += 1
        listing = self.real(*args, **kwargs)  # a missing input is refused here, not later
        return self._count(listing)

    def _count(self, listing: Iterator[VideoSource]) -> Iterator[VideoSource]:
        for source in listing:
            if self.fail_after is not None and self.taken >= self.fail_after:
                raise OSError(5, "the share went away while it was listed")
            self.taken += 1
            yield source


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 files with a video's name that are not videos (each fails in the probe, quickly)
    in nested folders, after one real video (the first in the listing's order)."""
    root = tmp_path_factory.mktemp("many")
    write_video(root / "a" / "0.mp4", [Segment("pan", 1, 1)], width=64, height=48, fps=12)
    for i in range(300):
        path = root / f"b{i // 100}" / f"c{i // 10 % 10}" / f"{i:03d}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not a video\n")
    return root


def test_the_first_video_is_done_while_a_long_listing_goes_on(
    many: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Counted(monkeypatch)
    taken_at: list[int] = []
    output = tmp_path / "out"
    executor = StreamingExecutor(LocalBackend(num_cpus=2), edge_max_tasks=EDGE_TASKS)
    config = fast(many, output)
    sources = VideoSources(config.input, config.output, batch=BATCH)
    report = run_video(
        config,
        executor,
        on_output=lambda _: taken_at.append(counted.taken),
        journal=default_journal(output),
        sources=sources,
    )
    # not a timing: the engine takes a source only where its first stage has room, and each
    # stage only where the next has, so a run holds at most a window of them whatever the
    # speeds; the listing had 301
    assert taken_at[0] <= WINDOW < 301
    assert max(t - done for done, t in enumerate(taken_at, start=1)) <= WINDOW
    assert report.result.completed and counted.listings == 1
    videos = report.summary["videos"]
    assert (videos["in"], videos["ok"], videos["failed"]) == (301, 1, 300)


def test_the_command_lists_once_and_counts_what_it_resumed(
    many: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "out"
    first = runner.invoke(app, ["video", str(many), str(output), *OPTIONS, "--limit", "30"])
    assert first.exit_code == 0, first.output
    assert "30 in, 1 ok, 29 failed" in first.output
    counted = Counted(monkeypatch)
    again = runner.invoke(app, ["video", str(many), str(output), *OPTIONS, "--limit", "40"])
    assert again.exit_code == 0, again.output
    assert "40 in, 1 ok, 39 failed" in again.output and "30 already complete" in again.output
    assert counted.listings == 1 and counted.taken == 40
    summary = json.loads((output / "summary.json").read_text())["videos"]
    assert (summary["done_this_run"], summary["skipped_as_complete"]) == (10, 30)


def test_a_listing_that_fails_mid_run_stops_the_command_with_its_reason(
    many: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Counted(monkeypatch, fail_after=150)
    output = tmp_path / "out"
    result = runner.invoke(app, ["video", str(many), str(output), *OPTIONS])
    assert result.exit_code == 1, result.output
    assert "the share went away while it was listed" in result.output
    monkeypatch.undo()  # the share is back: the same command finishes the work
    again = runner.invoke(app, ["video", str(many), str(output), *OPTIONS])
    assert again.exit_code == 0, again.output
    assert "301 in, 1 ok, 300 failed" in again.output


def test_a_missing_or_empty_input_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Counted(monkeypatch)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "notes.txt").write_text("no video here")
    missing = runner.invoke(app, ["video", str(tmp_path / "nope"), str(tmp_path / "o1")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    empty = runner.invoke(app, ["video", str(tmp_path / "empty"), str(tmp_path / "o2")])
    assert empty.exit_code == 2 and "no videos in" in empty.output
    assert counted.taken == 0 and not (tmp_path / "o2" / "summary.json").exists()


def test_an_engine_failure_is_told_of_its_video_with_or_without_a_journal() -> None:
    from conveyor.engine.journal import key_label, source_key

    pending = [VideoSource(f"/in/{n}", n, 1, 1.0) for n in ("a.mp4", "b.mp4", "c.mp4")]
    # without a journal the driver's i-th source is labelled "i"; with one, by its key
    assert video_of_label("1", pending) == "b.mp4"
    assert video_of_label("2.0*1.3", pending) == "c.mp4"
    assert video_of_label(key_label(source_key(pending[0])) + ".0", pending) == "a.mp4"
    assert video_of_label("7", pending) is None


def test_a_video_the_engine_failed_is_done_by_the_next_run(tmp_path: Path) -> None:
    """Its journal finished it for good: a video whose record met a full disk (here, a
    folder in its place) stayed undone however often the command ran (only --overwrite)."""
    source, output = tmp_path / "in", tmp_path / "out"
    for seed, name in enumerate("abc"):
        write_video(source / f"{name}.mp4", [Segment("checker", 2, seed)], width=160, height=96)
    (output / "videos" / "b.mp4.json").mkdir(parents=True)
    first = runner.invoke(app, ["video", str(source), str(output), *OPTIONS])
    assert first.exit_code == 1, first.output  # it was 0: a script took the run for done
    assert "3 in, 2 ok" in first.output and "1 incomplete" in first.output
    assert "tries them again" in first.output
    (output / "videos" / "b.mp4.json").rmdir()
    again = runner.invoke(app, ["video", str(source), str(output), *OPTIONS])
    assert again.exit_code == 0, again.output
    assert "3 in, 3 ok" in again.output and "2 already complete" in again.output
    assert json.loads((output / "videos" / "b.mp4.json").read_text())["clips"]


def test_a_run_whose_every_video_the_engine_failed_exits_1(tmp_path: Path) -> None:
    """It exited 0 (only failed videos counted), though nothing was curated."""
    source, output = tmp_path / "in", tmp_path / "out"
    write_video(source / "a.mp4", [Segment("checker", 2, 1)], width=160, height=96)
    (output / "videos" / "a.mp4.json").mkdir(parents=True)
    result = runner.invoke(app, ["video", str(source), str(output), *OPTIONS])
    assert result.exit_code == 1, result.output
    assert "1 incomplete" in result.output and "every video failed" in result.output
