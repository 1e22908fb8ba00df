"""The video curation pipeline: a ``VideoConfig`` in, an ordinary ``Pipeline`` out.

``build_video_pipeline(config)`` assembles the stages (read, split, transcode with the models'
frames and the motion vectors taken in the same decode, filter, embed, annotate, write, and
fill WebDataset shards when asked); ``run_video(config, executor)`` runs it, deduplicates
when asked, closes the last shard and writes ``summary.json``.
The ``conveyor video`` command only parses options into a ``VideoConfig``: whatever it does,
a script can do with the same objects.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.output_lock import locks_output
from conveyor.pipeline import Pipeline
from conveyor.pipelines.owner import COMMAND, check_clearable, check_owner
from conveyor.pipelines.video_config import (
    DEFAULT_THRESHOLDS,
    SHOT_THRESHOLD_RANGES,
    VideoConfig,
)
from conveyor.pipelines.video_summary import RunTally, build_summary
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage

if TYPE_CHECKING:
    from conveyor.executors.base import Executor
    from conveyor.executors.ray_data import RayDataExecutor
    from conveyor.result import RunResult
    from conveyor.stages.video.reader import VideoSources
    from conveyor.storage import StoragePath


# -- building ---------------------------------------------------------------------------
def build_video_pipeline(config: VideoConfig) -> Pipeline:
    """The stages of ``config``, in order, as an ordinary ``Pipeline``."""
    from conveyor.stages.video import (
        ClipTranscoder,
        ClipWriter,
        FixedStrideSplitter,
        MotionFilter,
        VideoReader,
    )
    from conveyor.stages.video.base import FrameConsumer

    gpus = config.use_gpus
    # the transcoder takes a GPU share for its NVENC
    nvenc = gpus and _nvenc_expected(config.encoder)
    small, captioner = gpu_shares(config, nvenc) if gpus else (0.0, 0.0)
    model_resources = Resources(cpus=1, gpus=small) if gpus else Resources(cpus=1)
    stages: list[ProcessingStage[Any, Any]] = [
        VideoReader(config.input, config.output, limit=config.limit, max_pixels=config.max_pixels)
    ]
    if config.splitter == "fixed":
        stages.append(
            FixedStrideSplitter(
                config.clip_len_s, config.stride_s, config.min_clip_s, config.clips_per_chunk
            )
        )
    else:
        stages += _shot_stages(config, model_resources)
    motion = (
        MotionFilter(
            config.motion_threshold,
            config.motion_patch_threshold,
            score_only=config.score_only,
            source=config.motion_source,
        )
        if config.motion
        else None
    )
    from_source = motion is not None and motion.source == "source"
    consumers: list[FrameConsumer] = _frame_consumers(config, model_resources, captioner)
    # one decode of each clip's stretch of the source: the transcoder samples the models'
    # frames and reads the source's motion vectors in the pass it encodes from
    transcoder = ClipTranscoder(
        encoder="libx264" if config.encoder == "auto" and not nvenc else config.encoder,
        preset=config.preset,
        crf=config.crf,
        max_height=config.max_height,
        frame_rates={c.frame_rate for c in consumers},
        motion_patch=motion.patch if motion is not None and from_source else None,
        decoder=config.decoder,
    )
    if nvenc:
        transcoder = transcoder.with_(resources=Resources(cpus=1, gpus=small))
    elif _nvdec_expected(config):
        transcoder = transcoder.with_(resources=Resources(cpus=1, nvdecs=TRANSCODER_NVDECS))
    stages.append(transcoder)
    if motion is not None:
        # judging from the source's vectors it compares two numbers: a quarter of a CPU
        stages.append(motion.with_(resources=Resources(cpus=0.25)) if from_source else motion)
    if consumers:
        consumers[-1].release_frames = True
        stages += consumers
    if config.embeds_text:
        from conveyor.stages.video.text_embed import TextEmbedder

        stages.append(TextEmbedder().with_(resources=model_resources))
    writer = ClipWriter(
        config.output, write_filtered=config.write_filtered, meta_json=config.meta_json
    )
    if config.embed or config.embeds_text:
        # every kept clip has a vector, so no video shares a table: a batch would only hold
        # records back
        writer = writer.with_(batch_size=1, batch_wait_s=None)
    stages.append(writer)
    if config.shards == "webdataset":
        from conveyor.stages.video.shards import ShardWriter

        stages.append(ShardWriter(config.output, config.shard_mb))
    return Pipeline("video-curation", stages, description=config.description or describe(config))


#: what a captioner's worker asks for: a vision-language model is the one large model here
CAPTIONER_GPU_SHARE = 0.5
#: NVDEC units a worker keeps busy (estimates; the GPU benchmark measures NVDEC's busy
#: time): a transcoder decodes at its encoder's pace, which libx264 on a core or two keeps
#: to tens of 720p frames a second, a small part of what one decoder unit decodes; the shot
#: detector's decoder does nothing but decode, and takes half a unit, so that one worker of
#: each fits a GPU of a single unit (a V100)
TRANSCODER_NVDECS = 0.05
SHOT_DECODER_NVDECS = 0.5


def gpu_shares(config: VideoConfig, nvenc: bool) -> tuple[float, float]:
    """The GPU share each small GPU stage's worker asks for, and the captioner's; ``nvenc``:
    the transcoder takes one, for NVENC (decoding on NVDEC takes decoder units instead, not
    a share of the GPU's compute, which would cap the transcoders at a few per GPU).

    Streaming runs every stage at once, so one worker of each GPU stage must fit on one GPU
    together (a one-GPU machine is the commonest GPU machine): the captioner takes half a GPU
    and the other GPU stages (shot detector, NVENC/NVDEC transcoder, aesthetic, embedder, a tagger
    that runs its own network, text embedder) split what is left, each at most
    ``config.gpu_share``. The autoscaler then adds workers where a GPU has room left.
    """
    small_stages = sum(
        (
            config.splitter == "shots" and config.shot_detector == "transnetv2",
            nvenc,
            config.aesthetic_model is not None,
            config.video_type_model is not None,
            config.embed,
            config.tags and not tags_from_embedder(config),
            config.embeds_text,
        )
    )
    captioner = CAPTIONER_GPU_SHARE if config.caption_model is not None else 0.0
    if not small_stages:
        return 0.0, 1.0 if captioner else 0.0
    room = (1.0 - captioner) / small_stages
    # rounded down, so that the shares of one worker per stage never add up past one GPU
    return math.floor(min(config.gpu_share, room) * 10_000) / 10_000, captioner


def tags_from_embedder(config: VideoConfig) -> bool:
    """Whether the tags come from the embedder's pass: it runs the tagger's network (the
    packaged EfficientNet-Lite0), whose classifier head is one matrix product away."""
    from conveyor.media.models import EFFICIENTNET_LITE0

    return config.embed and config.embed_model == EFFICIENTNET_LITE0


def _nvenc_expected(encoder: str) -> bool:
    """Whether the transcoder should take a GPU share for NVENC.

    ``auto`` asks NVENC on this machine when it has a GPU, so that a GPU without video
    encoders (A100, H100, H200) lends no share to a transcoder that would encode on the CPU
    anyway; a machine without GPUs (a cluster's driver) cannot tell and leaves it to the
    workers, which fall back to libx264 where NVENC will not open.
    """
    if encoder == "libx264":
        return False
    if encoder == "h264_nvenc":
        return True
    from conveyor.backends.devices import detect_gpus
    from conveyor.stages.video.transcode import nvenc_works

    return nvenc_works() if detect_gpus().physical_ids else True


def _nvdec_expected(config: VideoConfig) -> bool:
    """Whether decoding stages take NVDEC units: on GPUs, unless told to decode on the CPU
    (every NVIDIA data-centre GPU has NVDEC; where it cannot take a video, the CPU does)."""
    return config.use_gpus and config.decoder != "cpu"


def _shot_stages(
    config: VideoConfig, model_resources: Resources
) -> list[ProcessingStage[Any, Any]]:
    from conveyor.stages.video.cut_detectors import SCENEDETECT_WIDTH, detector_for
    from conveyor.stages.video.shots import (
        TRANSNET_CONTEXT,
        ShotFrameDecoder,
        ShotWindows,
        TransNetV2Detector,
    )
    from conveyor.stages.video.split import ShotSplitter, SplitRules

    rules = SplitRules(config.min_clip_s, config.max_clip_s, config.max_len_mode, config.crop_s)
    name = config.shot_detector
    threshold = config.shot_threshold
    if threshold is None:
        threshold = DEFAULT_THRESHOLDS[name]
    elif not SHOT_THRESHOLD_RANGES[name][0] < threshold < SHOT_THRESHOLD_RANGES[name][1]:
        low, high = SHOT_THRESHOLD_RANGES[name]
        raise ValueError(
            f"shot_threshold {threshold} is outside ({low:g}, {high:g}) for {name}, the "
            f"detector {config.detector} chose on this machine: name the detector"
        )
    detector: ProcessingStage[Any, Any]
    if name == "transnetv2":
        detector = TransNetV2Detector(threshold).with_(
            resources=model_resources, batch_size=8 if config.use_gpus else 1
        )
        window_s = config.detection_window_s
        decoder = ShotFrameDecoder(decoder=config.decoder)
    else:
        # PySceneDetect's detectors see frames as it does (256 wide); a detector costs less
        # than the decode, so longer windows save the context each window decodes again
        detector = detector_for(name, threshold)
        window_s = max(config.detection_window_s, 20.0)
        decoder = ShotFrameDecoder(
            size=None, width=SCENEDETECT_WIDTH, scaler="opencv", decoder=config.decoder
        )
    if _nvdec_expected(config):
        decoder = decoder.with_(resources=Resources(cpus=1, nvdecs=SHOT_DECODER_NVDECS))
    windows = ShotWindows(window_s, TRANSNET_CONTEXT, rules.first_clip_certain_s)
    return [windows, decoder, detector, ShotSplitter(rules, config.clips_per_chunk)]


def _frame_consumers(
    config: VideoConfig, model_resources: Resources, captioner_share: float
) -> list[Any]:
    """The stages that read decoded frames, in pipeline order."""
    consumers: list[Any] = []
    if config.quality:
        from conveyor.stages.video.quality import QualityFilter

        consumers.append(QualityFilter(score_only=config.score_only))
    if config.nsfw:
        from conveyor.stages.video.nsfw import NSFWFilter

        consumers.append(NSFWFilter(config.nsfw_threshold, score_only=config.score_only))
    if config.overlay_text:
        from conveyor.stages.video.overlay_text import OverlayTextFilter

        consumers.append(
            OverlayTextFilter(config.overlay_text_threshold, score_only=config.score_only)
        )
    if config.aesthetic_model is not None:
        from conveyor.stages.video.aesthetic import AestheticFilter

        consumers.append(
            AestheticFilter(
                config.aesthetic_model, config.aesthetic_threshold, score_only=config.score_only
            ).with_(resources=model_resources)
        )
    if config.video_type_model is not None:
        from conveyor.stages.video.video_type import VideoTypeClassifier

        classifier = VideoTypeClassifier(
            config.video_type_model,
            config.video_types,
            config.keep_types,
            score_only=config.score_only,
        )
        consumers.append(classifier.with_(resources=model_resources))
    embedder = None
    if config.embed:
        from conveyor.stages.video.embed import ClipEmbedder

        embedder = ClipEmbedder(config.embed_model)
        consumers.append(embedder.with_(resources=model_resources))
    if config.tags:
        from conveyor.stages.video.tags import ImageNetTagger

        if embedder is not None and tags_from_embedder(config):
            # the embedder's network classifies the frames it embeds: the tagger only
            # ranks the labels (no model, no GPU, the embedder's frames)
            tagger = ImageNetTagger(frame_rate=embedder.frame_rate, from_embedder=True)
            consumers.append(tagger.with_(resources=Resources(cpus=0.25)))
        else:
            consumers.append(ImageNetTagger().with_(resources=model_resources))
    if config.caption_model is not None:
        from conveyor.stages.video.caption import Captioner

        consumers.append(
            Captioner(config.caption_model).with_(
                resources=Resources(cpus=1, gpus=captioner_share)
                if captioner_share
                else Resources(cpus=1)
            )
        )
    return consumers


def describe(config: VideoConfig) -> str:
    """One line saying what the pipeline does."""
    if config.splitter == "fixed":
        stride = config.stride_s if config.stride_s is not None else config.clip_len_s
        split = f"fixed {config.clip_len_s:g} s clips every {stride:g} s"
    else:
        split = f"{config.shot_detector} shots, clips {config.min_clip_s:g}-{config.max_clip_s:g} s"
    parts = [split, f"H.264 ({config.encoder}, {config.preset}, crf {config.crf})"]
    if config.decoder != "auto":
        parts.append(f"decoded on {'NVDEC' if config.decoder == 'nvdec' else 'the CPU'}")
    filters = [
        name
        for name, on in (
            ("motion", config.motion),
            ("quality", config.quality),
            ("nsfw", config.nsfw),
            ("overlay_text", config.overlay_text),
            ("aesthetic", config.aesthetic_model is not None),
        )
        if on
    ]
    if filters:
        parts.append(("scored by " if config.score_only else "filtered by ") + "/".join(filters))
    if config.video_type_model is not None:
        kept = f", keeping {'/'.join(config.keep_types)}" if config.keep_types else ""
        parts.append(f"video types ({len(config.video_types)}{kept})")
    if config.embed:
        parts.append(f"embeddings ({Path(config.embed_model).name})")
    if config.tags:
        parts.append("ImageNet tags")
    if config.caption_model:
        parts.append(f"captions ({Path(config.caption_model).name})")
    if config.dedup:
        best = {"longest": "longest", "sharpest": "sharpest", "aesthetic": "best-looking"}
        keeping = f", keeping the {best[config.dedup_keep]}" if config.dedup_keep in best else ""
        parts.append(f"semantic dedup at {config.dedup_threshold:g}{keeping}")
    if config.shards != "none":
        parts.append(f"WebDataset shards of {config.shard_mb:g} MiB")
    return "; ".join(parts)


# -- running ----------------------------------------------------------------------------
def default_journal(output: str | os.PathLike[str]) -> Path | None:
    """Where ``conveyor video`` keeps its journal: in the output's internal folder, which
    ``--overwrite`` clears with the rest. ``None`` for an output on a bucket: a journal is
    appended to, which object stores cannot do (their records say what is done)."""
    from conveyor.media.layout import OutputLayout
    from conveyor.storage import is_url

    if is_url(output):
        return None
    internal = OutputLayout(output).internal
    assert isinstance(internal, Path)
    return internal / "journal"


class ConfigMismatch(ValueError):
    """The output holds results made with other options than the ones given: each in
    ``changes`` as (field, recorded value, value given)."""

    def __init__(self, message: str, changes: Sequence[tuple[str, Any, Any]] = ()) -> None:
        self.changes = list(changes)
        self._template = message
        super().__init__(self.said(_change))

    def said(self, change: Callable[[str, Any, Any], str]) -> str:
        """The message with each change written by ``change(field, before, now)`` (the
        command line writes them as its flags)."""
        return self._template.replace("{changes}", ", ".join(change(*one) for one in self.changes))


def _change(name: str, before: Any, now: Any) -> str:
    return f"{name}: {before!r} -> {now!r}"


#: the recorded ``limit`` of the run an output was made by: a later run may take more of
#: the input (each video is its own), not less (the summary would describe only those)
LIMIT = "limit"


def check_resume(config: VideoConfig) -> dict[str, Any] | None:
    """Compare ``config`` with the options an earlier run wrote into the same output.

    Returns the earlier options (``None`` for a fresh output) or raises ``ConfigMismatch``
    naming the options that differ, or ``ValueError`` for an output that is a file (it
    would fail only once the run had started, and with an errno), or ``FileNotFoundError``
    for shards that cannot be resumed (``check_shards``).
    """
    from conveyor.media.layout import OutputLayout
    from conveyor.storage import check_output_place

    check_output_place(config.output)
    check_owner(config.output, "video")
    if config.shards != "none":
        from conveyor.stages.video.shards import check_shards

        check_shards(config.output)
    layout = OutputLayout(config.output)
    earlier = earlier_options(layout.config, config.fingerprint(), config.output)
    before = (earlier or {}).get(LIMIT, config.limit)
    if config.limit is not None and (before is None or config.limit < before):
        made_from = "every video of its input" if before is None else f"{before} videos"
        raise ConfigMismatch(
            f"{config.output} holds results made from {made_from}; --limit {config.limit} "
            "would leave the rest out of its summary: resume with a larger --limit or none, "
            "or write to a new output (or pass --overwrite)"
        )
    return earlier


def earlier_options(
    recorded: StoragePath,
    now: dict[str, Any],
    output: str | os.PathLike[str],
    defaults: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The options an earlier run recorded in ``recorded`` (``None``: no earlier run), or
    ``ConfigMismatch`` naming those that differ from ``now``. An option the record lacks
    is not compared, unless ``defaults`` says what a run before the option was made with."""
    try:
        earlier = json.loads(recorded.read_bytes())
    except (OSError, ValueError):
        return None
    if isinstance(earlier, dict):
        earlier = {**(defaults or {}), **earlier}
    changed = [(k, earlier[k], now[k]) for k in now if k in earlier and earlier[k] != now[k]]
    if changed:
        raise ConfigMismatch(
            f"{output} holds results made with other options ({{changes}}); resume with "
            "the same options, or write to a new output (or pass --overwrite)",
            changed,
        )
    return earlier


def owned(output: str | os.PathLike[str]) -> tuple[list[StoragePath], list[StoragePath]]:
    """The folders and the files a video run writes under ``output``: what ``--overwrite``
    removes, and where no source may lie (``places``)."""
    from conveyor.media.layout import OutputLayout
    from conveyor.stages.video.dedup import DUPLICATES
    from conveyor.stages.video.dedup import REPORT as DEDUP_REPORT

    layout = OutputLayout(output)
    folders = [
        layout.clips, layout.filtered_clips, layout.metas, layout.metadata, layout.embeddings,
        layout.text_embeddings, layout.videos, layout.shards, layout.internal,
    ]  # fmt: skip
    return folders, [layout.summary, layout.root / DEDUP_REPORT, layout.root / DUPLICATES]


def clear_output(output: str | os.PathLike[str]) -> None:
    """Remove everything a video run writes under ``output`` (for ``--overwrite``), where
    the output is a video run's (``check_clearable``)."""
    from conveyor.media.layout import OutputLayout

    layout = OutputLayout(output)
    folders, files = owned(output)
    check_clearable(output, "video", [*folders, *files])
    for folder in folders:
        layout.remove_tree(folder)
    for file in files:
        file.unlink(missing_ok=True)


@dataclass
class VideoRunReport:
    """What ``run_video`` did: the engine's result and the summary it wrote."""

    result: RunResult
    summary: dict[str, Any]
    summary_path: StoragePath
    wall_s: float
    #: the totals the summary was made of (``failed_now``: this run's videos that failed)
    tally: RunTally | None = None


@locks_output(lambda config, *_, **__: config.output)
def run_video(
    config: VideoConfig,
    executor: Executor | RayDataExecutor | None = None,
    *,
    on_output: Callable[[Any], None] | None = None,
    journal: str | os.PathLike[str] | None = None,
    sources: VideoSources | None = None,
) -> VideoRunReport:
    """Run the pipeline of ``config`` into ``config.output`` (resuming an earlier run),
    deduplicate when asked, close the last shard, and write ``summary.json``.

    The videos are listed as the engine takes them (``VideoSources``, or ``sources`` when
    given, not yet read: the command peeks at it for an empty input), so the first starts
    while a folder or bucket of millions is still being listed, each checked against the
    output's records as it comes, on a disk or a bucket alike. With ``journal`` (a local
    file, see ``default_journal``) the run also keeps the engine's journal: each video is
    a source task, recorded once all its clips are written.

    Only one run at a time writes an output folder: another one raises ``OutputInUse``
    (``conveyor.output_lock``).
    """
    from conveyor.engine.journal import Journal
    from conveyor.media.layout import OutputLayout
    from conveyor.stages.video.reader import VideoSources

    check_resume(config)
    # built first: options only the stages refuse must not be recorded as the output's
    pipeline = build_video_pipeline(config)
    layout = OutputLayout(config.output)
    layout.internal.mkdir(parents=True, exist_ok=True)
    layout.write_json(
        layout.config, {**config.fingerprint(), LIMIT: config.limit, COMMAND: "video"}
    )
    if config.shards != "none":
        from conveyor.stages.video.shards import finish_shards
    if sources is None:
        sources = VideoSources(config.input, config.output, limit=config.limit)
    # the records of the videos complete already go into the summary's tally as they are
    # read to resume; each video finished now, as its record comes out of the pipeline
    tally = RunTally(keep_complete=config.shards != "none")
    sources.on_complete = tally.add_complete
    sources.on_pending = tally.add_pending
    layout.sweep_tmp()  # before any worker writes: only one run may use an output at once
    started = time.perf_counter()
    # the listing stage makes each source its video task: without a journal the i-th one
    # is labelled "i", with one after its key (``video_of_label``)
    # the sources leave out the videos whose records say they are complete: a video whose
    # record is gone is done again, whatever the journal holds
    kept = None if journal is None else Journal(journal, skip_finished=False)
    run = pipeline.stream(executor, sources, journal=kept)
    try:
        with run:
            for output in run:
                tally.add_output(output)
                if on_output is not None:
                    on_output(output)
    finally:
        # a worker stopped mid-clip (SIGTERM to the run's process group, a crash) ran no
        # teardown: its scratch clip is swept now that its process is gone, not at the next run
        from conveyor.stages.video.transcode import sweep_scratch_dirs

        sweep_scratch_dirs()
    result = run.result
    tally.stopped = True
    sources.drain()  # a run stopped early: the summary still counts every video
    tally.finish(layout, result.failures)
    if config.shards != "none":
        # before the dedup marks the metas: a video a stop left out of the shards is added
        # here, and its clips' metas in the shards carry no mark, as every other's
        finish_shards(config.output, config.shard_mb, tally.complete_paths or ())
    if config.dedup and result.completed:
        from conveyor.stages.video.dedup import deduplicate

        deduplicate(
            config.output, config.dedup_threshold, keep=config.dedup_keep, executor=executor
        )
    wall = time.perf_counter() - started
    summary = build_summary(config, tally, result, wall, pipeline.description or "")
    layout.write_json(layout.summary, summary)
    return VideoRunReport(result, summary, layout.summary, wall, tally)
