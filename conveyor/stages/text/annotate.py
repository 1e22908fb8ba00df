"""Per-document annotations computed batch by batch: word count and an exact-duplicate hash."""

from __future__ import annotations

import hashlib
from typing import Any

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.text import _arrow  # noqa: F401 - pandas/pyarrow set-up once
from conveyor.stages.text.filters import text_column
from conveyor.tasks import DocumentBatch


def content_hash(text: str) -> str:
    """Hex digest identifying exact duplicates (128-bit BLAKE2b of the UTF-8 bytes)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


class DocumentAnnotator(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Adds ``word_count`` (whitespace words, as the filters count them) and ``content_hash``.

    Equal hashes mean byte-identical texts, so a later exact-dedup step only has to group by
    one short column instead of comparing documents. Existing columns of those names are
    replaced; null texts get ``word_count`` 0 and a null hash.
    """

    resources = Resources(cpus=1.0)

    def __init__(
        self,
        text_field: str = "text",
        word_count_field: str = "word_count",
        hash_field: str = "content_hash",
    ) -> None:
        names = [text_field, word_count_field, hash_field]
        if len(set(names)) != 3 or not all(names):
            raise ValueError(
                f"DocumentAnnotator: text_field, word_count_field and hash_field must be "
                f"distinct non-empty names, got {names}"
            )
        self.text_field = text_field
        self.word_count_field = word_count_field
        self.hash_field = hash_field

    def inputs(self) -> tuple[list[str], list[str]]:
        return [], [self.text_field]

    # outputs() stays undeclared for the reason given in HeuristicFilter: it adds two columns
    # to whatever came in, which the (columns produced) contract cannot express.

    def process(self, task: DocumentBatch) -> DocumentBatch:
        import pyarrow as pa

        table = task.to_pyarrow()
        texts = text_column(self.name, task, self.text_field, table)
        nulls = table.column(self.text_field).is_null().to_pylist()
        counts = [len(text.split()) for text in texts]
        hashes = [None if null else content_hash(t) for t, null in zip(texts, nulls, strict=True)]
        for name, values in (
            (self.word_count_field, pa.array(counts, type=pa.int64())),
            (self.hash_field, pa.array(hashes, type=pa.string())),
        ):
            index = table.schema.get_field_index(name)
            if index >= 0:
                table = table.set_column(index, name, values)
            else:
                table = table.append_column(name, values)
        metadata: dict[str, Any] = dict(task.metadata)
        return DocumentBatch(data=table, dataset_name=task.dataset_name, metadata=metadata)
