"""``summary.json`` of a text run, added up from the counts its batches carry, and its human
form for the terminal.

Every count rides on the batches' metadata to the end of each pass: what the reader read
(documents, malformed and blank lines, with file and line), what each heuristic rule
rejected, what language identification found and the language filter removed, and what the
writers wrote. The documents add up::

    in = kept + filtered (by rule) + filtered_by_language + duplicates
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from conveyor.storage import printable_tree

if TYPE_CHECKING:
    from rich.console import Console

    from conveyor.pipeline import Pipeline
    from conveyor.pipelines.text_config import TextConfig
    from conveyor.result import RunResult
    from conveyor.stages.text.dedup import DedupResult
    from conveyor.stages.text.readers import InputListing
    from conveyor.stages.text.semantic import SemanticResult

#: malformed lines listed in summary.json (all of them are counted)
MAX_LISTED = 1000


class TextCounts:
    """The counts of a run's last-stage outputs, added up as they arrive."""

    def __init__(self) -> None:
        self.read: Counter[str] = Counter()
        self.rejected_by: Counter[str] = Counter()
        self.languages: Counter[str] = Counter()
        self.rejected_by_language: Counter[str] = Counter()
        self.kept_by_language: Counter[str] = Counter()
        self.kept_rows = 0
        self.staged_rows = 0
        self.samples: list[dict[str, Any]] = []
        self.segments: list[dict[str, Any]] = []
        self.file_errors: list[dict[str, Any]] = []
        #: parts pass 1 staged that pass 2 could not read: the run's own files, whose
        #: documents would be missing from the output without a word
        self.staged_errors: list[dict[str, Any]] = []
        self.dedup_s = 0.0
        #: per pass, the read tasks an earlier, interrupted run finished (resumed runs)
        self.resumed: dict[str, int] = {}
        #: documents those tasks read: the rate counts this run's alone
        self.carried_documents = 0

    def add(self, metadata: dict[str, Any], *, first_pass: bool, final: bool) -> None:
        """Add one output's metadata: ``first_pass`` for pass 1's (the reading and filter
        counts), ``final`` for the outputs of the pass that writes the output."""
        from conveyor.stages.text.filters import REJECTED_BY
        from conveyor.stages.text.langid import LANGUAGE_COUNTS, REJECTED_BY_LANGUAGE
        from conveyor.stages.text.readers import FILE_ERRORS, MALFORMED, READ, SEGMENTS
        from conveyor.stages.text.writers import WRITTEN

        written = metadata.get(WRITTEN, {})
        if first_pass:
            self.read.update(metadata.get(READ, {}))
            self.rejected_by.update(metadata.get(REJECTED_BY, {}))
            self.languages.update(metadata.get(LANGUAGE_COUNTS, {}))
            self.rejected_by_language.update(metadata.get(REJECTED_BY_LANGUAGE, {}))
            self.samples += metadata.get(MALFORMED, [])
            self.segments += metadata.get(SEGMENTS, [])
            self.file_errors += metadata.get(FILE_ERRORS, [])
            if not final:
                self.staged_rows += int(written.get("rows", 0))
        else:
            self.staged_errors += metadata.get(FILE_ERRORS, [])
        if final:
            self.kept_rows += int(written.get("rows", 0))
            self.kept_by_language.update(written.get("by", {}))

    @property
    def documents(self) -> int:
        return int(self.read.get("documents", 0))

    @property
    def malformed(self) -> int:
        return int(self.read.get("malformed", 0))


