"""The video pipeline end to end on the local backend: the output layout, the summary,
resuming (also after ``kill -9``), deterministic ids, refused option changes, and the
``conveyor video`` command's exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import av
import psutil
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conveyor.backends import LocalBackend
from conveyor.cli import app
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.media.layout import OutputLayout
from conveyor.pipeline import Pipeline
from conveyor.pipelines.video import (
    ConfigMismatch,
    VideoConfig,
    build_video_pipeline,
    check_resume,
    gpu_shares,
    run_video,
)
from conveyor.samples.video import Segment, write_bad_file, write_video
from conveyor.stages.video.base import FrameConsumer
from conveyor.stages.video.transcode import ClipTranscoder
from conveyor.stages.video.writer import NO_CLIPS

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def make_inputs(root: Path, videos: int = 2) -> Path:
    """Good videos in two containers (one with a still stretch) and one truncated file."""
    specs = [
        ("a.mp4", [Segment("pan", 4, 1), Segment("bars", 4, 2, static=True)]),
        ("sub/b.mkv", [Segment("rings", 5, 3), Segment("shapes", 3, 4)]),
        ("sub/c.mov", [Segment("checker", 6, 5)]),
        ("d.webm", [Segment("plasma", 5, 6)]),
    ]
    for relative, segments in specs[:videos]:
        write_video(root / relative, segments, width=160, height=96, fps=12)
    write_bad_file(root / "broken.mp4", "truncated")
    return root


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_inputs(tmp_path_factory.mktemp("videos"))


def fast_config(inputs: Path, output: Path, **changes: Any) -> VideoConfig:
    """Fixed stride, no models but the embedder: the layout without minutes of inference."""
    values: dict[str, Any] = {
        "splitter": "fixed",
        "clip_len_s": 3.0,
        "tags": False,
        "quality": False,
    }
    values.update(changes)
    return VideoConfig(str(inputs), str(output), **values)


def local(executor: type = StreamingExecutor) -> Any:
    return executor(LocalBackend(num_cpus=2))


def records(output: Path) -> dict[str, dict[str, Any]]:
    videos = output / "videos"
    return {
        str(p.relative_to(videos))[: -len(".json")]: json.loads(p.read_text())
        for p in videos.rglob("*.json")
    }


def check_layout(output: Path) -> dict[str, dict[str, Any]]:
    """Everything the layout promises, whatever run made it."""
    layout = OutputLayout(output)
    found = records(output)
    kept = {c for r in found.values() for c in r["kept"]}
    made = {c for r in found.values() for c in r["clips"]}
    assert {p.stem for p in layout.clips.glob("*.mp4")} == kept
    assert {p.stem for p in layout.metas.glob("*.json")} == made
    rows = [
        cid
        for path in layout.embeddings.glob("*.parquet")
        for cid in pq.read_table(path).column("clip_id").to_pylist()
    ]
    assert sorted(rows) == sorted(kept)  # exactly one row per kept clip
    for path in layout.embeddings.glob("*.parquet"):
        schema = pq.read_schema(path)
        assert str(schema.field("clip_id").type) == "string"
        assert str(schema.field("embedding").type) == "list<element: float>"
    assert not list(layout.tmp.glob("*")) if layout.tmp.exists() else True
    assert not list(layout.staging.glob("*")) if layout.staging.exists() else True
    for path in layout.clips.glob("*.mp4"):
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            assert stream.codec_context.pix_fmt == "yuv420p"
            frames = sum(1 for _ in container.decode(stream))
        meta = json.loads(layout.meta_path(path.stem).read_text())
        assert frames == meta["num_frames"] > 0
    return found


# -- one run -----------------------------------------------------------------------------
def test_fixed_stride_run_writes_the_layout_and_summary(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    report = run_video(fast_config(inputs, output), local())
    assert report.result.completed
    found = check_layout(output)
    assert set(found) == {"a.mp4", "sub/b.mkv", "broken.mp4"}
    assert found["broken.mp4"]["status"] == "failed"
    assert "truncated" in found["broken.mp4"]["errors"]["VideoProbe"]
    assert found["a.mp4"]["filtered"] == {"motion": found["a.mp4"]["filtered"]["motion"]}
    assert len(found["a.mp4"]["filtered"]["motion"]) >= 1  # the still stretch
    summary = json.loads((output / "summary.json").read_text())
    assert summary == report.summary
    assert summary["videos"] == {
        "in": 3,
        "ok": 2,
        "failed": 1,
        "incomplete": 0,
        "without_clips": 0,
        "damaged": [],
        "done_this_run": 3,
        "skipped_as_complete": 0,
    }
    assert summary["seconds_in"] == pytest.approx(16.0, abs=0.2)
    assert summary["clips"]["kept"] == len({c for r in found.values() for c in r["kept"]})
    assert summary["clips"]["filtered"]["motion"] >= 1
    assert [f["video"] for f in summary["failures"]] == ["broken.mp4"]
    meta = json.loads(next((output / "metas").glob("*.json")).read_text())
    for key in ("clip_id", "source_video", "span", "duration_s", "width", "height", "fps",
                "num_frames", "codec", "scores", "filtered_by", "tags", "captions"):  # fmt: skip
        assert key in meta
    assert meta["source_video"] in ("a.mp4", "sub/b.mkv")


class FlakyTranscoder(ClipTranscoder):
    """Fails once in each chunk of several clips right after sending its first clip, as a
    worker hiccup would (a file under ``marks`` says the chunk failed already)."""

    def __init__(self, marks: str, **options: Any) -> None:
        super().__init__(**options)
        self.marks = marks

    def process(self, task: Any) -> Any:
        video = task.data
        mark = Path(self.marks) / f"{video.video_id}-{video.chunk_index}"
        for sent, part in enumerate(super().process(task), start=1):
            yield part
            if sent == 1 and len(video.clips) > 1 and not mark.exists():
                mark.touch()
                raise RuntimeError("the worker stumbled after its first clip")


def test_a_transcoder_failing_after_its_first_clip_leaves_every_clip_once(
    inputs: Path, tmp_path: Path
) -> None:
    """The chunk is tried again; its parts, the same in the same order on every attempt,
    reach the writer once each (the engine drops those it forwarded already)."""
    clean = tmp_path / "clean"
    run_video(fast_config(inputs, clean, embed=False), local())
    output, marks = tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    pipeline = build_video_pipeline(fast_config(inputs, output))  # embeddings too, by part
    ours = next(s for s in pipeline.stages if isinstance(s, ClipTranscoder))
    flaky = FlakyTranscoder(
        str(marks), encoder="libx264", frame_rates=ours.frame_rates, motion_patch=ours.motion_patch
    )
    stages = [flaky if stage is ours else stage for stage in pipeline.stages]
    result = Pipeline("flaky", stages).run(local())
    assert result.completed and not result.failures
    assert result.stats["FlakyTranscoder"].retried == len(list(marks.iterdir())) > 0
    found, expected = check_layout(output), records(clean)
    for key in ("clips", "kept", "filtered", "damaged_packets"):
        assert {k: v[key] for k, v in found.items()} == {k: v[key] for k, v in expected.items()}
    metas = [json.loads(p.read_text()) for p in (output / "metas").glob("*.json")]
    assert (
        len(metas)
        == len({m["clip_id"] for m in metas})
        == sum(len(r["clips"]) for r in found.values())
    )


def test_the_clip_vectors_definition_on_request(inputs: Path, tmp_path: Path) -> None:
    """``motion_source="clip"`` scores each encoded clip's own vectors (decoding it again),
    the definition of earlier versions: the same clips filtered on these videos."""
    runs = {}
    for source in ("source", "clip"):
        output = tmp_path / source
        run_video(fast_config(inputs, output, embed=False, motion_source=source), local())
        metas = [json.loads(p.read_text()) for p in (output / "metas").glob("*.json")]
        assert {m["motion_source"] for m in metas} == {source}
        runs[source] = {m["clip_id"]: m["filtered_by"] for m in metas}
    assert runs["source"] == runs["clip"]
    assert "motion" in runs["source"].values()


def test_write_filtered_and_score_only(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "filtered"
    run_video(fast_config(inputs, output, write_filtered=True, embed=False), local())
    filtered = list((output / "filtered_clips").glob("*.mp4"))
    assert filtered
    for path in filtered:
        assert json.loads((output / "metas" / f"{path.stem}.json").read_text())["filtered_by"]
    scored = tmp_path / "scored"
    run_video(fast_config(inputs, scored, score_only=True, embed=False), local())
    found = records(scored)
    assert all(not r["filtered"] for r in found.values())
    metas = [json.loads(p.read_text()) for p in (scored / "metas").glob("*.json")]
    assert all("motion_global_mean" in m["scores"] for m in metas)


def test_batch_executor_gives_the_same_clips(inputs: Path, tmp_path: Path) -> None:
    streamed = run_video(fast_config(inputs, tmp_path / "s", embed=False), local())
    batched = run_video(fast_config(inputs, tmp_path / "b", embed=False), local(BatchExecutor))
    assert streamed.summary["clips"] == batched.summary["clips"]
    a, b = records(tmp_path / "s"), records(tmp_path / "b")
    assert {k: v["clips"] for k, v in a.items()} == {k: v["clips"] for k, v in b.items()}


def test_clip_ids_are_the_same_in_every_run(inputs: Path, tmp_path: Path) -> None:
    copy = tmp_path / "moved"
    shutil.copytree(inputs, copy)  # the same files elsewhere: ids follow relative paths
    run_video(fast_config(inputs, tmp_path / "one", embed=False), local())
    run_video(fast_config(copy, tmp_path / "two", embed=False), local())
    one, two = records(tmp_path / "one"), records(tmp_path / "two")
    assert {k: v["clips"] for k, v in one.items()} == {k: v["clips"] for k, v in two.items()}


# -- resuming ----------------------------------------------------------------------------
def test_a_second_run_skips_complete_videos_and_redoes_a_changed_one(
    inputs: Path, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    shutil.copytree(inputs, source)
    output = tmp_path / "out"
    run_video(fast_config(source, output), local())
    before = {p: p.stat().st_mtime_ns for p in (output / "clips").glob("*.mp4")}
    again = run_video(fast_config(source, output), local())
    assert again.summary["videos"]["skipped_as_complete"] == 3
    assert again.summary["videos"]["done_this_run"] == 0
    assert {p: p.stat().st_mtime_ns for p in (output / "clips").glob("*.mp4")} == before
    # the input changed: its outputs are replaced, nothing of the old version is left
    write_video(source / "a.mp4", [Segment("checker", 4, 9)], width=160, height=96, fps=12)
    third = run_video(fast_config(source, output), local())
    assert third.summary["videos"]["done_this_run"] == 1
    check_layout(output)


def test_other_options_on_the_same_output_are_refused(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    run_video(fast_config(inputs, output, embed=False), local())
    with pytest.raises(ConfigMismatch, match=r"clip_len_s: 3\.0 -> 4\.0"):
        run_video(fast_config(inputs, output, embed=False, clip_len_s=4.0), local())
    # the executor is no output option; --limit may take more of the input than before,
    # not less: on a whole output, --limit 2 picked two videos that had failed, and the
    # summary said "2 in, 2 failed" (exit 1, "nothing was curated") for 14 clips written
    with pytest.raises(ConfigMismatch, match="made from every video of its input; --limit 1"):
        run_video(fast_config(inputs, output, embed=False, limit=1), local())
    run_video(fast_config(inputs, output, embed=False), local(BatchExecutor))
    limited = tmp_path / "limited"
    run_video(fast_config(inputs, limited, embed=False, limit=2), local())
    with pytest.raises(ConfigMismatch, match="made from 2 videos; --limit 1 would leave"):
        check_resume(fast_config(inputs, limited, embed=False, limit=1))
    for more in (3, None):
        check_resume(fast_config(inputs, limited, embed=False, limit=more))


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie); one that ends while it is looked at has ended
    (psutil can then raise a plain FileNotFoundError for its /proc file)."""
    try:
        return psutil.Process(pid).status() != "zombie"
    except (psutil.Error, OSError):
        return False


