"""Finding the images of an input and cutting them into parts, as the run consumes them.

An input is a folder (searched recursively), a file, a glob or a URL (``conveyor.storage``).
What it holds is read as it comes, in sorted order:

- image files (``IMAGE_EXTENSIONS``, any case): consecutive files make a part of up to
  ``images_per_task`` images and ``bytes_per_task`` bytes;
- WebDataset tar shards (img2dataset's layout: ``key.jpg`` + ``key.txt`` caption +
  ``key.json``): the tar's headers are read (``tarfile`` seeks over each member's data) to
  find each sample's members and where their bytes lie, and consecutive samples make a
  part; a part's reader then reads its members by byte range, never the whole shard;
- Parquet files of image bytes or paths: each row group is cut into parts of rows. A Parquet
  file beside a tar of the same name is img2dataset's table of that shard (urls and
  statuses), not images, and is left out.

A tar or Parquet file that cannot be listed becomes an ``unreadable`` part: one failure, with
its reason, in the run's records, and the run goes on. ``ImageSources`` yields the parts an
earlier run into the same output did not finish (those without a record whose key matches),
so a run starts on its first images while a bucket is still being listed.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.stages.image.layout import ImageLayout
from conveyor.stages.image.shards import changed_since_packed, group_name, packed_parts
from conveyor.stages.video.reader import VideoSource
from conveyor.stages.video.reader import iter_videos as iter_files
from conveyor.storage import glob_files, has_magic, location, open_input, printable, special_file
from conveyor.tasks.image import ImageFile, ImagePart, ParquetRows, TarMember, TarSample, part_name

#: what a folder run takes as images (any case); decoding decides whether a file is one
IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tiff", ".tif", ".avif",
)  # fmt: skip
SHARD_EXTENSIONS: tuple[str, ...] = (".tar",)
TABLE_EXTENSIONS: tuple[str, ...] = (".parquet",)
#: images per part: enough that a task's overhead is small next to its work, few enough
#: that a part's decoded working copies stay a few tens of MB
IMAGES_PER_TASK = 128
#: input bytes per part at most (a part of large images holds fewer)
BYTES_PER_TASK = 64 << 20
#: read-ahead while a tar's headers are listed (each member's data is seeked over)
SCAN_BLOCK = 64 << 10
#: a Parquet column of image bytes (binary, or a struct with ``bytes``, as Hugging Face
#: datasets store images), first match wins; then a column of paths or URLs
BYTES_COLUMNS = ("image", "img", "jpg", "png", "webp", "image_bytes", "bytes", "content")
PATH_COLUMNS = ("path", "image_path", "file", "filepath", "file_name", "url", "image_url")
CAPTION_COLUMNS = ("caption", "text", "txt", "alt")


class ImageInputError(ValueError):
    """The input names nothing to read: a missing path, a glob matching nothing. One line,
    fit for a command's error output."""


def list_files(inputs: str | Sequence[str], exclude: Sequence[str] = ()) -> Iterator[VideoSource]:
    """Every image, tar and Parquet file of ``inputs`` in relative path order, found as it is
    consumed (folders one directory at a time, S3 page by page: ``iter_videos``); a glob is
    expanded first. ``ImageInputError`` for a missing input or a glob matching nothing."""
    items = [inputs] if isinstance(inputs, str) else list(inputs)
    paths: list[str] = []
    for item in items:
        if has_magic(item):
            found = [p for p, _ in glob_files(item) if not _under(p, exclude)]
            if not found:
                raise ImageInputError(f"INPUT glob {item!r} matches no file")
            paths += found
        else:
            paths.append(item)
    if not paths:
        raise ImageInputError("no INPUT given")
    wanted = IMAGE_EXTENSIONS + SHARD_EXTENSIONS + TABLE_EXTENSIONS
    try:
        return iter_files(paths if len(paths) > 1 else paths[0], extensions=wanted, exclude=exclude)
    except FileNotFoundError as exc:
        text = str(exc)
        raise ImageInputError(
            "INPUT " + (text[len("input ") :] if text.startswith("input ") else text)
        ) from None


def _under(path: str, prefixes: Sequence[str]) -> bool:
    return any(path == p or path.startswith(str(p).rstrip("/") + "/") for p in prefixes)


