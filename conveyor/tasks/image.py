"""The image pipeline's tasks: a part of the input (``ImagePart``) and its images as they go
through the stages (``ImageBatch`` of ``ImageRecord``s).

A part is the unit of work, of resuming and of output: up to a few hundred images that are
read together (files of a folder, samples of a tar shard, rows of a Parquet file), numbered
in input order. Each image is known by its ``key`` (where it is in the input) and by its
``id``, a hash of the key that serves as its WebDataset key in the output shards.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from conveyor.tasks.base import Task, wrong_data

if TYPE_CHECKING:
    import numpy as np

PartKind = Literal["files", "tar", "parquet", "unreadable"]
#: ``filtered_by`` of an image that failed (it has ``errors``)
ERROR_FILTER = "error"
#: bits of ``ImageRecord.order`` for the position inside a part
POSITION_BITS = 24
#: hex digits of an image id (96 bits: no collision expected among billions)
ID_HEX = 24


def image_id(key: str) -> str:
    """The id of the image at ``key``: the same in every run, a valid WebDataset key."""
    return hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest()[:ID_HEX]


@dataclass(frozen=True, slots=True)
class TarMember:
    """One member of a tar shard: its name and where its data lies."""

    name: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class TarSample:
    """The members of one WebDataset sample (``key.jpg``, ``key.txt``, ``key.json``)."""

    key: str
    image: TarMember | None
    caption: TarMember | None = None
    meta: TarMember | None = None


@dataclass(frozen=True, slots=True)
class ImageFile:
    """An image file of a folder, a glob or a bucket, with its stamp."""

    path: str
    relative: str
    size: int


@dataclass(frozen=True, slots=True)
class ParquetRows:
    """Rows ``[start, stop)`` of one row group of a Parquet file, and the columns that hold
    each image's bytes or path, its caption and what else is kept."""

    row_group: int
    start: int
    stop: int
    first_row: int
    image_column: str
    image_is_path: bool
    caption_column: str | None
    extra_columns: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ImagePart:
    """A part of the input, read by one task.

    Attributes:
        index: its number in input order (names its outputs: ``part-NNNNNN``).
        kind: ``files``, ``tar`` (samples of one shard), ``parquet`` (rows of one file), or
            ``unreadable`` (a shard or file that could not be listed: ``error`` says why).
        path: the tar or Parquet file (``""`` for files).
        relative: that file's path relative to the input root.
        items: the files, samples or rows.
        digest: a hash of what the part holds (names, sizes, times), so that a part whose
            input changed is another part.
        error: why an ``unreadable`` part could not be listed.
    """

    index: int
    kind: PartKind
    path: str
    relative: str
    items: tuple[Any, ...]
    digest: str
    error: str | None = None

    @property
    def key(self) -> tuple[str, int, str]:
        """What the journal and the part's record know it by."""
        return ("image-part", self.index, self.digest)

    @property
    def name(self) -> str:
        return part_name(self.index)

    @property
    def count(self) -> int:
        """Images it holds (an unreadable one: the one failure it stands for)."""
        if self.kind == "unreadable":
            return 1
        if self.kind == "parquet":
            return sum(rows.stop - rows.start for rows in self.items)
        return len(self.items)


def part_name(index: int) -> str:
    return f"part-{index:06d}"


@dataclass(slots=True, eq=False)
class ImageRecord:
    """One image on its way: where it came from, what the stages made of it.

    Attributes:
        key: where it is in the input (a relative path, ``shard.tar/sample``, or
            ``file.parquet#row``); unique within a run's input.
        source: the file it was read from.
        order: its position in input order (the part's index, then its place in the part):
            the keep order of deduplication.
        data: its bytes as read (dropped once decoded).
        caption, extra: the caption and other fields the input had for it (a sample's
            ``.txt`` and ``.json``, a row's columns).
        width, height, format, mode, frames: the image as stored.
        pixels: the decoded working copy (RGB, shorter side at most ``WORK_SIDE``), which
            the scoring stages read; dropped after the last of them.
        payload, payload_ext: what the output shard holds (the bytes as read when they
            needed no change, else the normalised image re-encoded).
        normalised: what normalising changed (``exif-rotated``, ``cmyk``, ``16-bit`` ...).
        content_hash, phash: the hash of its bytes and its perceptual hash (hex).
        scores, tags, embedding, class_probabilities: what the models said.
        filtered_by: the filter that dropped it (``"error"`` when it failed), or ``None``.
        errors: stage -> reason, for an image that failed.
        again: it failed for a reason of the machine's (its file could not be read for
            want of permission, or an I/O error): the next run does its part again.
        duplicate_of: the id of the image it duplicates (set after deduplication).
    """

    key: str
    source: str
    order: int
    id: str = ""
    data: bytes | None = None
    caption: str | None = None
    extra: dict[str, Any] | None = None
    num_bytes: int = 0
    width: int = 0
    height: int = 0
    format: str | None = None
    mode: str | None = None
    frames: int = 1
    pixels: np.ndarray | None = None
    payload: bytes | None = None
    payload_ext: str | None = None
    normalised: list[str] = field(default_factory=list)
    content_hash: str | None = None
    phash: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    tags: list[tuple[str, float]] = field(default_factory=list)
    embedding: np.ndarray | None = None
    class_probabilities: np.ndarray | None = None
    filtered_by: str | None = None
    errors: dict[str, str] = field(default_factory=dict)
    duplicate_of: str | None = None
    again: bool = False

    def __post_init__(self) -> None:
        if not self.id:
            self.id = image_id(self.key)

    @property
    def active(self) -> bool:
        """Neither filtered nor failed: the next stage works on it."""
        return self.filtered_by is None

    @property
    def kept(self) -> bool:
        return self.filtered_by is None

    def fail(self, stage: str, reason: str, again: bool = False) -> None:
        """The image is bad: recorded with its reason, never written; retried only by the
        next run, and only ``again`` (the machine's reason, not the image's)."""
        self.errors[stage] = reason
        self.filtered_by = ERROR_FILTER
        self.again = self.again or again
        self.release()

    def reject(self, filter_name: str) -> None:
        """A filter dropped it (the first filter to do so is the one recorded)."""
        if self.filtered_by is None:
            self.filtered_by = filter_name
        self.release()

    def release(self) -> None:
        """Drop what no later stage needs of an image that will not be written."""
        self.data = self.payload = self.pixels = None
        self.class_probabilities = None


@dataclass
class ImageBatch(Task[list[ImageRecord]]):
    """The images of one part (``part``); ``record`` is the part's record once the writer
    wrote it (what the driver's summary adds up)."""

    data: list[ImageRecord] = field(default_factory=list)
    part: ImagePart | None = None
    record: dict[str, Any] | None = None

    def check_data(self, data: Any) -> None:
        if isinstance(data, list) and all(isinstance(r, ImageRecord) for r in data):
            return
        raise wrong_data(self, "a list of ImageRecord", data)

    @property
    def active(self) -> list[ImageRecord]:
        return [r for r in self.data if r.active]
