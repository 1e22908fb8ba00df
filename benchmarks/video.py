"""Video curation benchmark: the real pipeline on generated 720p videos, three ways, one run.

For each kind of work (``shots``: the full CPU pipeline, TransNetV2 shot detection,
transcoding, motion and quality filters, embeddings and tags; ``fixed``: fixed 10 s stride,
libx264 veryfast and motion scores), the same videos go through:

- ``sequential``: a plain script, no engine: one process runs every stage's code on one task
  after the other (the same stages, the same libraries), with the libraries' threads on every
  core as a script would have them (torch, x264 and the decoders use all cores);
- ``streaming``: ``StreamingExecutor(LocalBackend)``: all stages at once, auto-balanced;
- ``batch``: ``BatchExecutor(LocalBackend)``: one stage at a time over all the videos;
- ``streaming-own-cpus`` (only when named): streaming with every batch on its stage's own
  CPUs (``elastic_threads=False``), to measure what elastic threads change.

It prints hours of video per wall hour, each stage's CPU seconds per video-hour, and the
CPU-bound ideal: the sum of the stages' CPU seconds over the usable cores (the physical limit
here; each stage's cost is the least of what the sequential and the streaming runs measured,
so the ideal is the hardest one the measurements support). Also: time to the first clip on
disk, peak memory of the process tree from 4 to 16 videos (``--memory``), also under a
memory limit (``--memory-limit-gb``), a run on a
two-node loopback Ray cluster (``--ray``), and a simulator scenario built from the measured
costs (``--scenario-out``). Prints; asserts nothing.

``--user`` measures instead as a user would (``video_user.py`` says how): the real command,
``conveyor video``, and a plain sequential PyAV script (``plain_video.py``, no Conveyor code)
run as subprocesses, side by side: wall time, first clip on disk, CPU seconds of the whole
process tree per video-hour, with their ratios and the targets of issue 26, for ``--cases``
``fixed`` (``--videos`` 720p30 videos, 4 by default), ``small`` (``--small-videos`` videos of
2 s at 160x90 in nested folders) and ``shots`` (ours only); ``--repeats`` alternates the
contenders' order. The fixed case and the small one at their defaults::

    python benchmarks/video.py --user --cases fixed,small --repeats 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    CpuClock,
    TreeSampler,
    fmt,
    machine_line,
    mb,
    table,
    usable_cores,
)

from conveyor import Resources
from conveyor.backends import LocalBackend
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.pipelines.video import VideoConfig, build_video_pipeline, run_video
from conveyor.samples.video import Segment, write_video
from conveyor.tasks import EmptyTask

KINDS = ("pan", "shapes", "noise", "plasma", "rings", "checker")
WORKS = ("shots", "fixed")
CONTENDERS = ("sequential", "streaming", "batch")
#: streaming with each batch on its stage's own CPUs only (no elastic threads): an A/B
OPTIONAL_CONTENDERS = ("streaming-own-cpus",)


# -- inputs ------------------------------------------------------------------------------
def _segments(seed: int, seconds: float) -> tuple[list[Segment], dict[int, float]]:
    """A video's timeline: shots of 3-12 s, a still stretch in every fourth video, now and
    then a crossfade."""
    rng = random.Random(seed)
    segments: list[Segment] = []
    total = 0.0
    while total < seconds - 1e-6:
        length = min(rng.uniform(3, 12), seconds - total)
        if length < 1:
            if segments:  # too short for a shot of its own: the last one grows
                last = segments[-1]
                segments[-1] = Segment(last.kind, last.duration_s + length, last.seed, last.static)
            break
        static = seed % 4 == 3 and len(segments) == 1
        kind = "bars" if static else rng.choice(KINDS)
        segments.append(Segment(kind, round(length, 3), rng.randrange(1 << 20), static))
        total += round(length, 3)
    fades = {
        i: 1.0
        for i in range(len(segments) - 1)
        if rng.random() < 0.2 and min(segments[i].duration_s, segments[i + 1].duration_s) > 2
    }
    return segments, fades


def _write_one(job: tuple[str, int, float, int, int, int]) -> str:
    path, seed, seconds, width, height, fps = job
    segments, fades = _segments(seed, seconds)
    write_video(path, segments, width=width, height=height, fps=fps, crossfades=fades)
    return path


def make_videos(
    cache: Path, count: int, seconds: float, width: int, height: int, fps: int, seed: int
) -> Path:
    """``count`` generated videos in a cached folder (made once, in parallel)."""
    folder = cache / f"v{count}-{seconds:g}s-{width}x{height}@{fps}-seed{seed}"
    marker = folder / ".complete"
    if marker.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    jobs = [
        (str(folder / f"video-{i:03d}.mp4"), seed * 1000 + i, seconds, width, height, fps)
        for i in range(count)
    ]
    begun = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(int(usable_cores(os.cpu_count() or 1))) as pool:
        pool.map(_write_one, jobs)
    marker.write_text("")
    print(f"generated {count} videos in {time.perf_counter() - begun:.0f} s -> {folder}")
    return folder


def work_config(work: str, source: Path, output: Path, **changes: Any) -> VideoConfig:
    if work == "shots":
        # TransNetV2 on every frame, as on a GPU machine (and the CPU default before
        # --detector auto): the figures and the simulator's scenario stay comparable
        changes.setdefault("detector", "transnetv2")
        return VideoConfig(str(source), str(output), gpus=False, **changes)
    return VideoConfig(
        str(source),
        str(output),
        splitter="fixed",
        quality=False,
        embed=False,
        tags=False,
        gpus=False,
        **changes,
    )


# -- measuring ---------------------------------------------------------------------------
@dataclass
class Result:
    label: str
    wall_s: float = 0.0
    video_s: float = 0.0
    first_clip_s: float | None = None
    stage_cpu_s: dict[str, float] = field(default_factory=dict)
    stage_busy_s: dict[str, float] = field(default_factory=dict)
    stage_tasks: dict[str, tuple[int, int]] = field(default_factory=dict)  # in, out
    stage_workers: dict[str, int] = field(default_factory=dict)
    stage_memory: dict[str, int] = field(default_factory=dict)  # peak bytes per worker
    clips_kept: int = 0
    peak_rss: int = 0
    peak_pss: int = 0
    cpu_s: float = 0.0
    completed: bool = True

    @property
    def hours_per_hour(self) -> float:
        return self.video_s / self.wall_s if self.wall_s > 0 else 0.0


class FirstClip:
    """Watches ``clips/`` for the first finished clip (files appear there by rename)."""

    def __init__(self, output: Path) -> None:
        self.folder = output / "clips"
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            if self.folder.is_dir() and any(self.folder.glob("*.mp4")):
                self.at = time.perf_counter() - self.begun
                return
            self._stop.wait(0.02)

    def __enter__(self) -> FirstClip:
        self.begun = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# Reading a torch process's PSS walks its page tables (~10 ms each): sampled every 0.5 s over a
# dozen workers that alone took a sixth of the two cores. RSS every 0.25 s, PSS every 5 s.
SAMPLE_S, PSS_EVERY = 0.25, 20


def run_engine(label: str, config: VideoConfig, executor: Any) -> Result:
    result = Result(label)
    sampler, clock = TreeSampler(SAMPLE_S, PSS_EVERY), CpuClock()
    with sampler, clock as cpu, FirstClip(Path(config.output)) as w:
        begun = time.perf_counter()
        report = run_video(config, executor)
        result.wall_s = time.perf_counter() - begun
    result.first_clip_s = w.at
    result.video_s = report.summary["seconds_in"]
    result.clips_kept = report.summary["clips"]["kept"]
    result.completed = report.result.completed
    result.stage_cpu_s = {n: s.cpu_s for n, s in report.result.stats.items()}
    result.stage_busy_s = {n: s.busy_s for n, s in report.result.stats.items()}
    result.stage_tasks = {n: (s.tasks_in, s.tasks_out) for n, s in report.result.stats.items()}
    result.stage_workers = {n: s.peak_workers for n, s in report.result.stats.items()}
    result.stage_memory = {n: s.worker_memory_bytes for n, s in report.result.stats.items()}
    result.peak_rss, result.peak_pss = sampler.peak_rss, sampler.peak_pss
    result.cpu_s = cpu.driver_s + max(cpu.children_s, sampler.descendants_cpu_s())
    return result


def run_sequential(label: str, config: VideoConfig, cores: float) -> Result:
    """Every stage in this process, one task at a time, depth first (a clip goes all the way
    to the writer before the next one starts), the libraries' threads on every core."""
    specs = build_video_pipeline(config).build()
    threads = Resources(cpus=max(1, round(cores)))
    stages = [s.stage.with_(resources=threads) if s.resources.cpus >= 1 else s.stage for s in specs]
    result = Result(label)
    node = NodeInfo("local", cores)
    sampler, clock = TreeSampler(SAMPLE_S, PSS_EVERY), CpuClock()
    with sampler, clock as cpu, FirstClip(Path(config.output)) as w:
        begun = time.perf_counter()
        for spec, stage in zip(specs, stages, strict=True):
            worker = WorkerInfo(f"{spec.name}-0", spec.name, "local")
            if spec.has_node_setup:
                stage.setup_on_node(node, worker)
            stage.setup(worker)
        pending: deque[tuple[int, Any]] = deque([(0, EmptyTask())])
        spent = {spec.name: 0.0 for spec in specs}
        while pending:
            index, task = pending.pop()
            started = time.process_time()
            outputs = stages[index].process_batch([task])
            spent[specs[index].name] += time.process_time() - started
            if index + 1 < len(stages):
                pending.extend((index + 1, out) for out in reversed(outputs))
        for stage in stages:
            stage.teardown()
        result.wall_s = time.perf_counter() - begun
    result.first_clip_s = w.at
    result.stage_cpu_s = spent
    records = list((Path(config.output) / "videos").rglob("*.json"))
    metas = [json.loads(p.read_text()) for p in records]
    result.video_s = sum((m.get("metadata") or {}).get("duration_s", 0.0) for m in metas)
    result.clips_kept = sum(len(m["kept"]) for m in metas)
    result.peak_rss, result.peak_pss = sampler.peak_rss, sampler.peak_pss
    result.cpu_s = cpu.driver_s
    return result


