"""The kept clips as WebDataset shards: ``shards/shard-NNNNNN.tar``, each with its index.

A shard is a plain tar, which is all WebDataset reads: per clip the members
``<clip_id>.mp4`` (the clip), ``<clip_id>.json`` (its meta, as ``metas/<clip_id>.json``)
and ``<clip_id>.npy`` (its embedding, where it has one). Clip ids are UUIDs, so a sample's
key holds no dot but its extension's, as WebDataset wants.

``ShardWriter`` is one worker after the ``ClipWriter``. When a task says that its video is
complete (``Video.record``), the video's kept clips are read back from the output (clip
files, the clip table, the embeddings: a video's clips arrive in pieces, in any order) and
appended to the shard being filled, ``.conveyor/shards/shard-NNNNNN.tar``. A shard that a
clip would take past the target size is closed first: its index ``shard-NNNNNN.json``
(clip ids by video, and the videos whose last clip it holds) is written, then the tar is
renamed into ``shards/``. A shard exists under ``shards/`` only once closed. The last one is
closed by ``finish_shards``, which ``run_video`` calls once the stream has ended (only the
driver knows when that is).

Resuming never puts a clip in two shards. After each video the shard being filled records
what it holds and its length in bytes (``.conveyor/shards/open.json``), so whoever comes
next (a restarted worker, ``finish_shards``, the next run) takes it up there, cutting off
what a crash left half-written after it. A video counts as done once a closed shard or that
record lists it complete; a video cut across a rollover adds only the clips no closed shard
holds. A video whose record was written but whose clips reached no shard (a crash between
the two, or an output made before shards were asked for) is added by ``finish_shards``,
which goes over every complete video of the run. Shards are only ever added to: a video
redone because its source changed keeps its earlier clips in the shards they are in
(``--overwrite`` starts afresh).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from conveyor.media.layout import OutputLayout
from conveyor.media.table import clip_metas
from conveyor.media.tar_shards import (
    DEFAULT_SHARD_MB,
    OPEN_STATE,
    Members,
    TarShardBook,
    check_key,
    listing,
    member_size,
    shard_bytes,
    shard_name,
)
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.storage import ObjectPath, StoragePath
from conveyor.tasks.video import VideoTask, video_id

__all__ = [
    "DEFAULT_SHARD_MB",
    "OPEN_STATE",
    "ShardBook",
    "ShardWriter",
    "check_shards",
    "finish_shards",
    "member_size",
    "shard_bytes",
    "shard_name",
]


class ShardBook(TarShardBook):
    """The shards of one local output: which videos and clips they hold, and the shard
    being filled (``load`` takes it up where it was)."""

    group_field = "videos"

    def __init__(self, layout: OutputLayout, target_bytes: int) -> None:
        shards, work = layout.shards, layout.open_shard
        if not isinstance(shards, Path) or not isinstance(work, Path):
            raise ValueError(
                f"shards need a local output (a tar is filled by appending to it): {layout.root}"
            )
        super().__init__(shards, work, target_bytes, layout.write_json)
        self.layout = layout
        self._last: tuple[StoragePath, Any] | None = None

    @classmethod
    def load(cls, layout: OutputLayout, target_bytes: int) -> ShardBook:
        """The shards as the output holds them (``TarShardBook.take_up``)."""
        book = cls(layout, target_bytes)
        book.take_up()
        return book

    def add_video(self, vid: str, record: dict[str, Any]) -> int:
        """Append the kept clips of a complete video (its record) that no shard holds yet,
        in order; returns how many were added."""
        kept = record["kept"]

        def samples(todo: list[str]) -> Iterator[tuple[str, Members]]:
            metas = self._metas(vid, todo, self.layout.table_of(vid, record))
            vectors = self._embeddings(vid)
            for cid in todo:
                yield cid, _sample(cid, self.layout, metas[cid], vectors.get(cid))

        return self.add_group(vid, kept, samples)

    # -- reading a video back -------------------------------------------------------------
    def _metas(self, vid: str, ids: Sequence[str], table: StoragePath) -> dict[str, dict[str, Any]]:
        """The metas of ``ids``: from the video's clip table (its rows of a shared one),
        else (an output written before tables) from ``metas/``."""
        if not ids:
            return {}
        layout = self.layout
        if table.exists():
            import pyarrow.compute as pc

            # its own rows: all of its own table, some of one it shares
            rows = self._read(table)
            rows = rows.filter(pc.equal(rows["video_id"], vid))
            return {m["clip_id"]: m for m in clip_metas(rows)}
        metas = {}
        for cid in ids:
            try:
                metas[cid] = json.loads(layout.meta_path(cid).read_bytes())
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"clip {cid} of video {vid} has no meta: neither {table} nor "
                    f"{layout.meta_path(cid)} exists"
                ) from None
        return metas

    def _read(self, table: StoragePath) -> Any:
        """A clip table, the last one read kept: the videos sharing one come in a row."""
        if self._last is None or self._last[0] != table:
            self._last = (table, self.layout.read_table(table))
        return self._last[1]

    def _embeddings(self, vid: str) -> dict[str, Any]:
        import numpy as np

        path = self.layout.embedding_path(vid)
        if not path.exists():
            return {}
        table = self.layout.read_table(path, columns=["clip_id", "embedding"])
        ids = table.column("clip_id").to_pylist()
        flat = table.column("embedding").combine_chunks().flatten().to_numpy()
        vectors = flat.reshape(len(ids), -1).astype(np.float32, copy=False)
        return dict(zip(ids, vectors, strict=True))


def _sample(
    cid: str, layout: OutputLayout, meta: dict[str, Any], vector: Any
) -> list[tuple[str, bytes]]:
    """The tar members of one clip: its bytes, its meta and, where it has one, its
    embedding in NumPy's ``.npy`` format."""
    check_key(cid, "clip id")
    text = json.dumps(meta, ensure_ascii=False) + "\n"
    members = [
        (f"{cid}.mp4", layout.clip_path(cid).read_bytes()),
        (f"{cid}.json", text.encode("utf-8", "backslashreplace")),
    ]
    if vector is not None:
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, np.asarray(vector, dtype=np.float32), allow_pickle=False)
        members.append((f"{cid}.npy", buffer.getvalue()))
    return members


