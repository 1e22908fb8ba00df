"""Text curation stages: reading (JSONL, compressed JSONL, Parquet; directories and globs),
Gopher-style heuristic filters, fastText language ID, exact, fuzzy and semantic dedup,
annotation, and sharded Parquet/JSONL writers."""

from conveyor.stages.text.annotate import DocumentAnnotator, content_hash
from conveyor.stages.text.dedup import (
    DUPLICATES_REMOVED,
    DedupKeys,
    DedupResult,
    DropDuplicates,
    FuzzyDedupConfig,
    resolve_duplicates,
)
from conveyor.stages.text.filters import (
    REJECTED_BY,
    EllipsisLines,
    HeuristicFilter,
    MeanWordLength,
    RepeatedLines,
    Rule,
    SymbolToWordRatio,
    TextStats,
    WordCount,
    gopher_rules,
)
from conveyor.stages.text.jsonl import JsonlReader, JsonlReaderStage, iter_jsonl
from conveyor.stages.text.langid import (
    LANGUAGE_COUNTS,
    LID176_LANGUAGES,
    REJECTED_BY_LANGUAGE,
    LanguageIdentifier,
    parse_languages,
)
from conveyor.stages.text.parquet import ParquetWriter
from conveyor.stages.text.readers import (
    DOC_ID,
    InputError,
    InputFile,
    InputListing,
    ReadTask,
    Segment,
    TextPartitioner,
    TextReader,
    list_inputs,
    plan_reads,
)
from conveyor.stages.text.semantic import DedupEmbeddings, SemanticResult, resolve_semantic
from conveyor.stages.text.writers import ShardedWriter, publish_shards, write_jsonl

__all__ = [
    "DOC_ID",
    "DUPLICATES_REMOVED",
    "LANGUAGE_COUNTS",
    "LID176_LANGUAGES",
    "REJECTED_BY",
    "REJECTED_BY_LANGUAGE",
    "DedupEmbeddings",
    "DedupKeys",
    "DedupResult",
    "DocumentAnnotator",
    "DropDuplicates",
    "EllipsisLines",
    "FuzzyDedupConfig",
    "HeuristicFilter",
    "InputError",
    "InputFile",
    "InputListing",
    "JsonlReader",
    "JsonlReaderStage",
    "LanguageIdentifier",
    "MeanWordLength",
    "ParquetWriter",
    "ReadTask",
    "RepeatedLines",
    "Rule",
    "Segment",
    "SemanticResult",
    "ShardedWriter",
    "SymbolToWordRatio",
    "TextPartitioner",
    "TextReader",
    "TextStats",
    "WordCount",
    "content_hash",
    "gopher_rules",
    "iter_jsonl",
    "list_inputs",
    "parse_languages",
    "plan_reads",
    "publish_shards",
    "resolve_duplicates",
    "resolve_semantic",
    "write_jsonl",
]