# -- reporting ---------------------------------------------------------------------------
def stage_costs(
    results: dict[str, Result], video_s: float
) -> list[tuple[str, float, float, float]]:
    """Per stage: CPU s per video-hour measured sequentially, streaming, and the least."""
    seq, stream = results.get("sequential"), results.get("streaming")
    names = list((stream or seq).stage_cpu_s)  # type: ignore[union-attr]
    rows = []
    for name in names:
        a = seq.stage_cpu_s.get(name) if seq else None
        b = stream.stage_cpu_s.get(name) if stream else None
        known = [v for v in (a, b) if v is not None]
        least = min(known) if known else 0.0
        per_hour = 3600 / video_s
        rows.append(
            (
                name,
                (a or 0.0) * per_hour if a is not None else float("nan"),
                (b or 0.0) * per_hour if b is not None else float("nan"),
                least * per_hour,
            )
        )
    return rows


def report_work(work: str, results: dict[str, Result], cores: float) -> dict[str, Any]:
    any_result = next(iter(results.values()))
    video_s = any_result.video_s
    costs = stage_costs(results, video_s)
    cpu_per_hour = sum(least for *_, least in costs)
    ideal = 3600 * cores / cpu_per_hour if cpu_per_hour else None  # video-hours per wall hour
    print(
        table(
            f"[{work}] CPU seconds per video-hour, by stage",
            ["stage", "sequential", "streaming", "least (ideal uses)"],
            [(n, fmt(a, ".0f"), fmt(b, ".0f"), fmt(c, ".0f")) for n, a, b, c in costs]
            + [("total", "", "", fmt(cpu_per_hour, ".0f"))],
        )
    )
    rows = []
    for label, r in results.items():
        rows.append(
            [
                label,
                fmt(r.video_s / 60, ".1f"),
                fmt(r.wall_s, ".1f"),
                fmt(r.hours_per_hour, ".3f"),
                fmt(r.hours_per_hour / ideal if ideal else None, ".2f"),
                fmt(r.first_clip_s, ".1f"),
                str(r.clips_kept),
                mb(r.peak_rss),
                mb(r.peak_pss),
                fmt(r.cpu_s / (r.wall_s * cores) if r.wall_s else None, ".2f"),
            ]
        )
    print(
        table(
            f"[{work}] {len(results)} contenders, same videos, {cores:g} usable cores; ideal "
            f"{fmt(ideal, '.3f')} video-hours per wall hour",
            [
                "contender",
                "video min",
                "wall s",
                "video h/h",
                "of ideal",
                "first clip s",
                "clips kept",
                "peak RSS MB",
                "peak PSS MB",
                "cpu util",
            ],
            rows,
        )
    )
    streaming = results.get("streaming")
    lines = {}
    if streaming:
        for other in ("sequential", "batch", *OPTIONAL_CONTENDERS):
            if other in results and results[other].hours_per_hour:
                ratio = streaming.hours_per_hour / results[other].hours_per_hour
                lines[other] = ratio
                print(f"  streaming / {other}: {ratio:.2f}x")
        workers = ", ".join(f"{k}={v}" for k, v in streaming.stage_workers.items())
        print(f"  streaming peak workers: {workers}")
    return {
        "ideal_video_hours_per_hour": ideal,
        "cpu_s_per_video_hour": {n: c for n, *_, c in costs},
        "contenders": {
            label: {
                "wall_s": r.wall_s,
                "video_s": r.video_s,
                "video_hours_per_hour": r.hours_per_hour,
                "of_ideal": r.hours_per_hour / ideal if ideal else None,
                "first_clip_s": r.first_clip_s,
                "clips_kept": r.clips_kept,
                "peak_rss_mb": r.peak_rss / 2**20,
                "peak_pss_mb": r.peak_pss / 2**20,
                "stage_workers": r.stage_workers,
                "completed": r.completed,
            }
            for label, r in results.items()
        },
        "streaming_over": lines,
    }


