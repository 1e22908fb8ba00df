"""The text curation pipeline: a ``TextConfig`` in, ordinary ``Pipeline``s out.

Pass 1 reads the input (``TextPartitioner`` -> ``TextReader``), applies the Gopher-style
heuristic filters and fastText language identification (and the language filter), and with
deduplication spills each kept document's keys (``DedupKeys``; semantic dedup: its MiniLM
embedding, ``DedupEmbeddings``) and stages the kept rows as Parquet under
``OUTPUT/.conveyor/staging``; without it, it writes the output directly.
``resolve_duplicates`` (``resolve_semantic``) then finds the duplicates across the whole
dataset, and pass 2 reads the staged rows, drops them (``DropDuplicates``) and writes the
output. ``run_text`` runs both passes on any executor and backend, publishes the shards as
``OUTPUT/documents/part-00000.parquet``... in input order, and writes
``OUTPUT/summary.json``. The ``conveyor text`` command only turns options into a
``TextConfig``: whatever it does, a script can do with the same objects.

::

    OUT/documents/part-00000.parquet ...
                                   the kept documents, every input field plus language and
                                   language_score (or part-00000.jsonl ... with format="jsonl"):
                                   a folder of them alone, which reads as one dataset
    OUT/summary.json               documents in / kept / filtered by rule and by language /
                                   removed as duplicates, malformed lines with file and line
    OUT/.conveyor/                 work in progress (staging, dedup keys or embeddings, and
                                   resume/: what an interrupted run finished, for the
                                   next one), removed at the end
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.executors.base import held
from conveyor.output_lock import locks_output
from conveyor.pipeline import Pipeline
from conveyor.pipelines.owner import check_owner, output_kind
from conveyor.pipelines.text_config import TextConfig
from conveyor.pipelines.text_resume import Finished, PassLog, TextResume
from conveyor.pipelines.text_summary import TextCounts, build_summary
from conveyor.stage import ProcessingStage

if TYPE_CHECKING:
    from conveyor.executors.base import Executor
    from conveyor.executors.ray_data import RayDataExecutor
    from conveyor.result import RunResult
    from conveyor.stages.text.dedup import DedupResult
    from conveyor.stages.text.readers import InputListing
    from conveyor.stages.text.semantic import SemanticResult
    from conveyor.storage import StoragePath

INTERNAL = ".conveyor"
SUMMARY = "summary.json"
#: the folder of the kept documents' part files (beside the summary and the event log,
#: ``pandas.read_parquet(OUT)`` failed on the first file that is not Parquet)
DOCUMENTS = "documents"


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
        self.documents = self.root / DOCUMENTS
        if isinstance(self.root, Path):
            self.dedup: Path = self.root / INTERNAL / "dedup"
        else:  # the dedup spill is local (every worker on this machine, or a shared disk)
            import hashlib
            import tempfile

            digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:16]
            self.dedup = Path(tempfile.gettempdir()) / f"conveyor-dedup-{digest}"
        self.removed = self.dedup / "removed.npy"

    def clear_work(self, *, keep_ready: bool = False) -> None:
        """Remove what an earlier (or this) run left in the work folders (``keep_ready``:
        but ``ready/``, which says the output is a text run's until its summary is in)."""
        from conveyor.storage import remove_tree

        for folder in (self.staging,) if keep_ready else (self.staging, self.ready):
            remove_tree(folder)
        shutil.rmtree(self.dedup, ignore_errors=True)

    def finish(self) -> None:
        """Remove the work folders, and the internal folder when nothing else is in it."""
        self.clear_work()
        if isinstance(self.internal, Path):
            with contextlib.suppress(OSError):
                self.internal.rmdir()


def check_output(output: str | os.PathLike[str]) -> None:
    """A local OUTPUT must be a folder, and the ``part-NNNNN`` files of its ``documents/``
    an earlier text run's: a run replaces every such file there (``publish_shards``), so
    ones that came from elsewhere (no text run's ``summary.json`` beside the folder) are
    refused rather than deleted; so is another command's output (``check_owner``)."""
    from conveyor.stages.text.writers import published_pattern

    layout = TextLayout(output)
    if not isinstance(layout.root, Path) or not layout.root.exists():
        return
    if not layout.root.is_dir():
        raise NotADirectoryError(f"OUTPUT {os.fspath(output)!r} is a file, expected a directory")
    check_owner(output, "text")
    if output_kind(output) == "text":
        return
    if not layout.documents.is_dir():
        return
    pattern = published_pattern()
    parts = sorted(p.name for p in layout.documents.iterdir() if pattern.fullmatch(p.name))
    if parts:
        more = f" and {len(parts) - 3} more" if len(parts) > 3 else ""
        raise ValueError(
            f"OUTPUT {os.fspath(output)} holds {DOCUMENTS}/{', '.join(parts[:3])}{more}, which "
            f"no earlier text run wrote there (it has no {SUMMARY}), and a run replaces every "
            f"part-NNNNN file of its {DOCUMENTS}/: move them, or write to another OUTPUT"
        )


def _drop_parts_at_the_top(layout: TextLayout) -> None:
    """Remove the part files a text run published at OUTPUT's top before they moved to
    ``documents/`` (ours: its summary is a text run's), so the output holds one set."""
    from conveyor.stages.text.writers import published_pattern

    if not isinstance(layout.root, Path) or output_kind(layout.root) != "text":
        return
    for path in layout.root.iterdir():
        if published_pattern().fullmatch(path.name) and path.is_file():
            path.unlink()


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


def build_text_pipelines(config: TextConfig, *, skip: Collection[int] = ()) -> TextPipelines:
    """The stages of ``config``, in order, as ordinary ``Pipeline``s. ``skip``: the read
    tasks of pass 1 an earlier run finished (``text_resume``)."""
    from conveyor.stages.text.dedup import DedupKeys
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
            skip=skip,
        ),
        TextReader(
            config.text_field, batch_bytes=config.chunk_bytes, max_doc_bytes=config.max_doc_bytes
        ),
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
                language_field=config.language_fields[0],
                score_field=config.language_fields[1],
                replace=False,
            )
        )
    count_by = config.language_field if config.langid else None
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
    return TextPipelines(first, second_pipeline(config))


