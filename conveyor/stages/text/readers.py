"""Reading a text corpus as users have it: directories, globs, many files, big files, JSONL
(plain, ``.gz``, ``.zst``) and Parquet, with every malformed line counted instead of fatal.

``list_inputs`` finds the files (sorted, so the same input always gives the same run);
``plan_reads`` packs them into ``ReadTask``s of about ``chunk_bytes`` of input each, splitting
a big uncompressed JSONL file into byte ranges (a compressed file cannot be split and is read
whole; its reader hands on sub-batches of ``chunk_bytes``); ``TextReader`` reads a task into
``DocumentBatch``es that keep every input field as a column and add ``_conveyor_doc_id``:
an int64 that is unique across the dataset and grows in input order, ``(file index << 40) |
byte offset`` of the line (its row number in a Parquet file). Its name is one no input
has (an input's own ``_doc_id`` was taken for it and dropped).

A line that is not valid UTF-8, not JSON, not an object, nested deeper than ``MAX_DEPTH``
levels, longer than ``max_doc_bytes`` (a Parquet row: its text), or whose text field is
missing or not a string is counted in the batch's metadata with its file, line number and
reason (the first ``max_samples`` per task), and the reader goes on with the next line. A
line is read at most ``max_doc_bytes`` at a time, so a line of gigabytes (a decompression
bomb) is skipped without ever being held whole. A file that cannot be read or ends early
(a truncated ``.gz``) keeps the lines before the problem and is reported in
``metadata["file_errors"]``. A split file's line numbers are relative to its
byte range: ``metadata["segments"]`` gives each range's line count so that whoever collects
the batches can make them absolute (``absolute_lines``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.text import _arrow  # noqa: F401 - pandas/pyarrow set-up once
from conveyor.storage import ObjectPath, glob_files, has_magic, location, open_input
from conveyor.tasks import DocumentBatch
from conveyor.tasks.base import Task

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import pyarrow as pa

#: internal column: the document's id (never written to the final output)
DOC_ID = "_conveyor_doc_id"
#: field metadata of a column whose values are JSON text (``json_field``)
JSON_VALUES = {b"conveyor.values": b"json"}
#: bits of ``_conveyor_doc_id`` for the byte offset (row number) inside a file: 1 TiB per file,
#: 8 million files
OFFSET_BITS = 40
MAX_FILES = 1 << (63 - OFFSET_BITS)
#: input bytes per read task: small enough that a corpus of a few hundred MB still makes
#: dozens of tasks for the stages after the reader to share out
DEFAULT_CHUNK_BYTES = 16 << 20
#: a compressed file's content is guessed at this many times its size when packing tasks
COMPRESSION_RATIO = 4
#: the most bytes of one document (a JSONL line, decompressed, without its line end; a
#: Parquet row's text): a longer one is counted malformed, never parsed. The stages after
#: the reader hold many times a document's size while they split it into words and shingles
#: (a 600 MB line took 11.8 GB, 17.8 GB with fuzzy dedup), so one huge document must not
#: reach them. Real documents stay well below 16 MiB: a web page's text is a few to tens of
#: KB, a Wikipedia page at most 2 MB of wikitext (MediaWiki's page limit), War and Peace
#: about 3 MB, the King James Bible 4.3 MB, Shakespeare's complete works 5.5 MB; more is a
#: dump, a log or an encoded file in a text field. (The default filters drop a document of
#: more than 100,000 words, about 600 KB of English, anyway.)
DEFAULT_MAX_DOC_BYTES = 16 << 20
#: the deepest a JSON record may nest (the record itself is level 1): a Parquet reader
#: refuses a schema deeper than 100 levels and an array takes two of them, so a record
#: nested deeper was written to a part that nothing could read back (with dedup: the staged
#: part, and its task's documents were lost), and from about 160 levels it failed its whole
#: task (too deep to pickle), other files' documents with it
MAX_DEPTH = 50
#: metadata keys a ``TextReader`` batch carries
READ = "read"
MALFORMED = "malformed_lines"
SEGMENTS = "segments"
FILE_ERRORS = "file_errors"
SHARD = "shard"
#: on a task's last batch: how many batches the task made (a resumed run knows by it
#: that every batch of a task reached the end)
BATCHES = "batches"

Kind = Literal["jsonl", "parquet"]
Compression = Literal["gzip", "zstd"] | None

_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson", ".jsonlines")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_COMPRESSION_SUFFIXES: dict[str, Compression] = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BOM = b"\xef\xbb\xbf"
_SNIPPET = 60
#: what ``list_inputs`` looks for in a directory, for messages
LOOKED_FOR = ".jsonl .json .ndjson (also .gz or .zst compressed) and .parquet"


class InputError(ValueError):
    """The input names nothing readable: a missing path, a glob matching nothing, an empty
    folder. The message is one line, fit for a command's error output."""


# -- finding files --------------------------------------------------------------------------
def classify(name: str, *, strict: bool = True) -> tuple[Kind, Compression] | None:
    """A file's format from its name: ``("jsonl", "gzip")`` for ``a.jsonl.gz``. With
    ``strict=False`` (files named explicitly) an unknown suffix is read as JSONL."""
    lower = name.lower()
    compression: Compression = None
    for suffix, kind in _COMPRESSION_SUFFIXES.items():
        if lower.endswith(suffix):
            compression = kind
            lower = lower[: -len(suffix)]
            break
    if lower.endswith(_PARQUET_SUFFIXES) and compression is None:
        return "parquet", None
    if lower.endswith(_JSONL_SUFFIXES) or not strict:
        return "jsonl", compression
    return None


@dataclass(frozen=True)
class InputFile:
    """One input file: where it is, its position in the sorted listing, size and format."""

    path: str
    index: int
    size: int
    kind: Kind
    compression: Compression