def scenario_yaml(per_task: dict[str, tuple[float, float]], gpus: int) -> str:
    """A simulator scenario of this pipeline on ``gpus`` GPUs from the measured costs.

    CPU stages keep their measured CPU seconds per task; the model stages (TransNetV2,
    embeddings, tags) and NVENC transcoding move to GPU shares, with their CPU cost divided
    by the speed-ups in ``GPU_SPEEDUP`` (assumptions, stated in the scenario).
    """
    lines = [
        "name: video_curation_measured",
        "description: >",
        f"  The video curation pipeline (shots, transcode, motion, quality, embeddings, tags) on "
        f"{gpus // 8} nodes of 8 GPUs and 64 CPUs, from costs benchmarks/video.py measured on "
        "generated 720p30 video",
        "  (CPU seconds per task on this machine). Model stages and NVENC run on GPU shares; "
        "their GPU times assume the speed-ups over one CPU core given per stage below (not "
        "measured here: no GPU was lent). A task is one 60 s video.",
        "seed: 0",
        "cluster:",
        f"  - {{name: gpu, count: {gpus // 8}, cpus: 64, gpus: 8, gpu_memory_gb: 80}}",
        "stages:",
    ]
    for name, (mean, ratio) in per_task.items():
        speedup = GPU_SPEEDUP.get(name)
        if speedup:
            share = 0.25 if name != "ClipTranscoder" else 0.33
            comment = f"GPU: {speedup:g}x one CPU core (assumed)"
            lines += scenario_stage(name, mean / speedup, ratio, share, comment)
        else:
            lines += scenario_stage(name, mean, ratio)
    return "\n".join(lines + SCENARIO_TAIL)


