"""Semantic deduplication of documents: near duplicates by the cosine similarity of their
MiniLM embeddings, as the same two-pass plan as exact and fuzzy dedup.

1. **Pass 1**, ``DedupEmbeddings``: an ordinary stage that embeds each document with the
   packaged all-MiniLM-L6-v2 (``conveyor.media.minilm``) and spills ``(_conveyor_doc_id,
   embedding)`` Parquet, one file per batch, then passes the batch on.
2. **Resolve**, ``resolve_semantic``: ``conveyor.dedup.semantic_dedup`` over the spill (k-means
   on a sample, then every pair within a cluster, as passes on the run's executor); the ids
   of its ``duplicates.parquet`` become the sorted ``.npy`` that ``DropDuplicates`` reads.
3. **Pass 2**, ``DropDuplicates``, as for exact and fuzzy dedup.

A document is removed when one with a smaller ``_conveyor_doc_id`` has a cosine similarity
of at least the threshold with it: ids grow in input order, so the first document of a group
is kept, as in exact and fuzzy dedup. The encoder reads a text's first 256 tokens; the rest
of a longer text does not count. See docs/text-dedup.md for the threshold and what MiniLM scores.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor.media.minilm import MAX_TOKENS, check_installed
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.text.dedup import (
    _batch_file_name,
    _id_array,
    _label,
    _save_ids,
    _texts,
    _write_atomic,
)
from conveyor.stages.text.readers import DOC_ID
from conveyor.storage import arrow_file
from conveyor.tasks import DocumentBatch

if TYPE_CHECKING:
    from conveyor.executors.base import Executor

__all__ = [
    "SEMANTIC_THRESHOLD",
    "DedupEmbeddings",
    "SemanticResult",
    "prefix",
    "resolve_semantic",
]

#: the least cosine similarity of two documents' MiniLM embeddings that makes one a duplicate
#: (why this value: docs/text-dedup.md)
SEMANTIC_THRESHOLD = 0.95
#: where ``DedupEmbeddings`` spills, under its spill_dir
EMBEDDINGS = "embeddings"
#: where ``resolve_semantic`` has ``semantic_dedup`` write, under the spill_dir
SEMANTIC = "semantic"
#: texts per forward pass
BATCH = 64
#: characters kept by ``prefix``: 16 per token the encoder reads
PREFIX_CHARS = 16 * MAX_TOKENS


def prefix(text: str) -> str:
    """The start of ``text`` that holds the tokens the encoder reads: its first ``MAX_TOKENS``
    words (each is one token at least), at most ``PREFIX_CHARS`` characters (for scripts
    written without spaces). The tokenizer would otherwise read a whole long text before
    keeping its start: 0.7 s for 100,000 words."""
    if len(text) <= PREFIX_CHARS:
        return text
    words = text.split(maxsplit=MAX_TOKENS)
    return " ".join(words[:MAX_TOKENS])[:PREFIX_CHARS]


class DedupEmbeddings(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Pass 1 of semantic dedup: spills each document's MiniLM embedding to
    ``spill_dir/embeddings/`` and passes the batch on unchanged.

    Input rows need the text column and an int64 document id column, unique across the
    dataset (the reader's ``_conveyor_doc_id``: it grows in input order, which ``resolve_semantic``
    keeps by). Each batch is one Parquet file (``_conveyor_doc_id``, ``embedding``: 384 float32),
    written atomically under a name derived from the batch's ids, so a retried batch rewrites
    its file. A text that is blank is not spilled: there is nothing to compare (fuzzy mode
    leaves out a text with no words likewise). ``spill_dir`` is a local directory every
    worker can write to, fresh for each dataset.
    """

    resources = Resources(cpus=1.0)
    preload_modules = ("torch", "transformers.models.bert.modeling_bert")
    #: one encoder gains little past four threads (as the video pipeline's model stages)
    max_threads = 4

    def __init__(
        self,
        spill_dir: str | Path,
        *,
        text_column: str = "text",
        id_column: str = DOC_ID,
    ) -> None:
        if not text_column or not id_column or text_column == id_column:
            raise ValueError(
                f"DedupEmbeddings: text_column and id_column must be distinct non-empty names, "
                f"got {text_column!r} and {id_column!r}"
            )
        check_installed("semantic dedup")
        self.spill_dir = str(spill_dir)
        self.text_column = text_column
        self.id_column = id_column
        self._encoder: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_encoder"] = None  # each worker loads the model itself
        return state

    def inputs(self) -> tuple[list[str], list[str]]:
        return [], [self.text_column, self.id_column]

    # outputs() stays undeclared: the batch passes through unchanged (see DedupKeys).

    def setup(self, worker: Any) -> None:
        import torch

        from conveyor.media.minilm import SentenceEncoder

        self._limit_threads()
        gpu = worker is not None and worker.gpu_ids and torch.cuda.is_available()
        self._encoder = SentenceEncoder(device="cuda" if gpu else "cpu")

    def teardown(self) -> None:
        self._encoder = None

    def _limit_threads(self) -> None:
        """Torch's threads follow the batch's ``threads`` (more while cores idle)."""
        import torch

        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if torch.get_num_interop_threads() != 1:
            with contextlib.suppress(RuntimeError):  # it can be set once per process
                torch.set_num_interop_threads(1)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit-length embeddings of ``texts`` (their ``prefix``), shortest texts batched
        together so that a forward pass pads little."""
        if self._encoder is None:
            self.setup(None)
        self._limit_threads()
        cut = [prefix(text) for text in texts]
        order = sorted(range(len(cut)), key=lambda i: len(cut[i]))
        vectors = self._encoder.embed([cut[i] for i in order], BATCH)
        out = np.empty_like(vectors)
        out[order] = vectors
        return out

    def process(self, task: DocumentBatch) -> DocumentBatch:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = task.to_pyarrow()
        ids = _id_array(self.name, task, table, self.id_column)
        texts = _texts(self.name, task, table, self.text_column)
        if len(np.unique(ids)) != len(ids):
            raise ValueError(
                f"stage {self.name!r}: {_label(task)}: repeated values in id column "
                f"{self.id_column!r}; document ids must be unique across the dataset"
            )
        keep = [i for i, text in enumerate(texts) if text.strip()]
        if not keep:
            return task
        vectors = self.embed([texts[i] for i in keep])
        flat = pa.array(vectors.reshape(-1), pa.float32())
        spilled = pa.table(
            {
                DOC_ID: pa.array(ids[keep], pa.int64()),
                "embedding": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]),
            }
        )
        path = Path(self.spill_dir) / EMBEDDINGS / _batch_file_name(ids[keep], ".parquet")

        def write(tmp: Path) -> None:
            with arrow_file(tmp, "wb") as sink:
                pq.write_table(spilled, sink)

        _write_atomic(path, write)
        return task


@dataclass(frozen=True)
class SemanticResult:
    """What ``resolve_semantic`` found (``semantic_dedup``'s counts) and where the ids to
    remove are."""

    #: documents with an embedding
    documents: int
    #: documents to drop: each has an earlier one at ``threshold`` or more
    removed: int
    #: k-means clusters the documents were compared within
    clusters: int
    threshold: float
    #: .npy file of the sorted int64 ids to remove
    removed_path: Path
    #: seconds of each of semantic_dedup's passes
    passes: dict[str, float] = field(default_factory=dict)
    mode: str = "semantic"


def resolve_semantic(
    spill_dir: str | Path,
    *,
    threshold: float = SEMANTIC_THRESHOLD,
    clusters: int | None = None,
    executor: Executor | None = None,
    out_path: str | Path | None = None,
) -> SemanticResult:
    """Finds the near duplicates among the embeddings ``DedupEmbeddings`` spilled to
    ``spill_dir`` and writes the ids to remove to ``out_path`` (default
    ``spill_dir/removed.npy``).

    ``semantic_dedup`` runs its passes on ``executor`` (default: streaming, local), keeping
    the smallest ``_conveyor_doc_id`` of each group; its ``duplicates.parquet`` and
    ``dedup.json`` are left in ``spill_dir/semantic/``. ``clusters`` (default one per 10,000
    documents): fewer find more of the pairs a cluster boundary separates, and cost more.
    """
    from conveyor.stages.text.readers import DOC_ID

    spill = Path(spill_dir)
    if not spill.is_dir():
        raise FileNotFoundError(
            f"resolve_semantic: spill_dir {str(spill)!r} does not exist (run DedupEmbeddings first)"
        )
    out = Path(out_path) if out_path is not None else spill / "removed.npy"
    folder = spill / EMBEDDINGS
    if not (folder.is_dir() and any(folder.glob("*.parquet"))):  # no document to compare
        _save_ids(out, np.zeros(0, dtype=np.int64))
        return SemanticResult(0, 0, 0, threshold, out)
    import pyarrow.parquet as pq

    from conveyor.dedup import semantic_dedup

    found = semantic_dedup(
        folder,
        spill / SEMANTIC,
        id_column=DOC_ID,
        order_by=DOC_ID,
        threshold=threshold,
        n_clusters=clusters,
        executor=executor,
    )
    with arrow_file(found.duplicates_path) as source:
        ids = pq.read_table(source, columns=["id"]).column("id").to_numpy()
    ids = np.sort(ids.astype(np.int64))
    _save_ids(out, ids)
    return SemanticResult(found.items, len(ids), found.clusters, threshold, out, dict(found.passes))
