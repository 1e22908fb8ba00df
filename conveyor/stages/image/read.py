"""Reading a part's images: files whole, a tar shard's members by byte range, a Parquet
file's rows.

A tar part is read in one ranged read, from its first member's data to its last member's
end (at most ``BYTES_PER_TASK`` of input, see ``conveyor.stages.image.sources``), then cut
into members; the rest of the shard is never read. A file that cannot be read, a member the
shard ends before, a sample without an image or a row without bytes fails alone, with its
reason; the others of the part go on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conveyor.media.errors import access_error
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.storage import location, open_input, special_file
from conveyor.tasks.image import (
    POSITION_BITS,
    ImageBatch,
    ImageFile,
    ImagePart,
    ImageRecord,
    ParquetRows,
    TarMember,
    TarSample,
)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def read_range(path: str, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of a local file or an object (fewer where it ends first)."""
    where = location(path)
    if isinstance(where, Path):
        with open(where, "rb") as f:
            return os.pread(f.fileno(), stop - start, start) if stop > start else b""
    fs, key = where.filesystem()
    return bytes(fs.cat_file(key, start=start, end=stop))


class ImageReader(ProcessingStage[ImagePart, ImageBatch]):
    """A part of the input -> its images, with their bytes, captions and input fields."""

    resources = Resources(cpus=0.5)

    def process(self, part: ImagePart) -> ImageBatch:
        base = part.index << POSITION_BITS
        if part.kind == "files":
            images = [self._file(item, base + i) for i, item in enumerate(part.items)]
        elif part.kind == "tar":
            images = self._tar(part, base)
        elif part.kind == "parquet":
            images = self._parquet(part, base)
        else:
            image = ImageRecord(part.relative, part.relative, base)
            image.fail(self.name, part.error or "unreadable")
            images = [image]
        return ImageBatch(data=images, part=part)

    def _file(self, item: ImageFile, order: int) -> ImageRecord:
        image = ImageRecord(item.relative, item.relative, order)
        special = special_file(item.path)  # a named pipe blocked the worker for ever,
        if special is not None:  # a link to /dev/zero filled its memory
            image.fail(self.name, f"not a regular file but {special}")
            return image
        try:
            image.data = location(item.path).read_bytes()
        except OSError as exc:
            image.fail(self.name, f"unreadable: {_reason(exc)}", again=access_error(exc))
        return image

    # -- tar shards -----------------------------------------------------------------------
    def _tar(self, part: ImagePart, base: int) -> list[ImageRecord]:
        samples: tuple[TarSample, ...] = part.items
        members = [m for s in samples for m in (s.image, s.caption, s.meta) if m is not None]
        start = min((m.offset for m in members), default=0)
        stop = max((m.offset + m.size for m in members), default=0)
        try:
            span = read_range(part.path, start, stop)
            problem, again = None, False
        except OSError as exc:
            span, problem, again = b"", f"unreadable: {_reason(exc)}", access_error(exc)

        def data(member: TarMember) -> bytes | None:
            piece = span[member.offset - start : member.offset - start + member.size]
            return piece if len(piece) == member.size else None

        images = []
        for i, sample in enumerate(samples):
            image = ImageRecord(f"{part.relative}/{sample.key}", part.relative, base + i)
            images.append(image)
            if problem is not None:
                image.fail(self.name, problem, again=again)
                continue
            if sample.image is None:
                image.fail(self.name, "the sample has no image member")
                continue
            image.data = data(sample.image)
            if image.data is None:
                image.fail(self.name, f"truncated: the shard ends inside {sample.image.name}")
                continue
            if sample.caption is not None and (text := data(sample.caption)) is not None:
                image.caption = text.decode("utf-8", "replace").strip()
            if sample.meta is not None and (raw := data(sample.meta)) is not None:
                image.extra = _json_fields(raw, sample.meta.name)
        return images

    # -- Parquet --------------------------------------------------------------------------
    def _parquet(self, part: ImagePart, base: int) -> list[ImageRecord]:
        import pyarrow.parquet as pq

        images: list[ImageRecord] = []
        for rows in part.items:
            assert isinstance(rows, ParquetRows)
            columns = [rows.image_column, *rows.extra_columns]
            if rows.caption_column is not None:
                columns.append(rows.caption_column)
            with open_input(part.path) as raw:
                table = pq.ParquetFile(raw).read_row_group(rows.row_group, columns=columns)
            table = table.slice(rows.start, rows.stop - rows.start).to_pylist()
            for i, row in enumerate(table):
                number = rows.first_row + i
                image = ImageRecord(f"{part.relative}#{number}", part.relative, base + len(images))
                images.append(image)
                if rows.caption_column is not None and row[rows.caption_column] is not None:
                    image.caption = str(row[rows.caption_column])
                image.extra = {c: row[c] for c in rows.extra_columns} or None
                self._row_bytes(image, row[rows.image_column], rows.image_is_path, part.path)
        return images

    def _row_bytes(self, image: ImageRecord, value: Any, is_path: bool, table: str) -> None:
        if isinstance(value, dict):  # Hugging Face datasets: {"bytes": ..., "path": ...}
            is_path = value.get("bytes") is None
            value = value.get("path") if is_path else value.get("bytes")
        if value is None:
            image.fail(self.name, "the row has no image (a null value)")
            return
        if not is_path:
            image.data = bytes(value)
            return
        path = str(value)
        where = location(path)
        if isinstance(where, Path) and not where.is_absolute():
            where = location(table).parent / path  # relative to the table's folder
        try:
            image.data = where.read_bytes()
        except OSError as exc:
            image.fail(self.name, f"unreadable: {_reason(exc)}", again=access_error(exc))


def _json_fields(raw: bytes, name: str) -> dict[str, Any]:
    """A sample's ``.json`` member: its object, or the reason it is not one."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return {"json_error": f"{name} is not JSON: {exc}"}
    return value if isinstance(value, dict) else {"json": value}