def _sorted_lines(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(entry: dict[str, Any]) -> tuple[Any, ...]:
        line = entry.get("line", entry.get("row"))
        return (entry.get("file", ""), entry.get("offset", 0), line or 0)

    return sorted(entries, key=key)


def _failure(record: Any) -> dict[str, Any]:
    return {
        "stage": record.stage,
        "task": record.task,
        "reason": f"{record.error_type}: {record.message}",
    }


def _staged_failure(error: dict[str, Any]) -> dict[str, Any]:
    return {
        "stage": "TextReader (pass 2)",
        "task": error["file"],
        "reason": f"a part pass 1 staged could not be read back ({error['reason']}): the "
        "run is not published; the same command tries it again, --overwrite starts over",
    }


def _dedup_counts(dedup: DedupResult | SemanticResult) -> dict[str, Any]:
    """What the resolve step found: semantic dedup compares documents within clusters, and
    has no candidate pairs or components to count."""
    from conveyor.stages.text.semantic import SemanticResult

    if isinstance(dedup, SemanticResult):
        return {
            "documents": dedup.documents,
            "threshold": dedup.threshold,
            "clusters": dedup.clusters,
            "removed": dedup.removed,
            "passes_s": dedup.passes,
        }
    return {
        "documents": dedup.documents,
        "candidate_pairs": dedup.candidate_pairs,
        "duplicate_pairs": dedup.duplicate_pairs,
        "components": dedup.components,
        "removed": dedup.removed,
    }


def build_summary(
    config: TextConfig,
    listing: InputListing,
    counts: TextCounts,
    dedup: DedupResult | SemanticResult | None,
    results: list[RunResult],
    files: list[str],
    wall_s: float,
    completed: bool,
    pipeline: Pipeline,
) -> dict[str, Any]:
    """The run's ``summary.json`` (a file name that is not valid UTF-8 written ``\\xNN``:
    JSON holds no such name, and every summary with one failed to be written)."""
    from conveyor.stages.text.readers import absolute_lines

    rules = [rule.name for rule in config.rules()]
    rejected = {name: int(counts.rejected_by.get(name, 0)) for name in rules}
    for name, count in counts.rejected_by.items():
        rejected.setdefault(name, int(count))
    filtered = sum(rejected.values())
    by_language = sum(counts.rejected_by_language.values())
    duplicates = dedup.removed if dedup is not None else 0
    samples = _sorted_lines(absolute_lines(counts.samples, counts.segments))
    listed = samples[:MAX_LISTED]
    file_errors = _sorted_lines(absolute_lines(counts.file_errors, counts.segments))
    for entry in listed + file_errors:
        entry.pop("offset", None)
    records_per_file: Counter[int] = Counter()
    for seg in counts.segments:
        records_per_file[seg["file_index"]] += seg.get("records", seg["lines"])
    empty = [f.path for f in listing.files if f.size == 0]
    read_whole = {f.index for f in listing.files} if config.limit is None else set()
    unreadable = {entry["file"] for entry in file_errors}  # listed as errors, not as empty
    empty += [
        f.path
        for f in listing.files
        if f.size > 0
        and f.index in read_whole
        and records_per_file.get(f.index, -1) == 0
        and f.path not in unreadable
    ]
    documents = counts.documents
    wall = max(wall_s, 1e-9)
    resumed = {label.replace(" ", "_"): n for label, n in counts.resumed.items() if n}
    dedup_info: dict[str, Any] = {"mode": config.dedup}
    if dedup is not None:
        dedup_info.update(_dedup_counts(dedup))
        dedup_info["resolve_s"] = round(counts.dedup_s, 3)
    elif config.dedup != "none":
        dedup_info.update({"documents": 0, "removed": 0})
    return printable_tree(
        {
            "command": "text",  # whose output this is (conveyor.pipelines.owner)
            "pipeline": pipeline.description or "",
            "input": config.input if isinstance(config.input, str) else list(config.input),
            "output": str(config.output),
            "options": config.options(),
            "completed": completed,
            "documents": {
                "in": documents,
                "kept": counts.kept_rows if completed else None,
                "filtered": filtered,
                "filtered_by_language": by_language,
                "duplicates": duplicates,
                "malformed": counts.malformed,
            },
            "filtered_by_rule": rejected,
            "languages": {
                "identified": dict(counts.languages.most_common()),
                "kept": dict(counts.kept_by_language.most_common()) if completed else {},
                "filtered": dict(counts.rejected_by_language.most_common()),
            },
            "dedup": dedup_info,
            "malformed_lines": {
                "total": counts.malformed,
                "listed": len(listed),
                "lines": listed,
            },
            "blank_lines": int(counts.read.get("blank", 0)),
            "files": {
                "in": len(listing.files),
                "bytes": listing.total_bytes,
                "empty": sorted(set(empty)),
                "ignored": len(listing.ignored),
                "broken_links": list(listing.broken),
                "earlier_outputs": list(listing.outputs),
                "errors": file_errors,
            },
            "output_files": ["documents/" + str(f).rsplit("/", 1)[-1] for f in files],
            "failures": [_failure(f) for r in results for f in r.failures]
            + [_staged_failure(e) for e in counts.staged_errors],
            "resumed_tasks": resumed,
            "wall_s": round(wall_s, 3),
            "documents_per_s": round((documents - counts.carried_documents) / wall, 1),
            "engine": [
                {
                    "first_output_s": r.first_output_s,
                    "startup_s": round(r.startup_s, 3),
                    "wall_s": round(r.wall_s, 3),
                    "stages": {name: s.as_dict() for name, s in r.stats.items()},
                }
                for r in results
            ],
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
    )


def print_summary(summary: dict[str, Any], console: Console, max_lines: int = 10) -> None:
    """The run's summary as a few lines and a table."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    docs = summary["documents"]
    files = summary["files"]
    console.print(
        f"[bold]documents[/]: {docs['in']:,} in from {files['in']:,} file(s)"
        + (f", {docs['kept']:,} kept" if docs["kept"] is not None else "")
        + (f"; {docs['malformed']:,} malformed line(s)" if docs["malformed"] else "")
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("documents", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_row("in", f"{docs['in']:,}")
    for name, count in summary["filtered_by_rule"].items():
        table.add_row(f"filtered by {name}", f"{count:,}")
    if summary["options"]["languages"]:
        table.add_row("filtered by language", f"{docs['filtered_by_language']:,}")
    if summary["dedup"]["mode"] != "none":
        table.add_row(f"{summary['dedup']['mode']} duplicates removed", f"{docs['duplicates']:,}")
    if docs["kept"] is not None:
        table.add_row("[bold]kept[/]", f"[bold]{docs['kept']:,}[/]")
    console.print(table)
    languages = summary["languages"]
    if languages["identified"]:
        kept = languages["kept"]
        shown = list(languages["identified"].items())[:12]
        console.print(
            "[bold]languages[/] (identified -> kept): "
            + ", ".join(f"{lang} {n:,} -> {kept.get(lang, 0):,}" for lang, n in shown)
            + (
                f", and {len(languages['identified']) - len(shown)} more"
                if len(languages["identified"]) > len(shown)
                else ""
            )
        )
    malformed = summary["malformed_lines"]
    if malformed["total"]:
        console.print(f"[yellow]{malformed['total']:,} malformed line(s)[/] (skipped):")
        for entry in malformed["lines"][:max_lines]:
            number = entry.get("line", entry.get("row"))
            number = "?" if number is None else number
            # file:line as editors write it; a Parquet row (counted from 0) says so
            where = (
                f"{entry['file']}:{number}" if "line" in entry else f"{entry['file']} row {number}"
            )
            console.print(f"  {where}: {entry['reason']}", markup=False, highlight=False)
        if malformed["total"] > max_lines:
            console.print(f"  ... and {malformed['total'] - max_lines:,} more (summary.json)")
    if files["empty"]:
        names = ", ".join(files["empty"][:5]) + (" ..." if len(files["empty"]) > 5 else "")
        console.print(f"{len(files['empty'])} empty file(s) (no records): {escape(names)}")
    for error in files["errors"][:max_lines]:
        console.print(f"[red]file error[/] {escape(error['file'])}: {escape(error['reason'])}")
    for failure in summary["failures"][:max_lines]:
        console.print(
            f"[red]failed[/] {escape('[' + failure['stage'] + ']')} task {failure['task']}: "
            f"{escape(failure['reason'])}"
        )
    if docs["in"] == 0 and not summary["failures"]:
        # (a failed task's counts are lost with it: its documents may well have been read)
        console.print("[yellow]no documents in the input[/] (every file empty or malformed)")
    outputs = [name.rsplit("/", 1)[-1] for name in summary["output_files"]]
    if summary["completed"]:
        console.print(
            f"wrote {len(outputs)} file(s) to {escape(summary['output'])}/documents"
            + (f" ({outputs[0]} .. {outputs[-1]})" if outputs else "")
        )
    resumed = summary.get("resumed_tasks") or {}
    console.print(
        f"wall {summary['wall_s']:.1f} s: {summary['documents_per_s']:,.0f} documents/s"
        + (
            " (resumed: "
            + ", ".join(f"{n:,} task(s) of {k.replace('_', ' ')}" for k, n in resumed.items())
            + " done by an earlier run)"
            if resumed
            else ""
        )
    )
