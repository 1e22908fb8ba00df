"""Video curation with GPUs: the full shots pipeline with its models on CUDA, one run.

The same generated 720p videos go through the default pipeline (TransNetV2 shot detection,
transcoding, motion and quality filters, embeddings and tags) in the ways named by
``--contenders``, on every CPU of this machine:

- ``streaming``: ``StreamingExecutor(LocalBackend)`` with the machine's GPUs: TransNetV2 and
  the embedder (whose pass gives the tags too) on CUDA, the shot detector's frames and the
  transcoder's input decoded on NVDEC, the transcoder on NVENC where the GPU has video
  encoders (A100, H100 and H200 have none: it then encodes with libx264 and takes NVDEC
  units, no GPU share);
- ``batch``: ``BatchExecutor`` with the same GPUs, one stage at a time;
- ``cpu-decode`` (when named in ``--contenders``): streaming with the GPUs, every frame
  decoded on the CPUs (``decoder="cpu"``), for what decoding on NVDEC changes (``streaming``
  decodes the shot detector's small frames and the transcoder's input on NVDEC);
- ``cpu-only`` (when named in ``--contenders``): streaming with the GPUs hidden, for what
  they change;
- ``fast-encode`` (when named in ``--contenders``): streaming with the GPUs, libx264 at
  ``superfast`` and CRF 27 (``FAST_ENCODE``), which gave ``veryfast`` at CRF 23's luma PSNR
  for half its CPU time and 8% more bytes (benchmarks/x264_presets.py): what a GPU without
  NVENC leaves the CPUs when the encoder is told to spend less;
- ``captioned`` (when named in ``--contenders``): streaming with the GPUs and a captioner of
  realistic cost: a LLaVA of 2.1 billion parameters with random weights
  (``conveyor.samples.vlm``, built once into the cache and loaded through the captioner's
  own path), 4 frames and 64 new tokens a clip, 8 clips a batch (the captions are not
  embedded: ``text_embed=False`` in every contender). From the run's event log:
  the captioner's busy fraction over the steady part of the run (NeMo Curator's write-up
  shows its GPU stages over 99.5% busy) and its GPU-held seconds per video-hour.

For each: video-hours per wall hour, wall seconds per video-hour (times the GPU count: the
GPU time a video-hour holds the machine's GPUs), CPU seconds per video-hour, GPU busy
seconds per video-hour (NVML's utilisation integrated over the run: the time a kernel ran),
NVENC and NVDEC busy seconds, peak GPU memory, first clip on disk, what decoded the videos
(their records' ``decoders`` and ``shot_decoders``, and the first reason NVDEC could not),
and per stage its GPU share, NVDEC units, busy and CPU seconds per video-hour and workers.
Before the contenders, libx264 alone encodes the first video's first 20 s once, one
thread, at the pipeline's settings: its CPU seconds per video-hour are the floor of every
contender's on a GPU without NVENC (A100, H100, H200), printed with each contender's ratio
to it. For scale, NeMo Curator's DGX Cloud write-up gives about 195 s of GPU per video-hour
streaming and 352 s batch (its pipeline and GPUs differ). Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import fmt, machine_line, mb, table
from nvdec_paths import one_thread_x264
from video import SCENARIO_TAIL, Result, make_videos, run_engine, scenario_stage

from conveyor.backends import LocalBackend
from conveyor.backends.devices import detect_gpus
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.monitor import EventLog
from conveyor.pipelines.video import VideoConfig, build_video_pipeline
from conveyor.samples.vlm import SIZES

CONTENDERS = ("streaming", "batch", "cpu-decode", "cpu-only", "captioned", "fast-encode")
#: the ``fast-encode`` contender's libx264 preset and CRF (docs/measurements/
#: 2026-11-30-x264-presets.md: ``veryfast`` at CRF 23's quality for half the CPU)
FAST_ENCODE = ("superfast", 27)
#: the captioner's model in the cache: a LLaVA of random weights (its size's cost)
CAPTION_MODEL = "llava-{size}-random"
#: NeMo Curator's DGX Cloud write-up: GPU seconds per hour of video
WRITE_UP = {"streaming": 195.0, "batch": 352.0}


class GpuSampler:
    """Integrates NVML's GPU, encoder and decoder utilisation over a block, per GPU summed.

    NVML reports each as the share of its last sample period (1/6 s to 1 s) in which a kernel
    (an encode, a decode) ran; sampled every ``interval_s`` and integrated over time, that is
    busy seconds, the figure the write-up's "GPU seconds" stands for.
    """

    def __init__(self, interval_s: float = 0.1) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        self.interval_s = interval_s
        self.busy_s = self.encoder_s = self.decoder_s = 0.0
        self.peak_memory = 0
        self.base_memory = sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)

    def _read(self) -> tuple[float, float, float, int]:
        n = self.nvml
        gpu = enc = dec = 0.0
        used = 0
        for h in self.handles:
            gpu += n.nvmlDeviceGetUtilizationRates(h).gpu / 100
            enc += n.nvmlDeviceGetEncoderUtilization(h)[0] / 100
            dec += n.nvmlDeviceGetDecoderUtilization(h)[0] / 100
            used += n.nvmlDeviceGetMemoryInfo(h).used
        return gpu, enc, dec, used

    def _loop(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            gpu, enc, dec, used = self._read()
            now = time.perf_counter()
            dt, last = now - last, now
            self.busy_s += gpu * dt
            self.encoder_s += enc * dt
            self.decoder_s += dec * dt
            self.peak_memory = max(self.peak_memory, used - self.base_memory)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.nvml.nvmlShutdown()


def environment() -> dict[str, Any]:
    """What this machine's GPU path can use: CUDA through torch, NVENC and NVDEC through
    PyAV's FFmpeg."""
    import av
    import torch

    from conveyor.media.decode import nvdec_works
    from conveyor.stages.video.transcode import nvenc_works

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "av": av.__version__,
        "nvenc_opens": nvenc_works(),
        "h264_cuvid_built_in": "h264_cuvid" in av.codecs_available,
        "nvdec_opens": nvdec_works(),
    }
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    return env


