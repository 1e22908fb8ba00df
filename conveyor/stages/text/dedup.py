"""Exact and fuzzy (MinHash LSH) deduplication across a whole dataset, as a two-pass plan.

A duplicate can be anywhere in the dataset, so a streaming stage that sees one batch at a time
cannot decide alone. The work is split so that memory stays bounded for data larger than RAM:

1. **Pass 1**, ``DedupKeys``: an ordinary stage. For each batch it computes each document's keys
   (exact: the hash of the normalised text; fuzzy: one hash per LSH band of a MinHash
   signature) and spills them to local disk in hash partitions, one small Arrow file per
   (batch, partition). Fuzzy mode also spills each document's shingle set, partitioned by
   document id, for the exact Jaccard check.
2. **Resolve**, ``resolve_duplicates``: reads one key partition at a time; documents sharing a
   key are candidates. Candidate pairs are checked against the real shingle Jaccard (a join
   done one document partition at a time, see ``resolve_duplicates``), the pairs that pass are
   unioned into components, and every member of a component but the one with the smallest
   document id is written to a ``.npy`` file of ids to remove.
3. **Pass 2**, ``DropDuplicates``: an ordinary stage that drops the rows whose id is in it.

What grows with the data is on disk (the spill); in RAM are one partition and the union-find
over the documents that appear in candidate pairs. See docs/text-dedup.md for measurements.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.text import _arrow  # noqa: F401 - pandas/pyarrow set-up once
from conveyor.stages.text import _minhash as mh
from conveyor.stages.text._minhash import content_hash, normalise
from conveyor.stages.text.readers import DOC_ID
from conveyor.storage import arrow_file
from conveyor.tasks import DocumentBatch

if TYPE_CHECKING:
    import numpy.typing as npt
    import pyarrow as pa

__all__ = [
    "DUPLICATES_REMOVED",
    "DedupKeys",
    "DedupResult",
    "DropDuplicates",
    "FuzzyDedupConfig",
    "content_hash",
    "normalise",
    "resolve_duplicates",
]

Mode = Literal["exact", "fuzzy"]
#: metadata key where ``DropDuplicates`` adds up the rows it dropped
DUPLICATES_REMOVED = "duplicates_removed"
MANIFEST = "_dedup.json"
_FORMAT = 1
#: config fields that shape the spilled keys: pass 1 and resolve must agree on them
_KEY_FIELDS = ("shingle_size", "num_perm", "bands", "rows", "seed")


#: the most MinHash permutations a fuzzy dedup takes (a signature of 4 KB per document)
MAX_PERM = 1024


@dataclass(frozen=True)
class FuzzyDedupConfig:
    """MinHash LSH parameters. Two documents whose word ``shingle_size``-gram sets have a
    Jaccard similarity ``s`` share at least one of ``bands`` bands of ``rows`` signature values
    (and so become a candidate pair) with probability ``1 - (1 - s**rows)**bands``; the defaults
    (20 x 6) give 0.998 at s = 0.8 and 0.27 at s = 0.5. With ``jaccard_check`` each candidate
    pair is then kept only if the exact Jaccard of the two shingle sets (32-bit shingle hashes)
    is at least ``threshold``, which is what makes precision high: the banding alone cannot
    tell 0.75 from 0.8.
    """

    shingle_size: int = 5
    num_perm: int = 120
    bands: int = 20
    rows: int = 6
    threshold: float = 0.8
    jaccard_check: bool = True
    seed: int = 42

    def __post_init__(self) -> None:
        for name in ("shingle_size", "num_perm", "bands", "rows", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"FuzzyDedupConfig: {name} must be an int, got {value!r}")
        for name in ("shingle_size", "num_perm", "bands", "rows"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"FuzzyDedupConfig: {name} must be >= 1, got {getattr(self, name)}"
                )
        if self.shingle_size > 64:
            raise ValueError(
                f"FuzzyDedupConfig: shingle_size must be <= 64 words, got {self.shingle_size}"
            )
        if not 0 <= self.seed < 1 << 64:
            raise ValueError(f"FuzzyDedupConfig: seed must be in [0, 2**64), got {self.seed}")
        if max(self.num_perm, self.bands * self.rows) > MAX_PERM:
            # each permutation costs every document 4 bytes and a hash per shingle: a
            # million by a million ran until the kernel killed the worker
            raise ValueError(
                f"FuzzyDedupConfig: num_perm (bands * rows) must be <= {MAX_PERM}, got "
                f"{max(self.num_perm, self.bands * self.rows):,} (120 is usual)"
            )
        if self.bands * self.rows != self.num_perm:
            raise ValueError(
                f"FuzzyDedupConfig: num_perm must equal bands * rows, got {self.num_perm} != "
                f"{self.bands} * {self.rows} = {self.bands * self.rows} (pass "
                f"num_perm={self.bands * self.rows})"
            )
        threshold = self.threshold
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, (int, float))
            or not 0 < threshold <= 1
        ):
            raise ValueError(f"FuzzyDedupConfig: threshold must be in (0, 1], got {threshold!r}")
        if not isinstance(self.jaccard_check, bool):
            raise ValueError(
                f"FuzzyDedupConfig: jaccard_check must be a bool, got {self.jaccard_check!r}"
            )

    def candidate_probability(self, similarity: float) -> float:
        """Probability that two documents of Jaccard ``similarity`` become a candidate pair."""
        return 1.0 - (1.0 - similarity**self.rows) ** self.bands


def _check_mode(mode: object, where: str) -> Mode:
    if mode not in ("exact", "fuzzy"):
        raise ValueError(f"{where}: mode must be 'exact' or 'fuzzy', got {mode!r}")
    return mode  # type: ignore[return-value]


def _manifest(mode: Mode, config: FuzzyDedupConfig | None, partitions: int) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "mode": mode,
        "partitions": partitions,
        "config": asdict(config) if config is not None else None,
    }


def _write_atomic(path: Path, write: Any) -> None:
    """``write(tmp_path)``, then rename over ``path``: readers see a whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_table(path: Path, table: pa.Table) -> None:
    import pyarrow as pa

    def write(tmp: Path) -> None:
        with arrow_file(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    _write_atomic(path, write)


def _read_table(path: Path) -> pa.Table:
    import pyarrow as pa

    with arrow_file(path) as source:
        return pa.ipc.open_file(source).read_all()


def _partition_dir(spill: Path, kind: str, partition: int) -> Path:
    return spill / kind / f"p{partition:04d}"


def _files(directory: Path) -> list[Path]:
    """The finished files of one partition (writers' temporaries are hidden ``.tmp`` names)."""
    if not directory.is_dir():
        return []
    return sorted(directory.glob("*.arrow"))


class DedupKeys(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Pass 1: spills each document's dedup keys to ``spill_dir`` and passes the batch on.

    Input rows need the text column and an int64 document id column, unique across the dataset
    (the reader assigns it; ``resolve_duplicates`` keeps the smallest id of each duplicate
    group, so ids in input order keep the first document seen). ``spill_dir`` is a local
    directory that every worker can write to, fresh for each dataset.

    Per call (``batch_size`` batches, 4 by default), one Arrow IPC file per partition is written
    atomically under a name derived from the batches' ids, so a retried or re-run call replaces
    its files instead of adding to them (and ``resolve_duplicates`` ignores repeated rows, so
    a batch retried alone after its group failed adds nothing either).
    Exact mode writes ``keys/pNNNN/`` rows (content_hash, doc id). Fuzzy mode writes one row per
    LSH band (band key, doc id) to ``keys/`` and one row per document (doc id, its sorted
    32-bit shingle hashes when ``jaccard_check``) to ``docs/``, partitioned by id. A text with
    no words after ``normalise`` has no shingles and spills no fuzzy keys (it is not a
    document to fuzzy dedup); in exact mode all empty texts share one hash. ``config`` is
    used in fuzzy mode only (``None``: the defaults).
    """

    resources = Resources(cpus=1.0)
    #: batches spilled together: a quarter of the files (and of resolve's file opens), for
    #: four batches held at once
    batch_size = 4

    def __init__(
        self,
        spill_dir: str | Path,
        mode: Mode,
        config: FuzzyDedupConfig | None = None,
        *,
        text_column: str = "text",
        id_column: str = DOC_ID,
        partitions: int = 16,
    ) -> None:
        self.mode = _check_mode(mode, "DedupKeys")
        if config is not None and not isinstance(config, FuzzyDedupConfig):
            raise TypeError(f"DedupKeys: config must be a FuzzyDedupConfig, got {config!r}")
        if mode == "fuzzy" and config is None:
            config = FuzzyDedupConfig()
        self.config = config if mode == "fuzzy" else None
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"DedupKeys: partitions must be an int >= 1, got {partitions!r}")
        if not text_column or not id_column or text_column == id_column:
            raise ValueError(
                f"DedupKeys: text_column and id_column must be distinct non-empty names, got "
                f"{text_column!r} and {id_column!r}"
            )
        self.spill_dir = str(spill_dir)
        self.text_column = text_column
        self.id_column = id_column
        self.partitions = partitions
        self._manifest_checked = False

    def inputs(self) -> tuple[list[str], list[str]]:
        return [], [self.text_column, self.id_column]

    # outputs() stays undeclared: the batch passes through unchanged (see HeuristicFilter).

    def process(self, task: DocumentBatch) -> DocumentBatch:
        self.process_batch([task])
        return task

    def process_batch(self, tasks: list[DocumentBatch]) -> list[DocumentBatch]:
        """Spills the keys of all ``tasks`` together (one file per partition for the group:
        ``batch_size`` > 1 means fewer, larger spill files) and returns them unchanged."""
        import pyarrow as pa

        id_parts, texts = [], []
        for task in tasks:
            table = task.to_pyarrow()
            id_parts.append(_id_array(self.name, task, table, self.id_column))
            texts.extend(_texts(self.name, task, table, self.text_column))
        ids = np.concatenate(id_parts) if id_parts else np.zeros(0, dtype=np.int64)
        if len(ids) == 0:
            return tasks
        if len(mh.sorted_unique(ids)) != len(ids):
            raise ValueError(
                f"stage {self.name!r}: {', '.join(_label(t) for t in tasks)}: repeated values in "
                f"id column {self.id_column!r}; document ids must be unique across the dataset"
            )
        spill = Path(self.spill_dir)
        self._check_manifest(spill)
        name = _batch_file_name(ids)
        if self.mode == "exact":
            keys = np.fromiter(map(content_hash, texts), dtype=np.int64, count=len(texts))
            self._spill(
                spill,
                "keys",
                mh.partition_of(keys, self.partitions),
                name,
                {"key": pa.array(keys), "doc": pa.array(ids)},
            )
            return tasks
        config = self.config
        assert config is not None
        flat, offsets = mh.shingle_hashes(texts, config.shingle_size)
        present = np.diff(offsets) > 0
        if not present.any():
            return tasks
        # docs first: a document with keys on disk always has its shingles there too
        doc_ids = ids[present]
        columns: dict[str, pa.Array] = {"doc": pa.array(doc_ids)}
        if config.jaccard_check:
            values, set_offsets = mh.unique_sets(flat, offsets)
            sets = pa.LargeListArray.from_arrays(pa.array(set_offsets), pa.array(values))
            columns["shingles"] = sets.filter(pa.array(present))
        self._spill(spill, "docs", mh.doc_partition(doc_ids, self.partitions), name, columns)
        sig = mh.signatures(flat, offsets, config.num_perm, config.seed)[present]
        band = mh.band_keys(sig, config.bands, config.rows).reshape(-1).view(np.int64)
        owners = np.repeat(doc_ids, config.bands)
        self._spill(
            spill,
            "keys",
            mh.partition_of(band, self.partitions),
            name,
            {"key": pa.array(band), "doc": pa.array(owners)},
        )
        return tasks

    def _spill(
        self,
        spill: Path,
        kind: str,
        partition: npt.NDArray[np.int64],
        name: str,
        columns: dict[str, pa.Array],
    ) -> None:
        import pyarrow as pa

        table = pa.table(columns)
        order = np.argsort(partition, kind="stable")
        bounds = np.searchsorted(partition[order], np.arange(self.partitions + 1))
        for p in range(self.partitions):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if lo < hi:
                part = table.take(pa.array(order[lo:hi]))
                _write_table(_partition_dir(spill, kind, p) / name, part)

    def _check_manifest(self, spill: Path) -> None:
        """Record how the keys are made; refuse a directory that holds keys made otherwise
        (``threshold`` is recorded as resolve's default but is free to differ)."""
        wanted = _manifest(self.mode, self.config, self.partitions)
        path = spill / MANIFEST
        if not path.exists():
            _write_atomic(path, lambda tmp: tmp.write_text(json.dumps(wanted, sort_keys=True)))
        elif not self._manifest_checked:
            found = json.loads(path.read_text())
            if _without_threshold(found) != _without_threshold(wanted):
                raise ValueError(
                    f"stage {self.name!r}: spill_dir {str(spill)!r} already holds keys made "
                    f"with {found}, this stage makes {wanted}; use a fresh directory per "
                    "dataset and setting"
                )
        self._manifest_checked = True


def _without_threshold(manifest: dict[str, Any]) -> dict[str, Any]:
    config = manifest.get("config")
    if isinstance(config, dict):
        manifest = {**manifest, "config": {k: v for k, v in config.items() if k != "threshold"}}
    return manifest


def _label(task: DocumentBatch) -> str:
    origin = ", ".join(task.metadata.get("source_files", [])) or "unknown files"
    return f"task {task.task_id or '?'} (from {origin})"


def _id_array(stage: str, task: DocumentBatch, table: pa.Table, column: str) -> Any:
    import pyarrow as pa

    if column not in table.column_names:
        raise ValueError(
            f"stage {stage!r}: {_label(task)} has no id column {column!r} (columns: "
            f"{', '.join(table.column_names) or 'none'}); dedup needs an int64 document id "
            "unique across the dataset, assigned by the reader (set id_column)"
        )
    values = table.column(column)
    if not pa.types.is_integer(values.type):
        raise ValueError(
            f"stage {stage!r}: {_label(task)} id column {column!r} holds {values.type}, "
            "expected integers"
        )
    if values.null_count:
        raise ValueError(
            f"stage {stage!r}: {_label(task)} id column {column!r} has {values.null_count} null ids"
        )
    try:
        return values.cast(pa.int64()).to_numpy()
    except pa.ArrowInvalid as error:
        raise ValueError(
            f"stage {stage!r}: {_label(task)} id column {column!r} has ids that do not fit an "
            f"int64: {error}"
        ) from error


def _texts(stage: str, task: DocumentBatch, table: pa.Table, column: str) -> list[str]:
    import pyarrow as pa

    if column not in table.column_names:
        raise ValueError(
            f"stage {stage!r}: {_label(task)} has no text column {column!r} (columns: "
            f"{', '.join(table.column_names) or 'none'}); set text_column"
        )
    values = table.column(column)
    kind = values.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
        raise ValueError(
            f"stage {stage!r}: {_label(task)} text column {column!r} holds {kind}, expected strings"
        )
    return [value or "" for value in values.to_pylist()]


def _batch_file_name(ids: Any, suffix: str = ".arrow") -> str:
    """Deterministic in the batch's set of ids: a retry rewrites the same files."""
    import xxhash

    ordered = np.sort(ids)
    return f"{int(ordered[0])}-{len(ordered)}-{xxhash.xxh3_64_hexdigest(ordered.tobytes())}{suffix}"


# -- resolve -------------------------------------------------------------------------------


@dataclass
class DedupResult:
    """What ``resolve_duplicates`` found. In exact mode a group of ``k`` equal documents counts
    ``k - 1`` candidate and duplicate pairs (each member with the kept one)."""

    mode: str
    documents: int  # documents whose keys were spilled
    candidate_pairs: int  # distinct pairs that shared a key (fuzzy: an LSH band)
    duplicate_pairs: int  # candidate pairs that passed the Jaccard check
    components: int  # groups of two or more documents
    removed: int  # documents to drop: the sum over components of their size - 1
    removed_path: Path  # .npy file of the sorted int64 ids to remove
    peak_partition_rows: int  # the most key rows held at once


def resolve_duplicates(
    spill_dir: str | Path,
    mode: Mode,
    config: FuzzyDedupConfig | None = None,
    *,
    out_path: str | Path | None = None,
) -> DedupResult:
    """Finds the duplicate documents among the keys ``DedupKeys`` spilled to ``spill_dir`` and
    writes the ids to remove to ``out_path`` (default ``spill_dir/removed.npy``).

    Each component keeps its smallest document id. Exact mode: documents with equal
    ``content_hash`` form a component; equal hashes share a partition, so each partition is
    settled on its own. Fuzzy mode, with ``config`` from the spill when not given (only
    ``threshold`` and ``jaccard_check`` may differ from pass 1's):

    1. each key partition in turn: rows sorted by key, candidate pairs from each bucket
       (``_minhash.bucket_pairs``), written under ``_resolve/`` by the partition of the
       smaller id ``a``;
    2. each document partition ``q`` in turn: its pairs deduplicated across bands; the shingle
       sets of their ``a`` documents read from ``docs/pq`` (file by file, keeping only those),
       and written with the pairs to the partition of ``b``;
    3. each document partition ``r`` in turn: the sets of the ``b`` documents read from
       ``docs/pr``, the Jaccard of every pair computed, the pairs at or above ``threshold``
       kept;
    4. union-find over the documents of the kept pairs.

    Memory: one partition's rows (and the shingle sets of the candidate documents of one
    partition) plus the kept pairs and the union-find over their documents.
    ``_resolve/`` is removed at the end.
    """

    mode = _check_mode(mode, "resolve_duplicates")
    spill = Path(spill_dir)
    if not spill.is_dir():
        raise FileNotFoundError(
            f"resolve_duplicates: spill_dir {str(spill)!r} does not exist (run DedupKeys first)"
        )
    out = Path(out_path) if out_path is not None else spill / "removed.npy"
    manifest_path = spill / MANIFEST
    if not manifest_path.exists():
        if any(spill.iterdir()):
            raise ValueError(
                f"resolve_duplicates: {str(spill)!r} has no {MANIFEST}; it was not written by "
                "DedupKeys"
            )
        _save_ids(out, np.zeros(0, dtype=np.int64))  # pass 1 saw no documents
        return DedupResult(mode, 0, 0, 0, 0, 0, out, 0)
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != _FORMAT or manifest.get("mode") != mode:
        raise ValueError(
            f"resolve_duplicates: {str(spill)!r} holds {manifest.get('mode')!r} keys (format "
            f"{manifest.get('format')}), asked to resolve {mode!r}"
        )
    partitions = int(manifest["partitions"])
    if mode == "exact":
        return _resolve_exact(spill, partitions, out)
    spilled = FuzzyDedupConfig(**manifest["config"])
    if config is None:
        config = spilled
    else:
        differ = [f for f in _KEY_FIELDS if getattr(config, f) != getattr(spilled, f)]
        if differ:
            raise ValueError(
                "resolve_duplicates: config differs from the one the keys were made with in "
                + ", ".join(f"{f} ({getattr(config, f)} != {getattr(spilled, f)})" for f in differ)
            )
        if config.jaccard_check and not spilled.jaccard_check:
            raise ValueError(
                "resolve_duplicates: jaccard_check=True, but pass 1 ran with jaccard_check=False "
                "and spilled no shingle sets; resolve with jaccard_check=False or rerun pass 1"
            )
    work = spill / "_resolve"
    shutil.rmtree(work, ignore_errors=True)
    try:
        return _resolve_fuzzy(spill, work, partitions, config, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _save_ids(path: Path, ids: Any) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as stream:
            np.save(stream, np.ascontiguousarray(ids, dtype=np.int64))

    _write_atomic(path, write)


def _read_keys(spill: Path, partition: int) -> tuple[Any, Any, int]:
    """One key partition: (keys, docs) sorted, each distinct row once, and rows read."""

    keys, docs = [], []
    for path in _files(_partition_dir(spill, "keys", partition)):
        table = _read_table(path)
        keys.append(table.column("key").to_numpy())
        docs.append(table.column("doc").to_numpy())
    if not keys:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, 0
    key = np.concatenate(keys)
    doc = np.concatenate(docs)
    del keys, docs
    rows = len(key)
    key, doc = mh.dedupe_rows(key, doc)
    return key, doc, rows


def _resolve_exact(spill: Path, partitions: int, out: Path) -> DedupResult:
    documents = components = peak = 0
    removed = []
    for p in range(partitions):
        keys, docs, rows = _read_keys(spill, p)
        peak = max(peak, rows)
        documents += len(mh.sorted_unique(docs))
        starts = mh.group_starts(keys)
        removed.append(docs[~starts])  # sorted by doc within a key: the first is the smallest
        sizes = np.diff(np.append(np.flatnonzero(starts), len(keys)))
        components += int((sizes >= 2).sum())
        del keys, docs
    ids = np.sort(np.concatenate(removed)) if removed else np.zeros(0, dtype=np.int64)
    _save_ids(out, ids)
    return DedupResult("exact", documents, len(ids), len(ids), components, len(ids), out, peak)


@dataclass
class _Sets:
    """Shingle sets of some documents: ``ids`` sorted, set ``i`` is
    ``values[offsets[i]:offsets[i + 1]]``."""

    ids: Any
    values: Any
    offsets: Any

    @classmethod
    def from_table(cls, table: pa.Table) -> _Sets:
        import pyarrow as pa

        if table.num_rows == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.uint32), np.zeros(1, np.int64))
        table = table.sort_by("doc").combine_chunks()
        ids = table.column("doc").to_numpy()
        if len(ids) > 1:  # a document spilled twice (a re-batched rerun): keep one copy
            keep = np.ones(len(ids), dtype=bool)
            keep[1:] = ids[1:] != ids[:-1]
            if not keep.all():
                table = table.filter(pa.array(keep)).combine_chunks()
                ids = ids[keep]
        sets = table.column("shingles").chunk(0)
        return cls(ids, sets.values.to_numpy(), sets.offsets.to_numpy().astype(np.int64))

    def subset(self, ids: Any) -> pa.Table:
        """The sets of ``ids`` (sorted, all present) as a ``doc``, ``shingles`` table."""
        import pyarrow as pa

        rows = self.index(ids, "subset")
        lengths = self.offsets[rows + 1] - self.offsets[rows]
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        positions = np.repeat(self.offsets[rows], lengths) + within
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = pa.array(self.values[positions], type=pa.uint32())
        shingles = pa.LargeListArray.from_arrays(pa.array(offsets), values)
        return pa.table({"doc": pa.array(self.ids[rows]), "shingles": shingles})

    def index(self, ids: Any, where: str) -> Any:
        position = np.searchsorted(self.ids, ids)
        found = position < len(self.ids)
        found[found] = self.ids[position[found]] == ids[found]
        if not found.all():
            raise RuntimeError(
                f"resolve_duplicates: {where}: no shingle set for document(s) "
                f"{ids[~found][:5].tolist()}; the spill is incomplete (rerun pass 1)"
            )
        return position


def _read_sets(spill: Path, partition: int, wanted: Any) -> tuple[_Sets, int]:
    """Shingle sets of the ``wanted`` (sorted) ids of one document partition, read file by
    file and keeping only those, and how many distinct documents the partition holds."""
    import pyarrow as pa

    kept, seen = [], []
    for path in _files(_partition_dir(spill, "docs", partition)):
        table = _read_table(path)
        ids = table.column("doc").to_numpy()
        seen.append(ids)
        if not len(wanted):
            continue
        position = np.minimum(np.searchsorted(wanted, ids), len(wanted) - 1)
        mask = wanted[position] == ids
        if mask.any():
            kept.append(table.filter(pa.array(mask)))
    documents = len(mh.sorted_unique(np.concatenate(seen))) if seen else 0
    if not kept:
        return _Sets.from_table(pa.table({"doc": pa.array([], pa.int64())})), documents
    return _Sets.from_table(pa.concat_tables(kept)), documents


def _resolve_fuzzy(
    spill: Path, work: Path, partitions: int, config: FuzzyDedupConfig, out: Path
) -> DedupResult:
    import pyarrow as pa

    # 1. key partitions -> candidate pairs, filed by the partition of their smaller id
    peak = 0
    for p in range(partitions):
        keys, docs, rows = _read_keys(spill, p)
        peak = max(peak, rows)
        a, b = mh.bucket_pairs(keys, docs)
        del keys, docs
        owner = mh.doc_partition(a, partitions)
        for q in mh.sorted_unique(owner):
            pick = owner == q
            directory = work / "pairs" / f"d{q:04d}"
            directory.mkdir(parents=True, exist_ok=True)
            np.save(directory / f"k{p:04d}.npy", np.stack([a[pick], b[pick]]))
    documents = candidates = 0
    kept_a, kept_b = [], []
    # 2. per document partition: distinct pairs; with the check, ship a's sets to b's partition
    for q in range(partitions):
        a, b = _load_pairs(work / "pairs" / f"d{q:04d}")
        candidates += len(a)
        check = config.jaccard_check and len(a) > 0
        sets, count = _read_sets(spill, q, mh.sorted_unique(a) if check else a[:0])
        documents += count
        if not check:
            kept_a.append(a)
            kept_b.append(b)
            continue
        target = mh.doc_partition(b, partitions)
        for r in mh.sorted_unique(target):
            pick = target == r
            half = work / "half" / f"d{r:04d}"
            half.mkdir(parents=True, exist_ok=True)
            np.save(half / f"q{q:04d}.npy", np.stack([a[pick], b[pick]]))
            _write_table(half / f"q{q:04d}.arrow", sets.subset(mh.sorted_unique(a[pick])))
        del sets
    # 3. per document partition: Jaccard of each pair whose b lives here
    if config.jaccard_check:
        for r in range(partitions):
            half = work / "half" / f"d{r:04d}"
            if not half.is_dir():
                continue
            pairs = [np.load(path) for path in sorted(half.glob("q*.npy"))]
            a = np.concatenate([pair[0] for pair in pairs])
            b = np.concatenate([pair[1] for pair in pairs])
            del pairs
            a_sets = _Sets.from_table(
                pa.concat_tables([_read_table(path) for path in sorted(half.glob("q*.arrow"))])
            )
            b_sets, _ = _read_sets(spill, r, mh.sorted_unique(b))
            similarity = mh.pair_jaccard(
                a_sets.index(a, f"partition {r}"),
                b_sets.index(b, f"partition {r}"),
                a_sets.values,
                a_sets.offsets,
                b_sets.values,
                b_sets.offsets,
            )
            passed = similarity >= config.threshold
            kept_a.append(a[passed])
            kept_b.append(b[passed])
            del a_sets, b_sets
            shutil.rmtree(half)
    # 4. components of the kept pairs; all but the smallest id of each are removed
    empty = np.zeros(0, dtype=np.int64)
    a = np.concatenate(kept_a) if kept_a else empty
    b = np.concatenate(kept_b) if kept_b else empty
    del kept_a, kept_b
    duplicate_pairs = len(a)
    nodes, roots = mh.components(a, b)
    removed = nodes[nodes != roots]
    _save_ids(out, removed)
    groups = int((nodes == roots).sum())
    return DedupResult(
        "fuzzy", documents, candidates, duplicate_pairs, groups, len(removed), out, peak
    )


def _load_pairs(directory: Path) -> tuple[Any, Any]:
    if not directory.is_dir():
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    pairs = [np.load(path) for path in sorted(directory.glob("k*.npy"))]
    a = np.concatenate([pair[0] for pair in pairs])
    b = np.concatenate([pair[1] for pair in pairs])
    return mh.unique_pairs(a, b)


# -- pass 2 --------------------------------------------------------------------------------


class DropDuplicates(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Pass 2: drops the rows whose id is in the sorted ``.npy`` of ids ``resolve_duplicates``
    wrote. Each worker loads the ids once (8 bytes per removed document) and looks a batch up
    with one ``searchsorted``. A batch left with no rows is dropped (the engine counts it as
    filtered); the others carry ``metadata["duplicates_removed"]`` added up.
    """

    resources = Resources(cpus=1.0)

    def __init__(self, removed_path: str | Path, *, id_column: str = DOC_ID) -> None:
        if not id_column:
            raise ValueError("DropDuplicates: id_column must be a non-empty name")
        self.removed_path = str(removed_path)
        self.id_column = id_column
        self._removed: Any = None

    def inputs(self) -> tuple[list[str], list[str]]:
        return [], [self.id_column]

    def setup(self, worker: Any) -> None:
        self._load()

    def _load(self) -> Any:
        if self._removed is None:
            path = Path(self.removed_path)
            if not path.is_file():
                raise FileNotFoundError(
                    f"stage {self.name!r}: removed-ids file {self.removed_path!r} does not "
                    "exist (run resolve_duplicates first)"
                )
            removed = np.load(path)
            if removed.dtype != np.int64 or removed.ndim != 1:
                raise ValueError(
                    f"stage {self.name!r}: {self.removed_path!r} holds {removed.dtype} of shape "
                    f"{removed.shape}, expected a 1-d int64 array"
                )
            if len(removed) > 1 and not (removed[1:] >= removed[:-1]).all():
                removed = np.sort(removed)
            self._removed = removed
        return self._removed

    def teardown(self) -> None:
        self._removed = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_removed"] = None  # workers load it themselves, not through the pickle
        return state

    def process(self, task: DocumentBatch) -> DocumentBatch | None:
        import pyarrow as pa

        removed = self._load()
        table = task.to_pyarrow()
        ids = _id_array(self.name, task, table, self.id_column)
        if len(removed) and len(ids):
            position = np.minimum(np.searchsorted(removed, ids), len(removed) - 1)
            drop = removed[position] == ids
        else:
            drop = np.zeros(len(ids), dtype=bool)
        dropped = int(drop.sum())
        if dropped and dropped == len(ids):
            return None
        if dropped:
            table = table.filter(pa.array(~drop))
        metadata: dict[str, Any] = dict(task.metadata)
        metadata[DUPLICATES_REMOVED] = int(metadata.get(DUPLICATES_REMOVED, 0)) + dropped
        return DocumentBatch(data=table, dataset_name=task.dataset_name, metadata=metadata)
