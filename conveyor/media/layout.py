"""Where the video pipeline's outputs go, and how a run tells finished work from unfinished.

::

    OUT/clips/<clip_id>.mp4              kept clips
    OUT/filtered_clips/<clip_id>.mp4     filtered clips (only with write_filtered)
    OUT/metadata/<video_id>.parquet      the clip table: one row per clip made, kept or
                                         filtered (``conveyor.media.table``)
    OUT/metadata/group-<hash>.parquet    the same for videos written together: short ones,
                                         each whole in one task and without embeddings,
                                         share one table (``ClipWriter.process_batch``)
    OUT/metas/<clip_id>.json             the same, a file per clip (only with meta_json)
    OUT/embeddings/<video_id>.parquet    clip_id, embedding: one row per kept clip
    OUT/text_embeddings/<video_id>.parquet  clip_id, text, embedding (when text is embedded)
    OUT/videos/<relative path>.json      the video: metadata, clip ids, errors (a name too
                                         long for the disk ends in ~<hash>.json)
    OUT/shards/shard-NNNNNN.tar          kept clips as WebDataset shards (only with shards),
    OUT/shards/shard-NNNNNN.json         each with its index (``conveyor.stages.video.shards``)
    OUT/summary.json                     the run's totals
    OUT/.conveyor/                       work in progress (temporary files, staging, the
                                         shard being filled)

``OUT`` is a directory or a URL (``s3://bucket/out``; ``conveyor.storage``). Every file is
written under ``.conveyor/tmp`` and renamed into place (on an object store: uploaded whole,
which the store publishes at once), so a reader never sees half a file. A video is *complete*
once its ``videos/<relative path>.json`` exists: that record is written last, after every
clip, meta, clip-table row and embedding of the video; it names the table that holds
the video's rows (``clip_table``). Before a video's first file is written its clip ids (and
its table) are logged in staging (``intent``), so a run killed half-way can remove exactly
what the unfinished video left behind before doing it again: its files, and its rows from a
table it shares (``drop_from_group``). A shard is filled
under ``.conveyor/shards`` from complete videos only and renamed into ``shards/`` once full,
after its index; ``conveyor.stages.video.shards`` says how a resumed run keeps every clip in
one shard.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from conveyor.storage import (
    ObjectPath,
    StoragePath,
    atomic_write,
    explained,
    location,
    remove_tree,
)
from conveyor.tasks.video import video_id

INTERNAL = ".conveyor"


#: tables of fewer rows are written plain (no compression, no dictionary pages): a short
#: video's clip table is a row or a few, whose file is mostly its footer, and zstd and
#: dictionaries then make the file larger, not smaller, and cost 0.6 ms of the 2 ms its
#: writing takes (a tenth of what a 2 s video costs the pipeline besides encoding); from
#: 16 rows on they pay for themselves in bytes
PLAIN_BELOW_ROWS = 16


def parquet_options(rows: int) -> dict[str, Any]:
    """``pyarrow.parquet.write_table``'s options for a table of ``rows`` rows."""
    if rows < PLAIN_BELOW_ROWS:
        return {"compression": "none", "use_dictionary": False}
    return {"compression": "zstd"}


