"""``conveyor text INPUT... OUTPUT``: the text curation pipeline from the command line.

It only turns options into a ``TextConfig`` and an executor; ``run_text`` does the rest.
Exit codes: 0 when the run completes (malformed lines are counted and listed, not fatal),
1 when a stage cannot start, a task failed, every line was malformed or the run stops
early, 2 for a bad INPUT, OUTPUT or option (one line saying why), 130 on Ctrl-C.
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


class FormatChoice(StrEnum):
    parquet = "parquet"
    jsonl = "jsonl"


class DedupChoice(StrEnum):
    none = "none"
    exact = "exact"
    fuzzy = "fuzzy"
    semantic = "semantic"


class TextExecutor(StrEnum):
    streaming = "streaming"
    batch = "batch"


def _switch(name: str, help: str) -> Any:
    return typer.Option(f"--{name}/--no-{name}", help=help, show_default="as --filters")


def text(
    ctx: typer.Context,
    input: Annotated[
        list[str],
        typer.Argument(
            help="A JSONL or Parquet file, a directory (searched recursively for .jsonl, "
            ".json, .ndjson, also .gz/.zst compressed, and .parquet), a glob such as "
            "'data/*.jsonl.gz', or a URL such as s3://bucket/docs; or several of them.",
            show_default=False,
            metavar="INPUT",
        ),
    ],
    output: Annotated[
        str,
        typer.Argument(
            help="Where documents/part-NNNNN files and summary.json go: a directory or a URL.",
            show_default=False,
            metavar="OUTPUT",
        ),
    ],
    text_field: Annotated[
        str, typer.Option("--text-field", help="The field that holds the text.")
    ] = "text",
    format: Annotated[
        FormatChoice, typer.Option(case_sensitive=False, help="Output format.")
    ] = FormatChoice.parquet,
    filters: Annotated[
        bool,
        typer.Option(
            "--filters/--no-filters",
            help="Every heuristic filter on or off (one named on its own, --gopher-all or "
            "--stop-words still apply).",
        ),
    ] = True,
    word_count: Annotated[bool | None, _switch("word-count", "Word count filter.")] = None,
    min_words: Annotated[int, typer.Option(min=0, help="Fewest words kept.")] = 50,
    max_words: Annotated[int, typer.Option(min=1, help="Most words kept.")] = 100_000,
    mean_word_length: Annotated[
        bool | None, _switch("mean-word-length", "Mean word length filter.")
    ] = None,
    min_mean_word_length: Annotated[
        float, typer.Option(min=0.0, help="Shortest mean word length kept.")
    ] = 3.0,
    max_mean_word_length: Annotated[
        float, typer.Option(min=0.0, help="Longest mean word length kept.")
    ] = 10.0,
    symbol_ratio: Annotated[
        bool | None, _switch("symbol-ratio", "Symbol (#, ...) to word ratio filter.")
    ] = None,
    max_symbol_ratio: Annotated[
        float,
        typer.Option(
            min=0.0, help="Most hash marks per word kept, and most ellipses (each apart)."
        ),
    ] = 0.1,
    ellipsis_lines: Annotated[
        bool | None, _switch("ellipsis-lines", "Lines ending in an ellipsis filter.")
    ] = None,
    max_ellipsis_lines: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Largest share of such lines kept.")
    ] = 0.3,
    repeated_lines: Annotated[
        bool | None, _switch("repeated-lines", "Repeated lines filter.")
    ] = None,
    max_repeated_lines: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Largest share of repeated lines kept.")
    ] = 0.3,
    gopher_all: Annotated[
        bool,
        typer.Option(
            "--gopher-all/--no-gopher-all",
            help="Gopher's other rules too, at its thresholds: bulleted lines, words with a "
            "letter, repeated paragraphs, characters in repeated lines, paragraphs and "
            "n-grams (about 20 times the five default rules' cost).",
        ),
    ] = False,
    stop_words: Annotated[
        bool,
        typer.Option(
            "--stop-words/--no-stop-words",
            help="At least 2 English stop words (the, of, and...): every document is held "
            "to it, so text in other languages fails it.",
        ),
    ] = False,
    langid: Annotated[
        bool,
        typer.Option(
            "--langid/--no-langid",
            help="fastText language ID (language, language_score: see --language-field).",
        ),
    ] = True,
    language_field: Annotated[
        str,
        typer.Option(
            help="Field the language ID writes (and NAME_score): another name where the "
            "input has a field of that name."
        ),
    ] = "language",
    languages: Annotated[
        str | None,
        typer.Option(
            help="Keep only these languages: ISO 639 codes such as en,de.",
            show_default="all",
        ),
    ] = None,
    language_threshold: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="With --languages: least language_score kept."),
    ] = 0.0,
    dedup: Annotated[
        DedupChoice,
        typer.Option(
            case_sensitive=False,
            help="Remove duplicate documents: exact (the same text but for case, whitespace "
            "and Unicode forms), fuzzy (MinHash LSH, word 5-gram Jaccard) or semantic (MiniLM "
            "embeddings, cosine; slower: a small neural network reads every document). The "
            "first in input order is kept.",
        ),
    ] = DedupChoice.fuzzy,
    shingle_size: Annotated[
        int | None, typer.Option(min=1, help="Fuzzy: words per shingle.", show_default="5")
    ] = None,
    num_perm: Annotated[
        int | None,
        typer.Option(min=1, help="Fuzzy: MinHash permutations.", show_default="bands*rows"),
    ] = None,
    bands: Annotated[
        int | None, typer.Option(min=1, help="Fuzzy: LSH bands.", show_default="20")
    ] = None,
    rows: Annotated[
        int | None, typer.Option(min=1, help="Fuzzy: rows per band.", show_default="6")
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            help="Fuzzy: least Jaccard similarity of duplicates (given alone, bands and rows "
            "follow it).",
            show_default="0.8",
        ),
    ] = None,
    jaccard_check: Annotated[
        bool | None,
        typer.Option(
            "--jaccard-check/--no-jaccard-check",
            help="Fuzzy: confirm candidates with their exact Jaccard.",
            show_default="on",
        ),
    ] = None,
    semantic_threshold: Annotated[
        float | None,
        typer.Option(
            help="Semantic: least cosine similarity of duplicates. MiniLM reads a document's "
            "first 256 tokens (about 200 words): longer text is truncated, its rest never "
            "compared.",
            show_default="0.95",
        ),
    ] = None,
    semantic_clusters: Annotated[
        int | None,
        typer.Option(
            help="Semantic: k-means clusters; documents are compared within their cluster "
            "(fewer find more pairs, and cost more).",
            show_default="1 per 10,000 documents",
        ),
    ] = None,
    executor: Annotated[
        TextExecutor, typer.Option(case_sensitive=False, help="How stages are scheduled.")
    ] = TextExecutor.streaming,
    backend: BACKEND = BackendChoice.local,
    address: ADDRESS = None,
    cpus: CPUS = None,
    memory_gb: MEMORY_GB = None,
    limit: Annotated[
        int | None,
        typer.Option(
            min=1, max=LIMIT_MAX, help="Only the first N records (lines or rows) of the input."
        ),
    ] = None,
    chunk_mb: Annotated[
        float,
        typer.Option(min=0.001, help="Input MB per task (and roughly per output shard)."),
    ] = 16.0,
    max_doc_mb: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="The most MB of one document (a JSONL line, decompressed; a Parquet row's "
            "text): a longer one is counted as malformed, never read whole.",
        ),
    ] = 16.0,
    live: LIVE = True,
    metrics_port: METRICS_PORT = None,
    report: REPORT = True,
) -> None:
    """Curate text: read JSONL or Parquet, filter with Gopher-style rules, identify languages
    (and keep chosen ones), remove exact, near or semantic duplicates, and write sharded
    Parquet or JSONL with every input field to OUTPUT/documents, with summary.json.
    Malformed lines are counted and listed by file and line; they never stop the run.
    Re-running the same command on the same OUTPUT resumes an interrupted run."""
    settings = dict(locals())  # the options as given, recorded with the run's event log
    del settings["ctx"]
    from rich.console import Console

    from conveyor.pipelines.text import TextConfig, input_problem
    from conveyor.stages.text.readers import InputError, list_inputs
    from conveyor.storage import check_output_place, location, normalize

    inputs = [normalize(i) for i in input]
    output = normalize(output)
    if address is not None and backend is BackendChoice.local:
        raise _fail("--address needs --backend ray")

    def off(switch: bool | None) -> bool:  # a rule's own switch, else --filters
        return not (filters if switch is None else switch)

    refuse_unused(
        ctx,
        [
            (not languages, ["language_threshold"], "--languages"),
            (not langid, ["language_field"], "--langid"),
            (off(word_count), ["min_words", "max_words"], "--word-count"),
            (off(mean_word_length), ["min_mean_word_length", "max_mean_word_length"],
             "--mean-word-length"),
            (off(symbol_ratio), ["max_symbol_ratio"], "--symbol-ratio"),
            (off(ellipsis_lines), ["max_ellipsis_lines"], "--ellipsis-lines"),
            (off(repeated_lines), ["max_repeated_lines"], "--repeated-lines"),
        ],
    )  # fmt: skip
    where = location(output)
    try:
        if where.exists() and not where.is_dir():
            raise _fail(f"OUTPUT {output!r} is a file, expected a directory")
    except (OSError, ImportError, ValueError) as exc:
        raise _fail(f"OUTPUT {exc}") from None
    try:
        check_output_place(output)  # a file in its path: it cannot be made a folder
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        config = TextConfig(
            input=inputs[0] if len(inputs) == 1 else inputs,
            output=output,
            text_field=text_field,
            format=format.value,
            filters=filters,
            word_count=word_count,
            min_words=min_words,
            max_words=max_words,
            mean_word_length=mean_word_length,
            min_mean_word_length=min_mean_word_length,
            max_mean_word_length=max_mean_word_length,
            symbol_ratio=symbol_ratio,
            max_symbol_ratio=max_symbol_ratio,
            ellipsis_lines=ellipsis_lines,
            max_ellipsis_lines=max_ellipsis_lines,
            repeated_lines=repeated_lines,
            max_repeated_lines=max_repeated_lines,
            gopher_all=gopher_all,
            stop_words=stop_words,
            langid=langid,
            language_field=language_field,
            languages=languages or (),
            language_threshold=language_threshold,
            dedup=dedup.value,
            shingle_size=shingle_size,
            num_perm=num_perm,
            bands=bands,
            rows=rows,
            threshold=threshold,
            jaccard_check=jaccard_check,
            semantic_threshold=semantic_threshold,
            semantic_clusters=semantic_clusters,
            limit=limit,
            chunk_bytes=max(1, int(chunk_mb * (1 << 20))),
            max_doc_bytes=max(1, int(max_doc_mb * (1 << 20))),
        )
    except ValueError as exc:
        raise _fail(as_flags(ctx, str(exc))) from None
    try:
        listing = list_inputs(config.input, exclude=[config.output])
    except InputError as exc:
        raise _fail(str(exc)) from None
    except (OSError, ImportError, ValueError) as exc:  # a store refusing, unreachable, ...
        raise _fail(f"INPUT {exc}") from None
    problem = input_problem(config, listing, ("--text-field", "--language-field", "--no-langid"))
    if problem:
        raise _fail(problem)
    watch = (metrics_port, report, settings)
    machine = Machine(cpus, None, memory_gb)
    if backend is BackendChoice.ray:
        try:
            machine.check_ray(address)
        except (ValueError, OSError) as exc:  # OSError: nothing answers at the address
            raise _fail(str(exc)) from None
    from conveyor.pipelines.text import check_output

    # before the event log goes there
    with hold_output(config.output, check=lambda: check_output(config.output)):
        _run(config, listing, executor, backend, address, machine, live, Console(), watch)


def _executor(
    kind: TextExecutor,
    backend: BackendChoice,
    address: str | None,
    machine: Machine,
    monitors: list[Any],
) -> Any:
    from conveyor.executors import BatchExecutor, StreamingExecutor

    cls = BatchExecutor if kind is TextExecutor.batch else StreamingExecutor
    return cls(machine.backend(backend, address), monitors=monitors)


def _run(
    config: Any,
    listing: Any,
    kind: TextExecutor,
    backend: BackendChoice,
    address: str | None,
    machine: Machine,
    live: bool,
    console: Any,
    watch: tuple[int | None, bool, dict[str, Any]],
) -> None:
    from rich.markup import escape

    from conveyor.cli_common import close_monitors, report_path, run_monitors
    from conveyor.errors import ConveyorError
    from conveyor.monitor import LiveView
    from conveyor.pipelines.text import run_text
    from conveyor.pipelines.text_summary import print_summary
    from conveyor.storage import is_url

    progress = _Progress()
    view = LiveView(console=console, live=None if live else False, extra=progress.line)
    # the event log and report of both passes go into OUTPUT (not into a bucket)
    run_dir = None if is_url(config.output) else Path(config.output)
    extra = run_monitors(run_dir, *watch, echo=console.print)
    try:
        executor = _executor(kind, backend, address, machine, [view, *extra])
    except (ImportError, ValueError, ConveyorError) as exc:
        raise _fail(str(exc), 2 if isinstance(exc, ValueError) else 1) from None
    empty = len(listing.empty)
    console.print(
        f"[bold]conveyor text[/]: {len(listing.files):,} file(s) in {escape(listing.source)} "
        f"({listing.total_bytes / 1e6:,.1f} MB"
        + (f", {empty} empty" if empty else "")
        + (f", {len(listing.ignored)} other file(s) ignored" if listing.ignored else "")
        + f") -> {escape(config.output)}\n  {escape(config.description or _describe(config))}\n"
        f"  {kind.value} executor, {'Ray' if backend is BackendChoice.ray else 'local'} backend"
    )
    if listing.broken:
        more = f" and {len(listing.broken) - 3} more" if len(listing.broken) > 3 else ""
        console.print(
            f"[yellow]{len(listing.broken)} link(s) to nothing skipped[/]: "
            f"{escape(', '.join(listing.broken[:3]))}{more}"
        )
    if listing.outputs:
        more = f" and {len(listing.outputs) - 3} more" if len(listing.outputs) > 3 else ""
        console.print(
            f"[yellow]{len(listing.outputs)} earlier Conveyor output(s) in INPUT not read[/]: "
            f"{escape(', '.join(listing.outputs[:3]))}{more}"
        )
    if empty == len(listing.files):
        console.print("[yellow]every input file is empty[/]: there is nothing to curate")

    def on_pass(label: str) -> None:
        progress.stage = label
        progress.written = 0
        if label != "pass 1":
            console.print(
                f"[bold]{label}[/]" + (": resolving duplicates" if label == "dedup" else "")
            )

    try:
        report = run_text(
            config,
            executor,
            listing=listing,
            on_output=progress.add,
            on_pass=on_pass,
            on_note=lambda note: console.print(escape(note)),
        )
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (cli_common.Stopped)
        view.close()
        console.print(
            "[yellow]interrupted[/]: nothing was published; "
            + (
                "run the same command again to resume"
                if run_dir is not None
                else "run the command again (an output in a bucket starts over)"
            )
        )
        raise typer.Exit(code=stopped_code()) from None
    except (ConveyorError, OSError, ImportError, ValueError) as exc:
        view.close()
        raise _fail(str(exc), 1) from None
    finally:
        view.close()
        close_monitors(extra)
    print_summary(report.summary, console)
    console.print(f"summary: {escape(str(report.summary_path))}", soft_wrap=True)
    html = report_path(extra)
    if html is not None:
        console.print(f"report:  {escape(str(html))}", soft_wrap=True)
    if not report.completed:
        console.print(
            "[red]the run did not complete[/]: nothing was published"
            + ("; the same command again resumes it" if run_dir is not None else "")
        )
        raise typer.Exit(code=1)
    if report.failures:
        console.print(
            f"[red]{len(report.failures)} task(s) failed[/]: the output lacks their documents"
        )
        raise typer.Exit(code=1)
    documents = report.summary["documents"]
    if documents["malformed"] and not documents["in"]:
        console.print(
            "[red]every line was malformed[/]: nothing was curated (why: above; a wrong "
            "--text-field?)"
        )
        raise typer.Exit(code=1)


def _describe(config: Any) -> str:
    from conveyor.pipelines.text import describe

    return describe(config)


class _Progress:
    """Documents read and written so far, for the live view's last line."""

    def __init__(self) -> None:
        self.stage = "pass 1"
        self.read = 0
        self.written = 0

    def add(self, task: Any) -> None:
        from conveyor.stages.text.readers import READ
        from conveyor.stages.text.writers import WRITTEN

        metadata = task.metadata
        if self.stage == "pass 1":
            self.read += int(metadata.get(READ, {}).get("documents", 0))
        self.written += int(metadata.get(WRITTEN, {}).get("rows", 0))

    def line(self) -> str:
        return f"{self.stage}: documents read {self.read:,} | written {self.written:,}"
