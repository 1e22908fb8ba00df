"""``conveyor image INPUT OUTPUT``: the image curation pipeline from the command line.

It only turns options into an ``ImageConfig`` and an executor; ``run_image`` does the rest.
Exit codes: 0 when the run completes (bad images are listed, not fatal), 1 when a stage
cannot start, a part's task failed, every image failed, an image could not be read for now
(permission, I/O) or the run stops early, 2 for a bad INPUT, OUTPUT or option (one line
saying why), 130 on Ctrl-C.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from conveyor.cli_common import (
    ADDRESS,
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
from conveyor.pipelines.fields import LIMIT_MAX


class DedupChoice(StrEnum):
    none = "none"
    exact = "exact"
    phash = "phash"
    semantic = "semantic"


class DedupKeep(StrEnum):
    first = "first"
    largest = "largest"
    aesthetic = "aesthetic"


class ImageExecutor(StrEnum):
    streaming = "streaming"
    batch = "batch"


def image(
    ctx: typer.Context,
    input: Annotated[
        str,
        typer.Argument(
            help="A folder of images (searched recursively for .jpg .jpeg .png .webp .gif "
            ".bmp .tiff .tif .avif), WebDataset tar shards (img2dataset's layout), a Parquet file "
            "of image bytes or paths, a glob such as 'data/*.tar', or a URL such as "
            "s3://bucket/images.",
            show_default=False,
            metavar="INPUT",
        ),
    ],
    output: Annotated[
        str,
        typer.Argument(
            help="A local folder for shards/, metadata/, embeddings/ and summary.json.",
            show_default=False,
            metavar="OUTPUT",
        ),
    ],
    quality: Annotated[
        bool,
        typer.Option("--quality/--no-quality", help="Filter small, extreme and blank images."),
    ] = True,
    min_size: Annotated[
        int, typer.Option("--min-size", min=0, help="Quality: shortest side kept (pixels).")
    ] = 64,
    max_aspect: Annotated[
        float,
        typer.Option(min=1.0, help="Quality: largest ratio of the longer side to the shorter."),
    ] = 4.0,
    min_contrast: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=255.0,
            help="Quality: least standard deviation of grey levels (blank), of the 256-px "
            "working copy.",
        ),
    ] = 2.0,
    max_pixels: Annotated[
        int,
        typer.Option(min=1, help="Most pixels an image may have (more: a decompression bomb)."),
    ] = 89_478_485,
    nsfw: Annotated[bool, typer.Option("--nsfw/--no-nsfw", help="Content-safety filter.")] = True,
    nsfw_threshold: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Safety: reject at this NSFW probability.")
    ] = 0.8,
    aesthetic_model: Annotated[
        Path | None, typer.Option(help="Aesthetic scorer (CLIP directory + head, or TorchScript).")
    ] = None,
    aesthetic_threshold: Annotated[
        float, typer.Option(help="Aesthetic: least score kept (LAION's scale, 1-10).")
    ] = 4.5,
    clip_score_model: Annotated[
        Path | None,
        typer.Option(
            help="CLIP score: a Hugging Face CLIP directory; each captioned image's cosine "
            "similarity to its caption."
        ),
    ] = None,
    clip_score_threshold: Annotated[
        float,
        typer.Option(
            min=-1.0,
            max=1.0,
            help="CLIP score: least kept (LAION-5B: 0.28 with OpenAI's ViT-B/32).",
        ),
    ] = 0.28,
    embed: Annotated[bool, typer.Option("--embed/--no-embed", help="Image embeddings.")] = True,
    embed_model: Annotated[
        str,
        typer.Option(help="Embedding model: the packaged one, or a path to a torch or HF model."),
    ] = "efficientnet-lite0",
    tags: Annotated[bool, typer.Option("--tags/--no-tags", help="ImageNet tags.")] = True,
    dedup: Annotated[
        DedupChoice,
        typer.Option(
            case_sensitive=False,
            help="Leave duplicates out of the shards: exact (the same bytes), phash (perceptual "
            "hashes a few bits apart: resized, recompressed) or semantic (embeddings, cosine). "
            "One of each set is kept (--dedup-keep); metadata marks the others' duplicate_of.",
        ),
    ] = DedupChoice.exact,
    dedup_keep: Annotated[
        DedupKeep,
        typer.Option(
            case_sensitive=False,
            help="Phash, semantic: the image of a duplicate set kept: the first in input "
            "order, the largest (most pixels) or the best-looking (--aesthetic-model).",
        ),
    ] = DedupKeep.first,
    phash_distance: Annotated[
        int, typer.Option(min=0, max=32, help="Phash: most bits (of 64) apart.")
    ] = 4,
    semantic_threshold: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Semantic: least cosine similarity.")
    ] = 0.95,
    semantic_clusters: Annotated[
        int | None,
        typer.Option(
            min=1, help="Semantic: k-means clusters.", show_default="one per 10,000 images"
        ),
    ] = None,
    score_only: Annotated[
        bool, typer.Option("--score-only", help="Score with every filter, filter nothing.")
    ] = False,
    shard_mb: Annotated[
        float, typer.Option("--shard-mb", min=0.001, help="The size each shard is filled to (MiB).")
    ] = 1024.0,
    images_per_task: Annotated[
        int, typer.Option(min=1, help="Images per task (and per metadata file).")
    ] = 128,
    executor: Annotated[
        ImageExecutor, typer.Option(case_sensitive=False, help="How stages are scheduled.")
    ] = ImageExecutor.streaming,
    backend: BACKEND = BackendChoice.local,
    address: ADDRESS = None,
    cpus: CPUS = None,
    gpus: GPUS = None,
    memory_gb: MEMORY_GB = None,
    limit: Annotated[
        int | None,
        typer.Option(min=1, max=LIMIT_MAX, help="Only the first N images (in input order)."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Delete OUTPUT's earlier results first.")
    ] = False,
    live: LIVE = True,
    metrics_port: METRICS_PORT = None,
    report: REPORT = True,
) -> None:
    """Curate images: decode and normalise (EXIF orientation, CMYK, palettes, 16-bit), filter
    (quality, safety, aesthetics), embed, tag, deduplicate, and write WebDataset shards of the
    kept images with metadata/, embeddings/ and summary.json to OUTPUT. Bad images are listed
    with their reasons; they never stop the run. Re-running the same command resumes."""
    settings = dict(locals())  # the options as given, recorded with the run's event log
    del settings["ctx"]
    from rich.console import Console

    from conveyor.pipelines.image import (
        ImageConfig,
        build_image_pipeline,
        check_resume,
        clear_output,
    )
    from conveyor.stages.image.sources import IMAGE_EXTENSIONS, ImageInputError, ImageSources
    from conveyor.storage import check_output_place, normalize

    if address is not None and backend is BackendChoice.local:
        raise _fail("--address needs --backend ray")
    keep_needs = "--dedup phash or semantic" + (
        " (copies of the same bytes are as large and score the same)"
        if dedup is DedupChoice.exact
        else ""
    )
    refuse_unused(
        ctx,
        [
            (not quality, ["min_size", "max_aspect", "min_contrast"], "--quality"),
            (not nsfw, ["nsfw_threshold"], "--nsfw"),
            (aesthetic_model is None, ["aesthetic_threshold"], "--aesthetic-model"),
            (clip_score_model is None, ["clip_score_threshold"], "--clip-score-model"),
            (not embed, ["embed_model"], "--embed"),
            (dedup is not DedupChoice.phash, ["phash_distance"], "--dedup phash"),
            (dedup not in (DedupChoice.phash, DedupChoice.semantic), ["dedup_keep"], keep_needs),
            (dedup is not DedupChoice.semantic, ["semantic_threshold", "semantic_clusters"],
             "--dedup semantic"),
        ]
    )  # fmt: skip
    machine = Machine(cpus, gpus, memory_gb)
    try:
        use_gpus = machine.use_gpus(backend is BackendChoice.ray, address)
        config = ImageConfig(
            input=normalize(input),
            output=normalize(output),
            quality=quality,
            min_size=min_size,
            max_aspect=max_aspect,
            min_contrast=min_contrast,
            max_pixels=max_pixels,
            nsfw=nsfw,
            nsfw_threshold=nsfw_threshold,
            aesthetic_model=str(aesthetic_model) if aesthetic_model else None,
            aesthetic_threshold=aesthetic_threshold,
            clip_score_model=str(clip_score_model) if clip_score_model else None,
            clip_score_threshold=clip_score_threshold,
            embed=embed,
            embed_model=embed_model,
            tags=tags,
            dedup=dedup.value,
            dedup_keep=dedup_keep.value,
            phash_distance=phash_distance,
            semantic_threshold=semantic_threshold,
            semantic_clusters=semantic_clusters,
            score_only=score_only,
            shard_mb=shard_mb,
            images_per_task=images_per_task,
            limit=limit,
            gpus=use_gpus,
        )
        check_output_place(config.output)
        # its stages check their models: one that cannot be used ends it before OUTPUT is made
        build_image_pipeline(config)
    except (ValueError, OSError, ImportError) as exc:
        raise _fail(as_flags(ctx, str(exc))) from None
    clear = clear_output if overwrite else None
    with hold_output(config.output, clear, lambda: check_resume(config), ctx):
        try:
            sources = ImageSources(
                config.input,
                config.output,
                images_per_task=config.images_per_task,
                limit=config.limit,
            )
            empty = sources.empty()  # plans as far as the first part
        except ImageInputError as exc:
            raise _fail(str(exc)) from None
        except (OSError, ImportError, ValueError) as exc:  # a store refusing, unreachable, ...
            raise _fail(f"INPUT {exc}") from None
        if empty:
            wanted = " ".join((*IMAGE_EXTENSIONS, ".tar", ".parquet"))
            raise _fail(f"no images in {config.input} (looked for {wanted}, recursively)")
        watch = (metrics_port, report, settings)
        _run(config, sources, executor, backend, address, machine, live, Console(), watch)


def _run(
    config: Any,
    sources: Any,
    kind: ImageExecutor,
    backend: BackendChoice,
    address: str | None,
    machine: Machine,
    live: bool,
    console: Any,
    watch: tuple[int | None, bool, dict[str, Any]],
) -> None:
    from rich.markup import escape

    from conveyor.cli_common import add_input_failures, close_monitors, report_path, run_monitors
    from conveyor.errors import ConveyorError
    from conveyor.executors import BatchExecutor, StreamingExecutor
    from conveyor.monitor import LiveView
    from conveyor.pipelines.image import describe, run_image
    from conveyor.pipelines.image_summary import input_failures, print_summary
    from conveyor.stages.image.sources import InputChanged

    progress = _Progress(sources)
    view = LiveView(console=console, live=None if live else False, extra=progress.line)
    extra = run_monitors(Path(config.output), *watch, echo=console.print)
    try:
        chosen = machine.backend(backend, address)
        if backend is BackendChoice.local:
            chosen.open()  # its worker processes start while the run is prepared
        cls = BatchExecutor if kind is ImageExecutor.batch else StreamingExecutor
        executor = cls(chosen, monitors=[view, *extra])
    except (ImportError, ValueError, ConveyorError) as exc:
        close_monitors(extra)
        raise _fail(str(exc), 2 if isinstance(exc, ValueError) else 1) from None
    console.print(
        f"[bold]conveyor image[/]: {escape(str(config.input))} -> {escape(config.output)} "
        f"(images are listed as the run goes)\n  {escape(describe(config))}\n"
        f"  {kind.value} executor, {'Ray' if backend is BackendChoice.ray else 'local'} backend"
    )
    try:
        report = run_image(config, executor, on_output=progress.add, sources=sources)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (cli_common.Stopped)
        view.close()
        console.print("[yellow]interrupted[/]: run the same command again to resume")
        raise typer.Exit(code=stopped_code()) from None
    except InputChanged as exc:  # refused before its part was done again: nothing changed
        view.close()
        raise _fail(str(exc)) from None
    except (ConveyorError, OSError, ImportError, ValueError) as exc:
        view.close()
        raise _fail(str(exc), 1) from None
    finally:
        view.close()
        close_monitors(extra)
    add_input_failures(extra, input_failures(report.summary))
    print_summary(report.summary, console)
    console.print(f"summary: {escape(str(report.summary_path))}", soft_wrap=True)
    html = report_path(extra)
    if html is not None:
        console.print(f"report:  {escape(str(html))}", soft_wrap=True)
    if not report.result.completed:
        console.print("[red]the run did not complete[/]: run the same command again to resume")
        raise typer.Exit(code=1)
    if report.result.failures:
        console.print(
            f"[red]{len(report.result.failures)} task(s) failed[/]: their images are not in "
            "the output; run the same command again to retry them"
        )
        raise typer.Exit(code=1)
    images = report.summary["images"]
    if images["in"] and images["failed"] == images["in"]:
        console.print("[red]every image failed[/]: nothing was curated (why: above)")
        raise typer.Exit(code=1)
    if images["read_again"]:
        console.print(
            f"[yellow]{images['read_again']:,} image(s) could not be read for now[/] (a "
            "permission or I/O error, above): the same command does their parts again"
        )
        raise typer.Exit(code=1)


class _Progress:
    """Parts listed and images written so far, for the live view's last line."""

    def __init__(self, sources: Any) -> None:
        self.sources = sources
        self.images = 0
        self.kept = 0

    def add(self, task: Any) -> None:
        if task.record is not None:
            self.images += task.record["images"]
            self.kept += task.record["kept"]

    def line(self) -> str:
        done = self.sources.complete
        return (
            f"parts listed {self.sources.found:,}"
            + (f" ({done:,} complete before)" if done else "")
            + f" | images written {self.images:,}, kept {self.kept:,}"
        )
