"""Packing the kept images into WebDataset shards after the run: ``shards/shard-NNNNNN.tar``.

Each complete part staged its kept samples (image, ``.json`` meta, ``.npy`` embedding) as
one tar; once the stream and the deduplication are done, ``pack_shards`` appends the parts'
samples, duplicates left out, in input order, to shards of about ``shard_mb`` MiB
(``conveyor.media.tar_shards``: a shard is filled under ``.conveyor/shards``, closed by
its index then a rename, and taken up where it was after a crash). A part's staged tar is
removed once the shard holding its last sample is closed. So every kept image is in exactly
one shard, in the order of the input, whether the run went through at once or was resumed.

A shard's index lists its samples by part (``parts``: ``part-NNNNNN@digest``): a part whose
input changed after it was packed (another digest) cannot be packed again without putting
an image in two shards, and is refused; write to a new output, or ``--overwrite``.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from conveyor.media.tar_shards import Members, TarShardBook, listing, shard_bytes, shard_name
from conveyor.stages.image.layout import ImageLayout
from conveyor.tasks.image import part_name


class ImageShardBook(TarShardBook):
    """The shards of an image output, by part."""

    group_field = "parts"

    @classmethod
    def load(cls, layout: ImageLayout, target_bytes: int) -> ImageShardBook:
        book = cls(layout.local / "shards", layout.local / ".conveyor" / "shards", target_bytes,
                   layout.write_json)  # fmt: skip
        book.take_up()
        return book


@dataclass(frozen=True)
class PackResult:
    """The shards after packing: how many, and the samples they hold."""

    shards: int
    samples: int
    #: samples this packing added
    added: int


def group_name(index: int, digest: str) -> str:
    return f"{part_name(index)}@{digest}"


def changed_since_packed(layout: ImageLayout, index: int, earlier: str, now: str) -> str:
    """Why part ``index``, packed as group ``earlier``, cannot be packed as ``now``."""
    return (
        f"{part_name(index)} of the input changed since it was packed into the shards of "
        f"{layout.local} ({earlier} then, {now} now): packing it again would put its images "
        "in two shards; write to a new OUTPUT, or pass --overwrite"
    )


def packed_parts(layout: ImageLayout) -> dict[str, str]:
    """Each part the shards hold (whole or in part), by name: its group (name@digest)."""
    groups = ImageShardBook.packed(layout.local / "shards", layout.local / ".conveyor" / "shards")
    return {group.split("@", 1)[0]: group for group in groups}


def packed_ids(layout: ImageLayout) -> set[str]:
    """The ids of the images the shards hold."""
    held = ImageShardBook.held(layout.local / "shards", layout.local / ".conveyor" / "shards")
    return set().union(*held.values())


def staged_samples(path: Path) -> Iterator[tuple[str, Members]]:
    """A staged tar's samples, (id, members), in order."""
    with tarfile.open(path) as tar:
        current: str | None = None
        members: Members = []
        for info in tar:
            data = tar.extractfile(info)
            assert data is not None, f"{path}: {info.name} is not a file"
            sample = info.name.split(".", 1)[0]
            if sample != current and current is not None:
                yield current, members
                members = []
            current = sample
            members.append((info.name, data.read()))
        if current is not None:
            yield current, members


def pack_shards(
    layout: ImageLayout,
    shard_mb: float,
    parts: Sequence[tuple[int, str]],
    duplicates: Container[str] = (),
) -> PackResult:
    """Append the staged samples of the complete ``parts`` ((index, digest), in input order)
    that no shard holds yet, less ``duplicates`` (ids), then close the last shard."""
    book = ImageShardBook.load(layout, shard_bytes(shard_mb))
    packed = {name.split("@", 1)[0]: name for name in (*book.done, *book.partial)}
    added = 0
    for index, digest in parts:
        group = group_name(index, digest)
        earlier = packed.get(part_name(index))
        if earlier is not None and earlier != group:
            raise ValueError(changed_since_packed(layout, index, earlier, group))
        if group in book.done:
            continue
        staged = layout.staged_samples(index)
        if not staged.exists():
            raise FileNotFoundError(
                f"{staged} is missing: part {index}'s kept images are not staged; run again "
                "with --overwrite to redo the output"
            )
        samples = [(sid, m) for sid, m in staged_samples(staged) if sid not in duplicates]

        by_id = dict(samples)
        added += book.add_group(
            group, list(by_id), lambda todo, by_id=by_id: ((sid, by_id[sid]) for sid in todo)
        )
    book.close()
    for index, digest in parts:
        if group_name(index, digest) in book.done:
            layout.staged_samples(index).unlink(missing_ok=True)
    closed, _ = listing(book.shards)
    total = sum(
        json.loads((book.shards / shard_name(n, "json")).read_bytes())["samples"] for n in closed
    )
    return PackResult(len(closed), total, added)
