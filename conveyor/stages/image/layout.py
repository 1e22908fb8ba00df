"""Where the image pipeline's outputs go, and how a run tells finished parts from unfinished.

::

    OUT/shards/shard-NNNNNN.tar          kept images as WebDataset shards (image, json meta,
    OUT/shards/shard-NNNNNN.json         npy embedding per image), each with its index
    OUT/metadata/part-NNNNNN.parquet     one row per input image of the part: key, source,
                                         size, scores, tags, filtered_by, duplicate_of
    OUT/embeddings/part-NNNNNN.parquet   id, order, embedding: one row per kept image
    OUT/duplicates.parquet, dedup.json   what deduplication found (with --dedup)
    OUT/summary.json                     the run's totals
    OUT/.conveyor/parts/part-NNNNNN.json a finished part's record (its key, counts, failures)
    OUT/.conveyor/staging/part-NNNNNN.tar  a finished part's kept samples, until packed
    OUT/.conveyor/                       work in progress (temporary files, the shard being
                                         filled, the journal, the options of the run)

Every file is written under ``.conveyor/tmp`` and renamed into place. A part is *complete*
once its record exists: the record is written last, after its metadata, embeddings and
staged samples, which are named by the part's number, so a part done again (after a crash)
replaces exactly what it had begun. Shards are packed from the staged samples of complete
parts after the stream and the deduplication (``conveyor.stages.image.shards``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conveyor.media.layout import INTERNAL, OutputLayout
from conveyor.storage import ObjectPath
from conveyor.tasks.image import part_name


class ImageLayout(OutputLayout):
    """The paths of an image run under ``root`` (a local folder: shards are filled by
    appending), with the atomic writes of ``OutputLayout``."""

    def __init__(self, root: str | os.PathLike[str] | ObjectPath) -> None:
        super().__init__(root)
        local = self.root
        if not isinstance(local, Path):
            raise ValueError(
                f"OUTPUT {root} is a URL: image runs write to a local or mounted folder (a "
                "shard is filled by appending to a file)"
            )
        self.local: Path = local
        self.parts: Path = local / INTERNAL / "parts"
        self.part_staging: Path = local / INTERNAL / "staging"
        self.journal: Path = local / INTERNAL / "journal"
        self.duplicates: Path = local / "duplicates.parquet"
        self.dedup_report: Path = local / "dedup.json"

    def part_record(self, index: int) -> Path:
        return self.parts / f"{part_name(index)}.json"

    def metadata_path(self, index: int) -> Path:
        return self.local / "metadata" / f"{part_name(index)}.parquet"

    def part_embeddings(self, index: int) -> Path:
        return self.local / "embeddings" / f"{part_name(index)}.parquet"

    def staged_samples(self, index: int) -> Path:
        return self.part_staging / f"{part_name(index)}.tar"

    def read_part_record(self, index: int) -> dict[str, Any] | None:
        """A complete part's record, or ``None`` (absent or unreadable: not complete)."""
        try:
            record = json.loads(self.part_record(index).read_bytes())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None
