"""The keep rule's arithmetic: for each item, its most similar *earlier* item above a threshold.

An item is a duplicate when some item ranked before it (by the dedup's order) has cosine
similarity at least ``threshold`` with it; its ``duplicate_of`` is the most similar of those
(ties, within ``TIE``: the earliest). The first item of every near-duplicate set is therefore
kept, and following ``duplicate_of`` from any removed item always ends at a kept one (each step
goes to an earlier item). The rule is local to each item, so a cluster too large for one task
can be split by its items and each part computed alone, with the same result.

Rows are L2-normalised ``float32``; a rank is an integer, smaller is earlier.
"""

from __future__ import annotations

import numpy as np

#: entries of one similarity block (rows x columns): 16M float32 = 64 MB
BLOCK_ENTRIES = 1 << 24
#: similarities this close are a tie, won by the earlier item: an image and its byte-for-byte
#: copy embedded in different batches or thread counts differ by about 1e-7, and which of the
#: two a third item names must not hang on that
TIE = 1e-5
_LAST = np.iinfo(np.int64).max


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero: it matches nothing)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if not vectors.flags.writeable:  # a view of an arrow buffer
        vectors = vectors.copy()
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.divide(vectors, np.maximum(norms, 1e-12), out=vectors)
    return vectors


class BestEarlier:
    """Running best earlier match, at ``threshold`` or above, of a fixed set of query rows,
    fed other rows in parts."""

    def __init__(self, queries: np.ndarray, ranks: np.ndarray, threshold: float) -> None:
        self.queries = queries
        self.ranks = ranks
        self.threshold = np.float32(threshold)
        self.similarity = np.full(len(queries), -np.inf, np.float32)
        #: index into the rows fed so far (in feeding order), -1: none yet
        self.match = np.full(len(queries), -1, np.int64)
        self._match_rank = np.full(len(queries), _LAST, np.int64)
        self._fed = 0

    def feed(self, rows: np.ndarray, ranks: np.ndarray) -> None:
        """Compare the queries with ``rows`` (each with its rank)."""
        if len(rows) and len(self.queries):
            step = max(1, BLOCK_ENTRIES // len(rows))
            for a in range(0, len(self.queries), step):
                b = min(a + step, len(self.queries))
                sims = self.queries[a:b] @ rows.T
                sims[ranks[None, :] >= self.ranks[a:b, None]] = -np.inf
                top = sims.max(axis=1)
                near = np.flatnonzero(top >= self.threshold - TIE)  # the rest never match
                if len(near):
                    self._take(a + near, sims[near], top[near], ranks)
        self._fed += len(rows)

    def _take(
        self, queries: np.ndarray, sims: np.ndarray, top: np.ndarray, ranks: np.ndarray
    ) -> None:
        """Each query's earliest row within TIE of its best, where it beats what it holds."""
        best = np.argmin(np.where(sims >= (top - TIE)[:, None], ranks[None, :], _LAST), axis=1)
        value, rank = sims[np.arange(len(queries)), best], ranks[best]
        held, held_rank = self.similarity[queries], self._match_rank[queries]
        better = (value > held + TIE) | ((value >= held - TIE) & (rank < held_rank))
        queries = queries[better]
        self.similarity[queries] = value[better]
        self.match[queries] = best[better] + self._fed
        self._match_rank[queries] = rank[better]

    def duplicates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query index, matched row index, similarity) of every query at or above the
        threshold."""
        found = np.flatnonzero(self.similarity >= self.threshold)
        return found, self.match[found], self.similarity[found]


def best_earlier_within(
    vectors: np.ndarray, ranks: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``BestEarlier`` of a whole cluster against itself, in blocks of its rows sorted by rank
    (each block is compared only with the rows before its end: half the work)."""
    order = np.argsort(ranks, kind="stable")
    vectors, ranks = vectors[order], ranks[order]
    found: list[np.ndarray] = []
    matched: list[np.ndarray] = []
    sims: list[np.ndarray] = []
    step = max(1, BLOCK_ENTRIES // max(1, len(vectors)))
    for a in range(0, len(vectors), step):
        b = min(a + step, len(vectors))
        best = BestEarlier(vectors[a:b], ranks[a:b], threshold)
        best.feed(vectors[:b], ranks[:b])
        q, m, s = best.duplicates()
        found.append(order[q + a])
        matched.append(order[m])
        sims.append(s)
    if not found:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0, np.float32)
    return np.concatenate(found), np.concatenate(matched), np.concatenate(sims)
