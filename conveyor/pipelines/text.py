"""The text curation pipeline: a ``TextConfig`` in, ordinary ``Pipeline``s out.

Pass 1 reads the input (``TextPartitioner`` -> ``TextReader``), applies the Gopher-style
heuristic filters and fastText language identification (and the language filter), and with
deduplication spills each kept document's keys (``DedupKeys``; semantic dedup: its MiniLM
embedding, ``DedupEmbeddings``) and stages the kept rows as Parquet under
``OUTPUT/.conveyor/staging``; without it, it writes the output directly.
``resolve_duplicates`` (``resolve_semantic``) then finds the duplicates across the whole
dataset, and pass 2 reads the staged rows, drops them (``DropDuplicates``) and writes the
output. ``run_text`` runs both passes on any executor and backend, publishes the shards as
``OUTPUT/part-00000.parquet``... in input order, and writes ``OUTPUT/summary.json``. The
``conveyor text`` command only turns options into a ``TextConfig``: whatever it does, a script
can do with the same objects.

::

    OUT/part-00000.parquet ...     the kept documents, every input field plus language and
                                   language_score (or part-00000.jsonl ... with format="jsonl")
    OUT/summary.json               documents in / kept / filtered by rule and by language /
                                   removed as duplicates, malformed lines with file and line
    OUT/.conveyor/                 work in progress (staging, dedup keys or embeddings),
                                   removed at the end
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from conveyor.pipeline import Pipeline
from conveyor.stage import ProcessingStage

if TYPE_CHECKING:
    from conveyor.executors.base import Executor
    from conveyor.result import RunResult
    from conveyor.stages.text.dedup import DedupResult, FuzzyDedupConfig
    from conveyor.stages.text.filters import Rule
    from conveyor.stages.text.readers import InputListing
    from conveyor.stages.text.semantic import SemanticResult
    from conveyor.storage import StoragePath

Format = Literal["parquet", "jsonl"]
DedupMode = Literal["none", "exact", "fuzzy", "semantic"]
INTERNAL = ".conveyor"
SUMMARY = "summary.json"
#: the fuzzy dedup options (``None``: FuzzyDedupConfig's default)
FUZZY_OPTIONS = ("shingle_size", "num_perm", "bands", "rows", "threshold", "jaccard_check")
#: the semantic dedup options (``None``: SEMANTIC_THRESHOLD, and semantic_dedup's clusters)
SEMANTIC_OPTIONS = ("semantic_threshold", "semantic_clusters")


@dataclass
class TextConfig:
    """Everything the text pipeline can be told (the CLI's options, one for one).

    Each heuristic rule is on when its switch is ``True``, off when ``False``, and follows
    ``filters`` when ``None``.
    """

    #: a file, a directory, a glob or a URL; or a list of them
    input: str | Sequence[str]
    output: str
    text_field: str = "text"
    format: Format = "parquet"
    filters: bool = True
    word_count: bool | None = None
    min_words: int = 50
    max_words: int = 100_000
    mean_word_length: bool | None = None
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    symbol_ratio: bool | None = None
    max_symbol_ratio: float = 0.1
    ellipsis_lines: bool | None = None
    max_ellipsis_lines: float = 0.3
    repeated_lines: bool | None = None
    max_repeated_lines: float = 0.3
    langid: bool = True
    #: keep only these languages (ISO 639 codes, or "en,de"); empty: keep every language
    languages: Sequence[str] | str = ()
    #: with ``languages``: the least fastText probability of the language kept
    language_threshold: float = 0.0
    dedup: DedupMode = "fuzzy"
    shingle_size: int | None = None
    num_perm: int | None = None
    bands: int | None = None
    rows: int | None = None
    threshold: float | None = None
    jaccard_check: bool | None = None
    #: semantic: the least cosine similarity of two documents' MiniLM embeddings that makes
    #: the later one a duplicate (``None``: 0.95, see docs/text-dedup.md)
    semantic_threshold: float | None = None
    #: semantic: k-means clusters the documents are compared within (``None``: one per
    #: 10,000 documents)
    semantic_clusters: int | None = None
    dedup_partitions: int = 16
    #: only the first ``limit`` records (non-blank lines, Parquet rows) of the input
    limit: int | None = None
    #: input bytes per read task (and so, roughly, per output shard without dedup; with it,
    #: pass 2 writes shards of about 8 times as many bytes)
    chunk_bytes: int = 16 << 20
    description: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        from conveyor.stages.text.langid import parse_languages
        from conveyor.storage import is_url, normalize

        problems: list[str] = []

        def absolute(value: str) -> str:  # so that workers elsewhere (Ray) find it too
            if not is_url(value):
                value = os.path.abspath(os.path.expanduser(normalize(value)))
            return normalize(value)

        if isinstance(self.input, (str, os.PathLike)):
            self.input = absolute(os.fspath(self.input)) if os.fspath(self.input) else ""
        else:
            self.input = [absolute(os.fspath(i)) for i in self.input if os.fspath(i)]
            if len(self.input) == 1:
                self.input = self.input[0]
        if not self.input:
            problems.append("input must not be empty")
        self.output = absolute(os.fspath(self.output)) if os.fspath(self.output) else ""
        if not self.output:
            problems.append("output must not be empty")
        inputs = [self.input] if isinstance(self.input, str) else list(self.input)
        if self.output and self.output in inputs:
            problems.append(
                "OUTPUT is the INPUT directory: write to another directory (one inside INPUT "
                "is fine, it is not read)"
            )
        if not self.text_field:
            problems.append("text_field must be a non-empty name")
        internal = ("_doc_id", "language", "language_score") if self.langid else ("_doc_id",)
        if self.text_field in internal:
            problems.append(
                f"text_field {self.text_field!r} is a column the pipeline writes; rename it"
            )
        if self.format not in ("parquet", "jsonl"):
            problems.append(f"format must be 'parquet' or 'jsonl', got {self.format!r}")
        if self.dedup not in ("none", "exact", "fuzzy", "semantic"):
            problems.append(
                f"dedup must be 'none', 'exact', 'fuzzy' or 'semantic', got {self.dedup!r}"
            )
        try:
            self.languages = parse_languages(self.languages or None)
        except ValueError as exc:
            problems.append(f"languages: {exc}")
        if self.languages and not self.langid:
            problems.append("choosing languages needs language identification (langid=True)")
        if not 0.0 <= self.language_threshold <= 1.0:
            problems.append(f"language_threshold must be in [0, 1], got {self.language_threshold}")
        if self.limit is not None and self.limit < 1:
            problems.append(f"limit must be >= 1, got {self.limit}")
        if self.chunk_bytes < 1:
            problems.append(f"chunk_bytes must be >= 1, got {self.chunk_bytes}")
        if self.dedup_partitions < 1:
            problems.append(f"dedup_partitions must be >= 1, got {self.dedup_partitions}")
        given = [name for name in FUZZY_OPTIONS if getattr(self, name) is not None]
        if given and self.dedup != "fuzzy":
            problems.append(
                f"{', '.join(given)} set fuzzy deduplication, which needs dedup='fuzzy' "
                f"(dedup is {self.dedup!r})"
            )
        problems += self._semantic_problems()
        if not problems:
            try:
                self.rules()
                self.fuzzy_config()
            except (ValueError, TypeError) as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("; ".join(problems))

    def _semantic_problems(self) -> list[str]:
        given = [name for name in SEMANTIC_OPTIONS if getattr(self, name) is not None]
        if given and self.dedup != "semantic":
            return [
                f"{', '.join(given)} set semantic deduplication, which needs dedup='semantic' "
                f"(dedup is {self.dedup!r})"
            ]
        problems = []
        threshold, clusters = self.semantic_threshold, self.semantic_clusters
        if threshold is not None and (
            isinstance(threshold, bool)
            or not isinstance(threshold, (int, float))
            or not 0 < threshold <= 1
        ):
            problems.append(f"semantic_threshold must be in (0, 1], got {threshold!r}")
        if clusters is not None and (
            isinstance(clusters, bool) or not isinstance(clusters, int) or clusters < 1
        ):
            problems.append(f"semantic_clusters must be an int >= 1, got {clusters!r}")
        return problems

    def semantic_options(self) -> dict[str, Any] | None:
        """The semantic dedup settings (``None`` unless dedup is semantic; ``clusters``
        ``None``: one per 10,000 documents)."""
        if self.dedup != "semantic":
            return None
        from conveyor.stages.text.semantic import SEMANTIC_THRESHOLD

        threshold = self.semantic_threshold
        return {
            "threshold": SEMANTIC_THRESHOLD if threshold is None else float(threshold),
            "clusters": self.semantic_clusters,
        }

    def _on(self, switch: bool | None) -> bool:
        return self.filters if switch is None else switch

    def rules(self) -> list[Rule]:
        """The heuristic rules that are on, cheapest first."""
        from conveyor.stages.text.filters import (
            EllipsisLines,
            MeanWordLength,
            RepeatedLines,
            SymbolToWordRatio,
            WordCount,
        )

        rules: list[Rule] = []
        if self._on(self.word_count):
            rules.append(WordCount(self.min_words, self.max_words))
        if self._on(self.mean_word_length):
            rules.append(MeanWordLength(self.min_mean_word_length, self.max_mean_word_length))
        if self._on(self.symbol_ratio):
            rules.append(SymbolToWordRatio(self.max_symbol_ratio))
        if self._on(self.ellipsis_lines):
            rules.append(EllipsisLines(self.max_ellipsis_lines))
        if self._on(self.repeated_lines):
            rules.append(RepeatedLines(self.max_repeated_lines))
        return rules

    def fuzzy_config(self) -> FuzzyDedupConfig | None:
        """The MinHash LSH settings (``None`` unless dedup is fuzzy). ``num_perm`` follows
        ``bands * rows`` when only those are given, and ``rows`` follows ``num_perm / bands``
        when only ``num_perm`` is."""
        if self.dedup != "fuzzy":
            return None
        from conveyor.stages.text.dedup import FuzzyDedupConfig

        default = FuzzyDedupConfig()
        bands, rows, num_perm = self.bands, self.rows, self.num_perm
        if num_perm is None:
            bands = default.bands if bands is None else bands
            rows = default.rows if rows is None else rows
            num_perm = bands * rows
        elif bands is None and rows is None:
            bands = default.bands
            rows = num_perm // bands if num_perm % bands == 0 else default.rows
        elif bands is None:
            assert rows is not None
            bands = num_perm // rows if num_perm % rows == 0 else default.bands
        elif rows is None:
            rows = num_perm // bands if num_perm % bands == 0 else default.rows
        values: dict[str, Any] = {"num_perm": num_perm, "bands": bands, "rows": rows}
        for name in ("shingle_size", "threshold", "jaccard_check"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        return FuzzyDedupConfig(**values)

    def options(self) -> dict[str, Any]:
        """What the run was told, as plain values (for ``summary.json``)."""
        fuzzy = self.fuzzy_config()
        return {
            "text_field": self.text_field,
            "format": self.format,
            "rules": {rule.name: _rule_values(rule) for rule in self.rules()},
            "langid": self.langid,
            "languages": list(self.languages),
            "language_threshold": self.language_threshold,
            "dedup": self.dedup,
            "fuzzy": None if fuzzy is None else _rule_values(fuzzy),
            "semantic": self.semantic_options(),
            "limit": self.limit,
            "chunk_bytes": self.chunk_bytes,
        }


def _rule_values(obj: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(obj).items()}


# -- where things go ------------------------------------------------------------------------
class TextLayout:
    """The paths of a text run under ``output``."""

    def __init__(self, output: str | os.PathLike[str]) -> None:
        from conveyor.storage import location

        self.root = location(os.fspath(output))
        self.internal = self.root / INTERNAL
        self.staging = self.internal / "staging"  # pass 1's kept rows (with dedup)
        self.ready = self.internal / "ready"  # finished shards, before they are published
        self.summary = self.root / SUMMARY
        if isinstance(self.root, Path):
            self.dedup: Path = self.root / INTERNAL / "dedup"
        else:  # the dedup spill is local (every worker on this machine, or a shared disk)
            import hashlib
            import tempfile

            digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:16]
            self.dedup = Path(tempfile.gettempdir()) / f"conveyor-dedup-{digest}"
        self.removed = self.dedup / "removed.npy"

    def clear_work(self) -> None:
        """Remove what an earlier (or this) run left in the work folders."""
        import shutil

        from conveyor.storage import remove_tree

        for folder in (self.staging, self.ready):
            remove_tree(folder)
        shutil.rmtree(self.dedup, ignore_errors=True)

    def finish(self) -> None:
        """Remove the work folders, and the internal folder when nothing else is in it."""
        self.clear_work()
        if isinstance(self.internal, Path):
            with contextlib.suppress(OSError):
                self.internal.rmdir()


# -- building -------------------------------------------------------------------------------
@dataclass
class TextPipelines:
    """The run's pipelines: ``first`` always; ``second`` (after ``resolve_duplicates``) with
    deduplication."""

    first: Pipeline
    second: Pipeline | None = None

    def describe(self) -> str:
        parts = [self.first.describe()]
        if self.second is not None:
            parts.append(self.second.describe())
        return "\n".join(parts)


def build_text_pipelines(config: TextConfig) -> TextPipelines:
    """The stages of ``config``, in order, as ordinary ``Pipeline``s."""
    from conveyor.stages.text.dedup import DedupKeys, DropDuplicates
    from conveyor.stages.text.filters import HeuristicFilter
    from conveyor.stages.text.langid import LanguageIdentifier
    from conveyor.stages.text.readers import TextPartitioner, TextReader
    from conveyor.stages.text.semantic import DedupEmbeddings
    from conveyor.stages.text.writers import ShardedWriter

    layout = TextLayout(config.output)
    description = config.description or describe(config)
    stages: list[ProcessingStage[Any, Any]] = [
        TextPartitioner(
            config.input,
            chunk_bytes=config.chunk_bytes,
            limit=config.limit,
            exclude=[config.output],
        ),
        TextReader(config.text_field, batch_bytes=config.chunk_bytes),
    ]
    rules = config.rules()
    if rules:
        stages.append(HeuristicFilter(rules, text_field=config.text_field, drop_empty=False))
    if config.langid:
        stages.append(
            LanguageIdentifier(
                config.languages or None,
                config.language_threshold,
                text_field=config.text_field,
            )
        )
    count_by = "language" if config.langid else None
    if config.dedup == "none":
        stages.append(ShardedWriter(layout.ready, config.format, count_by=count_by))
        return TextPipelines(Pipeline("text-curation", stages, description=description))
    if config.dedup == "semantic":
        stages.append(DedupEmbeddings(layout.dedup, text_column=config.text_field))
    else:
        stages.append(
            DedupKeys(
                layout.dedup,
                config.dedup,
                config.fuzzy_config(),
                text_column=config.text_field,
                partitions=config.dedup_partitions,
            )
        )
    stages.append(
        ShardedWriter(layout.staging, "parquet", drop_columns=(), compression="zstd", count_by=None)
    )
    first = Pipeline("text-curation", stages, description=description)
    second = Pipeline(
        "text-curation-pass-2",
        [
            # staged Parquet is compressed (about 3x): pack a few staged files per output shard
            TextPartitioner(layout.staging, chunk_bytes=2 * config.chunk_bytes),
            TextReader(config.text_field, batch_bytes=16 * config.chunk_bytes, keep_ids=True),
            DropDuplicates(layout.removed),
            ShardedWriter(layout.ready, config.format, count_by=count_by),
        ],
        description=f"drop the {config.dedup} duplicates, write {config.format}",
    )
    return TextPipelines(first, second)


def describe(config: TextConfig) -> str:
    """One line saying what the pipeline does."""
    limit = f" (first {config.limit:,} records)" if config.limit else ""
    source = config.input if isinstance(config.input, str) else ", ".join(config.input)
    parts = [f"read {source}{limit}"]
    rules = config.rules()
    parts.append(
        "filters: " + ", ".join(rule.name for rule in rules) if rules else "no heuristic filters"
    )
    if config.langid:
        kept = (
            f", keep {','.join(config.languages)}"
            + (f" at >= {config.language_threshold:g}" if config.language_threshold else "")
            if config.languages
            else ""
        )
        parts.append(f"fastText language ID{kept}")
    if config.dedup == "fuzzy":
        fuzzy = config.fuzzy_config()
        assert fuzzy is not None
        parts.append(
            f"fuzzy dedup (MinHash {fuzzy.num_perm} = {fuzzy.bands}x{fuzzy.rows}, "
            f"{fuzzy.shingle_size}-word shingles, Jaccard >= {fuzzy.threshold:g}"
            + ("" if fuzzy.jaccard_check else ", no Jaccard check")
            + ")"
        )
    elif config.dedup == "exact":
        parts.append("exact dedup")
    elif config.dedup == "semantic":
        from conveyor.dedup.plan import ITEMS_PER_CLUSTER
        from conveyor.media.minilm import MAX_TOKENS

        semantic = config.semantic_options()
        assert semantic is not None
        clusters = semantic["clusters"]
        parts.append(
            f"semantic dedup (MiniLM embeddings of the first {MAX_TOKENS} tokens, cosine >= "
            f"{semantic['threshold']:g}, "
            + (
                f"1 cluster per {ITEMS_PER_CLUSTER:,} documents"
                if clusters is None
                else f"{clusters} cluster{'s' if clusters > 1 else ''}"
            )
            + ")"
        )
    parts.append(f"write {config.format}")
    return "; ".join(parts)


# -- running --------------------------------------------------------------------------------
def _resolve(
    config: TextConfig, layout: TextLayout, executor: Executor | None
) -> DedupResult | SemanticResult:
    """The duplicates among what pass 1 spilled, as ``layout.removed`` (semantic dedup runs
    its passes on ``executor``, the run's own)."""
    if config.dedup == "semantic":
        from conveyor.stages.text.semantic import resolve_semantic

        semantic = config.semantic_options()
        assert semantic is not None
        return resolve_semantic(
            layout.dedup,
            threshold=semantic["threshold"],
            clusters=semantic["clusters"],
            executor=executor,
            out_path=layout.removed,
        )
    from conveyor.stages.text.dedup import resolve_duplicates

    return resolve_duplicates(
        layout.dedup, config.dedup, config.fuzzy_config(), out_path=layout.removed
    )


@dataclass
class TextRunReport:
    """What ``run_text`` did: the passes' engine results and the summary it wrote."""

    results: list[RunResult]
    summary: dict[str, Any]
    summary_path: StoragePath
    files: list[str]
    dedup: DedupResult | SemanticResult | None
    wall_s: float

    @property
    def completed(self) -> bool:
        return all(r.completed for r in self.results)

    @property
    def failures(self) -> list[Any]:
        return [f for r in self.results for f in r.failures]


def run_text(
    config: TextConfig,
    executor: Executor | None = None,
    *,
    listing: InputListing | None = None,
    on_output: Callable[[Any], None] | None = None,
    on_pass: Callable[[str], None] | None = None,
) -> TextRunReport:
    """Run the pipelines of ``config`` (pass 1, dedup, pass 2) into ``config.output`` and
    write ``summary.json``; ``executor`` runs every pass (default: streaming, local).

    ``listing`` is the input's ``list_inputs`` when the caller already has it (it raises
    ``InputError`` for a missing input, a glob matching nothing, no text files).
    ``on_output`` sees every last-stage output (a ``FileGroupTask`` whose metadata holds the
    counts); ``on_pass`` is told when a pass or the dedup step starts. Output shards are
    published (moved to ``part-NNNNN``) only when every pass completed.
    """
    from conveyor.pipelines.text_summary import TextCounts, build_summary
    from conveyor.stages.text.readers import list_inputs
    from conveyor.stages.text.writers import publish_shards
    from conveyor.storage import atomic_write

    started = time.perf_counter()
    if listing is None:
        listing = list_inputs(config.input, exclude=[config.output])
    layout = TextLayout(config.output)
    if isinstance(layout.root, Path) and layout.root.is_file():
        raise NotADirectoryError(f"OUTPUT {config.output!r} is a file, expected a directory")
    layout.clear_work()
    pipelines = build_text_pipelines(config)
    counts = TextCounts()
    results: list[RunResult] = []
    dedup: DedupResult | SemanticResult | None = None
    files: list[str] = []

    def run_pass(pipeline: Pipeline, final: bool, label: str) -> RunResult:
        if on_pass is not None:
            on_pass(label)
        with pipeline.stream(executor) as run:
            for output in run:
                counts.add(output.metadata, first_pass=not results, final=final)
                if on_output is not None:
                    on_output(output)
        results.append(run.result)
        return run.result

    result = run_pass(pipelines.first, pipelines.second is None, "pass 1")
    passes = 1
    if result.completed and pipelines.second is not None and counts.staged_rows:
        if on_pass is not None:
            on_pass("dedup")
        t0 = time.perf_counter()
        layout.dedup.mkdir(parents=True, exist_ok=True)
        dedup = _resolve(config, layout, executor)
        counts.dedup_s = time.perf_counter() - t0
        run_pass(pipelines.second, True, "pass 2")
        passes = 2
    completed = len(results) == passes and all(r.completed for r in results)
    if completed:
        files = publish_shards(layout.ready, config.output)
    wall = time.perf_counter() - started
    summary = build_summary(
        config, listing, counts, dedup, results, files, wall, completed, pipelines.first
    )
    data = (json.dumps(summary, indent=1, ensure_ascii=False) + "\n").encode()
    layout.root.mkdir(parents=True, exist_ok=True)
    with atomic_write(layout.summary) as out:
        out.write(data)
    if completed:
        layout.finish()
    return TextRunReport(results, summary, layout.summary, files, dedup, wall)
