"""Smoke runs of the benchmark scripts: tiny sizes, in-process; they must print their tables.

Timings are never asserted (benchmarks print, they do not judge); only that each script runs
end to end, accounts for every task and prints its tables and targets.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.slow


def load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import ``benchmarks/<name>.py`` as the scripts see it: ``_common`` and ``video`` are
    sibling modules. A test package of the same name imported earlier in the suite
    (``tests/stages/video``) would shadow a sibling, so such entries are dropped for the test."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for sibling in BENCHMARKS.glob("*.py"):
        cached = sys.modules.get(sibling.stem)
        if cached is not None and Path(getattr(cached, "__file__", "") or "").parent != BENCHMARKS:
            monkeypatch.delitem(sys.modules, sibling.stem)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def own_shm_dirs() -> list[Path]:
    from conveyor.backends.shm_store import default_root

    return list(default_root().glob(f"conveyor-{os.getpid()}-*"))


def test_unbalanced3_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    bench = load("unbalanced3", monkeypatch)
    results = bench.main(["--quick", "--tasks", "8", "--costs-ms", "5,20,10", "--engines", "local"])
    out = capsys.readouterr().out
    assert [m.label for m in results] == ["streaming", "batch", "loop"]
    assert [m.outputs for m in results] == [8, 8, 6]
    assert all(m.failures == 0 and m.peak_rss > 0 for m in results)
    for text in (
        "unbalanced3 (sleep mode): throughput",
        "unbalanced3 (sleep mode): resources",
        "ideal/s",
        "first out s",
        "shm peak MB",
        "ideal: best integer allocation",
        "targets",
        "streaming tasks/s / ideal",
    ):
        assert text in out
    assert not own_shm_dirs()


def test_unbalanced3_cpu_mode_quick(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    bench = load("unbalanced3", monkeypatch)
    results = bench.main(
        [
            "--quick",
            "--mode",
            "cpu",
            "--tasks",
            "6",
            "--costs-ms",
            "2,8,4",
            "--only",
            "streaming,loop",
            "--payload",
            "bytes",
            "--engines",
            "local",
        ]
    )
    out = capsys.readouterr().out
    assert [m.outputs for m in results] == [6, 6]
    assert "unbalanced3 (cpu mode): throughput" in out
    assert "cpu mode also capped by cores" in out


def test_tiny3_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    bench = load("tiny3", monkeypatch)
    results = bench.main(["--quick", "--tasks", "200", "--engines", "local"])
    out = capsys.readouterr().out
    assert [m.label for m in results] == ["streaming", "journal", "watched", "batch", "loop"]
    assert [m.outputs for m in results] == [200, 200, 200, 200, 200]
    assert "!!" not in out  # every executor's outputs summed to the loop's
    for text in (
        "tiny3 (zero-cost tasks): throughput",
        "vs streaming",
        "targets",
        "streaming tasks/s",
        "journal: 200 journal records",
        "journal / streaming tasks/s",
        "watched: ",
        "event log lines",
        "watched / streaming tasks/s",
    ):
        assert text in out


def test_streams_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    bench = load("streams", monkeypatch)
    args = ["--inputs", "2", "--outputs", "4", "--gap-ms", "50", "--consumer-ms", "5"]
    figures = bench.main([*args, "--size", "100000", "--many", "300", "--cpus", "2"])
    out = capsys.readouterr().out
    assert "generator / list: first output" in out and "forwarding 300" in out
    for label in ("list", "generator"):
        assert figures[label]["first_output_s"] > 0 and figures[label]["wall_s"] > 0
    assert set(figures["outputs_per_s"]) == {"list", "generator"}


def test_dedup_quality_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    bench = load("dedup_quality", monkeypatch)
    bench.main(["--docs", "3000", "--shapes", "20x6"])
    out = capsys.readouterr().out
    assert "precision" in out and "recall" in out


def test_shots_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load("shots", monkeypatch)
    scores = bench.main(["--videos", "0", "--dissolves", "1", "--shot-s", "2"])
    out = capsys.readouterr().out
    assert "clips into a transition" in out
    both = scores["both heads (default)"]
    assert both.dissolves == both.dissolves_found == 2 and not both.spurious


def test_shots_scores_what_a_detector_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's bookkeeping on a made-up truth: a cut and a dissolve found, a cut
    missed, a spurious transition, and the clips that run into what was missed."""
    bench = load("shots", monkeypatch)
    truth = bench.SyntheticVideo(Path("v.mp4"), [], 64, 36, 10.0, "h264", 300)
    truth.cuts_s, truth.fades_s = [5.0, 20.0], [(10.0, 12.0)]
    found = bench.Score()
    bench.score(truth, [(50, 49), (100, 119)], found)  # the second cut missed
    assert (found.cuts_found, found.dissolves_found, found.spurious) == (1, 1, 0)
    assert found.misses == ["v.mp4: cut at 20.00 s"]
    # shots 0-49, 50-99, 120-299: a clip of the last one runs across the missed cut
    assert found.clips_into == 1
    empty = bench.Score()
    bench.score(truth, [(250, 249)], empty)
    assert (empty.cuts_found, empty.dissolves_found, empty.spurious) == (0, 0, 1)
    assert empty.clips_into >= 2