def repeated(source: Path, times: int, folder: Path) -> Path:
    """``source``'s videos listed ``times`` times, as hard links in ``folder``."""
    for copy in range(times):
        for video in sorted(source.glob("*.mp4")):
            target = folder / f"copy-{copy}" / video.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(video, target)
    return folder


def stage_resource(config: VideoConfig, name: str = "gpus") -> dict[str, float]:
    """What each stage's workers ask for of ``name`` (a ``Resources`` field)."""
    return {s.name: getattr(s.resources, name) for s in build_video_pipeline(config).build()}


def decoder_tally(output: Path) -> dict[str, Any]:
    """What decoded the run's videos, from their records: how many videos each list of
    ``decoders`` and ``shot_decoders`` names, and the first reason NVDEC could not."""
    tally: dict[str, Any] = {"decoders": {}, "shot_decoders": {}, "fallback": None}
    for path in sorted((output / "videos").rglob("*.json")):
        record = json.loads(path.read_text())
        for key in ("decoders", "shot_decoders"):
            name = "+".join(record.get(key) or []) or "-"
            tally[key][name] = tally[key].get(name, 0) + 1
        reason = record.get("decoder_fallback") or record.get("shot_decoder_fallback")
        tally["fallback"] = tally["fallback"] or reason
    return tally


def caption_model(cache: Path, size: str = "2b") -> Path:
    """The captioner of ``size`` in ``cache``, built there the first time (``2b``: a minute
    on a GPU machine's CPUs, 4.2 GB in bfloat16)."""
    from conveyor.samples.vlm import write_random_llava

    path = cache / CAPTION_MODEL.format(size=size)
    if not (path / "config.json").exists():
        print(f"  building a {size} LLaVA with random weights in {path} ...", flush=True)
        params = write_random_llava(path, size)
        print(f"  {params / 1e9:.3g} billion parameters", flush=True)
    return path


