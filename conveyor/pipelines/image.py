"""The image curation pipeline: an ``ImageConfig`` in, an ordinary ``Pipeline`` out.

``build_image_pipeline(config)`` assembles the stages (read a part, decode and normalise,
quality, NSFW, aesthetics, embeddings with tags, write); ``run_image(config, executor)``
runs it over the parts of the input still to do (``ImageSources``, with the run's journal),
then deduplicates the kept images (exact, perceptual or semantic, in input order), packs the
kept images that are no duplicate into WebDataset shards, and writes ``summary.json``. The
``conveyor image`` command only parses options into an ``ImageConfig``: whatever it does, a
script can do with the same objects. The layout of the output is in
``conveyor.stages.image.layout``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.output_lock import locks_output
from conveyor.pipeline import Pipeline
from conveyor.pipelines.image_config import OPTION_DEFAULTS, ImageConfig
from conveyor.pipelines.image_summary import ImageTally, build_summary
from conveyor.pipelines.owner import COMMAND, check_clearable, check_owner
from conveyor.pipelines.video import ConfigMismatch
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage

if TYPE_CHECKING:
    from conveyor.executors.base import Executor
    from conveyor.executors.ray_data import RayDataExecutor
    from conveyor.result import RunResult
    from conveyor.stages.image.dedup import ImageDedupResult
    from conveyor.stages.image.shards import PackResult
    from conveyor.stages.image.sources import ImageSources

__all__ = [
    "ConfigMismatch",
    "ImageConfig",
    "ImageRunReport",
    "build_image_pipeline",
    "check_resume",
    "clear_output",
    "describe",
    "run_image",
]

#: the most a GPU model stage's worker asks of a GPU
GPU_SHARE = 0.25


# -- building ---------------------------------------------------------------------------
def build_image_pipeline(config: ImageConfig) -> Pipeline:
    """The stages of ``config``, in order, as an ordinary ``Pipeline``."""
    from conveyor.stages.image.base import ImageStage
    from conveyor.stages.image.decode import ImageDecoder
    from conveyor.stages.image.models import (
        ImageAestheticFilter,
        ImageClipScoreFilter,
        ImageEmbedder,
        ImageNSFWFilter,
        ImageTagger,
    )
    from conveyor.stages.image.quality import ImageQualityFilter
    from conveyor.stages.image.read import ImageReader
    from conveyor.stages.image.writer import ImageWriter

    models = sum(
        (
            config.nsfw,
            config.aesthetic_model is not None,
            config.clip_score_model is not None,
            config.embed,
            config.tags and not config.tags_from_embedder,
        )
    )
    share = math.floor(min(GPU_SHARE, 1 / max(models, 1)) * 10_000) / 10_000
    on_gpu = Resources(cpus=1, gpus=share) if config.use_gpus else Resources(cpus=1)
    scored: list[ImageStage] = [ImageDecoder(config.max_pixels)]
    if config.quality:
        scored.append(
            ImageQualityFilter(
                config.min_size,
                config.max_aspect,
                config.min_contrast,
                score_only=config.score_only,
            )
        )
    if config.nsfw:
        nsfw = ImageNSFWFilter(config.nsfw_threshold, score_only=config.score_only)
        scored.append(nsfw.with_(resources=on_gpu))  # type: ignore[arg-type]
    if config.aesthetic_model is not None:
        aesthetic = ImageAestheticFilter(
            config.aesthetic_model, config.aesthetic_threshold, score_only=config.score_only
        )
        scored.append(aesthetic.with_(resources=on_gpu))  # type: ignore[arg-type]
    if config.clip_score_model is not None:
        clip_score = ImageClipScoreFilter(
            config.clip_score_model, config.clip_score_threshold, score_only=config.score_only
        )
        scored.append(clip_score.with_(resources=on_gpu))  # type: ignore[arg-type]
    if config.embed:
        embedder = ImageEmbedder(config.embed_model, tags=config.tags_from_embedder)
        scored.append(embedder.with_(resources=on_gpu))  # type: ignore[arg-type]
    if config.tags and not config.tags_from_embedder:
        scored.append(ImageTagger().with_(resources=on_gpu))  # type: ignore[arg-type]
    scored[-1].release_pixels = True  # the working copies go no further
    stages: list[ProcessingStage[Any, Any]] = [ImageReader(), *scored, ImageWriter(config.output)]
    return Pipeline("image-curation", stages, description=config.description or describe(config))


def describe(config: ImageConfig) -> str:
    """One line saying what the pipeline does."""
    parts = [f"decode (at most {config.max_pixels:,} pixels)"]
    filters = []
    if config.quality:
        filters.append(
            f"quality (min side {config.min_size}, aspect <= {config.max_aspect:g}, "
            f"contrast >= {config.min_contrast:g})"
        )
    if config.nsfw:
        filters.append(f"nsfw < {config.nsfw_threshold:g}")
    if config.aesthetic_model is not None:
        filters.append(f"aesthetic >= {config.aesthetic_threshold:g}")
    if config.clip_score_model is not None:
        filters.append(f"CLIP score of the caption >= {config.clip_score_threshold:g}")
    if filters:
        parts.append(("scored by " if config.score_only else "filtered by ") + ", ".join(filters))
    if config.embed:
        parts.append(f"embeddings ({Path(config.embed_model).name})")
    if config.tags:
        parts.append("ImageNet tags")
    if config.dedup == "exact":
        parts.append("exact dedup")
    elif config.dedup == "phash":
        parts.append(f"perceptual dedup (<= {config.phash_distance} bits{_keeping(config)})")
    elif config.dedup == "semantic":
        parts.append(f"semantic dedup at {config.semantic_threshold:g}{_keeping(config)}")
    parts.append(f"WebDataset shards of {config.shard_mb:g} MiB")
    return "; ".join(parts)


def _keeping(config: ImageConfig) -> str:
    return "" if config.dedup_keep == "first" else f", keeping the {config.dedup_keep}"


# -- running ----------------------------------------------------------------------------
def check_resume(config: ImageConfig) -> dict[str, Any] | None:
    """Compare ``config`` with the options an earlier run wrote into the same output.

    Returns the earlier options (``None`` for a fresh output); raises ``ConfigMismatch``
    naming the options that differ, ``ValueError`` for an output that is a file, and
    ``FileNotFoundError`` for a shard without its index (``listing``).
    """
    from conveyor.media.tar_shards import listing
    from conveyor.pipelines.video import earlier_options
    from conveyor.stages.image.layout import ImageLayout
    from conveyor.storage import check_output_place

    check_output_place(config.output)
    check_owner(config.output, "image")
    layout = ImageLayout(config.output)
    listing(layout.local / "shards")
    return earlier_options(layout.config, config.fingerprint(), config.output, OPTION_DEFAULTS)


def owned(output: str | os.PathLike[str]) -> tuple[list[Path], list[Path]]:
    """The folders and the files an image run writes under ``output``: what
    ``--overwrite`` removes, and where no source may lie (``places``)."""
    from conveyor.stages.image.layout import ImageLayout

    layout = ImageLayout(output)
    folders = [layout.metadata, layout.embeddings, layout.shards, layout.internal]
    return folders, [layout.summary, layout.duplicates, layout.dedup_report]


def clear_output(output: str | os.PathLike[str]) -> None:
    """Remove everything an image run writes under ``output`` (for ``--overwrite``), where
    the output is an image run's (``check_clearable``)."""
    from conveyor.stages.image.layout import ImageLayout

    layout = ImageLayout(output)
    folders, files = owned(output)
    check_clearable(output, "image", [*folders, *files])
    for folder in folders:
        layout.remove_tree(folder)
    for file in files:
        file.unlink(missing_ok=True)


