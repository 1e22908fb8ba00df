"""Gopher-style heuristic quality rules and the stage that applies them to a ``DocumentBatch``.

The rules follow Rae et al. 2021 ("Scaling Language Models", appendix A): cheap statistics of
words and lines that remove most machine-generated and boilerplate text. Each rule is a small
frozen dataclass with its thresholds, so a pipeline states exactly what it filtered on.
A rule that cannot apply (no words, fewer than two lines) keeps the document: emptiness is the
word-count rule's business, so every rejection is attributed to the rule that means it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
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
    #: what several rules derive from the words, made once (``_word_codes``)
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

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


def _fraction_check(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


#: what a bulleted line starts with
BULLETS = ("\u2022", "\u25cf", "\u25e6", "\u2023", "\u2043", "\u25aa", "\u25a0", "-", "*", "\u2013")


@dataclass(frozen=True)
class BulletLines(Rule):
    """Most lines bulleted: lists of links, menus and product features rather than prose."""

    name: ClassVar[str] = "bullet_lines"
    max_fraction: float = 0.9

    def __post_init__(self) -> None:
        _fraction_check("BulletLines: max_fraction", self.max_fraction)

    def keep(self, stats: TextStats) -> bool:
        if not stats.lines:
            return True
        bulleted = sum(1 for line in stats.lines if line.startswith(BULLETS))
        return bulleted / len(stats.lines) <= self.max_fraction


_LETTER = re.compile(r"[^\W\d_]")


@dataclass(frozen=True)
class AlphaWords(Rule):
    """Too few words with a letter in them: tables of numbers, code, separator lines."""

    name: ClassVar[str] = "alpha_words"
    min_fraction: float = 0.8

    def __post_init__(self) -> None:
        _fraction_check("AlphaWords: min_fraction", self.min_fraction)

    def keep(self, stats: TextStats) -> bool:
        if not stats.words:
            return True
        alpha = sum(1 for word in stats.words if _LETTER.search(word))
        return alpha / len(stats.words) >= self.min_fraction


@dataclass(frozen=True)
class StopWords(Rule):
    """Fewer than ``min_count`` of the commonest English function words: keyword lists and
    spam rather than sentences. English only: every other language fails it."""

    name: ClassVar[str] = "stop_words"
    min_count: int = 2
    words: tuple[str, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")

    def __post_init__(self) -> None:
        if self.min_count < 0 or not self.words or not all(self.words):
            raise ValueError(
                f"StopWords: need min_count >= 0 and non-empty words, got {self.min_count}, "
                f"{self.words!r}"
            )

    def keep(self, stats: TextStats) -> bool:
        wanted, found = frozenset(self.words), 0
        for word in stats.words:
            if word.lower().strip(".,;:!?\"'()") in wanted:
                found += 1
                if found >= self.min_count:
                    return True
        return found >= self.min_count


def _paragraphs(text: str) -> list[str]:
    return [p for p in (part.strip() for part in _BLANK_LINE.split(text)) if p]


_BLANK_LINE = re.compile(r"\n[^\S\n]*\n\s*")


def _repeats(items: Sequence[str]) -> tuple[int, int]:
    """How many of ``items`` repeat an earlier one, and their characters."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


@dataclass(frozen=True)
class RepeatedParagraphs(Rule):
    """Too many paragraphs (between blank lines) that repeat an earlier one."""

    name: ClassVar[str] = "repeated_paragraphs"
    max_fraction: float = 0.3

    def __post_init__(self) -> None:
        _fraction_check("RepeatedParagraphs: max_fraction", self.max_fraction)

    def keep(self, stats: TextStats) -> bool:
        paragraphs = _paragraphs(stats.text)
        if len(paragraphs) < 2:
            return True
        return _repeats(paragraphs)[0] / len(paragraphs) <= self.max_fraction


@dataclass(frozen=True)
class RepeatedLineChars(Rule):
    """Too much of the text in lines that repeat an earlier line (a few long repeated
    lines, which the share of repeated lines misses)."""

    name: ClassVar[str] = "repeated_line_chars"
    max_fraction: float = 0.2

    def __post_init__(self) -> None:
        _fraction_check("RepeatedLineChars: max_fraction", self.max_fraction)

    def keep(self, stats: TextStats) -> bool:
        total = sum(map(len, stats.lines))
        if len(stats.lines) < 2 or not total:
            return True
        return _repeats(stats.lines)[1] / total <= self.max_fraction