def _kind(name: str) -> str:
    lower = name.lower()
    if lower.endswith(SHARD_EXTENSIONS):
        return "tar"
    if lower.endswith(TABLE_EXTENSIONS):
        return "parquet"
    return "files"


def _digest(*parts: Any) -> str:
    text = "\n".join(repr(p) for p in parts)
    return hashlib.sha1(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Planner:
    """Cuts the listed files into parts, numbered in input order, up to ``limit`` images."""

    def __init__(self, images_per_task: int, bytes_per_task: int, limit: int | None = None) -> None:
        self.images_per_task = images_per_task
        self.bytes_per_task = bytes_per_task
        self.limit = limit
        self.next_index = 0
        #: images in the parts made so far
        self.images = 0

    def room(self, pending: int = 0) -> int:
        """Images that may still be planned, past ``pending`` ones not in a part yet."""
        if self.limit is None:
            return 1 << 62
        return self.limit - self.images - pending

    def _part(
        self, kind: Any, source: VideoSource | None, items: list[Any], digest: str
    ) -> ImagePart:
        path, relative = (source.path, source.relative_path) if source else ("", "")
        part = ImagePart(self.next_index, kind, path, relative, tuple(items), digest)
        self.next_index += 1
        self.images += part.count
        return part

    def plan(self, listing: Iterator[VideoSource]) -> Iterator[ImagePart]:
        files: list[ImageFile] = []
        stamps: list[tuple[str, int, float]] = []
        size = 0
        for source in listing:
            if self.room(len(files)) <= 0:
                break
            kind = _kind(source.relative_path)
            if kind == "files":
                full = len(files) >= self.images_per_task
                if files and (full or size + source.size > self.bytes_per_task):
                    yield self._part("files", None, files, _digest(*stamps))
                    files, stamps, size = [], [], 0
                files.append(ImageFile(source.path, source.relative_path, source.size))
                stamps.append((source.relative_path, source.size, source.mtime))
                size += source.size
                continue
            if files:
                yield self._part("files", None, files, _digest(*stamps))
                files, stamps, size = [], [], 0
            special = special_file(source.path)  # a named pipe blocked the listing
            if special is not None:
                yield self._unreadable(source, f"not a regular file but {special}")
            elif kind == "tar":
                yield from self._tar(source)
            elif not _is_shard_table(source):
                yield from self._parquet(source)
        if files:
            yield self._part("files", None, files, _digest(*stamps))

    def _unreadable(self, source: VideoSource, reason: str) -> ImagePart:
        stamp = _digest(source.relative_path, source.size, source.mtime)
        part = ImagePart(
            self.next_index, "unreadable", source.path, source.relative_path, (), stamp, reason
        )
        self.next_index += 1
        self.images += 1
        return part

    def _tar(self, source: VideoSource) -> Iterator[ImagePart]:
        stamp = (source.relative_path, source.size, source.mtime)
        samples: list[TarSample] = []
        size = found = 0
        reason = None
        try:
            for sample in scan_tar(source.path):
                if self.room(len(samples)) <= 0:
                    break
                extent = sum(m.size for m in (sample.image, sample.caption, sample.meta) if m)
                full = len(samples) >= self.images_per_task
                if samples and (full or size + extent > self.bytes_per_task):
                    yield self._part("tar", source, samples, _digest(*stamp, samples[0].key))
                    samples, size = [], 0
                samples.append(sample)
                size += extent
                found += 1
        except (OSError, tarfile.TarError, EOFError) as exc:
            reason = f"tar shard unreadable after {found} sample(s): {_why(exc)}"
        if samples:
            yield self._part("tar", source, samples, _digest(*stamp, samples[0].key))
        if reason is not None:
            yield self._unreadable(source, reason)

    def _parquet(self, source: VideoSource) -> Iterator[ImagePart]:
        stamp = (source.relative_path, source.size, source.mtime)
        try:
            groups, columns = parquet_plan(source.path)
        except (OSError, ValueError) as exc:
            yield self._unreadable(source, f"Parquet file unreadable: {_why(exc)}")
            return
        first = 0
        for group, rows in enumerate(groups):
            for start in range(0, rows, self.images_per_task):
                stop = min(rows, start + self.images_per_task, start + self.room())
                if stop <= start:
                    return
                items = [ParquetRows(group, start, stop, first + start, *columns)]
                yield self._part("parquet", source, items, _digest(*stamp, group, start, stop))
            first += rows


# -- tar shards -----------------------------------------------------------------------------
#: a sample's image member: the first with one of these extensions (WebDataset's names)
_IMAGE_EXTS = frozenset(e.lstrip(".") for e in IMAGE_EXTENSIONS)


def split_key(name: str) -> tuple[str, str]:
    """A member's sample key and extension as WebDataset splits them: ``dir/000123.jpg`` ->
    (``dir/000123``, ``jpg``); everything after the first dot of the file name is the
    extension."""
    folder, _, base = name.rpartition("/")
    stem, _, extension = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


def _open_for_scan(path: str) -> Any:
    where = location(path)
    if isinstance(where, Path):
        return open(where, "rb")  # closed by the caller's with
    return where.open("rb", block_size=SCAN_BLOCK)


def scan_tar(path: str) -> Iterator[TarSample]:
    """The samples of a tar, from its headers: ``tarfile`` seeks over each member's data,
    so the data is never read here (on a bucket, the read-ahead of ``SCAN_BLOCK`` may take
    some with each header)."""
    with _open_for_scan(path) as raw, tarfile.open(fileobj=raw, mode="r:") as tar:
        key: str | None = None
        members: dict[str, TarMember] = {}
        try:
            while (info := tar.next()) is not None:
                tar.members.clear()  # tarfile keeps every header it read: a shard has many
                if not info.isfile():
                    continue
                sample, extension = split_key(info.name)
                if sample != key:
                    if key is not None:
                        yield _sample(key, members)
                    key, members = sample, {}
                members.setdefault(extension, TarMember(info.name, info.offset_data, info.size))
        except (OSError, tarfile.TarError, EOFError):
            if key is not None:  # a shard cut short: the sample it ends in fails when read
                yield _sample(key, members)
            raise
        if key is not None:
            yield _sample(key, members)


def _sample(key: str, members: dict[str, TarMember]) -> TarSample:
    image = next((m for ext, m in members.items() if ext.rsplit(".", 1)[-1] in _IMAGE_EXTS), None)
    return TarSample(key, image, members.get("txt"), members.get("json"))


def _is_shard_table(source: VideoSource) -> bool:
    """Whether a Parquet file is img2dataset's table of the tar beside it (same name)."""
    path = source.path
    tar = path[: -len(".parquet")] + ".tar"
    return location(tar).exists()


# -- Parquet --------------------------------------------------------------------------------
def parquet_plan(path: str) -> tuple[list[int], tuple[str, bool, str | None, tuple[str, ...]]]:
    """The rows of each row group of a Parquet file of images, and its columns: the image's
    (``BYTES_COLUMNS``, else ``PATH_COLUMNS``), whether it holds paths, the caption's, and
    the other plain columns kept with each image. ``ValueError`` when no column holds
    images."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_input(path) as raw:
        meta = pq.ParquetFile(raw)
        schema = meta.schema_arrow
        groups = [meta.metadata.row_group(i).num_rows for i in range(meta.num_row_groups)]
    by_name = {f.name.lower(): f for f in schema}

    def is_bytes(kind: Any) -> bool:
        return (
            pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or (str(kind) == "binary_view")
        )

    def is_text(kind: Any) -> bool:
        # pandas writes every string column as large_string: captions were dropped and a
        # table of paths refused as having none
        return (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or (str(kind) == "string_view")
        )

    def binary(field: Any) -> bool:
        kind = field.type
        if pa.types.is_struct(kind):
            return any(
                kind.field(i).name == "bytes" and is_bytes(kind.field(i).type)
                for i in range(kind.num_fields)
            )
        return is_bytes(kind)

    image = next((by_name[c] for c in BYTES_COLUMNS if c in by_name and binary(by_name[c])), None)
    is_path = False
    if image is None:
        image = next(
            (by_name[c] for c in PATH_COLUMNS if c in by_name and is_text(by_name[c].type)),
            None,
        )
        is_path = image is not None
    if image is None:
        names = ", ".join(f.name for f in schema) or "none"
        raise ValueError(
            f"no column of image bytes ({', '.join(BYTES_COLUMNS)}) or paths "
            f"({', '.join(PATH_COLUMNS)}); its columns: {names}"
        )
    caption = next(
        (by_name[c].name for c in CAPTION_COLUMNS if c in by_name and is_text(by_name[c].type)),
        None,
    )
    plain = (is_text, pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    extra = tuple(
        f.name
        for f in schema
        if f.name not in (image.name, caption) and any(check(f.type) for check in plain)
    )
    return groups, (image.name, is_path, caption, extra)


# -- the run's sources ----------------------------------------------------------------------
class InputChanged(ValueError):
    """A part of the input that the output's shards hold changed since it was packed."""


class ImageSources:
    """The parts of ``inputs`` still to do in ``output``, planned as the run consumes them.

    Iterating lists the input (``list_files``), cuts it into parts (``Planner``) and yields
    those without a record of the same key in the output; ``on_complete(part, record)`` is
    told of each part complete before the run, with its record (a summary folds it in).
    ``found``, ``images``, ``complete`` and ``pending`` count as it goes; ``to_do`` keeps the
    pending parts' index, key and size (``PartInfo``), for the summary.
    """

    def __init__(
        self,
        inputs: str | Sequence[str],
        output: str | os.PathLike[str],
        *,
        images_per_task: int = IMAGES_PER_TASK,
        bytes_per_task: int = BYTES_PER_TASK,
        limit: int | None = None,
        on_complete: Callable[[ImagePart, dict[str, Any]], None] | None = None,
    ) -> None:
        if images_per_task < 1:
            raise ValueError(f"images_per_task must be >= 1, got {images_per_task}")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.layout = ImageLayout(output)
        self._listing = list_files(inputs, exclude=[str(self.layout.local)])
        self.planner = Planner(images_per_task, bytes_per_task, limit)
        self.on_complete = on_complete
        self.found = self.complete = self.pending = 0
        self.to_do: list[PartInfo] = []
        self.exhausted = False
        self._peeked: list[ImagePart] = []
        self._stream: Iterator[ImagePart] | None = None
        self._plan = self.planner.plan(self._listing)

    @property
    def images(self) -> int:
        """Images in the parts planned so far."""
        return self.planner.images

    def empty(self) -> bool:
        """Whether the input holds nothing to read (plans up to the first part)."""
        if not self._peeked and not self.exhausted and self._stream is None:
            first = next(self._plan, None)
            if first is None:
                self.exhausted = True
            else:
                self._peeked.append(first)
        return not self._peeked and self.exhausted

    def __iter__(self) -> Iterator[ImagePart]:
        if self._stream is not None:
            raise RuntimeError("ImageSources is iterated once (it lists as it goes)")
        self._stream = self._check(itertools.chain(self._peeked, self._plan))
        self._peeked = []
        return self._stream

    def drain(self) -> None:
        """Plan and count what the run did not take (a run stopped early)."""
        for _ in self._stream if self._stream is not None else self:
            pass

    def _check(self, parts: Iterator[ImagePart]) -> Iterator[ImagePart]:
        packed: dict[str, str] | None = None
        for part in parts:
            self.found += 1
            record = self.layout.read_part_record(part.index)
            if (
                record is not None
                and record.get("key") == list(part.key)
                and self.layout.metadata_path(part.index).exists()
                and not record.get("read_again")
            ):  # a part whose metadata file was deleted is done again (it stopped every run),
                # and one with images it could not read for now (permission, I/O)
                self.complete += 1
                if self.on_complete is not None:
                    self.on_complete(part, record)
                continue
            if record is not None:  # done before, from other images: was it packed?
                packed = packed_parts(self.layout) if packed is None else packed
                earlier = packed.get(part_name(part.index))
                now = group_name(part.index, part.digest)
                if earlier is not None and earlier != now:
                    # before its part is done again: its metadata would no longer be the
                    # shards' (the refusal at packing came after that)
                    raise InputChanged(changed_since_packed(self.layout, part.index, earlier, now))
            self.pending += 1
            self.to_do.append(PartInfo.of(part))
            yield part
        self.exhausted = True


@dataclass(frozen=True, slots=True)
class PartInfo:
    """What the summary keeps of a pending part: its number, key, size and where it is."""

    index: int
    key: tuple[str, int, str]
    count: int
    where: str

    @classmethod
    def of(cls, part: ImagePart) -> PartInfo:
        if part.kind == "files":
            first = part.items[0].relative
            where = first if part.count == 1 else f"{first} and {part.count - 1} more"
        else:
            where = printable(part.relative)
        return cls(part.index, part.key, part.count, where)