@dataclass
class ImageRunReport:
    """What ``run_image`` did: the engine's result, deduplication, shards and the summary."""

    result: RunResult
    summary: dict[str, Any]
    summary_path: Path
    dedup: ImageDedupResult | None
    shards: PackResult | None
    wall_s: float


@locks_output(lambda config, *_, **__: config.output)
def run_image(
    config: ImageConfig,
    executor: Executor | RayDataExecutor | None = None,
    *,
    on_output: Callable[[Any], None] | None = None,
    sources: ImageSources | None = None,
) -> ImageRunReport:
    """Run the pipeline of ``config`` into ``config.output`` (resuming an earlier run), then
    deduplicate, pack the shards and write ``summary.json``.

    The input is listed and cut into parts as the engine takes them (``ImageSources``, or
    ``sources`` when given: the command peeks at it for an empty input); a part an earlier
    run finished is skipped, its record counted. The run keeps the engine's journal in
    ``OUTPUT/.conveyor/journal``. Deduplication and packing run only when the stream
    completed, over every complete part; ``executor`` also runs the semantic dedup's passes.

    Only one run at a time writes an output folder: another one raises ``OutputInUse``
    (``conveyor.output_lock``).
    """
    from conveyor.engine.journal import Journal
    from conveyor.stages.image.dedup import deduplicate
    from conveyor.stages.image.layout import ImageLayout
    from conveyor.stages.image.shards import pack_shards
    from conveyor.stages.image.sources import ImageSources

    check_resume(config)
    # built first: options only the stages refuse must not be recorded as the output's
    pipeline = build_image_pipeline(config)
    layout = ImageLayout(config.output)
    layout.internal.mkdir(parents=True, exist_ok=True)
    layout.write_json(layout.config, {**config.fingerprint(), COMMAND: "image"})
    tally = ImageTally()
    if sources is None:
        sources = ImageSources(
            config.input,
            config.output,
            images_per_task=config.images_per_task,
            limit=config.limit,
        )
    sources.on_complete = tally.add_complete
    layout.sweep_tmp()  # before any worker writes: only one run may use an output at once
    started = time.perf_counter()
    # the sources leave out the parts whose records say they are complete: a part whose
    # record is gone is done again, whatever the journal holds
    journal = Journal(layout.journal, skip_finished=False)
    with pipeline.stream(executor, sources, journal=journal) as run:
        for output in run:
            tally.add_output(output)
            if on_output is not None:
                on_output(output)
    result = run.result
    sources.drain()  # a run stopped early: the summary still counts every part
    dedup = shards = None
    if result.completed:
        complete = tally.complete_parts()
        _remove_unfinished(layout, [p.index for p in sources.to_do if p.index not in tally.parts])
        indexes = [index for index, _ in complete]
        if config.dedup != "none":
            dedup = deduplicate(
                layout,
                indexes,
                config.dedup,
                max_distance=config.phash_distance,
                threshold=config.semantic_threshold,
                clusters=config.semantic_clusters,
                executor=executor,
                keep=config.dedup_keep,
            )
        marks = dedup.marks if dedup is not None else {}
        shards = pack_shards(layout, config.shard_mb, complete, marks)
    wall = time.perf_counter() - started
    summary = build_summary(config, sources, tally, result, dedup, shards, wall, pipeline)
    layout.write_json(layout.summary, summary)
    return ImageRunReport(result, summary, layout.summary, dedup, shards, wall)


def _remove_unfinished(layout: Any, indexes: Sequence[int]) -> None:
    """What parts of this run that did not complete (their task failed) left behind: no
    reader of the output should take their metadata for the parts'."""
    for index in indexes:
        for path in (
            layout.metadata_path(index),
            layout.part_embeddings(index),
            layout.staged_samples(index),
        ):
            path.unlink(missing_ok=True)
