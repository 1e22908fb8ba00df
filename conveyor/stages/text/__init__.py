"""Text curation stages: JSONL reading, Gopher-style heuristic filters, annotation, Parquet."""

from conveyor.stages.text.annotate import DocumentAnnotator, content_hash
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
from conveyor.stages.text.parquet import ParquetWriter

__all__ = [
    "REJECTED_BY",
    "DocumentAnnotator",
    "EllipsisLines",
    "HeuristicFilter",
    "JsonlReader",
    "JsonlReaderStage",
    "MeanWordLength",
    "ParquetWriter",
    "RepeatedLines",
    "Rule",
    "SymbolToWordRatio",
    "TextStats",
    "WordCount",
    "content_hash",
    "gopher_rules",
    "iter_jsonl",
]