def x264_floor(video: Path, preset: str, crf: int, seconds: float = 20.0) -> float:
    """CPU seconds per video-hour libx264 alone takes to encode ``video``'s first
    ``seconds`` once, one thread, as the transcoder encodes a clip: what a GPU without NVENC
    leaves the CPUs whatever else moves to the GPU. Two passes, decoding alone and decoding
    and encoding, so that the decode's cost drops out without holding frames in memory."""
    import av

    def spent(encode: bool) -> tuple[float, float]:
        began = time.process_time()
        with av.open(str(video)) as container, av.open(io.BytesIO(), "w", format="mp4") as out:
            stream = container.streams.video[0]
            rate = stream.average_rate or 30
            size = (stream.codec_context.width, stream.codec_context.height)
            encoder, step = one_thread_x264(out, rate, size, preset=preset, crf=crf)
            frames = 0
            for frame in container.decode(stream):
                if frames * step >= seconds:
                    break
                if encode:
                    frame.pts, frame.time_base, frame.pict_type = frames, step, 0
                    out.mux(encoder.encode(frame))
                frames += 1
            if encode:
                out.mux(encoder.encode(None))
        return time.process_time() - began, float(frames * step)

    decoding, _ = spent(False)
    both, shown = spent(True)
    return max(0.0, both - decoding) * 3600 / max(shown, 1e-9)


def stage_busy_fractions(events: Path) -> dict[str, float]:
    """Each stage's busy fraction over the steady part of the run its event log holds
    (the run report's own analysis: after warm-up, before the drain)."""
    from conveyor.report.analysis import analyse
    from conveyor.report.load import load_events

    verdict = analyse(load_events(events).run)
    return {name: summary.busy for name, summary in verdict.stages.items()}


def run(
    label: str, config: VideoConfig, executor: Any, events: Path | None = None
) -> tuple[Result, dict[str, Any]]:
    with GpuSampler() as gpu:
        result = run_engine(label, config, executor)
    figures = {
        "gpu_busy_s": gpu.busy_s,
        "nvenc_busy_s": gpu.encoder_s,
        "nvdec_busy_s": gpu.decoder_s,
        "peak_gpu_memory": gpu.peak_memory,
        "decoded_by": decoder_tally(Path(config.output)),
        "steady_busy": stage_busy_fractions(events) if events is not None else {},
    }
    print(
        f"  {label}: {result.video_s / 60:.1f} min of video in {result.wall_s:.1f} s, "
        f"GPU busy {gpu.busy_s:.1f} s, first clip {fmt(result.first_clip_s, '.1f')} s; "
        f"decoded by {figures['decoded_by']}",
        flush=True,
    )
    return result, figures