# ten virtual minutes: steady after two, and a minute of wall time to simulate
SCENARIO_TAIL = ["source: {duration_s: 600}", "report: {warmup_s: 120}", ""]


def scenario_stage(
    name: str, mean: float, ratio: float, gpu_share: float = 0.0, comment: str = ""
) -> list[str]:
    """A scenario's lines for one stage: ``mean`` seconds per task, ``ratio`` outputs per
    input, on a GPU share or (none) on one CPU (a quarter for the near-free stages)."""
    if gpu_share:
        resources = f"{{cpus: 1, gpus: {gpu_share:g}}}"
    else:
        resources = "{cpus: 1}" if mean > 0.05 else "{cpus: 0.25}"
    lines = [
        f"  - name: {name}" + (f"  # {comment}" if comment else ""),
        f"    resources: {resources}",
    ]
    if name in ("VideoListing", "ShotSplitter"):
        lines.append("    num_workers: 1")
    lines.append(
        f"    model: {{service: {{kind: lognormal, mean: {max(mean, 1e-4):.4g}, spread: 0.3}}, "
        f"output_ratio: {ratio:.4g}}}"
    )
    return lines


#: assumed GPU speed-up over one CPU core, per stage (no GPU measured here)
GPU_SPEEDUP = {
    "TransNetV2Detector": 40.0,
    "ClipEmbedder": 30.0,
    "ImageNetTagger": 30.0,
    "ClipTranscoder": 8.0,
}


