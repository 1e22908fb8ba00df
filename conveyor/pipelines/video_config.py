"""``VideoConfig``: everything the video pipeline can be told (the CLI's options, and more),
checked when it is made, and the options that decide what a run writes (``fingerprint``).

Its own module so that what reads a config (the summary, the CLI) needs nothing of how the
pipeline is built.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from conveyor.media.decode import DECODERS
from conveyor.media.limits import MAX_VIDEO_PIXELS
from conveyor.stages.video.transcode import X264_PRESETS
from conveyor.stages.video.video_type import DEFAULT_VIDEO_TYPES, split_labels

Splitter = Literal["fixed", "shots"]
Shards = Literal["none", "webdataset"]
SHARD_FORMATS: tuple[str, ...] = get_args(Shards)
Detector = Literal["auto", "transnetv2", "hybrid", "adaptive", "content", "histogram"]
DETECTORS: tuple[str, ...] = get_args(Detector)
#: each detector's threshold where ``shot_threshold`` gives none (TransNetV2: a probability;
#: hybrid and adaptive: the adaptive ratio; content: 0-255 levels; histogram: 0-1)
DEFAULT_THRESHOLDS = {
    "transnetv2": 0.4, "hybrid": 3.0, "adaptive": 3.0, "content": 27.0, "histogram": 0.2,
}  # fmt: skip
#: the open range each detector's threshold lies in (``auto``'s depends on the machine)
SHOT_THRESHOLD_RANGES = {
    "transnetv2": (0.0, 1.0), "hybrid": (0.0, 255.0), "adaptive": (0.0, 255.0),
    "content": (0.0, 255.0), "histogram": (0.0, 1.0),
}  # fmt: skip

#: options that change what is written: resuming into an output made with other values of
#: these would mix two kinds of results
OUTPUT_OPTIONS = (
    "splitter", "detector", "clip_len_s", "stride_s", "min_clip_s", "max_clip_s",
    "max_len_mode", "crop_s", "shot_threshold", "encoder", "preset", "crf", "max_height",
    "motion", "motion_threshold", "motion_patch_threshold", "motion_source", "quality", "nsfw",
    "nsfw_threshold", "aesthetic_model", "aesthetic_threshold", "score_only", "embed",
    "overlay_text", "overlay_text_threshold",
    "embed_model", "tags", "caption_model", "text_embed", "write_filtered",
    "video_type_model", "video_types", "keep_types", "meta_json", "max_pixels",
)  # fmt: skip


@dataclass
class VideoConfig:
    """Everything the video pipeline can be told (the CLI's options, and more)."""

    #: (``pathlib.Path``s too: each becomes its absolute path's text)
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
    output: str | os.PathLike[str]
    splitter: Splitter = "shots"
    #: ``auto``: TransNetV2 where the machine has a GPU, else ``hybrid`` (the adaptive
    #: detector, TransNetV2 on doubtful stretches only; benchmarks/shots.py)
    detector: Detector = "auto"
    #: fixed stride: clip length, stride (default: the clip length), shortest clip kept
    clip_len_s: float = 10.0
    stride_s: float | None = None
    min_clip_s: float = 2.0
    #: shots: longest clip; longer shots are cut at this stride or truncated
    max_clip_s: float = 10.0
    max_len_mode: Literal["stride", "truncate"] = "stride"
    crop_s: float = 0.5
    shot_threshold: float | None = None  # default per detector
    #: scripts only: seconds of video each detection task decodes, for TransNetV2 (the
    #: PySceneDetect detectors take at least 20 s: a window's context is decoded twice)
    detection_window_s: float = 5.0
    #: scripts only: clips per chunk of a video handed on together
    clips_per_chunk: int = 2
    encoder: str = "auto"
    #: where sources are decoded: auto (the GPU's NVDEC where a worker has a GPU), cpu, nvdec
    decoder: str = "auto"
    preset: str = "veryfast"
    crf: int = 23
    max_height: int | None = None
    motion: bool = True
    motion_threshold: float = 1e-5
    motion_patch_threshold: float = 0.0
    #: whose motion vectors the motion filter judges: the source's, read in the transcoder's
    #: decode (a source without vectors is scored from its clips'), or the encoded clip's
    #: (a second decode of each clip)
    motion_source: Literal["source", "clip"] = "source"
    quality: bool = True
    nsfw: bool = False
    nsfw_threshold: float = 0.8
    aesthetic_model: str | None = None
    aesthetic_threshold: float = 3.5
    #: burnt-in text: filter clips where the most text-covered sampled frame has more than
    #: this fraction of its area in detected text boxes
    overlay_text: bool = False
    overlay_text_threshold: float = 0.02
    #: zero-shot video type with this CLIP model directory, among ``video_types``; clips whose
    #: type is not in ``keep_types`` are filtered (empty: all kept). Labels: a sequence or a
    #: comma list
    video_type_model: str | None = None
    video_types: Sequence[str] = DEFAULT_VIDEO_TYPES
    keep_types: Sequence[str] = ()
    score_only: bool = False
    embed: bool = True
    embed_model: str = "efficientnet-lite0"
    tags: bool = True
    caption_model: str | None = None
    #: embed each clip's caption (else its tags) as text with the packaged MiniLM; default:
    #: when clips are captioned
    text_embed: bool | None = None
    dedup: bool = False
    dedup_threshold: float = 0.95
    #: which clip of a near-duplicate set the dedup keeps: ``first`` (of the first video),
    #: ``longest``, ``sharpest`` (the quality filter's score) or ``aesthetic`` (the
    #: aesthetic model's); ``conveyor.stages.video.dedup.DEDUP_KEEP``
    dedup_keep: str = "first"
    write_filtered: bool = False
    #: also write each clip's meta as ``metas/<clip_id>.json`` beside the clip table
    #: (``metadata/*.parquet``, always written). On by default: the metas are what
    #: outputs have held from the start, and scripts, the demo and the benchmarks read them;
    #: at millions of clips, turn them off (a file per clip is what a file system and a
    #: bucket listing handle worst) and read the table
    meta_json: bool = True
    #: the kept clips also as WebDataset shards (``shards/shard-NNNNNN.tar``: mp4, json meta,
    #: npy embedding per clip) of about ``shard_mb`` MiB each; a local output only
    shards: Shards = "none"
    shard_mb: float = 1024.0
    limit: int | None = None
    #: a video whose frames have more pixels fails alone, before any is decoded (default: DCI
    #: 8K; a 16,000 x 16,000 video took a worker to 21 GB)
    max_pixels: int = MAX_VIDEO_PIXELS
    #: run models (and NVENC) on GPUs: None = when this machine has any
    gpus: bool | None = None
    #: scripts only: the most of a GPU each model stage's worker asks for (less where one
    #: worker of every GPU stage would not fit on one GPU together: ``gpu_shares``)
    gpu_share: float = 0.25
    description: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        from conveyor.pipelines.fields import check_types, limit_problems, model_problems

        check_types(self)
        paths = self._path_problems()
        problems = list(paths)
        if self.splitter not in ("fixed", "shots"):
            problems.append(f"splitter must be 'fixed' or 'shots', got {self.splitter!r}")
        if self.detector not in DETECTORS:
            problems.append(
                f"detector must be one of {', '.join(DETECTORS)}, got {self.detector!r}"
            )
        if self.decoder not in DECODERS:
            problems.append(f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.shot_threshold is not None and self.detector in SHOT_THRESHOLD_RANGES:
            low, high = SHOT_THRESHOLD_RANGES[self.detector]
            if not low < self.shot_threshold < high:
                problems.append(
                    f"shot_threshold for {self.detector} must be in ({low:g}, {high:g}), got "
                    f"{self.shot_threshold}"
                )
        for name in ("clip_len_s", "max_clip_s", "detection_window_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if self.stride_s is not None and self.stride_s <= 0:
            problems.append(f"stride_s must be > 0, got {self.stride_s}")
        for name in ("min_clip_s", "crop_s"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.splitter == "fixed" and self.min_clip_s > self.clip_len_s:
            problems.append(
                f"min_clip_s ({self.min_clip_s}) is longer than clip_len_s ({self.clip_len_s}): "
                "no clip could be kept"
            )
        if self.splitter == "shots" and self.min_clip_s > self.max_clip_s:
            problems.append(
                f"min_clip_s ({self.min_clip_s}) is longer than max_clip_s ({self.max_clip_s})"
            )
        if self.motion_source not in ("source", "clip"):
            problems.append(f"motion_source must be 'source' or 'clip', got {self.motion_source!r}")
        if self.clips_per_chunk < 1:
            problems.append(f"clips_per_chunk must be >= 1, got {self.clips_per_chunk}")
        if self.max_pixels < 1:
            problems.append(f"max_pixels must be >= 1, got {self.max_pixels}")
        problems += limit_problems(self.limit)
        if not 0 <= self.crf <= 51:
            problems.append(f"crf must be in 0..51, got {self.crf}")
        if self.preset not in X264_PRESETS:
            problems.append(f"preset must be one of {', '.join(X264_PRESETS)}, got {self.preset!r}")
        if not 0 < self.dedup_threshold <= 1:
            problems.append(f"dedup_threshold must be in (0, 1], got {self.dedup_threshold}")
        if self.dedup and not self.embed:
            problems.append("dedup needs embeddings: drop --no-embed or --dedup")
        problems += self._keep_problems()
        problems += self._shard_problems()
        if not 0 <= self.overlay_text_threshold <= 1:
            problems.append(
                "overlay_text_threshold must be in [0, 1] (a fraction of the frame's area), "
                f"got {self.overlay_text_threshold}"
            )
        if self.overlay_text:
            from conveyor.stages.video.overlay_text import packaged_model_path

            try:
                packaged_model_path()
            except (ImportError, OSError) as exc:
                problems.append(str(exc))
        if not 0 < self.gpu_share <= 1:
            problems.append(f"gpu_share must be in (0, 1], got {self.gpu_share}")
        models = model_problems(self, ("aesthetic_model", "caption_model"))
        problems += models
        caption = self.caption_model
        if (
            not models
            and caption is not None
            and not (Path(caption).expanduser() / "config.json").is_file()
        ):  # (a file given for it failed the run once it had started)
            problems.append(
                f"caption model {caption!r} is not a Hugging Face model folder (it has no "
                "config.json)"
            )
        problems += self._video_type_problems()
        if not isinstance(self.embed_model, (str, os.PathLike)) or not os.fspath(self.embed_model):
            problems.append(
                f"embed_model must be a path or efficientnet-lite0, got {self.embed_model!r}"
            )
        elif (
            self.embed_model != "efficientnet-lite0"
            and not Path(self.embed_model).expanduser().exists()
        ):
            problems.append(f"embed_model {self.embed_model!r} does not exist")
        if self.text_embed and not self.tags and self.caption_model is None:
            problems.append(
                "text_embed embeds each clip's caption or tags: give caption_model or keep tags"
            )
        problems += [] if paths else self._place_problems()
        if not problems:
            problems += self._package_problems()
        if problems:
            raise ValueError("; ".join(problems))

    def _package_problems(self) -> list[str]:
        from conveyor.pipelines.fields import package_problems

        wanted = [("av", "the video pipeline", "video")]
        if self.embed or self.tags or self.detector in ("auto", "transnetv2", "hybrid"):
            wanted.append(("torch", "each model stage", "video"))
        if self.dedup:
            wanted.append(("faiss", "--dedup", "video"))
        return package_problems(wanted)

    def _path_problems(self) -> list[str]:
        """INPUT and OUTPUT made absolute (a relative ``~/out`` was a folder named ``~``);
        an empty one (the current folder, read or written into) is a problem."""
        from conveyor.pipelines.fields import absolute

        problems = []
        single = isinstance(self.input, (str, os.PathLike))
        inputs = [self.input] if single else []
        if isinstance(self.input, (list, tuple)):
            inputs = list(self.input)
        if not inputs or not all(isinstance(i, (str, os.PathLike)) for i in inputs):
            problems.append(f"input must be a path or a list of paths, got {self.input!r}")
        elif not all(os.fspath(i) for i in inputs):
            problems.append("input must not be empty")
        else:
            paths = [absolute(i) for i in inputs]
            self.input = paths[0] if single else paths
        if not isinstance(self.output, (str, os.PathLike)):
            problems.append(f"output must be a path, got {self.output!r}")
        elif not os.fspath(self.output):
            problems.append("output must not be empty")
        else:
            self.output = absolute(self.output)
        return problems

    def _place_problems(self) -> list[str]:
        """No source may be the output folder or lie where the run writes."""
        from conveyor.pipelines.owner import nesting_problem
        from conveyor.pipelines.places import source_problems
        from conveyor.pipelines.video import owned

        if not self.output:
            return []
        folders, files = owned(self.output)
        sources = [self.input] if isinstance(self.input, (str, os.PathLike)) else self.input
        nested = nesting_problem(self.output)
        problems = [nested] if nested else []
        return problems + source_problems(sources, self.output, [*folders, *files])

    def _keep_problems(self) -> list[str]:
        from conveyor.stages.video.dedup import DEDUP_KEEP

        if not isinstance(self.dedup_keep, str) or self.dedup_keep not in DEDUP_KEEP:
            return [f"dedup_keep must be one of {', '.join(DEDUP_KEEP)}, got {self.dedup_keep!r}"]
        if not self.dedup:  # the rule is not used: the scores it reads need not be made
            return []
        if self.dedup_keep == "sharpest" and not self.quality:
            return ["--dedup-keep sharpest reads the quality filter's score: drop --no-quality"]
        if self.dedup_keep == "aesthetic" and not self.aesthetic_model:
            return ["--dedup-keep aesthetic reads the aesthetic score: give --aesthetic-model"]
        return []

    def _shard_problems(self) -> list[str]:
        from conveyor.storage import is_url

        problems = []
        if self.shards not in SHARD_FORMATS:
            problems.append(
                f"shards must be one of {', '.join(SHARD_FORMATS)}, got {self.shards!r}"
            )
        if isinstance(self.shard_mb, bool) or not (
            isinstance(self.shard_mb, (int, float)) and 0 < self.shard_mb < math.inf
        ):
            problems.append(f"shard_mb must be a number of MiB > 0, got {self.shard_mb!r}")
        if self.shards != "none" and is_url(self.output):
            problems.append(
                f"shards needs a local output (a shard is filled by appending to a file), "
                f"got {self.output}: write to a local or mounted folder, or drop shards"
            )
        return problems

    def _video_type_problems(self) -> list[str]:
        for name in ("video_types", "keep_types"):
            labels = getattr(self, name)
            labels = split_labels(labels) if isinstance(labels, str) else tuple(labels)
            setattr(self, name, labels)
        if self.video_type_model is None:
            needs = "keep types need a video type model (--video-type-model)"
            return [needs] if self.keep_types else []
        from conveyor.stages.video.video_type import label_problems, model_problem

        problem = model_problem(self.video_type_model)
        return [problem] if problem else label_problems(self.video_types, self.keep_types)

    @property
    def use_gpus(self) -> bool:
        if self.gpus is not None:
            return self.gpus
        from conveyor.backends.devices import detect_gpus

        return bool(detect_gpus().physical_ids)

    @property
    def shot_detector(self) -> str:
        """The detector that runs: ``auto`` made concrete for this machine."""
        if self.detector != "auto":
            return self.detector
        return "transnetv2" if self.use_gpus else "hybrid"

    @property
    def embeds_text(self) -> bool:
        if self.text_embed is not None:
            return self.text_embed
        return self.caption_model is not None

    def fingerprint(self) -> dict[str, Any]:
        """The options that decide what is written (compared when resuming)."""
        return {name: _plain(getattr(self, name)) for name in OUTPUT_OPTIONS}


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return value