def report(
    results: dict[str, tuple[Result, dict[str, Any]]],
    shares: dict[str, float],
    gpu_count: int,
    cores: float,
    nvdecs: dict[str, float] | None = None,
) -> dict[str, Any]:
    rows, out = [], {}
    for label, (r, g) in results.items():
        per_hour = 3600 / r.video_s if r.video_s else 0.0
        gpus_here = 0 if label == "cpu-only" else gpu_count
        wall = r.wall_s * per_hour
        figures = {
            "video_s": r.video_s,
            "wall_s": r.wall_s,
            "video_hours_per_hour": r.hours_per_hour,
            "wall_s_per_video_hour": wall,
            "cpu_s_per_video_hour": r.cpu_s * per_hour,
            "gpu_held_s_per_video_hour": wall * gpus_here,
            "gpu_busy_s_per_video_hour": g["gpu_busy_s"] * per_hour,
            "nvenc_busy_s_per_video_hour": g["nvenc_busy_s"] * per_hour,
            "nvdec_busy_s_per_video_hour": g["nvdec_busy_s"] * per_hour,
            "peak_gpu_memory_mb": g["peak_gpu_memory"] / 2**20,
            "first_clip_s": r.first_clip_s,
            "clips_kept": r.clips_kept,
            "cpu_util": r.cpu_s / (r.wall_s * cores) if r.wall_s else None,
            "stage_busy_s_per_video_hour": {n: v * per_hour for n, v in r.stage_busy_s.items()},
            "stage_cpu_s_per_video_hour": {n: v * per_hour for n, v in r.stage_cpu_s.items()},
            "stage_workers": r.stage_workers,
            "stage_tasks": r.stage_tasks,
            "decoded_by": g["decoded_by"],
            "steady_busy": g.get("steady_busy", {}),
        }
        out[label] = figures
        rows.append(
            [
                label,
                fmt(r.video_s / 60, ".1f"),
                fmt(r.wall_s, ".1f"),
                fmt(r.hours_per_hour, ".2f"),
                fmt(wall, ".0f"),
                fmt(figures["cpu_s_per_video_hour"], ".0f"),
                fmt(figures["gpu_held_s_per_video_hour"], ".0f"),
                fmt(figures["gpu_busy_s_per_video_hour"], ".1f"),
                fmt(figures["nvenc_busy_s_per_video_hour"], ".1f"),
                fmt(figures["nvdec_busy_s_per_video_hour"], ".1f"),
                mb(g["peak_gpu_memory"]),
                fmt(r.first_clip_s, ".1f"),
                str(r.clips_kept),
                fmt(figures["cpu_util"], ".2f"),
            ]
        )
    print(
        table(
            f"video curation, shots work, {cores:g} cores and {gpu_count} GPU(s); per video-hour: "
            "wall s, GPU-held s (wall x GPUs), GPU busy s (NVML)",
            [
                "contender",
                "video min",
                "wall s",
                "video h/h",
                "wall s/vh",
                "CPU s/vh",
                "GPU held s/vh",
                "GPU busy s/vh",
                "NVENC s/vh",
                "NVDEC s/vh",
                "peak GPU MB",
                "first clip s",
                "clips kept",
                "cpu util",
            ],
            rows,
        )
    )
    for label, write_up in WRITE_UP.items():
        if label in out:
            print(
                f"  {label}: {out[label]['gpu_held_s_per_video_hour']:.0f} GPU-held and "
                f"{out[label]['gpu_busy_s_per_video_hour']:.1f} GPU-busy s per video-hour; "
                f"the write-up: ~{write_up:.0f}"
            )
    if "streaming" in out and "batch" in out and out["batch"]["video_hours_per_hour"]:
        ratio = out["streaming"]["video_hours_per_hour"] / out["batch"]["video_hours_per_hour"]
        print(f"  streaming / batch: {ratio:.2f}x")
    for other, what in (("cpu-only", "CPUs alone"), ("cpu-decode", "decoding on the CPUs")):
        if "streaming" in out and other in out and out[other]["video_hours_per_hour"]:
            speed = out["streaming"]["video_hours_per_hour"] / out[other]["video_hours_per_hour"]
            cpu = out["streaming"]["cpu_s_per_video_hour"] / out[other]["cpu_s_per_video_hour"]
            print(f"  streaming / {what}: {speed:.2f}x the speed, {cpu:.2f}x the CPU")
    captioned = out.get("captioned")
    if captioned is not None and "Captioner" in captioned["stage_busy_s_per_video_hour"]:
        busy = captioned["steady_busy"].get("Captioner", float("nan"))
        held = captioned["stage_busy_s_per_video_hour"]["Captioner"]
        # a run of a few clips may end before a snapshot (one a second) sees its worker ready
        share = "(not measured: a run too short)" if math.isnan(busy) else f"{busy:.1%}"
        print(
            f"  captioned: the captioner busy {share} of the steady part of the run "
            f"(the write-up: >= 99.5%); {held:.0f} busy s per video-hour on its GPU share; "
            f"{captioned['video_hours_per_hour']:.2f} video-hours per wall hour"
        )
    names = list(dict.fromkeys(n for r, _ in results.values() for n in r.stage_busy_s))
    print(
        table(
            "per stage, per video-hour: busy s (summed over workers) and CPU s; peak workers",
            ["stage", "GPU share", "NVDECs", *(f"{c} busy/cpu/w" for c in out)],
            [
                [
                    n,
                    fmt(shares.get(n, 0.0), ".4g"),
                    fmt((nvdecs or {}).get(n, 0.0), ".4g"),
                    *(
                        f"{fmt(f['stage_busy_s_per_video_hour'].get(n), '.0f')}/"
                        f"{fmt(f['stage_cpu_s_per_video_hour'].get(n), '.0f')}/"
                        f"{f['stage_workers'].get(n, '-')}"
                        for f in out.values()
                    ),
                ]
                for n in names
            ],
        )
    )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--videos", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60.0, help="length of each video")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="list each generated video this many times (hard links under other names): "
        "a longer run for what generating costs",
    )
    p.add_argument(
        "--events", type=Path, default=None, help="write the streaming run's event log and report"
    )
    p.add_argument("--cpus", type=float, default=None, help="CPU budget (default: all)")
    p.add_argument(
        "--contenders", default="streaming,batch", help=f"subset of {','.join(CONTENDERS)}"
    )
    p.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "conveyor-bench-videos"
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    p.add_argument(
        "--caption-size",
        choices=sorted(SIZES),
        default="2b",
        help="the captioned run's model (tiny: a few thousand parameters, to try the run "
        "quickly; its figures say nothing of a captioner's cost)",
    )
    p.add_argument(
        "--scenario-out",
        type=Path,
        default=None,
        help="write a simulator scenario (4 nodes of 8 GPUs) from the streaming run's costs",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="run nothing: read the figures of an earlier --json (for --scenario-out)",
    )
    args = p.parse_args(argv)
    if args.from_json is not None:
        if args.scenario_out is None:
            p.error("--from-json only rewrites a scenario: give --scenario-out too")
        figures = json.loads(args.from_json.read_text())
        write_scenario(figures, args.scenario_out)
        return figures
    chosen = [c for c in args.contenders.split(",") if c]
    if set(chosen) - set(CONTENDERS):
        p.error("unknown --contenders")
    gpu_count = len(detect_gpus().physical_ids)
    if not gpu_count:
        p.error("no GPU here (NVML sees none): this benchmark measures the GPU path")
    cpus = args.cpus or float(len(os.sched_getaffinity(0)))
    print(machine_line(cpus))
    figures: dict[str, Any] = {
        "environment": environment(),
        "videos": args.videos * args.repeat,
        "cores": cpus,
    }
    source = make_videos(
        args.cache, args.videos, args.seconds, args.width, args.height, args.fps, args.seed
    )
    out_root = Path(tempfile.mkdtemp(prefix="conveyor-bench-video-gpu-"))
    if args.repeat > 1:
        source = repeated(source, args.repeat, out_root / "inputs")
    results: dict[str, tuple[Result, dict[str, Any]]] = {}
    shares: dict[str, float] = {}
    nvdecs: dict[str, float] = {}
    defaults = VideoConfig(str(source), str(out_root / "unused"))
    first = min(source.glob("*.mp4"))
    floors = {}
    settings = [(defaults.preset, defaults.crf)]
    settings += [FAST_ENCODE] if "fast-encode" in chosen else []
    for preset, crf in dict.fromkeys(settings):
        floors[preset, crf] = x264_floor(first, preset, crf)
        print(
            f"  libx264 alone ({preset}, CRF {crf}, one thread) encoding {first.name} once: "
            f"{floors[preset, crf]:.0f} CPU-s per video-hour, the floor without NVENC",
            flush=True,
        )
    figures["x264_floor_cpu_s_per_video_hour"] = floors[defaults.preset, defaults.crf]
    if "fast-encode" in chosen:
        figures["x264_floor_fast_encode_cpu_s_per_video_hour"] = floors[FAST_ENCODE]
    try:
        for label in chosen:
            # the same work both ways: TransNetV2 on every frame (auto picks the hybrid
            # detector where no GPU is used)
            preset, crf = FAST_ENCODE if label == "fast-encode" else (defaults.preset, defaults.crf)
            config = VideoConfig(
                str(source),
                str(out_root / label),
                gpus=label != "cpu-only",
                preset=preset,
                crf=crf,
                detector="transnetv2",
                decoder="cpu" if label == "cpu-decode" else "auto",
                caption_model=(
                    str(caption_model(args.cache, args.caption_size))
                    if label == "captioned"
                    else None
                ),
                # the captions' sentence embeddings (MiniLM, an 83 MB wheel) are not the
                # GPU stage measured here
                text_embed=False,
            )
            if label in ("streaming", "batch"):
                shares = figures["gpu_shares"] = stage_resource(config)
                nvdecs = figures["stage_nvdecs"] = stage_resource(config, "nvdecs")
            elif label == "captioned":  # the captioner takes half the GPU, the rest less
                figures["captioned_gpu_shares"] = stage_resource(config)
            print(f"  {label} ...", flush=True)
            events = None
            if label == "batch":
                executor: Any = BatchExecutor(LocalBackend(num_cpus=cpus))
            else:
                gpus = 0 if label == "cpu-only" else None
                monitors = []
                if label == "streaming" and args.events is not None:
                    monitors.append(EventLog(args.events, report=True))
                if label == "captioned":  # its busy fraction comes from the log
                    events = out_root / "events-captioned"
                    monitors.append(EventLog(events))
                executor = StreamingExecutor(
                    LocalBackend(num_cpus=cpus, num_gpus=gpus), monitors=monitors
                )
            results[label] = run(label, config, executor, events)
            # a stage only the captioned contender has (the captioner) shows its own share
            column = {**figures.get("captioned_gpu_shares", {}), **shares}
            figures["contenders"] = report(results, column, gpu_count, cpus, nvdecs)
            if floors[preset, crf]:
                ours = figures["contenders"][label]["cpu_s_per_video_hour"]
                print(f"  {label}: {ours / floors[preset, crf]:.2f}x the CPU of libx264 alone")
            if args.json is not None:  # after each contender: a run cut short keeps its figures
                args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    finally:
        shutil.rmtree(out_root, ignore_errors=True)
    write_scenario(figures, args.scenario_out)
    return figures