class OutputLayout:
    """Paths and atomic writes under one output directory (or URL prefix).

    Its paths are ``Path``s for a local output and ``ObjectPath``s for a URL; both have the
    operations the writer and the resume logic use (``/``, ``glob``, ``read_text``, ...).
    """

    def __init__(self, root: str | os.PathLike[str] | ObjectPath) -> None:
        self.root: StoragePath = location(root)
        self.clips = self.root / "clips"
        self.filtered_clips = self.root / "filtered_clips"
        self.metas = self.root / "metas"
        self.metadata = self.root / "metadata"
        self.embeddings = self.root / "embeddings"
        self.text_embeddings = self.root / "text_embeddings"
        self.videos = self.root / "videos"
        self.shards = self.root / "shards"
        self.summary = self.root / "summary.json"
        self.internal = self.root / INTERNAL
        self.tmp = self.internal / "tmp"
        self.staging = self.internal / "staging"
        #: the shard being filled (``shards``), apart from ``tmp``, which a run sweeps
        self.open_shard = self.internal / "shards"
        self.config = self.internal / "config.json"

    # -- paths ----------------------------------------------------------------------------
    def clip_path(self, clip_id: str, kept: bool = True) -> StoragePath:
        return (self.clips if kept else self.filtered_clips) / f"{clip_id}.mp4"

    def meta_path(self, clip_id: str) -> StoragePath:
        return self.metas / f"{clip_id}.json"

    def clip_table_path(self, vid: str) -> StoragePath:
        return self.metadata / f"{vid}.parquet"

    def group_table_path(self, vids: Sequence[str]) -> StoragePath:
        """The table shared by videos ``vids``, named by them: writing the same group again
        replaces it, and another group never does."""
        digest = hashlib.sha256("\n".join(sorted(vids)).encode()).hexdigest()[:GROUP_HASH]
        return self.metadata / f"{GROUP_PREFIX}{digest}.parquet"

    def table_name(self, table: StoragePath) -> str:
        """How records and intents name a clip table: ``metadata/<file>``."""
        return f"{self.metadata.name}/{table.name}"

    def table_of(self, vid: str, record: dict[str, Any] | None) -> StoragePath:
        """Where a complete video's rows are: the table its record names (a record from
        before tables were shared names none: its own)."""
        name = (record or {}).get("clip_table")
        return self.root / name if name else self.clip_table_path(vid)

    def embedding_path(self, vid: str) -> StoragePath:
        return self.embeddings / f"{vid}.parquet"

    def text_embedding_path(self, vid: str) -> StoragePath:
        return self.text_embeddings / f"{vid}.parquet"

    def video_record(self, relative_path: str) -> StoragePath:
        """``videos/<relative path>.json``; on a disk, a name that ``.json`` takes past the
        file system's limit is shortened (``record_name``)."""
        path = self.videos / f"{relative_path}.json"
        if isinstance(path, Path):
            path = path.with_name(record_name(path.name))
        return path

    def staging_dir(self, vid: str) -> StoragePath:
        return self.staging / vid

    # -- atomic writes --------------------------------------------------------------------
    @contextlib.contextmanager
    def _replacing(self, final: StoragePath) -> Iterator[IO[bytes]]:
        """A file to write that becomes ``final`` when the block ends, and nothing if it
        raises (``atomic_write``: locally a temporary under ``.conveyor/tmp``, renamed)."""
        with atomic_write(final, self.tmp) as out:
            yield out

    def write_bytes(self, path: StoragePath, data: bytes) -> None:
        """Write ``data`` to a temporary file and rename it to ``path``."""
        with self._replacing(path) as out:
            out.write(data)

    def write_json(self, path: StoragePath, obj: Any) -> None:
        # a path the OS gave as bytes that are not UTF-8 (surrogates) becomes a \u escape
        # one line: indented JSON goes through the json module's pure-Python encoder, a tenth
        # of a millisecond per record, and every clip has one
        text = json.dumps(obj, ensure_ascii=False) + "\n"
        self.write_bytes(path, text.encode("utf-8", "backslashreplace"))

    def write_parquet(self, path: StoragePath, table: Any) -> None:
        """Write ``table`` as one Parquet file: zstd with dictionaries, except for a table of
        fewer than ``PLAIN_BELOW_ROWS`` rows (``parquet_options``)."""
        import pyarrow.parquet as pq

        with self._replacing(path) as out:
            pq.write_table(table, out, **parquet_options(table.num_rows))

    def read_table(self, path: StoragePath, columns: list[str] | None = None) -> Any:
        """A Parquet file written here, as a pyarrow Table."""
        import pyarrow.parquet as pq

        if isinstance(path, Path):
            # opened here: pyarrow refuses a path that is not UTF-8 (an output named in
            # Latin-1 bytes reaches Python with surrogates)
            with open(path, "rb") as data:
                return pq.read_table(data, columns=columns)
        import pyarrow as pa

        # one GET through fsspec (not pyarrow's own S3 client): these files are small
        return pq.read_table(pa.BufferReader(path.read_bytes()), columns=columns)

    def remove_tree(self, path: StoragePath) -> None:
        """Delete a folder of the layout and everything in it (absent is fine)."""
        remove_tree(path)

    def remove_staging(self, staging: StoragePath, files: Sequence[StoragePath]) -> None:
        """Delete a video's staging that holds just ``files``: locally each file and then
        the folder (a tree walk costs more than the writing of a short video's clip), the
        whole tree where something else is there too; on a store, the prefix."""
        if not isinstance(staging, Path):
            remove_tree(staging)
            return
        for path in files:
            _unlink(path)
        try:
            staging.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            remove_tree(staging)

    # -- resume ---------------------------------------------------------------------------
    def read_record(self, relative_path: str) -> dict[str, Any] | None:
        """A complete video's record, or ``None`` (absent or unreadable: not complete)."""
        try:
            return _parse_record(self.video_record(relative_path).read_bytes())
        except OSError:
            return None

    def read_records(self, relative_paths: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        """``read_record`` of many videos at once: on a store the reads go out concurrently
        (one request per video, not one round trip after another)."""
        if isinstance(self.root, Path):
            return {rel: self.read_record(rel) for rel in relative_paths}
        if not relative_paths:
            return {}
        videos = self.videos
        assert isinstance(videos, ObjectPath)
        fs, _ = videos.filesystem()
        keys = {rel: (videos / f"{rel}.json").filesystem()[1] for rel in relative_paths}
        with explained(str(videos)):
            found = fs.cat(list(keys.values()), on_error="return")
        records: dict[str, dict[str, Any] | None] = {}
        for rel, key in keys.items():
            data = found.get(key)
            if isinstance(data, BaseException) and not isinstance(data, FileNotFoundError):
                with explained(str(self.video_record(rel))):
                    raise data
            records[rel] = _parse_record(data) if isinstance(data, bytes) else None
        return records

    def is_complete(self, relative_path: str, size: int, mtime: float) -> bool:
        """Finished in an earlier run from this very file (same size and modification time)."""
        return same_source(self.read_record(relative_path), size, mtime)

    def started_videos(self) -> set[str]:
        """Ids of the videos something was written for (a record or staging): one listing of
        ``videos/`` and of the staging, so that a store is not asked about every video."""
        vids: set[str] = set()
        if isinstance(self.root, Path):
            if self.videos.is_dir():
                vids.update(
                    video_id(p.relative_to(self.videos).as_posix()[: -len(".json")])
                    for p in self.videos.rglob("*.json")
                )
            if self.staging.is_dir():
                vids.update(p.name for p in self.staging.iterdir())
            return vids
        assert isinstance(self.videos, ObjectPath) and isinstance(self.staging, ObjectPath)
        vids.update(
            video_id(e.relative[: -len(".json")])
            for e in self.videos.find()
            if e.relative.endswith(".json")
        )
        vids.update(e.relative.split("/", 1)[0] for e in self.staging.find())
        return vids

    def reset(self, relative_path: str) -> int:
        """Remove what an unfinished (or outdated) run of this video left; returns files
        removed. Clip files are found through the staging intents and the old record."""
        vid = video_id(relative_path)
        removed = 0
        ids: set[str] = set()
        tables: set[str] = set()
        staging = self.staging_dir(vid)
        for intent in staging.glob("intent-*.json"):
            logged, table = _intent(intent)
            ids.update(logged)
            tables.add(table)
        record = self.read_record(relative_path)
        if record is not None:
            ids.update(record.get("clips", []))
            tables.add(record.get("clip_table") or "")
        removed += self.remove_clips(ids)
        for name in sorted(tables):
            if is_group_table(name):
                self.drop_from_group(name, vid)
        for path in (
            self.clip_table_path(vid),
            self.embedding_path(vid),
            self.text_embedding_path(vid),
            self.video_record(relative_path),
        ):
            removed += _unlink(path)
        remove_tree(staging)
        return removed

    def remove_clips(self, ids: Iterable[str]) -> int:
        """Delete the clip files (kept or filtered) and metas of ``ids``; returns files
        removed."""
        removed = 0
        for cid in ids:
            for path in (self.clip_path(cid), self.clip_path(cid, False), self.meta_path(cid)):
                removed += _unlink(path)
        return removed

    def resume_video(self, relative_path: str, size: int, mtime: float) -> tuple[int, str] | None:
        """Before an unfinished video is done again: keep the clips an earlier run of this
        very file finished, remove the rest of what it left; returns this attempt's
        generation and the list of the clips kept (``resumed_clips``), or ``None`` where
        nothing is kept (``reset`` then removed everything).

        A clip is finished when the record of the staged part holding it exists (the writer
        writes it after the part's clips, metas and rows). A video that ran for an hour
        before a stop is not redone from its start: the splitter marks those clips
        ``Clip.restored`` and the writer adopts their staged parts. The clips of parts
        without a record, of another source file (size or time) or of a video whose record
        exists (outdated, or a clip deleted) are removed as ``reset`` does."""
        vid = video_id(relative_path)
        staging = self.staging_dir(vid)
        if self.read_record(relative_path) is not None:
            self.reset(relative_path)
            return None
        files = {p.name: p for p in staging.glob("*")}
        stamp = {"size_bytes": size, "mtime": mtime}
        finished: dict[str, dict[str, Any]] = {}
        for name, path in files.items():
            staged = staged_part(name)
            if staged is not None and staged[0] == "chunk":
                with contextlib.suppress(OSError):
                    record = _parse_record(path.read_bytes())
                    if record is not None and self._whole_part(record, stamp, files):
                        finished[staged[2]] = record
        index: dict[str, str] = {}
        for key, record in sorted(finished.items()):
            for cid in _intent(files.get(f"intent-{key}.json"))[0] or record.get("clips", []):
                index.setdefault(cid, key)
        if not index:
            self.reset(relative_path)
            return None
        ids: set[str] = set()
        tables: set[str] = set()
        doomed = []
        # an earlier attempt's tables a finished part adopted stay, their part's record gone
        named = {n for r in finished.values() for names in r["files"].values() for n in names}
        for name, path in files.items():
            staged = staged_part(name)
            if name in named or (staged is not None and staged[2] in finished):
                continue
            if staged is not None and staged[0] == "intent":
                logged, table = _intent(path)
                ids.update(logged)
                tables.add(table)
            doomed.append(path)
        # the clips first, their intents last: a stop half way leaves them to be found
        self.remove_clips(ids - index.keys())
        for name in sorted(tables):
            if is_group_table(name):
                self.drop_from_group(name, vid)
        for path in sorted(doomed, key=lambda p: p.name.startswith("intent-")):
            _unlink(path)
        generation = 1 + max(staged_generation(key) for key in finished)
        resume = staging / f"{RESUME_PREFIX}{generation}.json"
        self.write_json(resume, {"generation": generation, "clips": index})
        return generation, str(resume)

    def _whole_part(
        self, record: dict[str, Any], stamp: dict[str, Any], files: Iterable[str]
    ) -> bool:
        """Whether a staged part's record is of this source, every table it names is there
        (one gone would keep its video from ever being finalised) and, in a local output,
        every clip it kept (one deleted by hand was adopted as there)."""
        named = record.get("files")
        if record.get("source") != stamp or not isinstance(named, dict):
            return False
        if not all(name in files for names in named.values() for name in names):
            return False
        return not self.kept_clips_missing(record)

    def kept_clips_missing(self, record: dict[str, Any]) -> bool:
        """Whether a kept clip a record names (a video's, or a staged part's) has no file in a
        local output: one deleted by hand was counted as there. On a bucket the check would
        cost a request per clip, and is not made."""
        if not isinstance(self.clips, Path):
            return False
        return not all(Path(self.clip_path(c)).exists() for c in record.get("kept") or ())

    def drop_from_group(self, name: str, vid: str | None = None) -> int:
        """Rewrite the shared table ``name`` (``metadata/group-...parquet``) with only the
        rows of videos other than ``vid`` whose records name it (removed when none is left);
        returns rows dropped.

        A video redone (its source changed, or its writing failed after the table was
        written) leaves its rows behind in the group it was written with; its new rows are
        elsewhere. The rule reads only records, so writers dropping rows from one table at
        once agree on the result; on a local output they also take turns (a lock)."""
        table = self.root / name
        with self._locked(table):
            try:
                rows = self.read_table(table)
            except FileNotFoundError:
                return 0
            sources = dict(
                zip(
                    rows.column("video_id").to_pylist(),
                    rows.column("source_video").to_pylist(),
                    strict=True,
                )
            )
            keep = {
                v
                for v, source in sources.items()
                if v != vid and (self.read_record(source) or {}).get("clip_table") == name
            }
            if len(keep) == len(sources):
                return 0
            import pyarrow as pa
            import pyarrow.compute as pc

            members = pa.array(sorted(keep), type=pa.string())
            kept = rows.filter(pc.is_in(rows.column("video_id"), members))
            if kept.num_rows:
                self.write_parquet(table, kept)
            else:
                _unlink(table)
            return rows.num_rows - kept.num_rows

    @contextlib.contextmanager
    def _locked(self, table: StoragePath) -> Iterator[None]:
        """Hold a lock named for ``table`` (local outputs; a store has none to take)."""
        if not isinstance(table, Path) or not isinstance(self.tmp, Path):
            yield
            return
        import fcntl

        self.tmp.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.tmp / f"{table.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def sweep_tmp(self) -> int:
        """Delete temporary files a killed run left (only one run may use ``root`` at once)."""
        if isinstance(self.tmp, Path) and not self.tmp.is_dir():
            return 0  # (a store's listing of an absent prefix is simply empty)
        removed = 0
        for path in self.tmp.iterdir():
            removed += _unlink(path)
        return removed


#: a shared clip table's name: this, then ``GROUP_HASH`` hex digits of its videos' ids
GROUP_PREFIX = "group-"
GROUP_HASH = 20


def is_group_table(name: str | None) -> bool:
    """Whether ``name`` (``metadata/...parquet``) is a table shared by several videos."""
    return name is not None and name.rsplit("/", 1)[-1].startswith(GROUP_PREFIX)


#: the longest file name most file systems take, in bytes (ext4, XFS, APFS, NTFS in UTF-16)
NAME_MAX = 255
#: hex digits of the full name's hash a shortened record name ends with
NAME_HASH = 16


def record_name(name: str) -> str:
    """``name`` if it fits ``NAME_MAX`` bytes, else its start, ``~`` and a hash of all of it
    (then ``.json``): a video named up to the limit still gets its record, under a name that
    is the same in every run. The record holds the full ``source_video`` path."""
    data = name.encode()
    if len(data) <= NAME_MAX:
        return name
    tail = f"~{hashlib.sha256(data).hexdigest()[:NAME_HASH]}.json"
    head = data[: NAME_MAX - len(tail)].decode(errors="ignore")  # whole characters only
    return head + tail


def _parse_record(data: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class GroupCount:
    """How many complete videos' records name each shared table, against how many videos
    it was written with (``clip_table_videos``): a table named by fewer holds rows of a
    video whose record was deleted (done again, its rows are elsewhere), which no record
    leads to. Counting the records a listing reads anyway finds them at no cost.

    Records written before the count (``unknown``) cannot say: their tables are checked
    only in a listing that found a video to do with no record at all (``recordless``),
    the one way such rows come about, once per such run."""

    def __init__(self) -> None:
        self.named: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.unknown: set[str] = set()
        self.recordless = False

    def add(self, record: dict[str, Any]) -> None:
        name, count = record.get("clip_table"), record.get("clip_table_videos")
        if not isinstance(name, str) or not is_group_table(name):
            return
        if isinstance(count, int):
            self.named[name] = self.named.get(name, 0) + 1
            self.written[name] = count
        else:
            self.unknown.add(name)

    def stale(self) -> list[str]:
        """The tables some video written with them may no longer name (their rows to drop:
        ``drop_from_group`` keeps those of the videos whose records name the table)."""
        found = {n for n, count in self.written.items() if self.named[n] < count}
        return sorted(found | self.unknown if self.recordless else found)


def same_source(record: dict[str, Any] | None, size: int, mtime: float) -> bool:
    """Whether ``record`` was made from a file of this size and modification time."""
    if record is None:
        return False
    source = record.get("source", {})
    return source.get("size_bytes") == size and source.get("mtime") == mtime


#: a video's staged files: ``<kind>-[g<generation>-]<chunk>-<part>.<json|parquet>``
_STAGED = re.compile(
    r"^(chunk|intent|clips|embed|text)-((?:g(\d+)-)?\d{6}-\d{6})\.(?:json|parquet)$"
)
#: the list of the clips an interrupted run finished: ``resume-g<generation>.json``
RESUME_PREFIX = "resume-g"


def staged_part(name: str) -> tuple[str, int, str] | None:
    """A staged file's kind, generation and part key (``g1-000003-000000``), or ``None``."""
    found = _STAGED.match(name)
    if found is None:
        return None
    return found[1], int(found[3] or 0), found[2]


def staged_generation(key: str) -> int:
    """The generation of a part key (0: a first attempt's, named without one)."""
    return int(key[1 : key.index("-")]) if key.startswith("g") else 0


@functools.lru_cache(maxsize=64)
def resumed_clips(resume: str) -> dict[str, str]:
    """The clips an interrupted run finished (``OutputLayout.resume_video``): clip id ->
    the key of the staged part that holds it. Read once per worker and video (the file
    never changes once written)."""
    data = json.loads(location(resume).read_bytes())
    clips = data.get("clips") if isinstance(data, dict) else None
    if not isinstance(clips, dict):
        raise ValueError(f"{resume}: not a list of resumed clips")
    return clips


def _intent(path: StoragePath | None) -> tuple[list[str], str]:
    """The clip ids an intent names and the table their rows go to (none: no intent, or
    an unreadable one)."""
    try:
        logged = json.loads(path.read_bytes()) if path is not None else None
    except (OSError, ValueError):
        return [], ""
    if not isinstance(logged, dict):
        return [], ""
    ids, table = logged.get("clip_ids"), logged.get("clip_table")
    ids = [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
    return ids, table if isinstance(table, str) else ""


def _unlink(path: StoragePath) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1


def relative_paths(records: Iterable[Path], videos_dir: Path) -> list[str]:
    """Relative source paths of the records under ``videos_dir``."""
    return sorted(str(p.relative_to(videos_dir))[: -len(".json")] for p in records)
