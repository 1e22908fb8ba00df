"""The summary's tally folds each video's record in as it comes and keeps no entry per video:
only the videos the run took and has not heard of, the failures and the damaged videos."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conveyor.engine.journal import key_label, source_key
from conveyor.media.layout import OutputLayout
from conveyor.pipelines.video import VideoConfig
from conveyor.pipelines.video_summary import RunTally, build_summary, input_failures
from conveyor.result import FailureRecord, RunResult
from conveyor.stages.video.reader import VideoSource
from conveyor.tasks.video import Video, VideoTask


def record(status: str = "ok", clips: int = 1, **extra: Any) -> dict[str, Any]:
    ids = [f"c{i}" for i in range(clips)]
    return {
        "status": status,
        "metadata": {"duration_s": 2.0},
        "clips": ids,
        "kept": ids,
        "kept_seconds": 2.0 * clips,
        "filtered": {"motion": []},
        "errors": {},
        "clip_errors": [],
        **extra,
    }


def source(name: str) -> VideoSource:
    return VideoSource(f"/in/{name}", name, 10, 1.0)


def output(name: str, rec: dict[str, Any] | None) -> VideoTask:
    return VideoTask(data=Video(path=f"/in/{name}", relative_path=name, record=rec))


def failure(label: str) -> FailureRecord:
    return FailureRecord(
        stage="ClipTranscoder",
        task=label,
        error_type="RuntimeError",
        message="boom",
        traceback="",
        attempts=3,
    )


def test_records_are_folded_as_they_come_and_nothing_is_kept_per_video() -> None:
    tally = RunTally()
    for i in range(1_000):
        tally.add_complete(source(f"old{i:04d}.mp4"), record())
    for i in range(1_000):
        tally.add_pending(source(f"new{i:04d}.mp4"))
        tally.add_output(output(f"new{i:04d}.mp4", None))  # a part before the last
        tally.add_output(output(f"new{i:04d}.mp4", record(clips=2)))
    tally.add_output(output("new0000.mp4", record(clips=2)))  # told twice: counted once
    assert (tally.listed, tally.before, tally.now) == (2_000, 1_000, 1_000)
    assert tally.videos["ok"] == 2_000 and tally.clips["made"] == 3_000
    assert tally.seconds_in == 4_000.0 and tally.seconds_now == 2_000.0
    assert not tally.open and not tally.failures and not tally.damaged
    assert tally.complete_paths is None


def test_a_video_never_told_of_is_read_from_disk_or_is_incomplete_with_its_reason(
    tmp_path: Path,
) -> None:
    layout = OutputLayout(tmp_path / "out")
    tally = RunTally()
    for name in ("a.mp4", "b.mp4", "c.mp4", "d.mp4"):
        tally.add_pending(source(name))
    tally.add_output(output("a.mp4", record()))
    # b's output was failed after its record was written; c failed in the engine (labelled
    # by position without a journal, by key with one: d); nothing came of d
    layout.write_json(layout.video_record("b.mp4"), record(errors={"VideoProbe": "odd"}))
    failures = [failure("2.0"), failure(key_label(source_key(source("d.mp4"))) + ".1")]
    tally.finish(layout, failures)
    assert not tally.open
    assert (tally.videos["ok"], tally.videos["incomplete"]) == (2, 2)
    summary = build_summary(config(tmp_path), tally, RunResult(), 1.0, "test")
    assert [(f["video"], f["kind"]) for f in summary["failures"]] == [
        ("b.mp4", "input"),
        ("c.mp4", "engine"),
        ("d.mp4", "engine"),
    ]
    assert summary["videos"]["done_this_run"] == 4 and summary["seconds_this_run"] == 4.0
    assert [f.task for f in input_failures(summary, tally.failed_now)] == ["b.mp4"]


def test_after_a_stopped_run_the_rest_is_counted_incomplete_without_being_kept() -> None:
    tally = RunTally()
    tally.add_pending(source("a.mp4"))
    tally.stopped = True
    tally.add_pending(source("b.mp4"))
    tally.add_complete(source("c.mp4"), record())
    assert list(tally.open) == ["a.mp4"]
    assert tally.videos["incomplete"] == 1 and tally.failures[0]["video"] == "b.mp4"
    assert "stopped" in tally.failures[0]["reason"]


def test_the_tally_read_from_disk_is_the_one_a_run_adds_up(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path / "out")
    sources = [source(n) for n in ("a.mp4", "b.mp4", "c.mp4")]
    damaged = record(
        damaged_packets=3, clip_errors=[{"clip_id": "c0", "stage": "Q", "reason": "x"}]
    )
    layout.write_json(layout.video_record("a.mp4"), record())
    layout.write_json(layout.video_record("b.mp4"), damaged)
    streamed = RunTally(keep_complete=True)
    streamed.add_complete(sources[0], record())
    for s in sources[1:]:
        streamed.add_pending(s)
    streamed.add_output(output("b.mp4", damaged))
    streamed.finish(layout, [failure("1")])  # c, the run's second
    from_disk = RunTally.from_disk(layout, sources, sources[1:], [failure("1")])
    summaries = [
        build_summary(config(tmp_path), t, RunResult(), 1.0, "test") for t in (streamed, from_disk)
    ]
    for summary in summaries:
        summary.pop("finished_at")
    assert summaries[0] == summaries[1]
    assert summaries[0]["videos"]["damaged"] == ["b.mp4"] and summaries[0]["clips"]["failed"] == 1
    assert streamed.complete_paths == ["a.mp4", "b.mp4"]


def config(tmp_path: Path) -> VideoConfig:
    return VideoConfig(str(tmp_path / "in"), str(tmp_path / "out"), splitter="fixed")
