"""Smoke runs of the benchmark scripts: tiny sizes, in-process; they must print their tables.

Timings are never asserted (benchmarks print, they do not judge); only that each script runs
end to end, accounts for every task and prints its tables and targets.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import pyarrow.dataset as ds
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

#: the benchmarks whose smoke runs take seconds of CPU: `make test-slow` and CI run them
slow = pytest.mark.slow


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


@slow
def test_dedup_quality_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    bench = load("dedup_quality", monkeypatch)
    bench.main(["--docs", "3000", "--shapes", "20x6"])
    out = capsys.readouterr().out
    assert "precision" in out and "recall" in out


@slow
def test_shots_quick(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Every contender on the tiny corpus: PySceneDetect's CLI (split-video where an ffmpeg
    is found, imageio-ffmpeg's or one on PATH), its API's three detectors, ours (histogram;
    a detector the command rejects is skipped and says why)."""
    bench = load("shots", monkeypatch)
    corpus = tmp_path / "corpus"
    saved = tmp_path / "shots.json"
    args = ["--quick", "--corpus", str(corpus), "--detectors", "histogram,sparkles"]
    figures = bench.main([*args, "--misses", "-1", "--json", str(saved)])
    out = capsys.readouterr().out
    contenders = figures["contenders"]
    cli = next(name for name in contenders if name.startswith("PySceneDetect CLI adaptive"))
    assert set(contenders) == {
        cli,
        "PySceneDetect API adaptive",
        "PySceneDetect API content",
        "PySceneDetect API histogram",
        "ours histogram",
        "ours sparkles",
    }
    assert "'sparkles' is not one of" in contenders["ours sparkles"]["skipped"]
    assert "skipped ours sparkles: " in out
    if cli.endswith("(list only)"):
        assert "split-video skipped" in contenders[cli]["note"]
    else:
        assert (tmp_path / "corpus").exists() and cli.endswith("split-video")
    for name, c in contenders.items():
        if name == "ours sparkles":
            continue
        assert c["failed"] is None and c["wall_s"] > 0 and c["cpu_s"] > 0, name
        total = c["scores"]["all"]
        assert total["cuts"] == 4 and total["dissolves"] == 2 and total["dips"] == 1
        assert total["cuts_found"] >= 2, name  # the cuts between different scenes
        assert total["clips"] > 0 and len(c["found"]) == 5
    # the CLI's scenes are the API's (the same detector with the same defaults)
    assert contenders[cli]["found"] == contenders["PySceneDetect API adaptive"]["found"]
    for text in ("shot splitting on 5 generated videos", "per category", "targets (against"):
        assert text in out
    bench.main(["--from-json", str(saved), "--misses", "-1"])  # the tables again, as printed
    tables = out.split("shot splitting on", 1)[1].split("figures: ")[0]
    assert tables in capsys.readouterr().out
    again = bench.main(
        ["--quick", "--corpus", str(corpus), "--theirs", "adaptive", "--detectors", ""]
    )
    assert "(cached)" in capsys.readouterr().out  # the corpus is made once
    assert set(again["contenders"]) == {"PySceneDetect API adaptive"}


@slow
def test_shots_older_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """The older set scored without and with the variance sag, from one detection."""
    bench = load("shots_older", monkeypatch)
    scores = bench.main(["--quick"])
    assert set(scores) == {"without sag", "with sag"}
    for s in scores.values():
        assert s.cuts == 2 and s.dissolves == 4 and s.clips > 0
    assert scores["with sag"].dissolves_found >= scores["without sag"].dissolves_found
    assert "without sag" in capsys.readouterr().out


@slow
def test_shots_without_ffmpeg_lists_scenes_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bench = load("shots", monkeypatch)
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # not installed
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)  # nor on PATH
    env, why = bench.ffmpeg_env(tmp_path / "bin")
    assert env is None and "pip install imageio-ffmpeg" in why
    args = ["--quick", "--corpus", str(tmp_path / "corpus"), "--theirs", "cli", "--detectors", ""]
    figures = bench.main(args)
    out = capsys.readouterr().out
    cli = figures["contenders"]["PySceneDetect CLI adaptive (list only)"]
    assert cli["failed"] is None and "split-video skipped: no ffmpeg" in cli["note"]
    assert cli["scores"]["all"]["cuts_found"] >= 2
    assert not list((tmp_path / "corpus").rglob("*-Scene-*.mp4"))
    assert "split-video skipped" in out


