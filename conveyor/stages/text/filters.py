"""Gopher-style heuristic quality rules and the stage that applies them to a ``DocumentBatch``.

The rules follow Rae et al. 2021 ("Scaling Language Models", appendix A): cheap statistics of
words and lines that remove most machine-generated and boilerplate text. Each rule is a small
frozen dataclass with its thresholds, so a pipeline states exactly what it filtered on.
A rule that cannot apply (no words, fewer than two lines) keeps the document: emptiness is the
word-count rule's business, so every rejection is attributed to the rule that means it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.text import _arrow  # noqa: F401 - pandas/pyarrow set-up once
from conveyor.stages.text._scripts import UNSPACED_CHAR, UNSPACED_WORDS
from conveyor.tasks import DocumentBatch

if TYPE_CHECKING:
    import pyarrow as pa

#: metadata key where ``HeuristicFilter`` adds up how many documents each rule rejected
REJECTED_BY = "rejected_by"


@dataclass(frozen=True, slots=True)
class TextStats:
    """What the rules look at, computed once per document.

    In a script written without spaces (Chinese, Japanese, Thai...) each character counts
    as a word, and ``unspaced`` says that most words are such: split at spaces, a page of
    Chinese was a few "words" of hundreds of characters, and every one was filtered.
    """

    text: str
    words: list[str]
    lines: list[str]  # stripped, non-empty
    unspaced: bool = False

    @classmethod
    def of(cls, text: str) -> TextStats:
        lines = [s for s in (line.strip() for line in text.splitlines()) if s]
        if text.isascii() or not UNSPACED_CHAR.search(text):
            return cls(text, text.split(), lines)
        words = UNSPACED_WORDS.findall(text)
        single = sum(1 for w in words if len(w) == 1 and UNSPACED_CHAR.match(w))
        return cls(text, words, lines, unspaced=2 * single > len(words))


class Rule:
    """A keep/reject decision on one document; ``name`` labels it in counts and errors."""

    name: ClassVar[str] = "rule"

    def keep(self, stats: TextStats) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class WordCount(Rule):
    """Too short to be a document (fragments, menus) or too long to be one (dumps)."""

    name: ClassVar[str] = "word_count"
    min_words: int = 50
    max_words: int = 100_000

    def __post_init__(self) -> None:
        if self.min_words < 0 or self.max_words < self.min_words:
            raise ValueError(
                f"WordCount: need 0 <= min_words <= max_words, got {self.min_words}, "
                f"{self.max_words}"
            )

    def keep(self, stats: TextStats) -> bool:
        return self.min_words <= len(stats.words) <= self.max_words


@dataclass(frozen=True)
class MeanWordLength(Rule):
    """Mean word length outside [3, 10] characters: tables of numbers, hashes, base64 blobs."""

    name: ClassVar[str] = "mean_word_length"
    min_length: float = 3.0
    max_length: float = 10.0

    def __post_init__(self) -> None:
        if self.min_length < 0 or self.max_length < self.min_length:
            raise ValueError(
                f"MeanWordLength: need 0 <= min_length <= max_length, got {self.min_length}, "
                f"{self.max_length}"
            )

    def keep(self, stats: TextStats) -> bool:
        if not stats.words or stats.unspaced:  # a word is a character there: no measure
            return True
        mean = sum(len(w) for w in stats.words) / len(stats.words)
        return self.min_length <= mean <= self.max_length


@dataclass(frozen=True)
class SymbolToWordRatio(Rule):
    """Too many hash marks, or too many ellipses, per word: hashtag spam, truncated teasers.

    Each entry of ``symbols`` is held to the ratio apart, as the Gopher rule does (a few of
    each is ordinary prose); an entry may be a tuple of spellings counted together (``...``
    and ``\u2026`` are one ellipsis)."""

    name: ClassVar[str] = "symbol_to_word_ratio"
    max_ratio: float = 0.1
    symbols: tuple[str | tuple[str, ...], ...] = ("#", ("...", "\u2026"))

    def __post_init__(self) -> None:
        if self.max_ratio < 0:
            raise ValueError(f"SymbolToWordRatio: max_ratio must be >= 0, got {self.max_ratio}")
        spellings = [s for entry in self.symbols for s in _spellings(entry)]
        if not self.symbols or not all(spellings) or not all(map(_spellings, self.symbols)):
            raise ValueError(f"SymbolToWordRatio: symbols must be non-empty, got {self.symbols!r}")

    def keep(self, stats: TextStats) -> bool:
        if not stats.words:
            return True
        limit = self.max_ratio * len(stats.words)
        return all(
            sum(stats.text.count(s) for s in _spellings(entry)) <= limit for entry in self.symbols
        )


def _spellings(entry: str | tuple[str, ...]) -> tuple[str, ...]:
    return (entry,) if isinstance(entry, str) else tuple(entry)


@dataclass(frozen=True)
class EllipsisLines(Rule):
    """Too many lines that trail off: lists of truncated previews rather than prose."""

    name: ClassVar[str] = "ellipsis_lines"
    max_fraction: float = 0.3
    endings: tuple[str, ...] = ("...", "\u2026")

    def __post_init__(self) -> None:
        if not 0 <= self.max_fraction <= 1:
            raise ValueError(
                f"EllipsisLines: max_fraction must be in [0, 1], got {self.max_fraction}"
            )

    def keep(self, stats: TextStats) -> bool:
        if not stats.lines:
            return True
        trailing = sum(1 for line in stats.lines if line.endswith(self.endings))
        return trailing / len(stats.lines) <= self.max_fraction


@dataclass(frozen=True)
class RepeatedLines(Rule):
    """Too many lines that repeat an earlier line: templated pages, scraped navigation."""

    name: ClassVar[str] = "repeated_lines"
    max_fraction: float = 0.3

    def __post_init__(self) -> None:
        if not 0 <= self.max_fraction <= 1:
            raise ValueError(
                f"RepeatedLines: max_fraction must be in [0, 1], got {self.max_fraction}"
            )

    def keep(self, stats: TextStats) -> bool:
        if len(stats.lines) < 2:
            return True
        repeats = len(stats.lines) - len(set(stats.lines))
        return repeats / len(stats.lines) <= self.max_fraction


def gopher_rules() -> list[Rule]:
    """The default rule set with the Gopher paper's thresholds, cheapest first."""
    return [WordCount(), MeanWordLength(), SymbolToWordRatio(), EllipsisLines(), RepeatedLines()]