@dataclass(frozen=True)
class RepeatedParagraphChars(Rule):
    """Too much of the text in paragraphs that repeat an earlier paragraph."""

    name: ClassVar[str] = "repeated_paragraph_chars"
    max_fraction: float = 0.2

    def __post_init__(self) -> None:
        _fraction_check("RepeatedParagraphChars: max_fraction", self.max_fraction)

    def keep(self, stats: TextStats) -> bool:
        paragraphs = _paragraphs(stats.text)
        total = sum(map(len, paragraphs))
        if len(paragraphs) < 2 or not total:
            return True
        return _repeats(paragraphs)[1] / total <= self.max_fraction


def _words_and_lengths(stats: TextStats) -> tuple[list[int], list[int]]:
    """Each word's number (equal words, equal numbers: tuples of small ints hash fast)
    and its length, made once a document for every n-gram rule."""
    made = stats.derived.get("words")
    if made is None:
        numbers: dict[str, int] = {}
        ids = [numbers.setdefault(w, len(numbers)) for w in stats.words]
        made = stats.derived["words"] = (ids, [len(w) for w in stats.words])
    return made


def _ngram_counts(stats: TextStats, n: int) -> tuple[list[tuple[int, ...]], Counter[Any]]:
    """The ``n``-grams of the words in order (as word numbers), and how often each occurs."""
    ids, _ = _words_and_lengths(stats)
    grams = list(zip(*(ids[i:] for i in range(n)), strict=False))
    return grams, Counter(grams)


@dataclass(frozen=True)
class TopNGramChars(Rule):
    """Too much of the text (its words' characters) in the commonest ``n``-gram of words,
    when it occurs more than once: a phrase repeated over and over."""

    n: int = 2
    max_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"TopNGramChars: n must be >= 1, got {self.n}")
        _fraction_check("TopNGramChars: max_fraction", self.max_fraction)

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"top_{self.n}gram_chars"

    def keep(self, stats: TextStats) -> bool:
        grams, counts = _ngram_counts(stats, self.n)
        _, lengths = _words_and_lengths(stats)
        total = sum(lengths)
        if not grams or not total:
            return True
        gram, count = counts.most_common(1)[0]
        if count < 2:
            return True
        start = grams.index(gram)  # one of its occurrences: the characters of its words
        return sum(lengths[start : start + self.n]) * count / total <= self.max_fraction


@dataclass(frozen=True)
class DuplicateNGramChars(Rule):
    """Too much of the text (its words' characters) inside ``n``-grams of words that occur
    more than once, each word counted once however many such n-grams cover it."""

    n: int = 5
    max_fraction: float = 0.15

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"DuplicateNGramChars: n must be >= 1, got {self.n}")
        _fraction_check("DuplicateNGramChars: max_fraction", self.max_fraction)

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"duplicate_{self.n}gram_chars"

    def keep(self, stats: TextStats) -> bool:
        grams, counts = _ngram_counts(stats, self.n)
        _, lengths = _words_and_lengths(stats)
        total = sum(lengths)
        if not grams or not total or len(counts) == len(grams):  # (none repeats)
            return True
        covered = bytearray(len(lengths))
        for start, gram in enumerate(grams):
            if counts[gram] > 1:
                covered[start : start + self.n] = b"\x01" * self.n
        chars = sum(length for length, mark in zip(lengths, covered, strict=True) if mark)
        return chars / total <= self.max_fraction


def gopher_rules(full: bool = False) -> list[Rule]:
    """The default rule set with the Gopher paper's thresholds, cheapest first; ``full``
    adds the paper's other rules but its English stop words (``StopWords``): bulleted
    lines, words with a letter, repeated paragraphs, the characters in repeated lines and
    paragraphs, in the commonest 2-, 3- and 4-grams and in repeated 5- to 10-grams."""
    rules: list[Rule] = [
        WordCount(), MeanWordLength(), SymbolToWordRatio(), EllipsisLines(), RepeatedLines()
    ]  # fmt: skip
    if full:
        rules += more_gopher_rules()
    return rules


def more_gopher_rules() -> list[Rule]:
    """The Gopher rules ``gopher_rules()`` leaves out (but ``StopWords``), with the paper's
    thresholds: the repetition ones cost a pass over each document's n-grams."""
    return [
        BulletLines(),
        AlphaWords(),
        RepeatedParagraphs(),
        RepeatedLineChars(),
        RepeatedParagraphChars(),
        *(TopNGramChars(n, limit) for n, limit in ((2, 0.20), (3, 0.18), (4, 0.16))),
        *(
            DuplicateNGramChars(n, limit)
            for n, limit in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
        ),
    ]


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