@pytest.mark.slow
def test_kill_9_mid_run_then_the_same_command_finishes_with_every_clip_once(
    tmp_path: Path,
) -> None:
    source = make_inputs(tmp_path / "in", videos=4)
    for i in range(4):  # more work, so the kill lands in the middle
        write_video(
            source / f"more/e{i}.mp4",
            [Segment("pan", 6, 10 + i), Segment("noise", 6, 20 + i)],
            width=320,
            height=192,
            fps=15,
        )
    output = tmp_path / "out"
    command = [
        sys.executable, "-m", "conveyor", "video", str(source), str(output),
        "--splitter", "fixed", "--clip-len", "2", "--no-tags", "--no-quality",
        "--no-live", "--cpus", "2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    family: set[int] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        family |= {p.pid for p in _descendants(proc.pid)}
        done = list((output / "videos").rglob("*.json")) if (output / "videos").exists() else []
        if len(done) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    family |= {p.pid for p in _descendants(proc.pid)}
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # its workers go away by themselves once their driver is gone (a batch they were doing
    # may still be finished and written: writes are whole files)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in family):
        assert time.monotonic() < deadline, "workers outlived their killed driver"
        time.sleep(0.1)
    # what the killed run left: every file complete, every unfinished video incomplete
    layout = OutputLayout(output)
    for path in layout.clips.glob("*.mp4"):
        with av.open(str(path)) as container:
            assert sum(1 for _ in container.decode(video=0)) > 0
    finished = len(records(output))
    assert 2 <= finished < 9

    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    found = check_layout(output)
    assert len(found) == 9
    summary = json.loads((output / "summary.json").read_text())
    assert summary["videos"]["skipped_as_complete"] == finished
    assert summary["videos"]["ok"] == 8 and summary["videos"]["failed"] == 1
    # exactly once: the clips on disk are those of the records, each id in one video only
    ids = [c for r in found.values() for c in r["clips"]]
    assert len(ids) == len(set(ids))


@pytest.mark.slow
@pytest.mark.parametrize("splitter", ["fixed", "shots"])
def test_a_long_video_killed_part_way_resumes_from_its_finished_clips(
    tmp_path: Path, splitter: str
) -> None:
    """``kill -9`` once a long video's first clips are staged: the same command keeps them
    (their files are not written again) and ends with the output of a run never stopped."""
    segments = [Segment(kind, 10, i) for i, kind in enumerate(("pan", "rings", "checker"))]
    write_video(tmp_path / "in" / "long.mp4", segments, width=160, height=96, fps=15)
    cut = ["--splitter", "fixed", "--clip-len", "1"] if splitter == "fixed" else ["--max-clip", "1"]
    options = [*cut, "--min-clip", "0.5", "--no-tags", "--no-live", "--cpus", "2"]

    def command(output: Path) -> list[str]:
        return [sys.executable, "-m", "conveyor", "video", str(tmp_path / "in"), str(output)]

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    reference, output = tmp_path / "reference", tmp_path / "out"
    subprocess.run([*command(reference), *options], env=env, check=True, capture_output=True)
    proc = subprocess.Popen(
        [*command(output), *options],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    staging = output / ".conveyor" / "staging"
    try:
        deadline = time.monotonic() + 120
        while len(list(staging.glob("*/chunk-*.json"))) < 4:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no clip was staged within 120 s"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(0.5)  # (its workers' last writes)
    assert not (output / "videos" / "long.mp4.json").exists()
    before = {p.name: p.stat().st_ino for p in (output / "clips").glob("*.mp4")}

    result = subprocess.run(
        [*command(output), *options], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found, wanted = records(output)["long.mp4"], records(reference)["long.mp4"]
    resumed = found.pop("resumed_clips")
    assert resumed >= 4 and found.pop("resumed_seconds") == pytest.approx(resumed, abs=0.01)
    for record in (found, wanted):
        for key in ("finished_at", "resumed_clips", "resumed_seconds", "num_chunks", "path"):
            record.pop(key, None)
    assert found == wanted
    kept = {p.name: p.stat().st_ino for p in (output / "clips").glob("*.mp4")}
    assert sorted(kept) == sorted(p.name for p in (reference / "clips").glob("*.mp4"))
    assert sum(kept.get(name) == inode for name, inode in before.items()) >= resumed
    summary = json.loads((output / "summary.json").read_text())
    assert summary["clips"]["resumed"] == resumed
    assert summary["clips"]["made"] == len(wanted["clips"])
    assert not list(staging.iterdir())


# -- the shot pipeline -------------------------------------------------------------------
def test_shot_pipeline_finds_cuts_and_keeps_clips_inside_shots(tmp_path: Path) -> None:
    truth = write_video(
        tmp_path / "in" / "cuts.mp4",
        [Segment("pan", 4, 1), Segment("rings", 4, 2), Segment("checker", 4, 3)],
        width=160,
        height=96,
        fps=15,
    )
    output = tmp_path / "out"
    config = VideoConfig(str(tmp_path / "in"), str(output), tags=False, max_clip_s=3.0)
    report = run_video(config, local())
    assert report.result.completed
    record = check_layout(output)["cuts.mp4"]
    for cut in truth.cuts_s:
        assert any(abs(b - cut) <= 1.5 / truth.fps for b in record["boundaries_s"])
    # no GPU: every frame decoded on the CPU, as asked
    assert record["decoders"] == record["shot_decoders"] == ["cpu"]
    assert record["decoder_fallback"] is record["shot_decoder_fallback"] is None
    for clip in record["clips"]:
        start, end = json.loads((output / "metas" / f"{clip}.json").read_text())["span"]
        assert not any(start < cut < end for cut in truth.cuts_s)
        assert end - start <= 3.0 + 1e-6


def test_shot_pipeline_keeps_clips_out_of_a_dissolve_between_scenes_of_one_kind(
    tmp_path: Path,
) -> None:
    """Two plasmas blend over 2 s: the change is no more than the plasma's own, so only the
    sag of the picture's variance finds it (the CPU default, the hybrid, missed it)."""
    write_video(
        tmp_path / "in" / "blend.mp4",
        [Segment("plasma", 6, 1), Segment("plasma", 6, 2)],
        width=160,
        height=96,
        fps=15,
        crossfades={0: 2.0},
    )
    output = tmp_path / "out"
    config = VideoConfig(
        str(tmp_path / "in"), str(output), quality=False, embed=False, tags=False, max_clip_s=3.0
    )
    assert run_video(config, local()).result.completed
    record = records(output)["blend.mp4"]
    spans = [
        json.loads((output / "metas" / f"{clip}.json").read_text())["span"]
        for clip in record["clips"]
    ]
    blend = (4.0, 6.0)
    assert any(end <= blend[0] for _, end in spans) and any(start >= blend[1] for start, _ in spans)
    assert not any(start < blend[1] - 0.1 and end > blend[0] + 0.1 for start, end in spans)


def test_pipeline_stages_follow_the_options(tmp_path: Path) -> None:
    # auto: TransNetV2 on every frame with a GPU, the hybrid on a CPU
    for gpus, detector in ((True, "TransNetV2Detector"), (False, "HybridDetector")):
        config = VideoConfig(str(tmp_path), "o", gpus=gpus)
        names = [s.name for s in build_video_pipeline(config).build()]
        assert names[:6] == [
            "VideoListing", "VideoProbe", "ShotWindows", "ShotFrameDecoder", detector,
            "ShotSplitter",
        ]  # fmt: skip
        assert config.shot_detector == detector.removesuffix("Detector").lower()
    assert names[-1] == "ClipWriter"
    bare = VideoConfig(
        str(tmp_path), "o", splitter="fixed", quality=False, embed=False, tags=False,
        motion=False,
    )  # fmt: skip
    names = [s.name for s in build_video_pipeline(bare).build()]
    assert names == ["VideoListing", "VideoProbe", "FixedStrideSplitter", "ClipTranscoder",
                     "ClipWriter"]  # fmt: skip
    for name in ("transnetv2", "hybrid", "adaptive", "content", "histogram"):
        config = VideoConfig(str(tmp_path), "o", detector=name, shot_threshold=0.9)  # type: ignore[arg-type]
        stages = {s.name: s.stage for s in build_video_pipeline(config).build()}
        (detector,) = [s for n, s in stages.items() if n.endswith("Detector")]
        assert detector.threshold == 0.9  # type: ignore[attr-defined]
        assert type(detector).__name__.lower() == f"{name}detector"
        decoder = stages["ShotFrameDecoder"]
        assert decoder.width == (None if name == "transnetv2" else 256)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="detector must be one of auto, transnetv2"):
        VideoConfig(str(tmp_path), "o", detector="sparkles")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shot_threshold for transnetv2 must be in \(0, 1\)"):
        VideoConfig(str(tmp_path), "o", detector="transnetv2", shot_threshold=3.0)
    auto = VideoConfig(str(tmp_path), "o", shot_threshold=30.0, gpus=True)
    with pytest.raises(ValueError, match="for transnetv2, the detector auto chose"):
        build_video_pipeline(auto)
    # one EfficientNet-Lite0 pass per clip: the tagger ranks the embedder's probabilities
    default = {
        s.name: s.stage for s in build_video_pipeline(VideoConfig(str(tmp_path), "o")).build()
    }
    tagger, embedder = default["ImageNetTagger"], default["ClipEmbedder"]
    assert tagger.from_embedder and tagger.frame_rate == embedder.frame_rate
    alone = VideoConfig(str(tmp_path), "o", embed=False)
    assert not next(
        s.stage for s in build_video_pipeline(alone).build() if s.name == "ImageNetTagger"
    ).from_embedder
    # one decode of each clip's stretch of the source: the transcoder takes the models'
    # frames and the source's motion vectors in it, and no stage decodes the clip again
    order = list(default)
    transcoder, motion = default["ClipTranscoder"], default["MotionFilter"]
    assert "ClipFrameExtractor" not in order
    assert order.index("MotionFilter") == order.index("ClipTranscoder") + 1
    assert transcoder.motion_patch == motion.patch and motion.source == "source"
    rates = {s.frame_rate for s in default.values() if isinstance(s, FrameConsumer)}
    assert set(transcoder.frame_rates) == rates and transcoder.frame_rates
    last_reader = [s for s in default.values() if isinstance(s, FrameConsumer)][-1]
    assert last_reader.release_frames
    judging = next(
        s
        for s in build_video_pipeline(VideoConfig(str(tmp_path), "o")).build()
        if s.name == "MotionFilter"
    )
    assert judging.resources.cpus == 0.25  # it decodes nothing (but a source without vectors)
    frameless = VideoConfig(str(tmp_path), "o", quality=False, embed=False, tags=False)
    specs = {s.name: s for s in build_video_pipeline(frameless).build()}
    assert list(specs)[-3:] == ["ClipTranscoder", "MotionFilter", "ClipWriter"]
    assert specs["ClipTranscoder"].stage.frame_rates == ()
    still = VideoConfig(str(tmp_path), "o", motion=False)
    still_stages = {s.name: s.stage for s in build_video_pipeline(still).build()}
    assert "MotionFilter" not in still_stages
    assert still_stages["ClipTranscoder"].motion_patch is None
    # the definition of earlier versions: the encoded clip's vectors, from a decode of its own
    clip = VideoConfig(str(tmp_path), "o", motion_source="clip")
    clip_specs = {s.name: s for s in build_video_pipeline(clip).build()}
    assert clip_specs["ClipTranscoder"].stage.motion_patch is None
    assert clip_specs["MotionFilter"].stage.source == "clip"
    assert clip_specs["MotionFilter"].resources.cpus == 1


def gpu_load(config: VideoConfig) -> dict[str, float]:
    return {
        s.name: s.resources.gpus for s in build_video_pipeline(config).build() if s.resources.gpus
    }


def test_one_worker_of_every_gpu_stage_fits_on_one_gpu(tmp_path: Path) -> None:
    # no GPU here to try NVENC on: the transcoder keeps a share for the workers to try
    # the tagger ranks what the embedder's network gave: no GPU of its own
    shots = gpu_load(VideoConfig(str(tmp_path), "o", gpus=True))
    assert sorted(shots) == ["ClipEmbedder", "ClipTranscoder", "TransNetV2Detector"]
    assert sum(shots.values()) <= 1.0
    cpu_encoder = gpu_load(
        VideoConfig(str(tmp_path), "o", gpus=True, encoder="libx264", decoder="cpu")
    )
    assert "ClipTranscoder" not in cpu_encoder and set(cpu_encoder.values()) == {0.25}
    # x264 on the CPU and the source decoded on the GPU's NVDEC: decoder units, no share
    nvdec = gpu_load(VideoConfig(str(tmp_path), "o", gpus=True, encoder="libx264"))
    assert nvdec == cpu_encoder
    assert gpu_load(VideoConfig(str(tmp_path), "o", gpus=False)) == {}
    # the tagger runs its own network where the embedder runs another
    other = tmp_path / "embedder.pt"
    other.write_bytes(b"PK\x03\x04")  # as torch.save begins (the file is not loaded here)
    alone = gpu_load(VideoConfig(str(tmp_path), "o", gpus=True, embed_model=str(other)))
    assert "ImageNetTagger" in alone and sum(alone.values()) <= 1.0
    # every GPU stage there is, a captioner among them: it takes half, the five others share
    (tmp_path / "config.json").write_text("{}")  # a model folder (none is loaded here)
    full = VideoConfig(
        str(tmp_path), "o", gpus=True, caption_model=str(tmp_path),
        aesthetic_model=str(tmp_path), text_embed=True,
    )  # fmt: skip
    small, captioner = gpu_shares(full, nvenc=True)
    assert captioner == 0.5 and small > 0 and 5 * small + captioner <= 1.0
    assert gpu_shares(VideoConfig(str(tmp_path), "o", gpu_share=0.1), nvenc=True) == (0.1, 0.0)


def decoder_units(config: VideoConfig) -> dict[str, float]:
    return {
        s.name: s.resources.nvdecs
        for s in build_video_pipeline(config).build()
        if s.resources.nvdecs
    }


def test_a_gpu_without_video_encoders_lends_the_decoding_stages_nvdec_units_not_compute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an A100, H100 or H200 (NVDEC, no NVENC) the transcoder and the shot detector's
    decoder ask for decoder units: a share of the GPU's compute would cap the transcoders,
    which encode on the CPUs, at a few per GPU."""
    from conveyor.backends import devices
    from conveyor.pipelines.video import SHOT_DECODER_NVDECS, TRANSCODER_NVDECS
    from conveyor.stages.video import transcode

    monkeypatch.setattr(devices, "detect_gpus", lambda: devices.GpuInventory(("0",), 141.0))
    monkeypatch.setattr(transcode, "nvenc_works", lambda: False)
    on_cpu = VideoConfig(str(tmp_path), "o", gpus=True, decoder="cpu")
    assert "ClipTranscoder" not in gpu_load(on_cpu) and decoder_units(on_cpu) == {}
    config = VideoConfig(str(tmp_path), "o", gpus=True)  # decoder auto: NVDEC decodes
    assert gpu_load(config) == gpu_load(on_cpu)
    assert decoder_units(config) == {
        "ShotFrameDecoder": SHOT_DECODER_NVDECS,
        "ClipTranscoder": TRANSCODER_NVDECS,
    }
    # one worker of each fits a GPU of any model we know, the V100's single unit too
    least = min(decs for decs, _ in devices.VIDEO_ENGINES.values())
    assert least >= SHOT_DECODER_NVDECS + TRANSCODER_NVDECS
    stages = {s.name: s for s in build_video_pipeline(config).stages}
    assert stages["ClipTranscoder"].encoder == "libx264"
    assert stages["ClipTranscoder"].decoder == stages["ShotFrameDecoder"].decoder == "auto"
    # PySceneDetect's detectors read whole frames decoded on NVDEC the same way
    hybrid = VideoConfig(str(tmp_path), "o", gpus=True, detector="hybrid")
    assert decoder_units(hybrid)["ShotFrameDecoder"] == SHOT_DECODER_NVDECS
    assert decoder_units(VideoConfig(str(tmp_path), "o", gpus=False)) == {}  # the CPU decodes
    monkeypatch.setattr(transcode, "nvenc_works", lambda: True)
    assert "ClipTranscoder" in gpu_load(on_cpu)


@pytest.mark.slow  # (28 s; each fallback it shows is also tested alone: test_nvdec.py)
def test_the_gpu_pipeline_runs_on_one_gpu(inputs: Path, tmp_path: Path) -> None:
    """Every stage at once on one (declared) GPU: shot detection, NVENC's share, embeddings
    and tags; the models fall back to the CPU here, where CUDA is not there."""
    out = tmp_path / "out"
    config = VideoConfig(str(inputs), str(out), gpus=True, quality=False)
    report = run_video(config, StreamingExecutor(LocalBackend(num_cpus=2, num_gpus=1)))
    assert report.result.completed and report.summary["clips"]["kept"] > 0
    check_layout(out)
    # the transcoder asked NVDEC (decoder auto on a GPU worker); no driver takes it here, so
    # each video was decoded on the CPU, and its record says why
    ok = [r for r in records(out).values() if r["status"] == "ok"]
    assert ok and all(r["decoders"] == ["cpu"] for r in ok)
    assert all("cuvid" in r["decoder_fallback"] for r in ok)
    # so did the shot detector's decoder, on NVDEC units of the GPU, window by window
    assert all(r["shot_decoders"] == ["cpu"] for r in ok)
    assert all("h264_cuvid does not open" in r["shot_decoder_fallback"] for r in ok)


def test_decoder_nvdec_on_declared_gpus_decodes_each_video_on_the_cpu_saying_why(
    inputs: Path, tmp_path: Path
) -> None:
    from conveyor.media.decode import nvdec_works

    if nvdec_works():
        pytest.skip("NVDEC works here: the videos are decoded on it")
    out = tmp_path / "out"
    run_fixed(inputs, out, "3", "--no-quality", "--decoder", "nvdec", "--gpus", "1")
    ok = [r for r in records(out).values() if r["status"] == "ok"]
    assert len(ok) == 2 and all(r["decoders"] == ["cpu"] for r in ok)
    assert all(r["shot_decoders"] == [] for r in ok)  # fixed stride: no shot detection
    assert all("h264_cuvid does not open" in r["decoder_fallback"] for r in ok)


def test_thresholds_and_windows_reach_their_stages(tmp_path: Path) -> None:
    """Each knob is read where it acts (the audit found no test naming these)."""
    config = VideoConfig(
        str(tmp_path), str(tmp_path / "out"), detector="transnetv2", detection_window_s=7.5,
        motion_threshold=0.125, motion_patch_threshold=0.0625,
    )  # fmt: skip
    stages = {type(s).__name__: s for s in build_video_pipeline(config).stages}
    assert stages["ShotWindows"].window_s == 7.5
    motion = stages["MotionFilter"]
    assert (motion.global_threshold, motion.patch_threshold) == (0.125, 0.0625)
    # PySceneDetect's detectors take windows of 20 s at least
    config = VideoConfig(str(tmp_path), str(tmp_path / "out"), detector="content")
    stages = {type(s).__name__: s for s in build_video_pipeline(config).stages}
    assert stages["ShotWindows"].window_s == 20.0
    assert stages["VideoReader"].probe.max_pixels == 8192 * 4320
    config = VideoConfig(str(tmp_path), str(tmp_path / "out"), max_pixels=1000)
    assert build_video_pipeline(config).stages[0].probe.max_pixels == 1000


def test_a_video_over_max_pixels_fails_alone_saying_why(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    args = [*fixed_command(inputs, output, "3"), "--no-embed", "--no-tags", "--no-live"]
    result = runner.invoke(app, [*args, "--max-pixels", "15359"])  # the videos: 160 x 96
    assert result.exit_code == 1, result.output  # every video failed
    said = " ".join(result.output.split())
    assert said.count("frames of 160x96 (15,360 pixels) are over the limit of 15,359") == 2
    assert all(r["status"] == "failed" for r in records(output).values())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"splitter": "scenes"}, "splitter must be"),
        ({"clip_len_s": 0}, "clip_len_s must be > 0"),
        ({"splitter": "fixed", "min_clip_s": 20}, "no clip could be kept"),
        ({"dedup": True, "embed": False}, "dedup needs embeddings"),
        ({"caption_model": "/nowhere/model"}, "does not exist"),
        ({"embed_model": "/nowhere/model.pt"}, "does not exist"),
        ({"limit": 0}, "limit must be >= 1"),
        ({"motion_source": "pixels"}, "motion_source must be"),
        ({"max_pixels": 0}, "max_pixels must be >= 1"),
        ({"dedup": True, "dedup_keep": ["longest"]}, r"dedup_keep must be one of .*\['longest'\]"),
    ],
)
def test_bad_options_are_clear_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VideoConfig("in", "out", **changes)


def test_a_keep_rule_without_dedup_needs_no_scores() -> None:
    """The keep rule's scores are needed only where the dedup runs (``--dedup-keep`` alone
    is the command's error)."""
    VideoConfig("in", "out", dedup_keep="sharpest", quality=False)
    VideoConfig("in", "out", dedup_keep="aesthetic")
    with pytest.raises(ValueError, match="drop --no-quality"):
        VideoConfig("in", "out", dedup=True, dedup_keep="sharpest", quality=False)


def test_the_description_names_the_keep_rule() -> None:
    from conveyor.pipelines.video import describe

    first = describe(VideoConfig("in", "out", dedup=True))
    assert first.endswith("semantic dedup at 0.95")
    sharpest = describe(VideoConfig("in", "out", dedup=True, dedup_keep="sharpest"))
    assert sharpest.endswith("semantic dedup at 0.95, keeping the sharpest")


# -- the command -------------------------------------------------------------------------
def fixed_command(inputs: Path, output: Path, clip_len: str) -> list[str]:
    """``conveyor video`` with fixed-stride clips of ``clip_len`` seconds."""
    return ["video", str(inputs), str(output), "--splitter", "fixed", "--clip-len", clip_len]


def run_fixed(inputs: Path, output: Path, clip_len: str, *extra: str) -> Any:
    """``fixed_command`` without the embedding and tagging models, run to a clean exit."""
    args = [*fixed_command(inputs, output, clip_len), "--no-embed", "--no-tags", "--no-live"]
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 0, result.output
    return result


def test_a_run_where_every_video_failed_exits_1(tmp_path: Path) -> None:
    """Failed videos are listed, not fatal; but a run that curated nothing exited 0."""
    source = tmp_path / "notes.mp4"
    source.write_text("not a video")
    args = [*fixed_command(source, tmp_path / "out", "3"), "--no-embed", "--no-tags", "--no-live"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "notes.mp4" in result.output and "every video failed" in result.output


def test_command_runs_and_lists_failed_videos(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    result = run_fixed(inputs, output, "3", "--no-quality")
    assert "3 in, 2 ok, 1 failed" in result.output
    assert "broken.mp4" in result.output and "truncated" in result.output
    assert (output / "summary.json").exists()
    # the journal: a header, then each video once it finished (the failed one included)
    journal = (output / ".conveyor" / "journal").read_text().splitlines()
    assert len(journal) == 1 + 3 and "broken.mp4" in "".join(journal)
    # the run's event log and report
    assert "report:" in result.output and "report.html" in result.output
    html = (output / "report.html").read_text()
    assert "video-curation" in html
    # the broken video, found bad by the pipeline (not an engine failure), is in both
    assert "1 bad inputs" in html and "broken.mp4" in html and "truncated" in html
    events = [json.loads(line) for line in (output / "events.jsonl").read_text().splitlines()]
    bad = [e for e in events if e["type"] == "failure"]
    assert [(e["kind"], e["task"], e["error_type"]) for e in bad] == [
        ("input", "broken.mp4", "bad video")
    ]
    assert [f["kind"] for f in json.loads((output / "summary.json").read_text())["failures"]] == [
        "input"
    ]
    start = events[0]
    assert start["settings"]["clip_len"] == 3 and start["settings"]["splitter"] == "fixed"
    again = run_fixed(inputs, output, "3", "--no-quality")  # exits cleanly again
    assert "3 already complete" in again.output
    # a video's record deleted: the next run does it again (the journal skipped it for
    # ever, while the run said it would be tried again)
    records = [p for p in sorted((output / "videos").glob("*.json")) if "broken" not in p.name]
    clips = sorted(p.name for p in (output / "clips").glob("*.mp4"))
    records[0].unlink()
    redone = run_fixed(inputs, output, "3", "--no-quality")
    assert "2 already complete" in redone.output and "incomplete" not in redone.output
    assert records[0].exists() and sorted(p.name for p in (output / "clips").glob("*.mp4")) == clips
    # a clip file deleted: its video is done again (every run counted the clip as there)
    (output / "clips" / clips[0]).unlink()
    redone = run_fixed(inputs, output, "3", "--no-quality")
    assert "2 already complete" in redone.output
    assert sorted(p.name for p in (output / "clips").glob("*.mp4")) == clips
    changed = runner.invoke(app, [*fixed_command(inputs, output, "4"), "--no-embed", "--no-live"])
    assert changed.exit_code == 2
    # by the flags to type (they were said by field: "clip_len_s: 3.0 -> 4.0, quality: ...")
    assert (
        "other options (--clip-len: 3.0 -> 4.0, --no-quality -> --quality, --no-tags -> --tags)"
        in changed.output
    )


def test_a_video_with_damaged_packets_is_done_and_named_as_damaged(tmp_path: Path) -> None:
    from tests.stages.video.test_probe import damage_packets

    clean = write_video(tmp_path / "clean.mp4", [Segment("pan", 4, 1)], width=160, height=96)
    inputs = tmp_path / "in"
    inputs.mkdir()
    damage_packets(clean.path, inputs / "scratched.mp4", slice(30, 36, 2))
    write_video(inputs / "fine.mp4", [Segment("rings", 4, 2)], width=160, height=96)
    output = tmp_path / "out"
    result = run_fixed(inputs, output, "2", "--no-quality")
    assert "2 in, 2 ok, 0 failed" in result.output
    assert "1 video(s) with damaged stretches" in result.output and "scratched.mp4" in result.output
    found = records(output)
    assert found["scratched.mp4"]["damaged_packets"] == 3
    assert found["scratched.mp4"]["kept"] and found["fine.mp4"]["damaged_packets"] == 0
    summary = json.loads((output / "summary.json").read_text())
    assert summary["videos"]["damaged"] == ["scratched.mp4"]


def test_the_command_takes_the_motion_source(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    run_fixed(inputs, output, "3", "--no-quality", "--motion-source", "clip")
    metas = [json.loads(p.read_text()) for p in (output / "metas").glob("*.json")]
    assert metas and {m["motion_source"] for m in metas} == {"clip"}
    assert json.loads((output / ".conveyor" / "config.json").read_text())["motion_source"] == "clip"


def test_the_live_count_of_finished_videos_counts_a_video_once() -> None:
    from conveyor.cli_video import _Progress
    from conveyor.tasks.video import Clip, Video, VideoTask

    clips = [Clip(f"c{i}", "v.mp4", (i, i + 1.0), (i, i + 1), num_frames=1) for i in range(2)]
    last = Video("/v.mp4", "v.mp4", clips=clips, chunk_index=1, last_chunk=True)
    progress = _Progress()
    for k, clip in enumerate(clips):  # the last chunk arrives as two parts
        progress.add(VideoTask(data=last.part_of(k, 2, [clip])))
    assert (progress.videos, progress.made, progress.kept) == (1, 2, 2)


def test_names_that_are_not_utf8_are_curated_under_an_escaped_name(tmp_path: Path) -> None:
    # Latin-1 bytes from an old camera or share, in a video's name and in INPUT and OUTPUT:
    # one such name ended the whole run before any video was done
    inputs = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9"))
    write_video(inputs / "fine.mp4", [Segment("rings", 4, 2)], width=160, height=96)
    odd = Path(os.fsdecode(os.fsencode(inputs) + b"/d\xe9j\xe0 vu.mp4"))
    write_video(odd, [Segment("pan", 4, 1)], width=160, height=96)
    output = Path(os.fsdecode(os.fsencode(tmp_path) + b"/out\xe9"))
    result = run_fixed(inputs, output, "2")
    assert "2 in, 2 ok, 0 failed" in result.output
    found = records(output)
    assert sorted(found) == ["d\\xe9j\\xe0 vu.mp4", "fine.mp4"]
    record = found["d\\xe9j\\xe0 vu.mp4"]
    assert record["kept"] and Path(record["path"]) == odd  # the real file, for programs
    metas = [json.loads(p.read_text()) for p in (output / "metas").glob("*.json")]
    assert {m["source_video"] for m in metas} == {"d\\xe9j\\xe0 vu.mp4", "fine.mp4"}
    assert "report.html" in result.output and (output / "report.html").exists()
    again = run_fixed(inputs, output, "2")  # exits cleanly again
    assert "2 already complete, skipped" in again.output


def test_videos_too_short_for_a_clip_are_counted_and_say_why(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    args = fixed_command(inputs, output, "60")
    result = runner.invoke(app, [*args, "--min-clip", "60", "--no-embed", "--no-live"])
    assert result.exit_code == 0, result.output
    assert "3 in, 2 ok, 1 failed, 2 too short for any clip" in result.output
    summary = json.loads((output / "summary.json").read_text())
    assert summary["videos"]["without_clips"] == 2 and summary["clips"]["made"] == 0
    reasons = [r["no_clips"] for r in records(output).values()]
    assert sorted(reasons, key=str) == [None, NO_CLIPS, NO_CLIPS]  # None: the failed one


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["video", "/no/such/dir", "out"], "does not exist"),
        (["video", "{input}", "out", "--splitter", "scenes"], "scenes"),
        (["video", "{input}", "out", "--address", "127.0.0.2:6390"], "--backend ray"),
        (["video", "{input}", "out", "--caption-model", "/no/model"], "does not exist"),
        (["video", "{input}", "out", "--caption-model", "{file}"], "not a Hugging Face model"),
        (["video", "{input}", "out", "--clip-len", "0"], "0"),
        (["video", "{input}", "out", "--motion-source", "pixels"], "pixels"),
        (["video", "{empty}", "out"], "no videos in"),
        (["video", "{input}", "out", "--executor", "ray-data", "--journal", "j"], "journal"),
        # the private cluster's CPUs are known: said before Ray starts (it was after, exit 1)
        (["video", "{input}", "out", "--executor", "ray-data", "--cpus", "1"], "actor pools hold"),
        (["video", "{input}", "out", "--journal", "{input}"], "is a directory"),
        (["video", "{input}", "out", "--memory-gb", "0.2"], "leaves nothing for workers"),
        (["video", "{input}", "{file}"], "afile is a file, not a folder"),
        (["video", "{input}", "{file}/out"], "out inside"),
        (
            ["video", "{input}", "out", "--backend", "ray", "--memory-gb", "4"],
            "--memory-gb is for the local backend",
        ),
        (
            ["video", "{input}", "out", "--executor", "ray-data", "--memory-gb", "4"],
            "--memory-gb is for the local backend",
        ),
        # joining a cluster: its nodes' CPUs, and an address nothing answers at is said at
        # once (ray.init retried it for minutes; --cpus was a traceback)
        (
            [
                "video",
                "{input}",
                "out",
                "--backend",
                "ray",
                "--address",
                "127.0.0.1:1",
                "--cpus",
                "2",
            ],
            "--cpus declares a private cluster's CPUs: joining the Ray cluster at 127.0.0.1:1",
        ),
        (
            [
                "video",
                "{input}",
                "out",
                "--executor",
                "ray-data",
                "--address",
                "127.0.0.1:1",
                "--cpus",
                "2",
            ],
            "--cpus declares a private cluster's CPUs",
        ),
        (
            ["video", "{input}", "out", "--backend", "ray", "--address", "127.0.0.1:1"],
            "no Ray cluster answers at 127.0.0.1:1",
        ),
        # no NVENC on this machine (the test makes sure of it below)
        (["video", "{input}", "out", "--encoder", "h264_nvenc"], "NVENC does not open"),
        (
            ["video", "{input}", "out", "--detector", "histogram", "--shot-threshold", "27"],
            "--shot-threshold for histogram must be in (0, 1)",
        ),
        (["video", "{input}", "out", "--detector", "sparkles"], "sparkles"),
        (["video", "{input}", "out", "--decoder", "nvdec", "--gpus", "0"], "--decoder nvdec"),
        (["video", "{input}", "out", "--decoder", "gpu"], "gpu"),
        (["video", "{input}", "out", "--preset", "bogus"], "preset must be one of ultrafast"),
        # an option that would have no effect with the others (it was silently ignored)
        (
            ["video", "{input}", "out", "--splitter", "fixed", "--shot-threshold", "0.5"],
            "error: --shot-threshold has no effect without --splitter shots",
        ),
        (
            ["video", "{input}", "out", "--splitter", "fixed", "--max-clip", "1", "--crop", "0"],
            "error: --max-clip, --crop have no effect without --splitter shots",
        ),
        (["video", "{input}", "out", "--stride", "5"], "--stride has no effect without --splitter"),
        (["video", "{input}", "out", "--dedup-threshold", "0.5"], "without --dedup"),
        (["video", "{input}", "out", "--dedup-keep", "longest"], "without --dedup"),
        (["video", "{input}", "out", "--dedup", "--dedup-keep", "best"], "best"),
        (
            ["video", "{input}", "out", "--dedup", "--dedup-keep", "sharpest", "--no-quality"],
            "--dedup-keep sharpest reads the quality filter's score: drop --no-quality",
        ),
        (
            ["video", "{input}", "out", "--dedup", "--dedup-keep", "aesthetic"],
            "--dedup-keep aesthetic reads the aesthetic score: give --aesthetic-model",
        ),
        (["video", "{input}", "out", "--no-motion", "--motion-source", "clip"], "without --motion"),
        (["video", "{input}", "out", "--aesthetic-threshold", "9"], "without --aesthetic-model"),
        (["video", "{input}", "out", "--no-embed", "--embed-model", "x"], "without --embed"),
        (["video", "{input}", "out", "--video-types", "a,b"], "without --video-type-model"),
        (
            ["video", "{input}", "out", "--no-tags", "--text-embed"],
            "--text-embed embeds each clip's caption or tags: give --caption-model or keep tags",
        ),
        (
            ["video", "{input}", "out", "--executor", "ray-data", "--metrics-port", "0"],
            "--metrics-port has no effect without the streaming or batch executor",
        ),
    ],
)
def test_command_usage_errors_exit_2(
    args: list[str], message: str, inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.stages.video import transcode

    monkeypatch.setattr(transcode, "nvenc_works", lambda: False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("not a folder")
    places = {"{input}": inputs, "{empty}": tmp_path / "empty", "{file}": tmp_path / "afile"}
    filled = list(args)
    for mark, place in places.items():
        filled = [a.replace(mark, str(place)) for a in filled]
    filled = [str(tmp_path / a) if a == "out" else a for a in filled]
    result = runner.invoke(app, filled)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_overwrite_clears_what_a_run_wrote_and_nothing_else(tmp_path: Path) -> None:
    from conveyor.pipelines.video import clear_output

    out = tmp_path / "out"
    written = ["clips/a.mp4", "metas/a.json", "videos/v.mp4.json", "embeddings/v.parquet"]
    for name in [*written, "dedup.json", "duplicates.parquet", "notes.txt"]:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    (out / "summary.json").write_text('{"command": "video"}')  # a video run's output
    clear_output(out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_joining_a_ray_cluster_asks_the_cluster_whether_it_has_gpus(
    inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's own GPUs decided (a cluster's head has none): the cluster's GPUs were
    never used, and --gpus, refused when joining, could not say so."""
    import conveyor.cli_common as cli_common
    import conveyor.cli_video as cli_video
    from conveyor.backends import ray as ray_backend

    monkeypatch.setattr(ray_backend, "check_answers", lambda address: None)  # no cluster here
    asked: list[str] = []
    monkeypatch.setattr(cli_common, "cluster_has_gpus", lambda at: asked.append(at) or True)
    configs: list[Any] = []
    monkeypatch.setattr(cli_video, "_run", lambda config, *rest: configs.append(config))
    ray = ["--backend", "ray", "--address", "127.0.0.1:1"]
    result = runner.invoke(app, ["video", str(inputs), str(tmp_path / "a"), *ray])
    assert result.exit_code == 0, result.output
    assert asked == ["127.0.0.1:1"]
    assert configs[-1].use_gpus and configs[-1].shot_detector == "transnetv2"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:2")  # the cluster Ray's own tools join
    result = runner.invoke(app, ["video", str(inputs), str(tmp_path / "b"), "--backend", "ray"])
    assert result.exit_code == 0 and asked[-1] == "127.0.0.1:2"
    # --gpus says it without asking: a GPU cluster run on its CPUs alone
    result = runner.invoke(app, ["video", str(inputs), str(tmp_path / "c"), *ray, "--gpus", "0"])
    assert result.exit_code == 0 and len(asked) == 2 and not configs[-1].use_gpus
