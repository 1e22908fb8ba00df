"""``conveyor video INPUT OUTPUT``: the video curation pipeline from the command line.

It only turns options into a ``VideoConfig`` and an executor; ``run_video`` does the rest.
Exit codes: 0 when the run completes (failed videos are listed, not fatal), 1 when a stage
cannot start, every video failed or the run stops early, 2 for a missing INPUT or a bad
option, 130 on Ctrl-C.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from conveyor.cli_common import (
    BACKEND,
    CPUS,
    GPUS,
    LIVE,
    MEMORY_GB,
    METRICS_PORT,
    REPORT,
    BackendChoice,
    Machine,
    as_flags,
    hold_output,
    refuse_unused,
    stopped_code,
)
from conveyor.cli_common import fail as _fail
from conveyor.media.limits import MAX_VIDEO_PIXELS
from conveyor.pipelines.fields import LIMIT_MAX


class SplitterChoice(StrEnum):
    fixed = "fixed"
    shots = "shots"


class DetectorChoice(StrEnum):
    auto = "auto"
    transnetv2 = "transnetv2"
    hybrid = "hybrid"
    adaptive = "adaptive"
    content = "content"
    histogram = "histogram"


class MaxLenMode(StrEnum):
    stride = "stride"
    truncate = "truncate"


class EncoderChoice(StrEnum):
    auto = "auto"
    libx264 = "libx264"
    h264_nvenc = "h264_nvenc"


class DecoderChoice(StrEnum):
    auto = "auto"
    cpu = "cpu"
    nvdec = "nvdec"


class MotionSourceChoice(StrEnum):
    source = "source"
    clip = "clip"


class DedupKeep(StrEnum):
    first = "first"
    longest = "longest"
    sharpest = "sharpest"
    aesthetic = "aesthetic"


class ShardsChoice(StrEnum):
    none = "none"
    webdataset = "webdataset"


class VideoExecutor(StrEnum):
    streaming = "streaming"
    batch = "batch"
    ray_data = "ray-data"


def video(
    ctx: typer.Context,
    input: Annotated[
        str,
        typer.Argument(
            help="A video file or a directory of videos (searched recursively), or a URL "
            "such as s3://bucket/videos.",
            show_default=False,
            metavar="INPUT",
        ),
    ],
    output: Annotated[
        str,
        typer.Argument(
            help="Where clips, metas, embeddings and records go: a directory or a URL such "
            "as s3://bucket/out.",
            show_default=False,
            metavar="OUTPUT",
        ),
    ],
    splitter: Annotated[
        SplitterChoice, typer.Option(case_sensitive=False, help="How videos become clips.")
    ] = SplitterChoice.shots,
    detector: Annotated[
        DetectorChoice,
        typer.Option(
            case_sensitive=False,
            help="Shot detector (--splitter shots): auto is transnetv2 with a GPU, else hybrid "
            "(PySceneDetect's adaptive cuts, TransNetV2 on doubtful stretches); adaptive, "
            "content and histogram are PySceneDetect's detectors on their own.",
        ),
    ] = DetectorChoice.auto,
    clip_len: Annotated[
        float, typer.Option("--clip-len", min=0.1, help="Fixed stride: clip length (s).")
    ] = 10.0,
    stride: Annotated[
        float | None,
        typer.Option(
            min=0.1, help="Fixed stride: seconds between clip starts.", show_default="clip-len"
        ),
    ] = None,
    min_clip: Annotated[
        float, typer.Option("--min-clip", min=0.0, help="Shortest clip kept (s).")
    ] = 2.0,
    max_clip: Annotated[
        float, typer.Option("--max-clip", min=0.1, help="Shots: longest clip (s).")
    ] = 10.0,
    max_len_mode: Annotated[
        MaxLenMode,
        typer.Option(
            case_sensitive=False, help="Shots longer than --max-clip: cut at a stride or truncate."
        ),
    ] = MaxLenMode.stride,
    crop: Annotated[
        float, typer.Option(min=0.0, help="Shots: seconds trimmed at each end of a shot.")
    ] = 0.5,
    shot_threshold: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Detector threshold.",
            show_default="0.4 transnetv2, 3 hybrid and adaptive, 27 content, 0.2 histogram",
        ),
    ] = None,
    encoder: Annotated[
        EncoderChoice,
        typer.Option(
            case_sensitive=False,
            help="H.264 encoder (auto: NVENC where the GPU has it, else libx264).",
        ),
    ] = EncoderChoice.auto,
    decoder: Annotated[
        DecoderChoice,
        typer.Option(
            case_sensitive=False,
            help="Where sources are decoded (auto: the GPU's NVDEC where a worker has a GPU; "
            "a video NVDEC cannot take is decoded on the CPU, with the reason in its record).",
        ),
    ] = DecoderChoice.auto,
    preset: Annotated[
        str, typer.Option(help="libx264 preset, ultrafast to placebo (slower: smaller clips).")
    ] = "veryfast",
    crf: Annotated[
        int, typer.Option(min=0, max=51, help="libx264 quality (lower is better).")
    ] = 23,
    max_height: Annotated[
        int | None,
        typer.Option(
            min=2,
            help="Scale taller sources down to this height (as shown: a portrait phone "
            "video's is its long side).",
        ),
    ] = None,
    motion: Annotated[bool, typer.Option("--motion/--no-motion", help="Motion filter.")] = True,
    motion_threshold: Annotated[
        float, typer.Option(min=0.0, help="Motion: least global mean (frame widths per frame).")
    ] = 1e-5,
    motion_patch_threshold: Annotated[
        float, typer.Option(min=0.0, help="Motion: least per-patch mean (0: off).")
    ] = 0.0,
    motion_source: Annotated[
        MotionSourceChoice,
        typer.Option(
            case_sensitive=False,
            help="Motion: whose motion vectors, the source's (read as clips are cut; a source "
            "without any is scored from its clips') or each encoded clip's (decoded again).",
        ),
    ] = MotionSourceChoice.source,
    quality: Annotated[
        bool, typer.Option("--quality/--no-quality", help="Technical quality filter.")
    ] = True,
    nsfw: Annotated[bool, typer.Option("--nsfw/--no-nsfw", help="Content-safety filter.")] = False,
    nsfw_threshold: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Safety: reject at this NSFW probability.")
    ] = 0.8,
    overlay_text: Annotated[
        bool,
        typer.Option(
            "--overlay-text/--no-overlay-text",
            help="Burnt-in text filter (subtitles, titles, tickers): a text detector.",
        ),
    ] = False,
    overlay_text_threshold: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Overlay text: reject when a frame has more than this fraction of its area "
            "in text.",
        ),
    ] = 0.02,
    aesthetic_model: Annotated[
        Path | None, typer.Option(help="Aesthetic scorer (CLIP directory + head, or TorchScript).")
    ] = None,
    aesthetic_threshold: Annotated[float, typer.Option(help="Aesthetic: least score kept.")] = 3.5,
    video_type_model: Annotated[
        Path | None,
        typer.Option(help="Classify each clip's type zero-shot with this CLIP model directory."),
    ] = None,
    video_types: Annotated[
        str | None,
        typer.Option(
            help="Video type: the labels, a comma list.",
            show_default="natural footage,animation,screen recording,video game,slideshow",
        ),
    ] = None,
    keep_types: Annotated[
        str | None,
        typer.Option(
            help="Video type: keep only clips of these types (a comma list).", show_default="all"
        ),
    ] = None,
    score_only: Annotated[
        bool, typer.Option("--score-only", help="Score with every filter, filter nothing.")
    ] = False,
    embed: Annotated[bool, typer.Option("--embed/--no-embed", help="Clip embeddings.")] = True,
    embed_model: Annotated[
        str,
        typer.Option(help="Embedding model: the packaged one, or a path to a torch or HF model."),
    ] = "efficientnet-lite0",
    tags: Annotated[bool, typer.Option("--tags/--no-tags", help="ImageNet tags.")] = True,
    caption_model: Annotated[
        Path | None, typer.Option(help="A local Hugging Face vision-language model.")
    ] = None,
    text_embed: Annotated[
        bool | None,
        typer.Option(
            "--text-embed/--no-text-embed",
            help="Embed captions (else tags) with MiniLM.",
            show_default="with --caption-model",
        ),
    ] = None,
    dedup: Annotated[
        bool, typer.Option("--dedup/--no-dedup", help="Mark near-duplicate kept clips.")
    ] = False,
    dedup_threshold: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Dedup: cosine similarity that counts.")
    ] = 0.95,
    dedup_keep: Annotated[
        DedupKeep,
        typer.Option(
            case_sensitive=False,
            help="Dedup: the clip of a near-duplicate set kept: the first of the first video, "
            "the longest, the sharpest (quality filter) or the best-looking (--aesthetic-model).",
        ),
    ] = DedupKeep.first,
    write_filtered: Annotated[
        bool, typer.Option("--write-filtered", help="Also write filtered clips.")
    ] = False,
    meta_json: Annotated[
        bool,
        typer.Option(
            "--meta-json/--no-meta-json",
            help="Also write each clip's meta as metas/<clip_id>.json (the clip table, "
            "metadata/*.parquet, is always written; at millions of clips, turn this off).",
        ),
    ] = True,
    shards: Annotated[
        ShardsChoice,
        typer.Option(
            case_sensitive=False,
            help="Also write the kept clips as WebDataset shards, shards/shard-NNNNNN.tar "
            "(mp4, json meta, npy embedding per clip); a local OUTPUT only.",
        ),
    ] = ShardsChoice.none,
    shard_mb: Annotated[
        float, typer.Option("--shard-mb", help="Shards: the size each is filled to (MiB).")
    ] = 1024.0,
    executor: Annotated[
        VideoExecutor, typer.Option(case_sensitive=False, help="How stages are scheduled.")
    ] = VideoExecutor.streaming,
    backend: BACKEND = BackendChoice.local,
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster address (--backend ray, or --executor ray-data)."),
    ] = None,
    cpus: CPUS = None,
    gpus: GPUS = None,
    memory_gb: MEMORY_GB = None,
    limit: Annotated[
        int | None,
        typer.Option(min=1, max=LIMIT_MAX, help="Only the first N videos (sorted by path)."),
    ] = None,
    max_pixels: Annotated[
        int,
        typer.Option(
            min=1,
            help="Most pixels a video's frame may have; a larger video fails alone, before "
            "any frame is decoded (the default is DCI 8K, 8192x4320).",
        ),
    ] = MAX_VIDEO_PIXELS,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Delete OUTPUT's earlier results first.")
    ] = False,
    journal: Annotated[
        Path | None,
        typer.Option(
            help="Keep the run's journal in this local file (each finished video, recorded "
            "as it finishes; a re-run skips them).",
            show_default="OUTPUT/.conveyor/journal; none for a bucket OUTPUT or ray-data",
        ),
    ] = None,
    live: LIVE = True,
    metrics_port: METRICS_PORT = None,
    report: REPORT = True,
) -> None:
    """Curate videos: split into clips (shots or fixed stride), transcode to H.264, filter
    (motion, quality, safety, overlay text, aesthetics), embed, tag, caption, and write clips,
    metas and embeddings to OUTPUT. Re-running the same command on the same OUTPUT resumes."""
    settings = dict(locals())  # the options as given, recorded with the run's event log
    del settings["ctx"]
    from rich.console import Console

    from conveyor.pipelines.video import VideoConfig, check_resume, clear_output, default_journal
    from conveyor.stages.video.video_type import DEFAULT_VIDEO_TYPES
    from conveyor.storage import ObjectPath, check_output_place, is_url, location, normalize

    # "~/footage" quoted (or from a script) is the home folder's, as text and image take it
    input, output = (normalize(p if is_url(p) else os.path.expanduser(p)) for p in (input, output))
    where = location(input)
    try:
        if isinstance(where, ObjectPath):
            where.info()  # names what is wrong: no such key or bucket, no credentials, ...
        elif not where.exists():
            raise FileNotFoundError(f"{input!r} does not exist")
    except (OSError, ImportError, ValueError) as exc:
        raise _fail(f"INPUT {exc}") from None
    if (
        address is not None
        and backend is BackendChoice.local
        and executor is not VideoExecutor.ray_data
    ):
        raise _fail("--address needs --backend ray (or --executor ray-data)")
    fixed = splitter is SplitterChoice.fixed
    refuse_unused(
        ctx,
        [
            (fixed, ["detector", "shot_threshold", "max_clip", "max_len_mode", "crop"],
             "--splitter shots"),
            (not fixed, ["clip_len", "stride"], "--splitter fixed"),
            (not motion, ["motion_threshold", "motion_patch_threshold", "motion_source"],
             "--motion"),
            (not nsfw, ["nsfw_threshold"], "--nsfw"),
            (not overlay_text, ["overlay_text_threshold"], "--overlay-text"),
            (aesthetic_model is None, ["aesthetic_threshold"], "--aesthetic-model"),
            (video_type_model is None, ["video_types"], "--video-type-model"),
            (not embed, ["embed_model"], "--embed"),
            (not dedup, ["dedup_threshold", "dedup_keep"], "--dedup"),
            (shards is ShardsChoice.none, ["shard_mb"], "--shards webdataset"),
            # Ray Data's executor takes no monitors
            (executor is VideoExecutor.ray_data, ["metrics_port"],
             "the streaming or batch executor"),
        ]
    )  # fmt: skip
    if executor is VideoExecutor.ray_data and backend is BackendChoice.ray:
        raise _fail("--executor ray-data runs on Ray by itself: leave --backend at local")
    if journal is not None and executor is VideoExecutor.ray_data:
        raise _fail("--journal needs the streaming or batch executor (Ray Data keeps none)")
    if journal is not None and journal.is_dir():
        raise _fail(f"--journal {str(journal)!r} is a directory, expected a file")
    if journal is not None:
        from conveyor.engine.journal import Journal
        from conveyor.errors import JournalError

        try:
            Journal(journal).check()
        except JournalError as exc:
            raise _fail(f"--{exc}") from None
    machine = Machine(cpus, gpus, memory_gb)
    on_ray = backend is BackendChoice.ray or executor is VideoExecutor.ray_data
    try:
        use_gpus = machine.use_gpus(on_ray, address)
        config = VideoConfig(
            input=input,
            output=output,
            splitter=splitter.value,
            detector=detector.value,
            clip_len_s=clip_len,
            stride_s=stride,
            min_clip_s=min_clip,
            max_clip_s=max_clip,
            max_len_mode=max_len_mode.value,
            crop_s=crop,
            shot_threshold=shot_threshold,
            encoder=encoder.value,
            decoder=decoder.value,
            preset=preset,
            crf=crf,
            max_height=max_height,
            motion=motion,
            motion_threshold=motion_threshold,
            motion_patch_threshold=motion_patch_threshold,
            motion_source=motion_source.value,
            quality=quality,
            nsfw=nsfw,
            nsfw_threshold=nsfw_threshold,
            overlay_text=overlay_text,
            overlay_text_threshold=overlay_text_threshold,
            aesthetic_model=str(aesthetic_model) if aesthetic_model else None,
            aesthetic_threshold=aesthetic_threshold,
            video_type_model=str(video_type_model) if video_type_model else None,
            video_types=DEFAULT_VIDEO_TYPES if video_types is None else video_types,
            keep_types=keep_types or (),
            score_only=score_only,
            embed=embed,
            embed_model=embed_model,
            tags=tags,
            caption_model=str(caption_model) if caption_model else None,
            text_embed=text_embed,
            dedup=dedup,
            dedup_threshold=dedup_threshold,
            dedup_keep=dedup_keep.value,
            write_filtered=write_filtered,
            meta_json=meta_json,
            shards=shards.value,
            shard_mb=shard_mb,
            limit=limit,
            max_pixels=max_pixels,
            gpus=use_gpus,
        )
        local = backend is BackendChoice.local and executor is not VideoExecutor.ray_data
        if config.encoder == "h264_nvenc" and local:
            _check_nvenc()
        if config.decoder == "nvdec" and local and not config.use_gpus:
            raise ValueError(
                "--decoder nvdec: this machine has no GPU (NVDEC is an NVIDIA GPU's video "
                "decoder): use --decoder auto or cpu, or declare GPUs with --gpus"
            )
        check_output_place(config.output)
    except (ValueError, OSError, ImportError) as exc:
        raise _fail(as_flags(ctx, str(exc))) from None
    clear = clear_output if overwrite else None
    with hold_output(config.output, clear, lambda: check_resume(config), ctx):
        console = Console()
        if journal is None and executor is not VideoExecutor.ray_data:
            journal = default_journal(config.output)
        watch = _Watch(metrics_port, report, settings)
        _run(config, executor, backend, address, machine, live, console, journal, watch)


def _check_nvenc() -> None:
    """``--encoder h264_nvenc`` on this machine: refused before the run when NVENC will not
    open (every transcoder worker would fail to set up)."""
    from conveyor.stages.video.transcode import nvenc_works

    if not nvenc_works():
        raise ValueError(
            "--encoder h264_nvenc: NVENC does not open on this machine (it needs an NVIDIA GPU "
            "with a video encoder and its driver; the A100, H100 and H200 have none): use "
            "--encoder auto or libx264"
        )


def _executor(
    kind: VideoExecutor,
    backend: BackendChoice,
    address: str | None,
    machine: Machine,
    monitors: list[Any],
) -> Any:
    from conveyor.executors import BatchExecutor, StreamingExecutor

    if kind is VideoExecutor.ray_data:
        from conveyor.executors import RayDataExecutor

        machine.check_ray(address)
        return RayDataExecutor(address, **machine.ray_limits(address))
    cls = BatchExecutor if kind is VideoExecutor.batch else StreamingExecutor
    chosen = machine.backend(backend, address)
    if backend is BackendChoice.local:
        chosen.open()  # its worker processes start while the run is prepared
    return cls(chosen, monitors=monitors)


def _check_private_pools(pipeline: Any, machine: Machine) -> None:
    """Ray Data's actor pools must fit the private cluster the run would start, whose CPUs
    are known now (``--cpus``, else this machine's): said before Ray starts (7 s), exit 2,
    not after it, with an OUTPUT begun."""
    from conveyor.errors import BackendError
    from conveyor.executors.ray_data import check_pools_fit

    cpus = machine.cpus if machine.cpus is not None else float(os.cpu_count() or 1)
    try:
        check_pools_fit(pipeline.build(), cpus, machine.gpus)
    except BackendError as exc:
        raise ValueError(
            f"{exc} (--cpus gives the cluster more; --no-quality and the other filter "
            "switches take their stages away)"
        ) from None


def _run(
    config: Any,
    kind: VideoExecutor,
    backend: BackendChoice,
    address: str | None,
    machine: Machine,
    live: bool,
    console: Any,
    journal: Path | None,
    watch: _Watch,
) -> None:
    from conveyor.cli_common import (
        add_input_failures,
        close_monitors,
        ray_target,
        report_path,
        run_monitors,
    )
    from conveyor.errors import ConveyorError
    from conveyor.monitor import LiveView
    from conveyor.pipelines.video import build_video_pipeline, run_video
    from conveyor.pipelines.video_summary import input_failures, print_summary
    from conveyor.stages.video.reader import VIDEO_EXTENSIONS, VideoSources
    from conveyor.storage import is_url

    try:
        # listed as the run takes them: before it starts, only as far as the first video
        sources = VideoSources(config.input, config.output, limit=config.limit)
        empty = sources.empty()
    except (OSError, ImportError, ValueError) as exc:  # a store refusing, unreachable, ...
        raise _fail(str(exc), 1) from None
    if empty:
        wanted = " ".join(VIDEO_EXTENSIONS)
        raise _fail(f"no videos in {config.input} (looked for {wanted}, recursively)")
    try:  # before the event log: a model that cannot be used leaves nothing in OUTPUT
        pipeline = build_video_pipeline(config)
        if kind is VideoExecutor.ray_data and ray_target(address) is None:
            _check_private_pools(pipeline, machine)
    except (ValueError, OSError, ImportError, ConveyorError) as exc:
        raise _fail(str(exc)) from None
    progress = _Progress(sources)
    view = LiveView(console=console, live=None if live else False, extra=progress.line)
    # the event log and report go into OUTPUT (not into a bucket: they are written as it runs)
    run_dir = None if is_url(config.output) else Path(config.output)
    extra = run_monitors(run_dir, watch.metrics_port, watch.report, watch.settings, console.print)
    try:
        executor = _executor(kind, backend, address, machine, [view, *extra])
    except (ImportError, ValueError, ConveyorError) as exc:
        raise _fail(str(exc), 2 if isinstance(exc, ValueError) else 1) from None
    on_ray = backend is BackendChoice.ray or kind is VideoExecutor.ray_data
    console.print(
        f"[bold]conveyor video[/]: {config.input} -> {config.output} (videos are listed as "
        f"the run goes)\n  {pipeline.description}\n"
        f"  {kind.value} executor, {'Ray' if on_ray else 'local'} backend"
        + (" (no live view, metrics or run report)" if kind is VideoExecutor.ray_data else "")
    )
    try:
        report = run_video(
            config, executor, on_output=progress.add, journal=journal, sources=sources
        )
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (cli_common.Stopped)
        view.close()
        console.print("[yellow]interrupted[/]: run the same command again to resume")
        raise typer.Exit(code=stopped_code()) from None
    except (ConveyorError, OSError, ImportError) as exc:  # OSError: e.g. a store refusing
        view.close()
        raise _fail(str(exc), 1) from None
    finally:
        view.close()
        close_monitors(extra)
    failed_now = report.tally.failed_now if report.tally is not None else set()
    add_input_failures(extra, input_failures(report.summary, failed_now))
    print_summary(report.summary, console)
    from rich.markup import escape

    # soft_wrap: a long path stays one line to copy, however narrow the terminal
    console.print(f"summary: {escape(str(report.summary_path))}", soft_wrap=True)
    html = report_path(extra)
    if html is not None:
        console.print(f"report:  {escape(str(html))}", soft_wrap=True)
    if not report.result.completed:
        raise typer.Exit(code=1)
    videos = report.summary["videos"]
    if videos["incomplete"]:
        console.print(
            f"[yellow]{videos['incomplete']} incomplete[/]: a stage failed on them, not for "
            "their content (why: above); the same command tries them again"
        )
    if (videos["failed"] or videos["incomplete"]) and not videos["ok"]:
        console.print("[red]every video failed[/]: nothing was curated (why: above)")
    if videos["incomplete"] or (videos["failed"] and not videos["ok"]):
        # the run's work is not done: a script must not take it for done (as image's and
        # text's failed tasks), while a bad video is the input's, listed, not the run's
        raise typer.Exit(code=1)


@dataclass
class _Watch:
    """The options about watching a run, carried to ``_run``."""

    metrics_port: int | None
    report: bool
    settings: dict[str, Any]


class _Progress:
    """Videos listed and clips written so far, for the live view's last line."""

    def __init__(self, sources: Any = None) -> None:
        self.sources = sources
        self.videos = 0
        self.kept = 0
        self.made = 0

    def add(self, task: Any) -> None:
        video = task.data
        self.made += sum(1 for c in video.clips if c.made)
        self.kept += sum(1 for c in video.clips if c.kept)
        if video.last_chunk and video.part == video.parts - 1:
            self.videos += 1

    def line(self) -> str:
        listed = ""
        if self.sources is not None:
            done = self.sources.complete
            listed = f"videos listed {self.sources.found:,}" + (
                f" ({done:,} complete before) | " if done else " | "
            )
        return (
            f"{listed}videos finished {self.videos:,} | clips made {self.made:,}, "
            f"kept {self.kept:,}"
        )