def first_failure(rules: Sequence[Rule], text: str) -> str | None:
    """Name of the first rule that rejects ``text``, or ``None`` when all keep it."""
    stats = TextStats.of(text)
    for rule in rules:
        if not rule.keep(stats):
            return rule.name
    return None


def text_column(
    stage: str, task: DocumentBatch, field: str, table: pa.Table | None = None
) -> list[str]:
    """The text column as Python strings (nulls as ``""``), or a ``ValueError`` naming the task.

    ``table`` is ``task.to_pyarrow()`` when the caller already has it (saves a conversion).
    """
    import pyarrow as pa

    if table is None:
        table = task.to_pyarrow()
    origin = ", ".join(task.metadata.get("source_files", [])) or "unknown files"
    label = f"task {task.task_id or '?'} (from {origin})"
    if field not in table.column_names:
        raise ValueError(
            f"stage {stage!r}: {label} has no column {field!r} (columns: "
            f"{', '.join(table.column_names) or 'none'}); set text_field to the text column"
        )
    column = table.column(field)
    kind = column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
        raise ValueError(
            f"stage {stage!r}: {label} column {field!r} holds {kind}, expected strings"
        )
    return [value or "" for value in column.to_pylist()]


class HeuristicFilter(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Keeps the documents every rule keeps; the others are counted by the first rule to reject.

    The counts are added to ``metadata["rejected_by"]`` (rule name -> documents) of the output
    batch. A batch left with no documents is dropped (the engine counts it as filtered) unless
    ``drop_empty=False``, which passes it on so that its counts reach the end of the pipeline.
    """

    resources = Resources(cpus=1.0)

    def __init__(
        self,
        rules: Sequence[Rule] | None = None,
        text_field: str = "text",
        drop_empty: bool = True,
    ) -> None:
        self.rules = list(gopher_rules() if rules is None else rules)
        if not self.rules:
            raise ValueError("HeuristicFilter: rules must not be empty (omit it for the defaults)")
        for rule in self.rules:
            if not isinstance(rule, Rule):
                raise TypeError(f"HeuristicFilter: {rule!r} is not a conveyor Rule")
        names = [rule.name for rule in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"HeuristicFilter: rule names must be unique, got {names}")
        self.text_field = text_field
        self.drop_empty = drop_empty

    def inputs(self) -> tuple[list[str], list[str]]:
        return [], [self.text_field]

    # outputs() stays undeclared: every input column passes through, and the build check
    # compares a stage's inputs with the previous stage's outputs only, so declaring just the
    # text column would reject a following stage that needs any other column.

    def process(self, task: DocumentBatch) -> DocumentBatch | None:
        import pyarrow as pa

        table = task.to_pyarrow()
        texts = text_column(self.name, task, self.text_field, table)
        mask = []
        rejected = dict.fromkeys((rule.name for rule in self.rules), 0)
        for text in texts:
            failed = first_failure(self.rules, text)
            mask.append(failed is None)
            if failed is not None:
                rejected[failed] += 1
        kept = sum(mask)
        if kept == 0 and self.drop_empty:
            return None
        if kept < len(mask):
            table = table.filter(pa.array(mask, type=pa.bool_()))
        metadata: dict[str, Any] = dict(task.metadata)
        totals = dict(metadata.get(REJECTED_BY, {}))
        for name, count in rejected.items():
            totals[name] = totals.get(name, 0) + count
        metadata[REJECTED_BY] = totals
        return DocumentBatch(data=table, dataset_name=task.dataset_name, metadata=metadata)