def test_memory_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    bench = load("memory", monkeypatch)
    results = bench.main(["--quick", "--sizes", "10,30", "--last-ms", "1", "--engines", "local"])
    out = capsys.readouterr().out
    assert [(m.label, m.outputs) for m in results] == [("streaming 10", 10), ("streaming 30", 30)]
    assert all(m.peak_shm > 0 for m in results)  # 1 MiB payloads live in shared memory
    for text in (
        "memory (peaks over the run)",
        "peak RSS MB",
        "shm peak MB",
        "targets",
        "streaming peak RSS 30/10",
    ):
        assert text in out
    assert not own_shm_dirs()


def tiny_videos(tmp_path: Path) -> list[str]:
    """``benchmarks/video.py`` options for one 4 s video at 160x96, 12 fps, cached here."""
    size = ["--width", "160", "--height", "96", "--fps", "12"]
    return ["--videos", "1", "--seconds", "4", *size, "--cache", str(tmp_path / "cache")]


def test_video_gpu_rewrites_the_shipped_scenario_from_its_saved_figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped GPU scenario is what the H200 run's saved figures give, so it can be
    checked and rewritten without a GPU; a run needs one and says so."""
    from conveyor.backends.devices import GpuInventory

    bench = load("video_gpu", monkeypatch)
    saved = BENCHMARKS.parent / "docs" / "data" / "video_gpu_h200_48videos_2026-11-26.json"
    scenario = tmp_path / "gpu.yaml"
    bench.main(["--from-json", str(saved), "--scenario-out", str(scenario)])
    shipped = BENCHMARKS.parent / "conveyor/sim/scenarios/video_curation_gpu_measured.yaml"
    assert scenario.read_text() == shipped.read_text()
    monkeypatch.setattr(bench, "detect_gpus", lambda: GpuInventory((), None))
    with pytest.raises(SystemExit):
        bench.main(["--videos", "1"])
    assert "no GPU here" in capsys.readouterr().err


def test_video_quick(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bench = load("video", monkeypatch)
    scenario = tmp_path / "measured.yaml"
    figures = bench.main(
        [
            *tiny_videos(tmp_path),
            "--scenario-out",
            str(scenario),
            "--memory",
            "1",
            "--memory-seconds",
            "2",
            "--memory-limit-gb",
            "3",
        ]
    )
    out = capsys.readouterr().out
    for work in ("shots", "fixed"):
        contenders = figures[work]["contenders"]
        assert set(contenders) == {"sequential", "streaming", "batch"}
        assert all(
            c["completed"] and c["video_s"] == pytest.approx(4, abs=0.2)
            for c in contenders.values()
        )
        assert len({c["clips_kept"] for c in contenders.values()}) == 1  # the same work
        assert figures[work]["ideal_video_hours_per_hour"] > 0
        assert f"[{work}] CPU seconds per video-hour, by stage" in out
    assert "TransNetV2Detector" in figures["shots"]["cpu_s_per_video_hour"]
    assert "streaming / sequential" in out and "streaming / batch" in out
    # memory: the same videos without a limit and under one, each worker's peak measured
    runs = figures["memory"]
    assert set(runs) == {"1/None", "1/3.0"}
    assert all(r["peak_pss_mb"] > 0 and r["hours_per_hour"] > 0 for r in runs.values())
    assert runs["1/3.0"]["worker_mb"]["TransNetV2Detector"] > 50
    assert "[memory] peak memory of the process tree" in out and "limit 3 GB" in out
    from conveyor.sim import parse_scenario_text, simulate

    text = scenario.read_text().replace("duration_s: 600", "duration_s: 20")  # seconds, not minutes
    report = simulate(parse_scenario_text(text, str(scenario))).report  # measured costs simulate
    assert report.outputs > 0 and report.failed == 0


def test_video_elastic_threads_a_b(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bench = load("video", monkeypatch)
    figures = bench.main(
        [
            *tiny_videos(tmp_path),
            "--work",
            "fixed",
            "--contenders",
            "streaming,streaming-own-cpus",
        ]
    )
    contenders = figures["fixed"]["contenders"]
    assert set(contenders) == {"streaming", "streaming-own-cpus"}
    assert len({c["clips_kept"] for c in contenders.values()}) == 1  # the same work
    assert "streaming / streaming-own-cpus" in capsys.readouterr().out


def test_video_user_quick(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--user``: our command and the plain script as subprocesses, one 3 s video (fixed)
    and two of 2 s (small), each measured from its start: first clip, tree CPU, wall."""
    import av

    bench = load("video", monkeypatch)
    outputs = tmp_path / "runs"
    size = ["--width", "160", "--height", "90", "--fps", "30"]
    figures = bench.main(
        [
            *["--user", "--cases", "fixed,small", "--videos", "1", "--seconds", "3", *size],
            *["--small-videos", "2", "--cache", str(tmp_path / "cache"), "--outputs", str(outputs)],
        ]
    )
    out = capsys.readouterr().out
    plain = load("plain_video", monkeypatch)
    for case, videos, seconds in (("fixed", 1, 3.0), ("small", 2, 2.0)):
        runs = {r["contender"]: r for r in figures["user"][case]["runs"]}
        assert set(runs) == {"ours", "plain"}
        for r in runs.values():
            assert r["returncode"] == 0 and r["lingering"] == 0
            assert 0 < r["first_clip_s"] <= r["wall_s"]
            assert r["video_s"] == pytest.approx(videos * seconds, abs=0.1)
            # the tree's CPU from RUSAGE_CHILDREN: at least what sampling its processes saw
            assert 0 < r["sampled_cpu_s"] <= r["cpu_s"] + 0.1
        assert runs["ours"]["clips_kept"] == runs["plain"]["clips_kept"] == videos
        # the plain script's clips: decodable H.264, cut where the fixed splitter cuts
        lines = (outputs / f"{case}-plain-0" / "clips.jsonl").read_text().splitlines()
        made = [json.loads(line) for line in lines]
        expected = plain.spans(round(seconds * 30), 30, 10.0, 2.0)
        assert [c["frames"] for c in made] == [end - start for start, end in expected] * videos
        clips = sorted((outputs / f"{case}-plain-0" / "clips").glob("*.mp4"))
        assert len(clips) == videos
        for clip, meta in zip(clips, made, strict=True):
            with av.open(str(clip)) as container:
                stream = container.streams.video[0]
                assert stream.codec_context.name == "h264" and stream.format.name == "yuv420p"
                assert sum(1 for _ in container.decode(stream)) == meta["frames"]
        assert f"[user {case}] targets (judged on the medians)" in out
    assert "first clip, ours / plain" in out and "wall speed-up, ours vs plain" in out
