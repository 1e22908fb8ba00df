"""Deduplication at scale, as multi-pass plans on the engine.

``semantic_dedup`` (near-duplicates by embedding, k-means then pairs within clusters) runs on
any executor and backend over Parquet files of (id, embedding).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr

_EXPORTS = {
    "SemanticDedupError": "conveyor.dedup.plan",
    "SemanticDedupResult": "conveyor.dedup.semantic",
    "semantic_dedup": "conveyor.dedup.semantic",
}

__all__ = ["SemanticDedupError", "SemanticDedupResult", "semantic_dedup"]

if TYPE_CHECKING:
    from conveyor.dedup.plan import SemanticDedupError
    from conveyor.dedup.semantic import SemanticDedupResult, semantic_dedup

__getattr__ = lazy_getattr("conveyor.dedup", _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted(__all__)