def second_pipeline(config: TextConfig, *, skip: Collection[int] = ()) -> Pipeline:
    """Pass 2 of a run with deduplication: the staged rows without the duplicates, written
    to the output's format. ``skip``: its read tasks an earlier run finished."""
    from conveyor.stages.text.dedup import DropDuplicates
    from conveyor.stages.text.readers import TextPartitioner, TextReader
    from conveyor.stages.text.writers import ShardedWriter

    layout = TextLayout(config.output)
    count_by = config.language_field if config.langid else None
    return Pipeline(
        "text-curation-pass-2",
        [
            # staged Parquet is compressed (about 3x): pack a few staged files per output shard
            TextPartitioner(layout.staging, chunk_bytes=2 * config.chunk_bytes, skip=skip),
            # (the staged rows were held to max_doc_bytes when pass 1 read them)
            TextReader(
                config.text_field,
                batch_bytes=16 * config.chunk_bytes,
                keep_ids=True,
                max_doc_bytes=None,
            ),
            DropDuplicates(layout.removed),
            ShardedWriter(layout.ready, config.format, count_by=count_by),
        ],
        description=f"drop the {config.dedup} duplicates, write {config.format}",
    )


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


def input_problem(
    config: TextConfig, listing: InputListing, options: tuple[str, str, str] | None = None
) -> str | None:
    """What the input's first file surely says against ``config``, or None: a text field
    none of its records has, or (with language identification) a field of its own where
    that writes. ``options`` names the command's flags for the text and language fields
    and for no language identification (else the config's fields)."""
    from conveyor.pipelines.fields import package_problems
    from conveyor.stages.text.readers import field_clash, text_field_problem

    text_flag, language_flag, off = options or ("text_field=", "language_field=", "langid=False")
    if any(f.compression == "zstd" for f in listing.files):
        missing = package_problems([("zstandard", "reading .zst files", "text")])
        if missing:
            return missing[0]
    problem = text_field_problem(listing, config.text_field)
    if problem:
        return f"{problem}: name the text field with {text_flag}"
    clash = field_clash(listing, config.language_fields) if config.langid else None
    if clash:
        return (
            f"{clash}, which language identification writes: name its fields with "
            f"{language_flag} (e.g. detected_language), or turn it off ({off})"
        )
    return None


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
        """Every pass ran to its end, and what it staged was read back: the output is
        published."""
        return bool(self.summary["completed"])

    @property
    def failures(self) -> list[Any]:
        return [f for r in self.results for f in r.failures]