# -- main --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--videos", type=int, default=None, help="8, or 4 with --user")
    p.add_argument("--seconds", type=float, default=60.0, help="length of each video")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpus", type=float, default=2.0, help="CPU budget of the local backend")
    p.add_argument(
        "--work", default="shots,fixed", help=f"comma-separated subset of {','.join(WORKS)}"
    )
    p.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"subset of {','.join(CONTENDERS + OPTIONAL_CONTENDERS)}",
    )
    p.add_argument(
        "--memory",
        default="",
        help="video counts to compare peak memory at, e.g. 4,16 (streaming, shots work)",
    )
    p.add_argument("--memory-seconds", type=float, default=20.0)
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="also run each --memory count under this LocalBackend(memory_gb=...) limit",
    )
    p.add_argument("--ray", action="store_true", help="also run on a 2-node loopback Ray cluster")
    p.add_argument("--scenario-out", type=Path, default=None, help="write a simulator scenario")
    p.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "conveyor-bench-videos"
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    user = p.add_argument_group("--user: commands as subprocesses, with the plain script")
    user.add_argument("--user", action="store_true", help="measure as a user would (see above)")
    user.add_argument("--cases", default="fixed,small,shots", help="subset of fixed,small,shots")
    user.add_argument("--small-videos", type=int, default=2000)
    user.add_argument("--small-seconds", type=float, default=2.0)
    user.add_argument("--small-size", default="160x90", help="WIDTHxHEIGHT")
    user.add_argument("--repeats", type=int, default=1, help="runs of each contender")
    user.add_argument("--outputs", type=Path, default=None, help="keep the runs' outputs here")
    user.add_argument(
        "--inline",
        action="store_true",
        help="also our stages in one process, without the engine (video_inline.py)",
    )
    user.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="the conveyor command of another version: run beside ours as 'before'",
    )
    args = p.parse_args(argv)
    if args.videos is None:
        args.videos = 4 if args.user else 8
    if args.user:
        return user_main(p, args)
    works = [w for w in args.work.split(",") if w]
    chosen = [c for c in args.contenders.split(",") if c]
    if set(works) - set(WORKS) or set(chosen) - set(CONTENDERS + OPTIONAL_CONTENDERS):
        p.error("unknown --work or --contenders")
    if args.ray:
        from _ray_cluster import prepare

        prepare()  # before anything imports ray
    cores = usable_cores(args.cpus)
    print(machine_line(args.cpus))
    source = make_videos(
        args.cache, args.videos, args.seconds, args.width, args.height, args.fps, args.seed
    )
    out_root = Path(tempfile.mkdtemp(prefix="conveyor-bench-video-"))
    figures: dict[str, Any] = {"videos": args.videos, "seconds": args.seconds, "cores": cores}
    try:
        for work in works if chosen else []:
            results: dict[str, Result] = {}
            for contender in chosen:
                output = out_root / f"{work}-{contender}"
                config = work_config(work, source, output)
                print(f"  [{work}] {contender} ...", flush=True)
                if contender == "sequential":
                    results[contender] = run_sequential(contender, config, cores)
                elif contender == "batch":
                    executor = BatchExecutor(LocalBackend(num_cpus=args.cpus))
                    results[contender] = run_engine(contender, config, executor)
                else:
                    executor = StreamingExecutor(
                        LocalBackend(num_cpus=args.cpus),
                        elastic_threads=contender == "streaming",
                    )
                    results[contender] = run_engine(contender, config, executor)
            figures[work] = report_work(work, results, cores)
            if work == "shots" and args.scenario_out is not None and "streaming" in results:
                figures["scenario"] = str(args.scenario_out)
                per_task = _per_task(out_root / f"{work}-streaming")
                args.scenario_out.write_text(scenario_yaml(per_task, 32))
                print(f"  scenario written to {args.scenario_out}")
        if args.memory:
            figures["memory"] = memory_figures(args, out_root, cores)
        if args.ray:
            figures["ray"] = ray_figures(args, source, out_root, works, figures)
    finally:
        shutil.rmtree(out_root, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return figures


def user_main(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    from video_user import CASES, make_small_videos, user_figures

    cases = [c for c in args.cases.split(",") if c]
    if set(cases) - set(CASES) or args.repeats < 1:
        p.error("unknown --cases, or --repeats under 1")
    machine = machine_line(float(os.cpu_count() or 1))
    print(machine)
    sources = {}
    if {"fixed", "shots"} & set(cases):
        sources["fixed"] = sources["shots"] = make_videos(
            args.cache, args.videos, args.seconds, args.width, args.height, args.fps, args.seed
        )
    if "small" in cases:
        width, height = (int(x) for x in args.small_size.split("x"))
        sources["small"] = make_small_videos(
            args.cache, args.small_videos, args.small_seconds, width, height, args.fps
        )
    user = user_figures(cases, sources, args.repeats, args.outputs, args.baseline, args.inline)
    figures = {"machine": machine, "user": user}
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return figures


def _per_task(output: Path) -> dict[str, tuple[float, float]]:
    """Mean CPU seconds per task and outputs per input, per stage, from the summary's stats;
    the listing stage's fan-out is made one (a scenario's task is one video)."""
    stats = json.loads((output / "summary.json").read_text())["engine"]["stages"]
    per_task = {}
    for name, s in stats.items():
        if name == "VideoListing":
            continue
        tasks = max(s["tasks_in"], 1)
        per_task[name] = (s["cpu_s"] / tasks, s["tasks_out"] / tasks)
    return per_task


def memory_figures(args: argparse.Namespace, out_root: Path, cores: float) -> dict[str, Any]:
    """Peak memory of the process tree at each video count, without a memory limit and (with
    ``--memory-limit-gb``) under one, with the throughput each run kept."""
    counts = [int(c) for c in args.memory.split(",") if c]
    limits: list[float | None] = [None]
    if args.memory_limit_gb is not None:
        limits.append(args.memory_limit_gb)
    rows, found, heaviest = [], {}, {}
    for limit in limits:
        for count in counts:
            source = make_videos(
                args.cache,
                count,
                args.memory_seconds,
                args.width,
                args.height,
                args.fps,
                args.seed + 7,
            )
            named = "no limit" if limit is None else f"limit {limit:g} GB"
            output = out_root / f"memory-{count}-{limit}"
            print(f"  [memory] streaming, {count} videos, {named} ...", flush=True)
            backend = LocalBackend(num_cpus=args.cpus, memory_gb=limit)
            config = work_config("shots", source, output)
            r = run_engine(f"{count} videos, {named}", config, StreamingExecutor(backend))
            found[f"{count}/{limit}"] = {
                "videos": count,
                "limit_gb": limit,
                "peak_rss_mb": r.peak_rss / 2**20,
                "peak_pss_mb": r.peak_pss / 2**20,
                "wall_s": r.wall_s,
                "hours_per_hour": r.hours_per_hour,
                "peak_workers": sum(r.stage_workers.values()),
                "worker_mb": {n: b / 2**20 for n, b in r.stage_memory.items() if b},
            }
            heaviest = r.stage_memory
            rows.append(
                [
                    r.label,
                    fmt(r.video_s / 60, ".1f"),
                    fmt(r.wall_s, ".1f"),
                    fmt(r.hours_per_hour, ".3f"),
                    mb(r.peak_rss),
                    mb(r.peak_pss),
                    str(found[f"{count}/{limit}"]["peak_workers"]),
                ]
            )
    print(
        table(
            "[memory] peak memory of the process tree, streaming, shots work",
            [
                "run",
                "video min",
                "wall s",
                "video-h / h",
                "peak RSS MB",
                "peak PSS MB",
                "workers (sum of peaks)",
            ],
            rows,
        )
    )
    top = sorted(heaviest.items(), key=lambda kv: -kv[1])[:6]
    print("  measured peak per worker: " + ", ".join(f"{n} {b / 2**20:.0f} MB" for n, b in top))
    for limit in limits:
        if len(counts) >= 2:
            a, b = found[f"{counts[0]}/{limit}"], found[f"{counts[-1]}/{limit}"]
            rss = b["peak_rss_mb"] / a["peak_rss_mb"]
            pss = b["peak_pss_mb"] / a["peak_pss_mb"]
            named = "no limit" if limit is None else f"limit {limit:g} GB"
            print(f"  {named}: {counts[-1]} / {counts[0]} videos: RSS x{rss:.2f}, PSS x{pss:.2f}")
    return found


def ray_figures(
    args: argparse.Namespace,
    source: Path,
    out_root: Path,
    works: list[str],
    figures: dict[str, Any],
) -> dict[str, Any]:
    from _ray_cluster import two_node_cluster

    from conveyor.backends import RayBackend

    found = {}
    with two_node_cluster(cpus_per_node=max(1, round(args.cpus / 2))) as address:
        for work in works:
            output = out_root / f"ray-{work}"
            print(f"  [ray] streaming {work} on 2 loopback nodes ...", flush=True)
            r = run_engine(
                f"ray {work}",
                work_config(work, source, output),
                StreamingExecutor(RayBackend(address)),
            )
            ideal = figures.get(work, {}).get("ideal_video_hours_per_hour")
            found[work] = {
                "wall_s": r.wall_s,
                "video_hours_per_hour": r.hours_per_hour,
                "of_ideal": r.hours_per_hour / ideal if ideal else None,
                "first_clip_s": r.first_clip_s,
                "peak_rss_mb": r.peak_rss / 2**20,
                "stage_workers": r.stage_workers,
            }
            print(
                f"  [ray] {work}: {r.video_s / 60:.1f} video min in {r.wall_s:.1f} s = "
                f"{r.hours_per_hour:.3f} video h/h ({fmt(found[work]['of_ideal'], '.2f')} of the "
                f"local ideal), first clip {fmt(r.first_clip_s, '.1f')} s, "
                f"peak RSS {mb(r.peak_rss)} MB"
            )
    return found


if __name__ == "__main__":
    main()