@dataclass
class InputListing:
    """What ``list_inputs`` found: the files to read (sorted) and what it left out."""

    source: str
    files: list[InputFile]
    #: files a directory held that are not text data (by their suffix)
    ignored: list[str] = field(default_factory=list)
    #: links a directory held whose target is not there
    broken: list[str] = field(default_factory=list)
    #: folders inside a directory that hold an earlier Conveyor run's output (not read)
    outputs: list[str] = field(default_factory=list)

    @property
    def empty(self) -> list[str]:
        return [f.path for f in self.files if f.size == 0]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _under(path: str, prefixes: Sequence[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def list_inputs(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    exclude: Sequence[str] = (),
    skip_outputs: bool = True,
) -> InputListing:
    """The input files of ``source``: a file, a directory (searched recursively for
    ``LOOKED_FOR``; hidden files and folders skipped), or a glob (``data/*.jsonl.gz``,
    ``data/**/*.parquet``), local or a URL; or a list of them (read in that order, each
    file once). Files under ``exclude`` (the output) are left out, and with ``skip_outputs``
    the folders inside a directory that hold an earlier run's output (``earlier_output``).

    Raises ``InputError`` for a missing path, a glob that matches nothing, a directory with no
    text data, or more files than ``_conveyor_doc_id`` can number.
    """
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not sources:
        raise InputError("no INPUT given")
    excluded = [str(location(os.fspath(e))) for e in exclude]
    listings = []
    for one in sources:
        text = os.fspath(one)
        where = location(text)
        if isinstance(where, ObjectPath):
            listings.append(_list_url(where, excluded))
        else:
            listings.append(_list_local(text, excluded, skip_outputs))
    listing = listings[0]
    if len(listings) > 1:
        seen: set[str] = set()
        files: list[InputFile] = []
        for part in listings:
            for f in part.files:
                if f.path not in seen:
                    seen.add(f.path)
                    files.append(InputFile(f.path, len(files), f.size, f.kind, f.compression))
        listing = InputListing(
            ", ".join(os.fspath(s) for s in sources),
            files,
            [path for part in listings for path in part.ignored],
            list(dict.fromkeys(path for part in listings for path in part.broken)),
            list(dict.fromkeys(path for part in listings for path in part.outputs)),
        )
    if len(listing.files) > MAX_FILES:
        raise InputError(
            f"INPUT {listing.source!r} holds {len(listing.files):,} files; at most "
            f"{MAX_FILES:,} can be read in one run"
        )
    return listing


def _list_local(text: str, excluded: list[str], skip_outputs: bool) -> InputListing:
    path = location(text)
    assert isinstance(path, Path)
    if has_magic(str(path)):
        found = [f for f in glob_files(str(path)) if not _under(f[0], excluded)]
        if not found:
            raise InputError(f"INPUT glob {text!r} matches no file")
        return _glob_listing(text, found)
    if not path.exists():
        raise InputError(f"INPUT {text!r} does not exist")
    if path.is_file():
        return _listing(text, [(str(path), path.stat().st_size)], strict=False)
    if not path.is_dir():
        raise InputError(f"INPUT {text!r} is neither a file nor a directory")
    walk = _Walk(path, excluded, skip_outputs)
    walk.run()
    listing = _directory_listing(text, [(full, size) for _, full, size in sorted(walk.entries)])
    listing.broken = sorted(walk.broken)
    listing.outputs = sorted(walk.outputs)
    return listing


@dataclass
class _Walk:
    """A local folder's files, recursively (hidden ones skipped). A linked folder or file is
    followed where its target lies outside the folder, once per real one (one inside is
    read where it is, and one to a folder holding it would read that whole folder); a link
    to nothing is kept in ``broken`` to be said, not skipped without a word. A subfolder
    holding an earlier run's output (``earlier_output``) is left out and kept in ``outputs``:
    its parts, summary and event log were read as documents again."""

    root: Path
    excluded: list[str]
    skip_outputs: bool = True
    entries: list[tuple[str, str, int]] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def run(self) -> None:
        top = os.path.realpath(self.root)
        seen = {top}
        for folder, dirs, names in os.walk(self.root, followlinks=True, onerror=_unreadable):
            if self.skip_outputs and earlier_output(dirs, names):
                if folder != str(self.root):
                    if not _under(folder, self.excluded):  # (this run's own OUTPUT: unsaid)
                        self.outputs.append(folder)
                    dirs[:] = []
                    continue
                # INPUT itself is an output (its documents read again, or one written beside
                # the file it read): its summary, event log and report are no documents
                names = [n for n in names if n not in RUN_FILES]
            kept = []
            for name in sorted(dirs):
                full = os.path.join(folder, name)
                real = os.path.realpath(full)
                if name.startswith(".") or real in seen or self._inside(full, real, top):
                    continue
                seen.add(real)
                kept.append(name)
            dirs[:] = kept
            for name in names:
                full = os.path.join(folder, name)
                if name.startswith(".") or _under(full, self.excluded):
                    continue
                if not os.path.exists(full):
                    if os.path.islink(full):
                        self.broken.append(full)
                    continue
                real = os.path.realpath(full)
                if not os.path.isfile(full) or real in seen or self._inside(full, real, top):
                    continue
                seen.add(real)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                self.entries.append((rel, full, os.path.getsize(full)))

    @staticmethod
    def _inside(full: str, real: str, top: str) -> bool:
        """A link whose target lies in the folder walked (read there, not through it), or
        holds it (its whole parent would be read)."""
        return os.path.islink(full) and (
            real == top or real.startswith(top + os.sep) or top.startswith(real + os.sep)
        )


def _unreadable(exc: OSError) -> None:
    """A folder the walk cannot read is skipped, as ``os.walk`` does, but said."""
    log.warning("%s is skipped: it cannot be read (%s)", exc.filename, exc.strerror or exc)


#: the files a run writes at its output's top that hold no documents
RUN_FILES = ("summary.json", "events.jsonl", "report.html", "dedup.json")


def earlier_output(dirs: Sequence[str], names: Sequence[str]) -> bool:
    """Whether a folder of these subfolders and files is a Conveyor run's output: a work
    folder (``.conveyor/``: video and image runs, a text run under way), a text run's
    ``documents/`` (or the part files runs before it published at the top) beside its
    ``summary.json``, or ``conveyor dedup``'s two files."""
    from conveyor.stages.text.writers import published_pattern

    files = set(names)
    if ".conveyor" in dirs:
        return True
    if "summary.json" in files and (
        "documents" in dirs or any(published_pattern().fullmatch(n) for n in files)
    ):
        return True
    return {"dedup.json", "duplicates.parquet"} <= files


def _list_url(where: ObjectPath, excluded: list[str]) -> InputListing:
    text = str(where)
    if has_magic(text):
        found = [f for f in glob_files(text) if not _under(f[0], excluded)]
        if not found:
            raise InputError(f"INPUT glob {text!r} matches no file")
        return _glob_listing(text, found)
    try:
        info = where.info()
    except FileNotFoundError:
        raise InputError(f"INPUT {text!r} does not exist") from None
    if info.get("type") != "directory":
        return _listing(text, [(text, int(info.get("size") or 0))], strict=False)
    found = [
        (str(e.path), e.size)
        for e in where.find()
        if not any(part.startswith(".") for part in e.relative.split("/"))
        and not _under(str(e.path), excluded)
    ]
    return _directory_listing(text, found)


def _glob_listing(text: str, found: list[tuple[str, int]]) -> InputListing:
    """What a glob matched: its text data files, or every file it matched when none has a
    known suffix (``data/*.txt`` asks for those files, whatever they are called)."""
    listing = _listing(text, found, strict=True)
    return listing if listing.files else _listing(text, found, strict=False)


def _directory_listing(text: str, found: list[tuple[str, int]]) -> InputListing:
    listing = _listing(text, found, strict=True)
    if not listing.files:
        extra = f" ({len(listing.ignored)} other file(s) ignored)" if listing.ignored else ""
        raise InputError(
            f"no input files under {text!r}: looked for {LOOKED_FOR}, recursively{extra}"
        )
    return listing


def _listing(text: str, found: list[tuple[str, int]], *, strict: bool) -> InputListing:
    files: list[InputFile] = []
    ignored: list[str] = []
    for path, size in found:
        kind = classify(path.rsplit("/", 1)[-1], strict=strict)
        if kind is None:
            ignored.append(path)
            continue
        files.append(InputFile(path, len(files), int(size), kind[0], kind[1]))
    return InputListing(text, files, ignored)


# -- planning -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """A part of one input file: bytes ``[start, end)`` of a JSONL file (of its decompressed
    content for a compressed one), rows ``[start, end)`` of a Parquet file. ``end=None``
    reads to the end. ``chunk`` numbers the segments of a file that was split."""

    path: str
    file_index: int
    kind: Kind
    compression: Compression = None
    start: int = 0
    end: int | None = None
    chunk: int = 0


@dataclass
class ReadTask(Task[list[Segment]]):
    """Segments read together by one ``TextReader`` call; ``index`` orders the tasks (and
    names what is written from them)."""

    index: int = 0

    @property
    def key(self) -> tuple[Any, ...]:
        """What a journal knows this task by: its segments' paths and ranges."""
        return tuple(f"{s.path}@{s.start}" for s in self.data)

    @property
    def num_items(self) -> int:
        return len(self.data or [])


def sniff_compression(path: str) -> Compression:
    """``gzip`` or ``zstd`` when the file starts with that format's magic number."""
    try:
        with open_input(path) as stream:
            head = stream.read(4)
    except OSError:
        return None
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    return None


def plan_reads(
    files: Sequence[InputFile],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    limit: int | None = None,
    max_files_per_task: int = 256,
) -> list[ReadTask]:
    """Pack ``files`` (in order) into tasks of about ``chunk_bytes`` of input each.

    An uncompressed JSONL file larger than ``chunk_bytes`` is split into byte ranges, one
    task each, a Parquet file into runs of whole row groups; compressed files are read
    whole; small files share a task.
    ``limit`` keeps only the first ``limit`` records (non-blank lines, Parquet rows) of the
    input, in order. Empty files are left out.
    """
    if chunk_bytes < 1:
        raise ValueError(f"plan_reads: chunk_bytes must be >= 1, got {chunk_bytes}")
    segments: list[tuple[Segment, int]] = []  # (segment, estimated bytes)
    remaining = limit
    for file in files:
        if remaining is not None and remaining <= 0:
            break
        if file.size == 0:
            continue
        compression = file.compression
        end: int | None = None
        if remaining is not None:
            end, count = _limit_end(file, compression, remaining)
            remaining -= count
            if count == 0:
                continue
        if file.kind == "parquet" and file.size > chunk_bytes:
            segments.extend(_parquet_segments(file, chunk_bytes, end))
            continue
        if file.kind == "jsonl" and compression is None and file.size > chunk_bytes:
            compression = sniff_compression(file.path)
        if file.kind == "jsonl" and compression is None:
            stop = file.size if end is None else min(end, file.size)
            pieces = max(1, -(-stop // chunk_bytes))
            for chunk in range(pieces):
                first = chunk * chunk_bytes
                last = None if chunk == pieces - 1 and end is None else (chunk + 1) * chunk_bytes
                if chunk == pieces - 1 and end is not None:
                    last = end
                segment = Segment(file.path, file.index, "jsonl", None, first, last, chunk)
                segments.append((segment, (last or file.size) - first))
            continue
        estimate = file.size * (COMPRESSION_RATIO if compression else 1)
        segments.append(
            (Segment(file.path, file.index, file.kind, compression, 0, end, 0), estimate)
        )
    tasks: list[ReadTask] = []
    pack: list[Segment] = []
    packed = 0
    for segment, estimate in segments:
        if pack and (packed + estimate > chunk_bytes or len(pack) >= max_files_per_task):
            tasks.append(ReadTask(data=pack, index=len(tasks)))
            pack, packed = [], 0
        pack.append(segment)
        packed += estimate
    if pack:
        tasks.append(ReadTask(data=pack, index=len(tasks)))
    return tasks


def _parquet_segments(
    file: InputFile, chunk_bytes: int, end: int | None
) -> list[tuple[Segment, int]]:
    """A Parquet file as runs of whole row groups of about ``chunk_bytes`` (their sizes in
    its footer), rows ``[start, end)`` each, up to row ``end``: read whole by one task, a
    1 GB file grew its worker's memory with the file."""
    import pyarrow.parquet as pq

    try:
        with open_input(file.path) as stream:
            meta = pq.ParquetFile(stream).metadata
    except (OSError, ValueError):  # not Parquet, cut short: its reader says so, for it alone
        return [(Segment(file.path, file.index, "parquet", None, 0, end, 0), file.size)]
    runs: list[tuple[int, int, int]] = []  # (first row, last row, bytes)
    first = rows = size = 0
    for i in range(meta.num_row_groups):
        if end is not None and rows >= end:
            break
        group = meta.row_group(i)
        nbytes = sum(group.column(j).total_compressed_size for j in range(group.num_columns))
        if rows > first and size + nbytes > chunk_bytes:
            runs.append((first, rows, size))
            first, size = rows, 0
        rows += group.num_rows
        size += nbytes
    runs.append((first, rows, size))
    pieces = []
    for chunk, (start, stop, size) in enumerate(runs):
        last = end if chunk == len(runs) - 1 else stop  # the last run reads to the end
        segment = Segment(file.path, file.index, "parquet", None, start, last, chunk)
        pieces.append((segment, max(1, size)))
    return pieces


def _limit_end(file: InputFile, compression: Compression, wanted: int) -> tuple[int | None, int]:
    """Where the first ``wanted`` records of ``file`` end (a byte offset, a row count; None:
    the whole file) and how many records that is."""
    if file.kind == "parquet":
        import pyarrow.parquet as pq

        try:
            with open_input(file.path) as stream:
                rows = pq.ParquetFile(stream).metadata.num_rows
        except (OSError, ValueError):  # its reader says what is wrong, for it alone
            return None, 1
        return (None, rows) if rows <= wanted else (wanted, wanted)
    count = pos = 0
    with _jsonl_stream(file.path, compression) as (stream, _):
        while True:  # (a line of gigabytes is read a part at a time: it is not a document)
            line, size = read_line(stream, PEEK_LINE_BYTES)
            if not size:
                break
            pos += size
            if line is None or line.strip():
                count += 1
                if count == wanted:
                    return pos, count
    return None, count


# -- reading --------------------------------------------------------------------------------
@contextlib.contextmanager
def _jsonl_stream(path: str, compression: Compression) -> Iterator[tuple[IO[bytes], bool]]:
    """The (decompressed) bytes of a JSONL file and whether they are decompressed. The
    format comes from the file's first bytes when they name one, else from its name."""
    with open_input(path) as raw:
        head = raw.peek(4)[:4] if hasattr(raw, "peek") else b""
        if head.startswith(_GZIP_MAGIC):
            compression = "gzip"
        elif head.startswith(_ZSTD_MAGIC):
            compression = "zstd"
        elif head:
            compression = None
        if compression == "gzip":
            import gzip

            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield unzipped, True
        elif compression == "zstd":
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            with reader:
                yield io.BufferedReader(reader, 1 << 20), True  # type: ignore[arg-type]
        else:
            yield raw, False


#: bytes read at a time while skipping the rest of a line too long to keep
_SKIP_BYTES = 1 << 20


def read_line(stream: IO[bytes], most: int | None) -> tuple[bytes | None, int]:
    """The next line of ``stream`` (with its line end; ``b""`` at the end) and its length in
    bytes; ``None`` for a line longer than ``most`` bytes without its line end, which is
    never held whole: it is read through ``_SKIP_BYTES`` at a time (its length is still
    given). ``most=None``: no limit."""
    if most is None:
        line = stream.readline()
        return line, len(line)
    line = stream.readline(most + 2)  # room for the line and a "\r\n"
    size = len(line)
    if size <= most:
        return line, size
    if line.endswith(b"\n"):
        end = 2 if line.endswith(b"\r\n") else 1
        return (line, size) if size - end <= most else (None, size)
    while True:  # no line end yet: the line is longer than ``most``
        rest = stream.readline(_SKIP_BYTES)
        size += len(rest)
        if not rest or rest.endswith(b"\n"):
            return None, size


#: records of the first input file looked at before a run for its text field, and the most
#: of a line read (at a longer one the look ends: the run reads it)
FIELD_PEEK = 100
PEEK_LINE_BYTES = 16 << 20


def text_field_problem(listing: InputListing, field: str) -> str | None:
    """Why ``field`` is surely not the input's text field, or None: the first non-empty
    file's Parquet schema lacks it, or none of its first ``FIELD_PEEK`` JSON records has it
    (a run over the whole input found it only at the end, every record of every file
    malformed). Anything less certain (a file that does not parse) is left to
    the run, which counts what it cannot read."""
    peek = _first_fields(listing)
    if peek is None or field in peek.names:
        return None
    if peek.records is None:
        return f"{peek.path} has no column {field!r} (it has {', '.join(peek.names[:12])})"
    fields = ", ".join(peek.names[:12]) or "no fields"
    return (
        f"none of the first {peek.records} record(s) of {peek.path} has a field {field!r} "
        f"(their fields: {fields})"
    )


def field_clash(listing: InputListing, written: Sequence[str]) -> str | None:
    """Which of the fields a pipeline ``written`` (adds to every document) the input's
    first records have already, said, or None: the run would replace them."""
    peek = _first_fields(listing)
    found = [name for name in written if peek is not None and name in peek.names]
    if not found:
        return None
    names = " and ".join(map(repr, found))
    if peek.records is None:
        return f"the columns of {peek.path} include {names}"
    return f"records among the first {peek.records} of {peek.path} have {names}"


@dataclass(frozen=True)
class _Peek:
    path: str
    names: list[str]
    #: JSON records read (None: a Parquet schema)
    records: int | None


def _first_fields(listing: InputListing) -> _Peek | None:
    """The fields of the first non-empty file: its Parquet schema's, or those of its first
    ``FIELD_PEEK`` JSON records, in first-seen order; None where there is no such file, no
    record parses, or it cannot be read now (the run says why, file by file)."""
    first = next((f for f in listing.files if f.size > 0), None)
    if first is None:
        return None
    try:
        if first.kind == "parquet":
            import pyarrow.parquet as pq

            with open_input(first.path) as raw:
                names = pq.ParquetFile(raw).schema_arrow.names
            return _Peek(first.path, names, None)
        seen: dict[str, None] = {}
        records = 0
        with _jsonl_stream(first.path, first.compression) as (stream, _):
            for _ in range(FIELD_PEEK):
                line = stream.readline(PEEK_LINE_BYTES)  # a line of gigabytes is not read
                if not line or (len(line) == PEEK_LINE_BYTES and not line.endswith(b"\n")):
                    break
                try:
                    record = json.loads(line.removeprefix(_BOM))
                except ValueError:
                    continue
                if not isinstance(record, dict):
                    continue
                records += 1
                seen.update(dict.fromkeys(record))
    except Exception:  # noqa: BLE001 - unreadable now: the run says why, file by file
        return None
    return _Peek(first.path, list(seen), records) if records else None


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _SNIPPET else text[: _SNIPPET - 3] + "..."


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", bool: "a boolean", str: "a string"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _lone_surrogate(record: Any) -> bool:
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _Batcher:
    """Collects one task's documents and counts, and cuts them into batches."""

    def __init__(self, stage: TextReader, task: ReadTask) -> None:
        self.stage = stage
        self.task = task
        self.records: list[dict[str, Any]] = []
        self.ids: list[int] = []
        self.tables: list[pa.Table] = []  # pieces of the next batch, in input order
        self.pending_bytes = 0
        self.batches: list[DocumentBatch] = []
        self.counts = {"documents": 0, "malformed": 0, "blank": 0}
        self.samples: list[dict[str, Any]] = []
        self.segments: list[dict[str, Any]] = []
        self.file_errors: list[dict[str, Any]] = []

    def malformed(self, segment: Segment, line: int, offset: int, reason: str) -> None:
        self.counts["malformed"] += 1
        if len(self.samples) < self.stage.max_samples:
            where = "row" if segment.kind == "parquet" else "line"
            self.samples.append(
                {
                    "file": segment.path,
                    "file_index": segment.file_index,
                    "chunk": segment.chunk,
                    where: line,
                    "offset": offset,
                    "reason": reason,
                }
            )

    def add(self, record: dict[str, Any], doc_id: int, nbytes: int) -> None:
        self.records.append(record)
        self.ids.append(doc_id)
        self.counts["documents"] += 1
        self.pending_bytes += nbytes
        if self.pending_bytes >= self.stage.batch_bytes:
            self.flush()

    def add_table(self, table: pa.Table) -> None:
        self._seal()
        self.tables.append(table)
        self.counts["documents"] += table.num_rows
        self.pending_bytes += table.nbytes
        if self.pending_bytes >= self.stage.batch_bytes:
            self.flush()

    def _seal(self) -> None:
        """Pending JSONL records become a table, after the pieces before them (order kept)."""
        if self.records:
            self.tables.append(records_table(self.records, self.ids, self.stage.text_field))
            self.records, self.ids = [], []

    def flush(self, last: bool = False) -> None:
        self._seal()
        if not self.tables and not (last and not self.batches):
            return
        import pyarrow as pa

        parts = self.tables or [empty_table(self.stage.text_field)]
        if len(parts) > 1:
            # pieces that disagree on a column's type stay separate batches (in order)
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowTypeError):
                parts = [pa.concat_tables(parts, promote_options="permissive")]
        self.tables, self.pending_bytes = [], 0
        for table in parts:
            self.batches.append(
                DocumentBatch(data=table, dataset_name=self.stage.dataset_name, metadata={})
            )

    def finish(self) -> list[DocumentBatch]:
        self.flush(last=True)
        # the files, named in the stages' errors ("from unknown files" before)
        files = list(dict.fromkeys(segment.path for segment in self.task.data))
        for j, batch in enumerate(self.batches):
            batch.metadata = dict(self.task.metadata)
            batch.metadata[SHARD] = f"{self.task.index:08d}-{j:06d}"
            batch.metadata.setdefault("source_files", files)
        last = self.batches[-1].metadata  # the task's counts ride on its last batch
        last[READ] = dict(self.counts)
        last[MALFORMED] = list(self.samples)
        last[SEGMENTS] = list(self.segments)
        last[FILE_ERRORS] = list(self.file_errors)
        last[BATCHES] = len(self.batches)
        return self.batches


def _column(name: str, values: list[Any]) -> tuple[pa.Field, pa.Array]:
    """``values`` as an Arrow column; where their types are mixed (a number here, text
    there), each as JSON text in a ``json_field`` (strings quoted too, so that a JSONL
    writer gives every value back as it was read)."""
    import pyarrow as pa

    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return json_field(name), json_text(values)
    structs = list(_structs(array.type))
    if structs and (
        any(s.num_fields == 0 for s in structs) or not _same(array.to_pylist(), values)
    ):
        # Arrow gives every object of a column every key any of them has (``{"a": 1}``
        # came out ``{"a": 1, "b": null}``), and an empty object a struct Parquet cannot
        # write (the task failed): such objects are kept as JSON text, exactly
        return json_field(name), json_text(values)
    return pa.field(name, array.type), array


def _structs(kind: pa.DataType) -> Iterator[pa.StructType]:
    """Every struct type ``kind`` is or holds (JSON objects: what Arrow can change)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        yield kind
        for field in kind:
            yield from _structs(field.type)
    elif (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    ):
        yield from _structs(kind.value_type)
    elif pa.types.is_map(kind):
        yield from _structs(kind.key_type)
        yield from _structs(kind.item_type)


def _same(made: Any, read: Any) -> bool:
    """Whether Arrow's values are the JSON values read: the same keys in every object (a
    NaN equal to a NaN, an integer to its float)."""
    if isinstance(read, dict):
        return (
            isinstance(made, dict)
            and made.keys() == read.keys()
            and all(_same(made[k], read[k]) for k in read)
        )
    if isinstance(read, list):
        return (
            isinstance(made, list)
            and len(made) == len(read)
            and all(_same(a, b) for a, b in zip(made, read, strict=True))
        )
    if isinstance(read, float) and read != read:
        return isinstance(made, float) and made != made
    return bool(made == read)


def records_table(records: list[dict[str, Any]], ids: list[int], text_field: str) -> pa.Table:
    """A table with one column per field seen (in first-seen order; a record without it
    gives a null), the text field as strings, and ``_conveyor_doc_id``."""
    import pyarrow as pa

    names: dict[str, None] = {}
    for record in records:
        for key in record:
            if key not in names:
                names[key] = None
    names.pop(DOC_ID, None)
    fields, arrays = [], []
    for name in names:
        values = [r.get(name) for r in records]
        if name == text_field:
            field, array = pa.field(name, pa.string()), pa.array(values, type=pa.string())
        else:
            field, array = _column(name, values)
        fields.append(field)
        arrays.append(array)
    fields.append(pa.field(DOC_ID, pa.int64()))
    arrays.append(pa.array(ids, type=pa.int64()))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def json_field(name: str) -> pa.Field:
    """A string column whose values are JSON text (its metadata says so: ``is_json``)."""
    import pyarrow as pa

    return pa.field(name, pa.string(), metadata=JSON_VALUES)


def is_json(field: pa.Field) -> bool:
    return (field.metadata or {}).get(b"conveyor.values") == JSON_VALUES[b"conveyor.values"]


def json_text(values: Sequence[Any]) -> pa.Array:
    """Each value as JSON text (nulls stay null)."""
    import pyarrow as pa

    return pa.array(
        [None if v is None else json.dumps(v, ensure_ascii=False) for v in values],
        type=pa.string(),
    )


def empty_table(text_field: str) -> pa.Table:
    import pyarrow as pa

    return pa.table(
        {text_field: pa.array([], type=pa.string()), DOC_ID: pa.array([], type=pa.int64())}
    )


class TextReader(ProcessingStage[ReadTask, DocumentBatch]):
    """Reads a ``ReadTask`` into ``DocumentBatch``es of about ``batch_bytes`` each (at least
    one, possibly empty, so that the task's counts travel on): every field of the input
    becomes a column, plus ``_conveyor_doc_id``.

    Counts go to the last batch's metadata: ``read`` (documents, malformed, blank lines),
    ``malformed_lines`` (the first ``max_samples``: file, line or row, reason),
    ``segments`` (lines per segment) and ``file_errors``; every batch gets ``shard``, a
    name that sorts in input order. ``keep_ids`` keeps the ``_conveyor_doc_id`` column of a Parquet
    file that has one (files a first pass staged). ``max_doc_bytes`` (None: no limit) refuses
    a longer document as malformed: a JSONL line before it is parsed (read at most that
    much at a time), a Parquet row by its text. Reading is mostly parsing, hence a whole
    CPU.
    """

    resources = Resources(cpus=1.0)

    def __init__(
        self,
        text_field: str = "text",
        *,
        batch_bytes: int = DEFAULT_CHUNK_BYTES,
        max_samples: int = 100,
        keep_ids: bool = False,
        max_doc_bytes: int | None = DEFAULT_MAX_DOC_BYTES,
        dataset_name: str = "",
    ) -> None:
        if not text_field:
            raise ValueError("TextReader: text_field must be a non-empty name")
        if batch_bytes < 1:
            raise ValueError(f"TextReader: batch_bytes must be >= 1, got {batch_bytes}")
        if max_doc_bytes is not None and max_doc_bytes < 1:
            raise ValueError(f"TextReader: max_doc_bytes must be None or >= 1, got {max_doc_bytes}")
        self.text_field = text_field
        self.batch_bytes = batch_bytes
        self.max_doc_bytes = max_doc_bytes
        self.max_samples = max_samples
        self.keep_ids = keep_ids
        self.dataset_name = dataset_name

    def outputs(self) -> tuple[list[str], list[str]]:
        return [], [self.text_field, DOC_ID]

    def process(self, task: ReadTask) -> list[DocumentBatch]:
        if not isinstance(task, ReadTask):
            raise TypeError(f"stage {self.name!r} expects a ReadTask, got {type(task).__name__}")
        batcher = _Batcher(self, task)
        for segment in task.data:
            if segment.kind == "parquet":
                self._read_parquet(segment, batcher)
            else:
                self._read_jsonl(segment, batcher)
        return batcher.finish()

    # -- JSONL ----------------------------------------------------------------------------
    def _read_jsonl(self, segment: Segment, out: _Batcher) -> None:
        field = self.text_field
        base = segment.file_index << OFFSET_BITS
        most = self.max_doc_bytes
        lineno = blank = 0
        pos = 0
        try:
            with _jsonl_stream(segment.path, segment.compression) as (stream, decompressed):
                if segment.start > 0:
                    # (lines skipped are read at most ``most`` at a time, never held whole)
                    if decompressed:  # a split compressed file (from limit=): skip ahead
                        while pos < segment.start:
                            _, size = read_line(stream, most)
                            if not size:
                                break
                            pos += size
                    else:  # the line running into this range belongs to the previous one
                        stream.seek(segment.start - 1)
                        pos = segment.start - 1 + read_line(stream, most)[1]
                end = segment.end
                while end is None or pos < end:
                    line, size = read_line(stream, most)
                    if not size:
                        break
                    lineno += 1
                    offset = pos
                    pos += size
                    if line is None:
                        out.malformed(
                            segment, lineno, offset,
                            f"a line of {size:,} bytes: longer than the limit of {most:,} "
                            "on a document",
                        )  # fmt: skip
                        continue
                    if not line.strip():
                        out.counts["blank"] += 1
                        blank += 1
                        continue
                    if offset == 0 and line.startswith(_BOM):
                        line = line[3:]
                    try:
                        text = line.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        out.malformed(
                            segment, lineno, offset,
                            f"not valid UTF-8 ({exc.reason} at byte {exc.start})",
                        )  # fmt: skip
                        continue
                    try:
                        # without its line end: a record cut short is then an unterminated
                        # string, not an "invalid control character" (the newline in it)
                        record = json.loads(text.rstrip("\r\n"))
                    except json.JSONDecodeError as exc:
                        out.malformed(
                            segment, lineno, offset,
                            f"malformed JSON: {exc.msg.removesuffix(' at')} at column "
                            f"{exc.colno} in {_snippet(text)!r}",
                        )  # fmt: skip
                        continue
                    except RecursionError:  # (Python's parser stops near 1,000 levels)
                        out.malformed(segment, lineno, offset, TOO_DEEP)
                        continue
                    except ValueError as exc:
                        out.malformed(segment, lineno, offset, f"malformed JSON: {exc}")
                        continue
                    if not isinstance(record, dict):
                        out.malformed(
                            segment, lineno, offset,
                            f"expected a JSON object, got {_describe(record)}",
                        )  # fmt: skip
                        continue
                    if too_deep(line, record):
                        out.malformed(segment, lineno, offset, TOO_DEEP)
                        continue
                    value = record.get(field, _MISSING)
                    if value is _MISSING:
                        fields = ", ".join(list(record)[:10]) or "none"
                        out.malformed(
                            segment, lineno, offset,
                            f"no field {field!r} (fields: {fields})",
                        )  # fmt: skip
                        continue
                    if not isinstance(value, str):
                        out.malformed(
                            segment, lineno, offset,
                            f"field {field!r} is {_describe(value)}, expected a string",
                        )  # fmt: skip
                        continue
                    if (b"\\ud" in line or b"\\uD" in line) and _lone_surrogate(record):
                        out.malformed(
                            segment, lineno, offset,
                            "not valid Unicode (a lone surrogate \\uD800-\\uDFFF escape)",
                        )  # fmt: skip
                        continue
                    out.add(record, base | offset, len(line))
        except Exception as exc:  # noqa: BLE001 - a file's problem never stops the task
            out.file_errors.append(_file_error(segment, lineno, exc))
        out.segments.append(
            {
                "file_index": segment.file_index,
                "chunk": segment.chunk,
                "lines": lineno,
                "records": lineno - blank,
            }
        )

    # -- Parquet --------------------------------------------------------------------------
    def _read_parquet(self, segment: Segment, out: _Batcher) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        field = self.text_field
        base = segment.file_index << OFFSET_BITS
        row = first = segment.start
        try:
            with open_input(segment.path) as stream:
                parquet = pq.ParquetFile(stream)
                names = parquet.schema_arrow.names
                groups = _row_groups(parquet.metadata, segment.start, segment.end)
                for batch in parquet.iter_batches(batch_size=8192, row_groups=groups):
                    table = pa.Table.from_batches([batch])
                    if segment.end is not None and row + table.num_rows > segment.end:
                        table = table.slice(0, segment.end - row)
                    n = table.num_rows
                    rows = pa.array(range(row, row + n), type=pa.int64())
                    row += n
                    if field not in names:
                        for i in range(n):
                            out.malformed(
                                segment, row - n + i, row - n + i,
                                f"no column {field!r} (columns: {', '.join(names[:10])})",
                            )  # fmt: skip
                        continue
                    column = table.column(field)
                    if pa.types.is_dictionary(column.type):
                        column = column.cast(column.type.value_type)
                    if not (
                        pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                    ):
                        for i in range(n):
                            out.malformed(
                                segment, row - n + i, row - n + i,
                                f"column {field!r} holds {column.type}, expected strings",
                            )  # fmt: skip
                        continue
                    table = table.set_column(names.index(field), field, column)
                    keep = pc.is_valid(column).combine_chunks()
                    if column.null_count:
                        for i in pc.indices_nonzero(pc.invert(keep)).to_pylist():
                            out.malformed(
                                segment, row - n + i, row - n + i,
                                f"field {field!r} is null, expected a string",
                            )  # fmt: skip
                    bad = _invalid_utf8(column)
                    for i, reason in bad.items():
                        out.malformed(
                            segment, row - n + i, row - n + i,
                            f"field {field!r} is not valid UTF-8 ({reason})",
                        )  # fmt: skip
                    long = _too_long(column, self.max_doc_bytes)
                    for i, size in long.items():
                        if i not in bad:
                            out.malformed(
                                segment, row - n + i, row - n + i,
                                f"field {field!r} holds {size:,} bytes: longer than the "
                                f"limit of {self.max_doc_bytes:,} on a document",
                            )  # fmt: skip
                    refused = bad.keys() | long.keys()
                    if refused:
                        keep = pc.and_(keep, pa.array([i not in refused for i in range(n)]))
                    if column.null_count or refused:
                        table, rows = table.filter(keep), rows.filter(keep)
                    if DOC_ID in table.column_names:
                        if self.keep_ids:  # a file this pipeline staged: its ids stay
                            out.add_table(table)
                            continue
                        table = table.drop_columns([DOC_ID])
                    ids = pc.add(rows, pa.scalar(base, pa.int64()))
                    out.add_table(table.append_column(DOC_ID, ids))
                    if segment.end is not None and row >= segment.end:
                        break
        except Exception as exc:  # noqa: BLE001 - a file's problem never stops the task
            out.file_errors.append(_file_error(segment, row, exc))
        out.segments.append(
            {"file_index": segment.file_index, "chunk": segment.chunk, "lines": row - first}
        )


def _row_groups(meta: Any, start: int, end: int | None) -> list[int]:
    """The row groups holding rows ``[start, end)`` (a segment starts on one's first row)."""
    groups, first = [], 0
    for i in range(meta.num_row_groups):
        rows = meta.row_group(i).num_rows
        if first + rows > start and (end is None or first < end):
            groups.append(i)
        first += rows
    return groups


_MISSING = object()
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


def too_deep(line: bytes, record: dict[str, Any]) -> bool:
    """Whether ``record`` (parsed from ``line``) nests objects and arrays more than
    ``MAX_DEPTH`` levels deep (the record itself is level 1). Only a line holding that many
    brackets is walked, and without recursion: what is checked may be as deep as the parser
    allows."""
    if line.count(b"{") + line.count(b"[") <= MAX_DEPTH:
        return False
    stack: list[tuple[Any, int]] = [(record, 1)]
    while stack:
        value, depth = stack.pop()
        for child in value.values() if isinstance(value, dict) else value:
            if isinstance(child, (dict, list)):
                if depth >= MAX_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def _invalid_utf8(column: pa.ChunkedArray) -> dict[int, str]:
    """The rows of a string column whose bytes are not UTF-8, with why: Parquet does not
    check them (a writer that cast bytes to strings leaves them), and one such row failed
    the whole batch it reached, other files' documents with it. Checked at C speed first."""
    import pyarrow as pa

    try:
        column.validate(full=True)
        return {}
    except pa.ArrowInvalid:
        pass
    raw = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
    bad: dict[int, str] = {}
    for i, value in enumerate(raw.to_pylist()):
        if value is None:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad[i] = f"{exc.reason} at byte {exc.start}"
    return bad


def _too_long(column: pa.ChunkedArray, most: int | None) -> dict[int, int]:
    """The rows of a string column whose value is longer than ``most`` bytes, with their
    length (at C speed)."""
    import pyarrow.compute as pc

    if most is None or not len(column):
        return {}
    lengths = pc.binary_length(column).combine_chunks()
    over = pc.indices_nonzero(pc.fill_null(pc.greater(lengths, most), False)).to_pylist()
    return {i: lengths[i].as_py() for i in over}


def _file_error(segment: Segment, line: int, exc: BaseException) -> dict[str, Any]:
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, EOFError):
        detail = f"the file ends early (truncated?): {detail}"
    where = "row" if segment.kind == "parquet" else "line"
    return {
        "file": segment.path,
        "file_index": segment.file_index,
        "chunk": segment.chunk,
        where: line,
        "reason": f"{type(exc).__name__}: {detail}"
        if line == 0
        else f"after {where} {line}: {type(exc).__name__}: {detail}",
    }


def absolute_lines(
    samples: Sequence[dict[str, Any]], segments: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``samples`` (malformed lines or file errors of ``TextReader`` batches) with line
    numbers counted from the start of their file, given every batch's ``segments``. A line
    of a split file whose earlier ranges were not all read gets ``line: None`` (its
    ``offset`` still says where it is)."""
    lines: dict[tuple[int, int], int] = {}
    for seg in segments:
        lines[(seg["file_index"], seg["chunk"])] = seg["lines"]
    fixed = []
    for sample in samples:
        sample = dict(sample)
        chunk = sample.pop("chunk", 0)
        index = sample.pop("file_index", None)
        if "line" in sample and chunk and index is not None:
            before = [lines.get((index, c)) for c in range(chunk)]
            sample["line"] = (
                None if any(b is None for b in before) else sample["line"] + sum(before)
            )
        fixed.append(sample)
    return fixed


class TextPartitioner(ProcessingStage[Any, ReadTask]):
    """Lists ``source`` (a file, directory or glob, or a list of them; see ``list_inputs``)
    and emits its ``ReadTask``s (see ``plan_reads``). It ignores its input (the pipeline's
    seed task), so it belongs first. Listing happens on a worker, so its cost shows in the
    stage's stats. ``skip`` holds the indices of tasks an earlier run finished (a resumed
    run leaves them out; the others keep their index, so their outputs keep their names)."""

    resources = Resources(cpus=0.5)

    def __init__(
        self,
        source: str | os.PathLike[str] | ObjectPath | Sequence[str | os.PathLike[str]],
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        limit: int | None = None,
        exclude: Sequence[str] = (),
        skip: Collection[int] = (),
    ) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"TextPartitioner: chunk_bytes must be >= 1, got {chunk_bytes}")
        if limit is not None and limit < 1:
            raise ValueError(f"TextPartitioner: limit must be None or >= 1, got {limit}")
        self.source: str | list[str] = (
            os.fspath(source)
            if isinstance(source, (str, os.PathLike))
            else str(source)  # a bucket's folder (a text run's staging there)
            if isinstance(source, ObjectPath)
            else [os.fspath(s) for s in source]
        )
        self.chunk_bytes = chunk_bytes
        self.limit = limit
        self.exclude = [os.fspath(e) for e in exclude]
        self.skip = frozenset(skip)

    def tasks(self) -> list[ReadTask]:
        listing = list_inputs(self.source, exclude=self.exclude)
        tasks = plan_reads(listing.files, self.chunk_bytes, limit=self.limit)
        return [task for task in tasks if task.index not in self.skip]

    def process(self, task: Any) -> list[ReadTask]:
        return self.tasks()