@locks_output(lambda config, *_, **__: config.output)
def run_text(
    config: TextConfig,
    executor: Executor | RayDataExecutor | None = None,
    *,
    listing: InputListing | None = None,
    on_output: Callable[[Any], None] | None = None,
    on_pass: Callable[[str], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> TextRunReport:
    """Run the pipelines of ``config`` (pass 1, dedup, pass 2) into ``config.output`` and
    write ``summary.json``; ``executor`` runs every pass (default: streaming, local).

    ``listing`` is the input's ``list_inputs`` when the caller already has it (it raises
    ``InputError`` for a missing input, a glob matching nothing, no text files; so do the
    ``input_problem`` of the first file).
    ``on_output`` sees every last-stage output (a ``FileGroupTask`` whose metadata holds the
    counts); ``on_pass`` is told when a pass or the dedup step starts; ``on_note`` what
    the run decided that a user should know (it takes up an interrupted run's work, or
    starts over, and why: ``text_resume``; default: the log). Output shards are published
    (moved to ``documents/part-NNNNN``) only when every pass completed.

    Only one run at a time writes an output folder: another one raises ``OutputInUse``
    (``conveyor.output_lock``).
    """
    from conveyor.stages.text.readers import FILE_ERRORS, InputError, list_inputs
    from conveyor.stages.text.writers import publish_shards, unify_shards
    from conveyor.storage import atomic_write

    started = time.perf_counter()
    if listing is None:
        listing = list_inputs(config.input, exclude=[config.output])
        problem = input_problem(config, listing)
        if problem:  # (the command checks it itself, before it writes its event log)
            raise InputError(problem)
    check_output(config.output)
    layout = TextLayout(config.output)
    resume = TextResume(layout, config, listing, on_note)
    pipelines = build_text_pipelines(config, skip=resume.first.tasks)
    counts = TextCounts()
    results: list[RunResult] = []
    dedup: DedupResult | SemanticResult | None = None
    files: list[str] = []

    def run_pass(
        pipeline: Pipeline, label: str, finished: Finished, log: PassLog | None, *, final: bool
    ) -> RunResult:
        first_pass = not results
        before = counts.documents
        for metadata in finished.outputs:  # what an earlier run did of this pass
            counts.add(metadata, first_pass=first_pass, final=final)
        counts.carried_documents += counts.documents - before
        counts.resumed[label] = len(finished.tasks)
        if on_pass is not None:
            on_pass(label)
        try:
            with pipeline.stream(executor) as run:
                for output in run:
                    # (a staged part pass 2 could not read is not finished: tried again)
                    if log is not None and (first_pass or not output.metadata.get(FILE_ERRORS)):
                        log.add(output.metadata)
                    counts.add(output.metadata, first_pass=first_pass, final=final)
                    if on_output is not None:
                        on_output(output)
        finally:
            if log is not None:
                log.close()
        results.append(run.result)
        return run.result

    with held(executor):  # one private Ray cluster for every pass
        final = pipelines.second is None
        result = run_pass(pipelines.first, "pass 1", resume.first, resume.first_log(), final=final)
        passes = 1
        if result.completed and not final and counts.staged_rows:
            if on_pass is not None:
                on_pass("dedup")
            t0 = time.perf_counter()
            shutil.rmtree(layout.dedup / "semantic", ignore_errors=True)  # an earlier resolve's
            layout.dedup.mkdir(parents=True, exist_ok=True)
            dedup = _resolve(config, layout, executor)
            counts.dedup_s = time.perf_counter() - t0
            finished, log = resume.second()
            second = second_pipeline(config, skip=finished.tasks)
            run_pass(second, "pass 2", finished, log, final=True)
            passes = 2
        completed = (
            len(results) == passes
            and all(r.completed for r in results)
            and not counts.staged_errors  # its documents would be missing without a word
        )
        if completed:
            if on_pass is not None:
                on_pass("publishing")
            # to one schema (JSONL on the run's executor), each file atomically: a run
            # stopped while this goes on resumes, and does it again
            try:
                unify_shards(layout.ready, executor=executor)
            except Exception:
                # a part that cannot be rewritten (damaged) would fail every resume alike:
                # the next run starts over
                resume.forget()
                raise
            # a run stopped from here on is done again whole: the ready shards are moved
            resume.forget()
            _drop_parts_at_the_top(layout)
            # the run before's summary goes before its documents do: a run killed while it
            # published left some of each under a summary that called them complete
            layout.summary.unlink(missing_ok=True)
            files = publish_shards(layout.ready, layout.documents, unify_schemas=False)
            # the staged copy and the keys go before the summary calls the output complete
            layout.clear_work(keep_ready=True)
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
