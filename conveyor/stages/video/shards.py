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
import re
import tarfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.video.layout import OutputLayout
from conveyor.stages.video.table import clip_metas
from conveyor.storage import ObjectPath
from conveyor.tasks.video import VideoTask, video_id

#: ``--shard-mb``'s default: shards of about 1 GiB, as WebDataset's own writer makes
DEFAULT_SHARD_MB = 1024.0
#: what a tar is written in: 512-byte blocks, ended by two zero blocks and padded to a record
BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE
_NAME = re.compile(r"^shard-(\d{6,})\.(tar|json)$")
OPEN_STATE = "open.json"


def shard_name(number: int, suffix: str = "tar") -> str:
    return f"shard-{number:06d}.{suffix}"


def member_size(length: int) -> int:
    """Bytes a member of ``length`` bytes takes in a tar: its header and padded data."""
    return BLOCK + -(-length // BLOCK) * BLOCK


@dataclass
class _Filling:
    """The shard being filled: its number, bytes of whole samples (no end of archive yet),
    and what it holds (``open.json``)."""

    shard: int
    size: int = 0
    samples: int = 0
    videos: dict[str, list[str]] = field(default_factory=dict)
    complete: list[str] = field(default_factory=list)


class ShardBook:
    """The shards of one local output: which videos and clips they hold, and the shard
    being filled (``load`` takes it up where it was)."""

    def __init__(self, layout: OutputLayout, target_bytes: int) -> None:
        shards, work = layout.shards, layout.open_shard
        if not isinstance(shards, Path) or not isinstance(work, Path):
            raise ValueError(
                f"shards need a local output (a tar is filled by appending to it): {layout.root}"
            )
        self.layout = layout
        self.target_bytes = target_bytes
        self.shards = shards
        self.work = work
        #: videos whose every kept clip is in a shard (closed, or the one being filled)
        self.done: set[str] = set()
        #: clips of videos not done yet that shards hold already (a video cut by a rollover)
        self.partial: dict[str, set[str]] = {}
        self.next_shard = 0
        self.filling: _Filling | None = None

    @classmethod
    def load(cls, layout: OutputLayout, target_bytes: int) -> ShardBook:
        """The shards as the output holds them. An index whose tar is absent (a crash
        before the rename) is removed; a tar without its index is refused (``_listing``)."""
        book = cls(layout, target_bytes)
        closed, indexes = _listing(book.shards)
        for number in indexes - closed:
            (book.shards / shard_name(number, "json")).unlink(missing_ok=True)
        for number in sorted(closed):
            index = json.loads((book.shards / shard_name(number, "json")).read_bytes())
            book._note(index["videos"], index["complete"])
        book.next_shard = max(closed, default=-1) + 1
        book._take_up(closed)
        return book

    def _note(self, videos: dict[str, list[str]], complete: Iterable[str]) -> None:
        for vid, ids in videos.items():
            self.partial.setdefault(vid, set()).update(ids)
        for vid in complete:
            self.done.add(vid)
            self.partial.pop(vid, None)

    def _take_up(self, closed: set[int]) -> None:
        """Go on with the shard an earlier worker or run was filling, cut to the length it
        recorded; drop it if it was closed meanwhile or is shorter than recorded."""
        state_path = self.work / OPEN_STATE
        try:
            filling = _Filling(**json.loads(state_path.read_bytes()))
        except (OSError, ValueError, TypeError):
            filling = None
        keep = None
        if filling is not None and filling.shard not in closed:
            tar = self.work / shard_name(filling.shard)
            try:
                if tar.stat().st_size >= filling.size:
                    os.truncate(tar, filling.size)
                    keep = tar
            except FileNotFoundError:
                pass
        if self.work.is_dir():
            for path in self.work.iterdir():
                if path != keep and path.name != OPEN_STATE:
                    path.unlink(missing_ok=True)
        if keep is None or filling is None:
            state_path.unlink(missing_ok=True)
            return
        self.filling = filling
        self._note(filling.videos, filling.complete)
        self.next_shard = max(self.next_shard, filling.shard + 1)

    # -- adding ---------------------------------------------------------------------------
    def add_video(self, vid: str, kept: Sequence[str]) -> int:
        """Append the kept clips of a complete video that no shard holds yet, in order;
        returns how many were added."""
        if vid in self.done:
            return 0
        have = self.partial.get(vid, set())
        todo = [cid for cid in kept if cid not in have]
        metas = self._metas(vid, todo)
        vectors = self._embeddings(vid) if todo else {}
        for cid in todo:
            members = _sample(cid, self.layout, metas[cid], vectors.get(cid))
            size = sum(member_size(len(data)) for _, data in members)
            filling = self._filling()
            if filling.samples and filling.size + size > self.target_bytes:
                self._close_filling()
                filling = self._filling()
            self._append(filling, members)
            filling.samples += 1
            filling.videos.setdefault(vid, []).append(cid)
            self.partial.setdefault(vid, set()).add(cid)
        filling = self._filling()
        filling.complete.append(vid)
        self.done.add(vid)
        self.partial.pop(vid, None)
        self.layout.write_json(self.work / OPEN_STATE, asdict(filling))
        return len(todo)

    def close(self) -> None:
        """Close the shard being filled (nothing is written for one without a clip)."""
        filling, self.filling = self.filling, None
        if filling is not None and filling.samples:
            self._close(filling)
        elif filling is not None:
            (self.work / shard_name(filling.shard)).unlink(missing_ok=True)
        (self.work / OPEN_STATE).unlink(missing_ok=True)

    def _filling(self) -> _Filling:
        if self.filling is None:
            self.filling = _Filling(self.next_shard)
            self.next_shard += 1
        return self.filling

    def _close_filling(self) -> None:
        filling, self.filling = self.filling, None
        assert filling is not None
        self._close(filling)

    def _append(self, filling: _Filling, members: list[tuple[str, bytes]]) -> None:
        tar = self.work / shard_name(filling.shard)
        self.work.mkdir(parents=True, exist_ok=True)
        with open(tar, "r+b" if filling.size else "wb") as out:
            out.seek(filling.size)
            out.truncate()  # what a failed append left past the last whole sample
            now = time.time()
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), now, 0o644
                out.write(info.tobuf(tarfile.USTAR_FORMAT))
                out.write(data)
                out.write(bytes(-len(data) % BLOCK))
        filling.size += sum(member_size(len(data)) for _, data in members)

    def _close(self, filling: _Filling) -> None:
        """End the tar, write its index, then rename the tar into ``shards/``."""
        tar = self.work / shard_name(filling.shard)
        with open(tar, "r+b") as out:
            out.seek(filling.size)
            out.truncate()
            end = filling.size + 2 * BLOCK
            out.write(bytes(2 * BLOCK + -end % RECORD))
            total = out.tell()
        index = {
            "shard": shard_name(filling.shard),
            "samples": filling.samples,
            "bytes": total,
            "videos": filling.videos,
            "complete": filling.complete,
        }
        self.layout.write_json(self.shards / shard_name(filling.shard, "json"), index)
        os.replace(tar, self.shards / shard_name(filling.shard))

    # -- reading a video back -------------------------------------------------------------
    def _metas(self, vid: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The metas of ``ids``: from the video's clip table, else (an output written
        before tables) from ``metas/``."""
        if not ids:
            return {}
        layout = self.layout
        table = layout.clip_table_path(vid)
        if table.exists():
            return {m["clip_id"]: m for m in clip_metas(layout.read_table(table))}
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
    if "." in cid or "/" in cid:
        raise ValueError(
            f"clip id {cid!r} cannot be a WebDataset key (a dot or slash would split it)"
        )
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


def _listing(shards: Path) -> tuple[set[int], set[int]]:
    """The numbers of the closed shards and of the indexes under ``shards``; refuses a tar
    without its index (``FileNotFoundError``): only a hand can remove one, and which clips
    the tar holds is then unknown."""
    closed, indexes = set(), set()
    if shards.is_dir():
        for path in shards.iterdir():
            match = _NAME.match(path.name)
            if match is not None:
                (closed if match.group(2) == "tar" else indexes).add(int(match.group(1)))
    unindexed = sorted(closed - indexes)
    if unindexed:
        number = unindexed[0]
        raise FileNotFoundError(
            f"{shards / shard_name(number)} has no index {shard_name(number, 'json')} "
            "(removed by hand?): which clips it holds is unknown; remove the tar too and "
            "run again to write its clips into a new shard"
        )
    return closed, indexes


def check_shards(output: str | os.PathLike[str]) -> None:
    """Refuse an output whose shards cannot be resumed (a tar without its index) before a
    run starts, rather than at its first completed video."""
    shards = OutputLayout(output).shards
    assert isinstance(shards, Path), "shards need a local output (VideoConfig says so)"
    _listing(shards)


def shard_bytes(shard_mb: float) -> int:
    """``--shard-mb`` (MiB) in bytes."""
    return max(1, round(shard_mb * 2**20))


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
            self._book.add_video(video.video_id, video.record["kept"])
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
            book.add_video(vid, record["kept"])
    book.close()