def write_scenario(figures: dict[str, Any], path: Path | None) -> None:
    if path is None:
        return
    streaming = figures.get("contenders", {}).get("streaming")
    if streaming is None:
        raise SystemExit("--scenario-out needs a streaming run's figures")
    shares = figures.get("gpu_shares")  # what the run's stages asked for
    path.write_text(scenario_from(streaming, figures["environment"], figures["cores"], shares))
    print(f"  scenario written to {path}")


def scenario_from(
    streaming: dict[str, Any],
    environment: dict[str, Any],
    cores: float,
    shares: dict[str, float] | None = None,
) -> str:
    """The pipeline on 4 nodes of 8 GPUs and 64 CPUs, every cost measured here: a CPU
    stage's CPU seconds per task, a GPU stage's busy seconds per task (what its worker holds
    a CPU and its GPU share for). A task is one video."""
    nvenc = environment["nvenc_opens"]
    if shares is None:  # figures from before they were recorded: today's pipeline's
        config = VideoConfig(".", ".", gpus=True, encoder="auto" if nvenc else "libx264")
        shares = stage_resource(config)
    gpu = (environment["gpus"] or ["GPU"])[0]
    per_second = streaming["video_s"] / 3600  # per video-hour figures -> seconds in the run
    lines = [
        "name: video_curation_gpu_measured",
        "description: >",
        "  The video curation pipeline (TransNetV2 shots, transcode, motion, quality, "
        "embeddings, tags) on 4 nodes of 8 GPUs and 64 CPUs, every cost measured by "
        f"benchmarks/video_gpu.py on one {gpu} with {cores:g} CPU cores",
        "  and generated 720p30 video: CPU seconds per task of the CPU stages, busy seconds per "
        "task of the GPU stages. "
        + (
            "The transcoder encodes with NVENC."
            if nvenc
            else "This GPU has no video encoder (NVENC), so the transcoder encodes with "
            "libx264 on the CPUs."
        )
        + " A task is one 60 s video.",
        "seed: 0",
        "cluster:",
        "  - {name: gpu, count: 4, cpus: 64, gpus: 8, gpu_memory_gb: 80}",
        "stages:",
    ]
    for name, (n_in, n_out) in streaming["stage_tasks"].items():
        if name == "VideoListing" or not n_in:
            continue
        share = shares.get(name, 0.0)
        kind = "stage_busy_s_per_video_hour" if share else "stage_cpu_s_per_video_hour"
        mean = streaming[kind][name] * per_second / n_in
        comment = f"on a GPU share: busy seconds on {gpu}" if share else ""
        lines += scenario_stage(name, mean, n_out / n_in, share, comment)
    return "\n".join(lines + SCENARIO_TAIL)


if __name__ == "__main__":
    main()