@slow
def test_shots_speed_quick(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The timing case on its tiny videos: PySceneDetect's CLI one video at a time, our
    default shots command on the folder; wall, CPU and the ratio."""
    bench = load("shots", monkeypatch)
    figures = bench.main(["--speed", "--quick", "--corpus", str(tmp_path / "corpus")])
    out = capsys.readouterr().out
    for who in ("theirs", "ours"):
        (run,) = figures["runs"][who]
        assert run["failed"] is None and run["wall_s"] > 0 and run["cpu_s"] > 0
    assert figures["runs"]["ours"][0]["cuts"] == 16
    assert figures["ours_over_theirs"]["wall"] > 0
    assert "speed: 4 videos of 10 s at 160x90, 16 hard cuts" in out and "ours / theirs" in out


def test_shots_scores_what_a_detector_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bookkeeping on a made-up truth at 10 fps: cuts at 5 and 20 s, a dissolve at
    10-12 s, a dip through black at 25-26 s, a flash at 15 s."""
    bench = load("shots", monkeypatch)
    truth = bench.Truth("v", "mixed", 10.0, 300, cuts=[50, 200], flashes=[(150, 152)])
    truth.spans = [("dissolve", 100, 120), ("dip", 250, 260)]
    truth.shots = [(0, 50), (50, 100), (120, 200), (200, 250), (260, 300)]
    # a cut 0.1 s late, the dissolve as a span, a flash taken for a cut, the cut at 20 s and
    # the dip missed, one transition at nothing; clips between the transitions found
    found = bench.Found([(51, 50), (101, 118), (151, 150), (280, 279)])
    found.clips = [(0, 50), (51, 101), (119, 151), (151, 280), (280, 300)]
    s = bench.score(truth, found)
    assert (s.cuts, s.cuts_found, s.dissolves_found, s.dips, s.dips_found) == (2, 1, 1, 1, 0)
    assert (s.detections, s.spurious, s.spurious_at_flashes) == (4, 2, 1)
    assert s.missed == ["v: cut 20.00 s", "v: dip 25.00-26.00 s (1.0 s)"]
    assert s.spurious_at == ["v: 15.10 s (a flash)", "v: 28.00 s"]
    # (51, 101) and (119, 151) share one frame each with the dissolve: not crossing it;
    # (151, 280) runs over the cut at 20 s and through the dip
    assert (s.clips, s.clips_crossing) == (5, 1) and s.crossing == ["v: 15.10-28.00 s"]
    assert bench.score(truth, bench.Found(clips=[(0, 51)])).clips_crossing == 1  # past a cut
    assert s.lost_s == pytest.approx(0.1)  # frame 50, the first after the cut, is in no clip
    # the shot of 20-25 s: no clip has most of its frames in it
    assert (s.shots, s.shots_without_clip) == (5, 1) and s.no_clip == ["v: 20.00-25.00 s"]
    nothing = bench.score(truth, bench.Found())
    assert nothing.lost_s == pytest.approx(sum(b - a for a, b in truth.shots) / 10)
    assert nothing.shots_without_clip == 5 and nothing.cuts_found == 0


def test_shots_corpus_is_the_issues(monkeypatch: pytest.MonkeyPatch) -> None:
    """At least 30 videos of 20-40 s in every category, each shot at least 2 s; the speed
    case: 4 videos of 60 s with 16 hard cuts."""
    bench = load("shots", monkeypatch)
    specs = bench.corpus_specs()
    assert len(specs) >= 30 and {s.category for s in specs} == set(bench.CATEGORIES)
    assert specs == bench.corpus_specs()  # deterministic
    for spec in specs:
        fades = spec.crossfades
        alone = [
            duration - fades.get(i - 1, 0) - fades.get(i, 0)
            for i, (kind, duration, _, _) in enumerate(spec.segments)
            if kind != "black"
        ]
        assert min(alone) >= 2.0, spec.name
        assert 20 <= sum(d for _, d, _, _ in spec.segments) - sum(fades.values()) <= 40
    lengths = {
        round(f, 1) for s in specs if s.category == "dissolve" for f in s.crossfades.values()
    }
    assert lengths == {0.3, 0.5, 1.0, 2.0, 3.0}
    speed = bench.speed_specs()
    assert len(speed) == 4 and sum(len(s.segments) - 1 for s in speed) == 16
    assert all(sum(d for _, d, _, _ in s.segments) == 60 for s in speed)


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


def test_nvdec_paths_measures_each_way_or_says_why_it_cannot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every way of decoding over the same video: the CPU's give every frame and their
    cost; NVDEC's give theirs too where a GPU takes them, else the reason."""
    from conveyor.media.decode import nvdec_works

    bench = load("nvdec_paths", monkeypatch)
    saved = tmp_path / "paths.json"
    small = ["--seconds", "1", "--width", "320", "--height", "180", "--cache", str(tmp_path)]
    figures = bench.main([*small, "--presets", "ultrafast", "--json", str(saved)])
    results = {r["way"]: r for r in figures["sources"]["ultrafast"]}
    assert list(results) == list(bench.WAYS)
    for way in ("cpu", "cpu-1", "cpu-1-small"):
        assert results[way]["frames"] == 30 and results[way]["cpu_s_per_video_hour"] > 0
        assert results[way]["format"] == "yuv420p"
    for way in ("cuvid", "cuvid-small", "hwaccel"):
        if nvdec_works():
            assert results[way]["frames"] == 30
        else:
            assert results[way]["unavailable"]
    assert json.loads(saved.read_text()) == figures
    out = capsys.readouterr().out
    assert "decoding 1 s of 320x180 at 30 fps (x264 ultrafast)" in out
    assert "CPU-s per video-h" in out
    with pytest.raises(SystemExit):
        bench.main(["--ways", "cpu,gpu"])
    assert "unknown --ways: gpu" in capsys.readouterr().err

    # libx264 over NV12 as it is, converted, and the CPU's yuv420p: one stream, three costs
    figures = bench.main([*small, "--presets", "", "--encode", "6", "--repeats", "2"])
    encoding = figures["encoding"]
    assert encoding["frames"] == 6 and encoding["same_stream"] is True
    assert list(encoding["median"]) == list(bench.ENCODINGS)
    assert all(
        len(runs) == 2 and min(runs) > 0 for runs in encoding["cpu_s_per_video_hour"].values()
    )
    assert "the same stream each way: yes" in capsys.readouterr().out


def test_video_gpu_reports_what_decoding_on_nvdec_changes_and_what_decoded_each_video(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The figures of a GPU run, from results as the runs give them: CPU seconds per
    video-hour, the ratios to decoding on the CPUs, and the records' decoders counted."""
    from conveyor.report.analysis import analyse
    from conveyor.report.load import load_events
    from tests.report.events import three_stage_run, write_events

    bench = load("video_gpu", monkeypatch)
    records = tmp_path / "out" / "videos"
    records.mkdir(parents=True)
    for name, decoders, shots, reason in (
        ("a", ["nvdec"], ["nvdec"], None),
        ("b", ["cpu"], ["cpu"], "NVDEC does not decode yuv444p"),
        ("c", ["cpu", "nvdec"], ["nvdec"], None),
    ):
        record = {"decoders": decoders, "shot_decoders": shots, "decoder_fallback": reason}
        (records / f"{name}.json").write_text(json.dumps(record))
    tally = bench.decoder_tally(tmp_path / "out")
    assert tally == {
        "decoders": {"nvdec": 1, "cpu": 1, "cpu+nvdec": 1},
        "shot_decoders": {"nvdec": 2, "cpu": 1},
        "fallback": "NVDEC does not decode yuv444p",
    }

    def result(label: str, wall_s: float, cpu_s: float) -> object:
        stages = {"ShotFrameDecoder": 10.0, "ClipTranscoder": 100.0}
        return bench.Result(
            label, wall_s=wall_s, video_s=1800.0, cpu_s=cpu_s, stage_busy_s=stages,
            stage_cpu_s=stages, stage_workers={"ShotFrameDecoder": 1, "ClipTranscoder": 12},
            stage_tasks={"ShotFrameDecoder": (30, 30), "ClipTranscoder": (10, 40)},
        )  # fmt: skip

    gpu = {"gpu_busy_s": 2.0, "nvenc_busy_s": 0.0, "nvdec_busy_s": 30.0, "peak_gpu_memory": 0}
    captioned = result("captioned", 100.0, 1000.0)
    captioned.stage_busy_s["Captioner"] = 97.0  # type: ignore[attr-defined]
    # the captioner's busy fraction: the run report's analysis of the run's event log
    events = tmp_path / "events"
    write_events(events / "events.jsonl", three_stage_run())
    steady = bench.stage_busy_fractions(events)
    assert steady == {n: s.busy for n, s in analyse(load_events(events).run).stages.items()}
    steady["Captioner"] = 0.997
    out = bench.report(
        {
            "streaming": (result("streaming", 90.0, 900.0), {**gpu, "decoded_by": tally}),
            "cpu-decode": (result("cpu-decode", 120.0, 1800.0), {**gpu, "decoded_by": {}}),
            "captioned": (captioned, {**gpu, "decoded_by": {}, "steady_busy": steady}),
        },
        {"ShotFrameDecoder": 0.0},
        1,
        16.0,
        {"ShotFrameDecoder": 1.0, "ClipTranscoder": 0.1},
    )
    assert out["streaming"]["cpu_s_per_video_hour"] == pytest.approx(1800.0)
    assert out["streaming"]["nvdec_busy_s_per_video_hour"] == pytest.approx(60.0)
    assert out["streaming"]["decoded_by"] == tally
    printed = capsys.readouterr().out
    assert "streaming / decoding on the CPUs: 1.33x the speed, 0.50x the CPU" in printed
    assert "the captioner busy 99.7% of the steady part of the run" in printed
    assert "194 busy s per video-hour on its GPU share" in printed


@slow
def test_video_gpu_runs_its_captioned_contender_end_to_end_on_a_declared_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run a lent GPU machine makes, on one declared GPU here (the models fall back to
    the CPU, NVML reads nothing): the captioner's model built and loaded, the event log
    analysed, the figures written. A tiny captioner: its cost is not what is checked."""
    from conveyor.backends import devices, local

    bench = load("video_gpu", monkeypatch)
    declared = devices.GpuInventory(("0",), 80.0)
    monkeypatch.setattr(bench, "detect_gpus", lambda: declared)
    monkeypatch.setattr(local, "detect_gpus", lambda: declared)

    class NoNvml:  # what GpuSampler reads, on a machine without NVML
        busy_s = encoder_s = decoder_s = 0.0
        peak_memory = 0

        def __enter__(self) -> NoNvml:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(bench, "GpuSampler", NoNvml)
    figures_path = tmp_path / "figures.json"
    options = ["--contenders", "captioned,fast-encode", "--caption-size", "tiny", "--cpus", "2"]
    bench.main([*options, *tiny_videos(tmp_path), "--json", str(figures_path)])
    figures = json.loads(figures_path.read_text())
    captioned = figures["contenders"]["captioned"]
    assert captioned["clips_kept"] > 0
    assert captioned["decoded_by"]["shot_decoders"] == {"cpu": 1}  # NVDEC asked, no driver
    assert (tmp_path / "cache" / "llava-tiny-random" / "config.json").exists()
    out = capsys.readouterr().out
    # its worker is ready for under a second of this run: the snapshots (one a second) may
    # all miss it, and the figure then says it was not measured
    busy = captioned["steady_busy"]["Captioner"]
    if math.isnan(busy):
        assert "the captioner busy (not measured: a run too short)" in out
    else:
        assert 0.0 <= busy <= 1.0 and f"the captioner busy {busy:.1%}" in out
    # libx264 alone over the same video: the floor every contender's CPU is set against
    assert figures["x264_floor_cpu_s_per_video_hour"] > 0
    assert "the floor without NVENC" in out and "captioned: " in out
    assert "x the CPU of libx264 alone" in out
    # the encoder told to spend less: its own floor, and the same clips
    assert "libx264 alone (superfast, CRF 27, one thread)" in out
    assert figures["x264_floor_fast_encode_cpu_s_per_video_hour"] > 0
    assert figures["contenders"]["fast-encode"]["clips_kept"] == captioned["clips_kept"]
    # the per-stage table shows the captioner's GPU share, though no other contender ran
    share = figures["captioned_gpu_shares"]["Captioner"]
    assert share > 0 and re.search(rf"^Captioner +{share:.4g} ", out, re.M)


def test_the_x264_floor_is_the_encode_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """What it measures is the encoder: over the same frames, a slower preset costs more."""
    from conveyor.samples.video import Segment, write_video

    bench = load("video_gpu", monkeypatch)
    video = write_video(
        tmp_path / "v.mp4", [Segment("noise", 4.0, 1)], width=320, height=240, fps=24
    )
    fast = bench.x264_floor(Path(video.path), "ultrafast", 23, seconds=2.0)
    slow = bench.x264_floor(Path(video.path), "slow", 23, seconds=2.0)
    assert 0 < fast < slow


def test_x264_presets_prints_each_at_one_crf_and_at_the_baselines_quality(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load("x264_presets", monkeypatch)
    size = ["--width", "160", "--height", "96", "--frames", "12", "--repeats", "1"]
    figures = bench.main(
        [*size, "--presets", "ultrafast,veryfast", "--cache", str(tmp_path), "--grain", "8"]
    )
    out = capsys.readouterr().out
    for source in ("generated", "grain"):
        same_crf, same_quality = figures[source]["same_crf"], figures[source]["same_quality"]
        assert set(same_crf) == {"ultrafast@23", "veryfast@23"}
        (matched,) = set(same_quality) - {"veryfast@23"}
        # the faster preset at the CRF that reaches the baseline's luma PSNR
        assert matched.startswith("ultrafast@")
        assert same_quality[matched]["psnr_y_db"] >= same_quality["veryfast@23"]["psnr_y_db"]
        assert all(f["mbit_per_s"] > 0 for f in same_crf.values())
        assert f"{source}: 12 frames of 160x96@30" in out
    assert "as good as it" in out


@slow
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


@slow
def test_video_user_quick(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--user``: our command, the plain script and our stages without the engine
    (``--inline``) as subprocesses, one 3 s video (fixed) and two of 2 s (small), each
    measured from its start: first clip, tree CPU, wall."""
    import av

    bench = load("video", monkeypatch)
    outputs = tmp_path / "runs"
    size = ["--width", "160", "--height", "90", "--fps", "30"]
    figures = bench.main(
        [
            *["--user", "--cases", "fixed,small", "--videos", "1", "--seconds", "3", *size],
            *["--small-videos", "2", "--cache", str(tmp_path / "cache"), "--outputs", str(outputs)],
            "--inline",
        ]
    )
    out = capsys.readouterr().out
    plain = load("plain_video", monkeypatch)
    for case, videos, seconds in (("fixed", 1, 3.0), ("small", 2, 2.0)):
        runs = {r["contender"]: r for r in figures["user"][case]["runs"]}
        assert set(runs) == {"ours", "plain", "inline"}
        for r in runs.values():
            assert r["returncode"] == 0 and r["lingering"] == 0
            assert 0 < r["first_clip_s"] <= r["wall_s"]
            assert r["video_s"] == pytest.approx(videos * seconds, abs=0.1)
            # the tree's CPU from RUSAGE_CHILDREN: at least what sampling its processes saw
            assert 0 < r["sampled_cpu_s"] <= r["cpu_s"] + 0.1
        assert runs["ours"]["clips_kept"] == runs["plain"]["clips_kept"] == videos
        # the same stages without the engine: the same clips, rows and records
        assert runs["inline"]["clips_kept"] == videos
        ours, inline = outputs / f"{case}-ours-0", outputs / f"{case}-inline-0"
        for folder in ("clips", "metas", "videos"):
            names = sorted(p.relative_to(ours).as_posix() for p in (ours / folder).rglob("*"))
            assert names and names == sorted(
                p.relative_to(inline).as_posix() for p in (inline / folder).rglob("*")
            )
        # (which short videos share a table depends on when each reached the writer)
        rows = [
            sorted(ds.dataset(out / "metadata").to_table().column("clip_id").to_pylist())
            for out in (ours, inline)
        ]
        assert rows[0] and rows[0] == rows[1]
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
    assert "inline / plain (the stages' work)" in out and "ours / inline" in out


@slow
def test_semdedup_tiny(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Ours and the one-process baseline on 3,000 items, the quality case on 1,000: both
    find the planted copies, ours with precision 1.0."""
    bench = load("semdedup", monkeypatch)
    saved = tmp_path / "semdedup.json"
    args = ["--sizes", "3000", "--dim", "16", "--quality", "1000", "--clusters", "2"]
    figures = bench.main([*args, "--data", str(tmp_path / "data"), "--json", str(saved)])
    (row,) = figures["growth"]
    assert row["ours"]["duplicates"] > 200 and row["baseline"]["duplicates"] > 200
    assert row["ours"]["peak_rss_mb"] > 0 and row["ours"]["cpu_s"] > 0
    (run,) = figures["quality"]["runs"]
    assert run["precision"] == 1.0 and run["recall"] >= 0.9
    out = capsys.readouterr().out
    assert "growth (16-d float32" in out and "quality on 1,000 items" in out
    assert json.loads(saved.read_text())["growth"][0]["n"] == 3000


@slow
def test_video_many_full_runs_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--no-resume``: one run per size, the resume figures left empty, not made up."""
    bench = load("video_many", monkeypatch)
    figures = bench.main(["--sizes", "1,2", "--no-resume", "--cache", str(tmp_path / "c")])
    for size in figures["sizes"]:
        assert size["full"]["exit"] == 0 and size["partial"] is None and size["resume"] is None
        assert size["derived"]["resume_s"] is None
    assert "0/-/-" in capsys.readouterr().out  # the exit codes' row


@slow
def test_video_many_quick(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Two tiny sizes, each run as the command (full, partial, resumed): the driver's own
    figures, the journal, the summary time and the ratios are reported."""
    bench = load("video_many", monkeypatch)
    saved = tmp_path / "many.json"
    figures = bench.main(
        ["--sizes", "3,6", "--cache", str(tmp_path / "cache"), "--json", str(saved)]
    )
    out = capsys.readouterr().out
    assert [s["videos"] for s in figures["sizes"]] == [3, 6]
    for size in figures["sizes"]:
        n = size["videos"]
        full, partial, resume = size["full"], size["partial"], size["resume"]
        assert full["exit"] == partial["exit"] == resume["exit"] == 0
        assert full["videos"]["ok"] == resume["videos"]["ok"] == n
        assert partial["videos"]["in"] == n - 1
        assert resume["videos"]["skipped_as_complete"] == n - 1
        assert resume["videos"]["done_this_run"] == 1
        assert 0 < full["driver_cpu_s"] < full["tree_cpu_s"]
        assert 0 < full["run_cpu_s"] < full["driver_cpu_s"]
        assert full["driver_peak_rss"] >= full["rss_at_run"] > 0
        assert full["journal_bytes"] > 0 and full["summary_s"] is not None
        assert 0 < full["first_clip_s"] <= full["wall_s"]
    assert set(figures["ratios"]) == {
        "driver_cpu_ms_per_video",
        "run_cpu_ms_per_video",
        "driver_peak_rss",
        "peak_rss_before_summary",
        "driver_peak_rss_bytes_per_added_video",
        "peak_rss_before_summary_bytes_per_added_video",
    }
    assert "6 videos over 3" in out and "driver peak RSS before the summary" in out
    assert json.loads(saved.read_text())["sizes"][1]["videos"] == 6
    again = bench.main(["--from-json", str(saved)])  # the same tables, from the saved figures
    assert again["ratios"] == figures["ratios"] and "6 videos over 3" in capsys.readouterr().out


@slow
def test_image_quick(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bench = load("image", monkeypatch)
    saved = tmp_path / "image.json"
    options = ["--data", str(tmp_path / "data"), "--work", str(tmp_path / "work")]
    figures = bench.main(["--quick", *options, "--json", str(saved)])
    out = capsys.readouterr().out
    assert figures["ours"]["images"] == figures["plain"]["images"] == 48
    assert figures["ours"]["kept"] == figures["plain"]["kept"] == 48
    assert [m["images"] for m in figures["memory"]] == [24, 48]
    assert all(m["peak_pss_bytes"] > 0 and m["images_per_s"] > 0 for m in figures["memory"])
    assert figures["plain_one_thread"]["images"] == 24
    assert figures["plain_one_thread"]["threads"] == 1 and figures["plain"]["threads"] == 2
    for text in ("image curation, 48 images", "ours / plain images/s", "peak memory by input"):
        assert text in out
    assert "on 2 cores with no overhead at all" in out
    assert json.loads(saved.read_text())["ratio"] == figures["ratio"] > 0
    assert figures["ceiling"] > 0
    with pytest.raises(SystemExit):
        bench.main(["--images", "48", *options, "--compare", "0"])
    assert bench.generate(tmp_path / "data", 48, 16, 0, True, 2) == 0.0  # written once


@slow
def test_video_resume_quick(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    bench = load("video_resume", monkeypatch)
    argv = ["video_resume.py", "--minutes", "0.8", "--width", "160", "--stop-at", "0.5"]
    monkeypatch.setattr(sys, "argv", [*argv, "--cpus", "2"])
    bench.main()
    out = capsys.readouterr().out
    assert "resumed / never stopped:" in out
    resumed = next(line for line in out.splitlines() if line.startswith("resumed "))
    *_, adopted, same = resumed.split()
    assert int(adopted) >= 6 and same == "True"