def check_shards(output: str | os.PathLike[str]) -> None:
    """Refuse an output whose shards cannot be resumed (a tar without its index) before a
    run starts, rather than at its first completed video."""
    shards = OutputLayout(output).shards
    assert isinstance(shards, Path), "shards need a local output (VideoConfig says so)"
    listing(shards)


class ShardWriter(ProcessingStage[VideoTask, VideoTask]):
    """Append each completed video's kept clips to WebDataset shards under ``output``.

    One worker: the shards are filled one after the other and numbered in order. The task
    goes on unchanged. The last shard is closed by ``finish_shards`` after the run (a
    script that runs the pipeline itself calls it too).
    """

    resources = Resources(cpus=0.25)
    num_workers = 1

    def __init__(
        self, output: str | os.PathLike[str] | ObjectPath, shard_mb: float = DEFAULT_SHARD_MB
    ) -> None:
        if not shard_mb > 0:
            raise ValueError(f"shard_mb must be > 0, got {shard_mb}")
        self.output = str(output)
        self.shard_mb = shard_mb
        self._book: ShardBook | None = None

    def process(self, task: VideoTask) -> VideoTask:
        video = task.data
        if video.record is None:
            return task  # the video is not complete yet
        if self._book is None:
            self._book = ShardBook.load(OutputLayout(self.output), shard_bytes(self.shard_mb))
        try:
            self._book.add_video(video.video_id, video.record)
        except BaseException:
            self._book = None  # what is on disk is the truth: taken up again next time
            raise
        return task


def finish_shards(
    output: str | os.PathLike[str] | ObjectPath,
    shard_mb: float,
    complete: Iterable[str],
) -> None:
    """After a run: add the complete videos (``complete``: their relative paths) that no
    shard holds, then close the shard being filled."""
    layout = OutputLayout(output)
    book = ShardBook.load(layout, shard_bytes(shard_mb))
    for relative in complete:
        vid = video_id(relative)
        if vid in book.done:
            continue
        record = layout.read_record(relative)
        if record is not None:
            book.add_video(vid, record)
    book.close()
