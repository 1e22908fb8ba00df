"""A small but real text-curation run: JSONL in, Gopher-filtered, annotated Parquet out.

``run_demo`` generates a seeded synthetic corpus (decent English-like documents mixed with the
junk web text is full of), runs partition -> read -> filter -> annotate -> write, and checks the
result against the labels the generator put on every document: no junk kept, no good dropped.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich import box
from rich.console import Console
from rich.table import Table

from conveyor.backends.local import LocalBackend
from conveyor.demos import check_places
from conveyor.engine.events import Monitor
from conveyor.executors import BatchExecutor, StreamingExecutor
from conveyor.executors.base import Executor
from conveyor.monitor import LiveView
from conveyor.pipeline import Pipeline
from conveyor.result import RunResult
from conveyor.stages.text import (
    REJECTED_BY,
    DocumentAnnotator,
    HeuristicFilter,
    JsonlReader,
    ParquetWriter,
)
from conveyor.tasks import FileGroupTask

ExecutorName = Literal["streaming", "batch"]

DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "conveyor-text-demo"
INPUT_PATTERN = "docs-*.jsonl"
FIELDS = ("id", "text", "label")

_WORD_TEXT = """
the of and to in is was for that with as on by at from his her their they this which an be
are were have has had not but or all one two three new more first last many some most other
such into over after before between through during under about against among within without
people time year years day days world city country state government house family school
water land river mountain forest island coast valley north south east west village town
music book story history science research study system language culture museum church market
company industry trade farm field garden road bridge station railway harbour castle tower
small large great long short old young early late high low strong simple common public local
built opened founded named known called made became began remained served moved lived worked
wrote played studied described developed produced published recorded designed discovered
visitors students workers members children teachers farmers writers artists scientists
morning evening winter summer spring autumn season weather rain snow wind light stone wood
important popular famous national regional central western eastern northern southern
because although while where when however therefore often usually still also only even
building library hospital university college theatre gallery park square street avenue
population economy tradition festival ceremony language region province district century
"""
_WORDS = _WORD_TEXT.split()

#: share of each kind of document in the generated corpus (labels travel as a column)
MIX: dict[str, float] = {
    "good": 0.62,
    "duplicate": 0.05,
    "short": 0.08,
    "symbols": 0.07,
    "ellipsis": 0.06,
    "repeated": 0.07,
    "gibberish": 0.05,
}
#: kinds the filters should keep (exact duplicates are good text; the hash column marks them)
KEEP_KINDS = frozenset({"good", "duplicate"})


# -- sample data ------------------------------------------------------------------------
def _sentence(rng: random.Random, low: int = 6, high: int = 16) -> str:
    words = rng.choices(_WORDS, k=rng.randint(low, high))
    return words[0].capitalize() + " " + " ".join(words[1:]) + rng.choice(".....?!")


def _good(rng: random.Random) -> str:
    lines: list[str] = []
    while sum(len(line.split()) for line in lines) < 60 or len(lines) < 3:
        lines.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 3))))
    return "\n".join(lines)


def _document(kind: str, rng: random.Random, pool: Sequence[str]) -> str:
    if kind == "good":
        return _good(rng)
    if kind == "duplicate":
        return rng.choice(pool)
    if kind == "short":
        return _sentence(rng, 2, 20)
    if kind == "symbols":
        words = " ".join(_sentence(rng) for _ in range(10)).split()
        return " ".join("#" + w if rng.random() < 0.4 else w for w in words)
    if kind == "ellipsis":
        return "\n".join(
            " ".join(rng.choices(_WORDS, k=rng.randint(14, 20))) + "..."
            for _ in range(rng.randint(5, 9))
        )
    if kind == "repeated":
        boilerplate = "Subscribe to our newsletter for the latest news and offers every week."
        lines = [_sentence(rng, 10, 16) for _ in range(3)] + [boilerplate] * rng.randint(5, 9)
        rng.shuffle(lines)
        return "\n".join(lines)
    if kind == "gibberish":
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        count = rng.randint(60, 90)
        return " ".join("".join(rng.choices(alphabet, k=rng.randint(12, 24))) for _ in range(count))
    raise ValueError(f"unknown document kind {kind!r}")


@dataclass
class SampleData:
    """What ``generate_sample_data`` wrote: files, and documents per kind."""

    directory: Path
    files: list[Path]
    kinds: Counter[str]

    @property
    def documents(self) -> int:
        return sum(self.kinds.values())


def generate_sample_data(
    directory: str | Path, files: int = 40, docs_per_file: int = 200, seed: int = 0
) -> SampleData:
    """Write ``files`` JSONL files of ``docs_per_file`` labelled documents, reproducibly.

    Each file has its own generator seeded from ``(seed, file index)``, so a file's content does
    not depend on how many files are asked for. ``docs-*.jsonl`` files left from a larger earlier
    run are removed; nothing else in ``directory`` is touched.
    """
    if files < 1 or docs_per_file < 1:
        raise ValueError(f"need files >= 1 and docs_per_file >= 1, got {files}, {docs_per_file}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    pool_rng = random.Random(f"conveyor-demo-pool-{seed}")
    pool = [_good(pool_rng) for _ in range(20)]
    kinds, weights = list(MIX), list(MIX.values())
    written: list[Path] = []
    counts: Counter[str] = Counter()
    for index in range(files):
        rng = random.Random(f"conveyor-demo-{seed}-{index}")
        path = root / f"docs-{index:05d}.jsonl"
        with path.open("w", encoding="utf-8") as out:
            for j in range(docs_per_file):
                kind = rng.choices(kinds, weights)[0]
                counts[kind] += 1
                text = _document(kind, rng, pool)
                out.write(json.dumps({"id": f"{index:05d}-{j:05d}", "text": text, "label": kind}))
                out.write("\n")
        written.append(path)
    keep = set(written)
    for stale in root.glob(INPUT_PATTERN):
        if stale not in keep:
            stale.unlink()
    return SampleData(root, written, counts)


# -- the pipeline -----------------------------------------------------------------------
def build_pipeline(
    input_dir: str | Path, output_dir: str | Path, files_per_partition: int = 2
) -> Pipeline:
    """partition -> read JSONL -> Gopher filters -> word count + content hash -> Parquet."""
    return Pipeline(
        "text-curation-demo",
        [
            JsonlReader(input_dir, INPUT_PATTERN, files_per_partition, fields=FIELDS),
            # drop_empty=False: an all-junk batch still reaches the writer with its counts
            HeuristicFilter(drop_empty=False),
            DocumentAnnotator(),
            ParquetWriter(output_dir),
        ],
        description="synthetic web text, Gopher-style quality filtering",
    )


@dataclass
class DemoReport:
    """Outcome of ``run_demo``, for callers and tests (the CLI prints it)."""

    sample: SampleData
    result: RunResult
    output_dir: Path
    written: list[Path]
    kept: int
    rejected_by: dict[str, int]
    junk_kept: int
    good_dropped: int
    exact_duplicates: int
    cpus: float
    generate_s: float
    pipeline_s: float

    @property
    def filtered(self) -> int:
        return sum(self.rejected_by.values())

    @property
    def ok(self) -> bool:
        accounted = self.kept + self.filtered == self.sample.documents
        return self.result.ok and accounted and not self.junk_kept and not self.good_dropped


def _make_executor(kind: ExecutorName, backend: LocalBackend, monitors: list[Monitor]) -> Executor:
    if kind == "streaming":
        return StreamingExecutor(backend, monitors=monitors)
    if kind == "batch":
        return BatchExecutor(backend, monitors=monitors)
    raise ValueError(f"executor must be 'streaming' or 'batch', got {kind!r}")


def _check_output(paths: list[Path], sample: SampleData) -> tuple[int, int, int, int]:
    """Read back label and hash columns: kept rows, junk kept, good dropped, exact duplicates."""
    import pyarrow.parquet as pq

    from conveyor.storage import arrow_file

    labels: Counter[str] = Counter()
    hashes: list[str] = []
    for path in paths:
        with arrow_file(path) as source:  # (a work folder whose name is not UTF-8)
            table = pq.read_table(source, columns=["label", "content_hash"])
        labels.update(table.column("label").to_pylist())
        hashes.extend(table.column("content_hash").to_pylist())
    kept = sum(labels.values())
    junk_kept = sum(n for kind, n in labels.items() if kind not in KEEP_KINDS)
    good_total = sum(n for kind, n in sample.kinds.items() if kind in KEEP_KINDS)
    good_dropped = good_total - (kept - junk_kept)
    return kept, junk_kept, good_dropped, len(hashes) - len(set(hashes))


def run_demo(
    workdir: str | Path = DEFAULT_WORKDIR,
    files: int = 40,
    docs_per_file: int = 200,
    *,
    executor: ExecutorName = "streaming",
    live: bool = True,
    seed: int = 0,
    files_per_partition: int = 2,
    cpus: float | None = None,
    console: Console | None = None,
    monitors: Sequence[Monitor] = (),
) -> DemoReport:
    """Generate the corpus under ``workdir/input``, curate it into ``workdir/output``, report.

    Only ``docs-*.jsonl`` and ``part-*.parquet`` files under those two directories are
    replaced, so pointing ``workdir`` at an existing directory is safe. ``monitors`` watch
    the run beside the live view.
    """
    console = console or Console()
    root = Path(workdir)
    check_places(root)
    input_dir, output_dir = root / "input", root / "output"
    started = time.perf_counter()
    sample = generate_sample_data(input_dir, files, docs_per_file, seed)
    generate_s = time.perf_counter() - started
    if output_dir.exists():
        for old in output_dir.glob("part-*.parquet"):
            old.unlink()

    pipeline = build_pipeline(input_dir, output_dir, files_per_partition)
    backend = LocalBackend(num_cpus=cpus)
    declared = backend.num_cpus
    views = [LiveView(console=console, live=None if live else False)]
    run_executor = _make_executor(executor, backend, [*views, *monitors])
    console.print(
        f"[bold]Conveyor demo[/]: {sample.documents:,} documents in {len(sample.files)} files "
        f"(generated in {generate_s:.2f}s) -> {executor} executor, local backend, "
        f"{declared:g} CPUs"
    )
    started = time.perf_counter()
    try:
        result = pipeline.run(run_executor)
    finally:
        for view in views:
            view.close()
    pipeline_s = time.perf_counter() - started

    tasks: list[FileGroupTask] = [t for t in result.outputs if isinstance(t, FileGroupTask)]
    written = sorted(Path(p) for t in tasks for p in t.data)
    rejected: Counter[str] = Counter()
    for task in tasks:
        rejected.update(task.metadata.get(REJECTED_BY, {}))
    kept, junk_kept, good_dropped, duplicates = _check_output(written, sample)
    return DemoReport(
        sample=sample,
        result=result,
        output_dir=output_dir,
        written=written,
        kept=kept,
        rejected_by={rule: rejected.get(rule, 0) for rule in _rule_order(rejected)},
        junk_kept=junk_kept,
        good_dropped=good_dropped,
        exact_duplicates=duplicates,
        cpus=declared,
        generate_s=generate_s,
        pipeline_s=pipeline_s,
    )


def _rule_order(rejected: Counter[str]) -> list[str]:
    names = [rule.name for rule in HeuristicFilter().rules]
    return names + sorted(set(rejected) - set(names))


def print_report(report: DemoReport, console: Console | None = None) -> None:
    """The human summary: documents in/kept/filtered per rule, files written, checks, time."""
    console = console or Console()
    n = report.sample.documents
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("documents", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_column("share", justify="right")
    table.add_row("in", f"{n:,}", "100.0%")
    table.add_row("kept", f"{report.kept:,}", f"{100 * report.kept / n:.1f}%")
    table.add_row("filtered", f"{report.filtered:,}", f"{100 * report.filtered / n:.1f}%")
    for rule, count in report.rejected_by.items():
        table.add_row(f"  by {rule}", f"{count:,}", f"{100 * count / n:.1f}%")
    console.print(table)
    size = sum(p.stat().st_size for p in report.written)
    console.print(
        f"written: {len(report.written)} Parquet files, {report.kept:,} rows, "
        f"{size / 1e6:.2f} MB -> {report.output_dir}"
    )
    verdict = "[green]ok[/]" if not (report.junk_kept or report.good_dropped) else "[red]WRONG[/]"
    console.print(
        f"check against generator labels: {report.junk_kept} junk kept, "
        f"{report.good_dropped} good dropped {verdict}; {report.exact_duplicates:,} exact "
        "duplicates among kept documents (same content_hash)"
    )
    result = report.result
    first = f"{result.first_output_s:.2f}s" if result.first_output_s is not None else "-"
    console.print(
        f"time: generate {report.generate_s:.2f}s, pipeline {report.pipeline_s:.2f}s "
        f"(startup {result.startup_s:.2f}s, first output {first}), "
        f"{n / report.pipeline_s:,.0f} docs/s"
    )
    if result.failures:
        console.print(f"[bold red]{len(result.failures)} failed task(s)[/]:")
        for failure in result.failures[:5]:
            console.print(f"  {failure}", markup=False)
