"""Where the video pipeline's outputs go, and how a run tells finished work from unfinished.

::

    OUT/clips/<clip_id>.mp4              kept clips
    OUT/filtered_clips/<clip_id>.mp4     filtered clips (only with write_filtered)
    OUT/metas/<clip_id>.json             one per clip made, kept or filtered
    OUT/embeddings/<video_id>.parquet    clip_id, embedding: one row per kept clip
    OUT/text_embeddings/<video_id>.parquet  clip_id, text, embedding (when text is embedded)
    OUT/videos/<relative path>.json      the video: metadata, clip ids, errors
    OUT/summary.json                     the run's totals
    OUT/.conveyor/                       work in progress (temporary files, staging)

Every file is written under ``.conveyor/tmp`` and renamed into place, so a reader never sees
half a file. A video is *complete* once its ``videos/<relative path>.json`` exists: that record
is written last, after every clip, meta and embedding of the video. Before a video's first
file is written its clip ids are logged in staging (``intent``), so a run killed half-way can
remove exactly what the unfinished video left behind before doing it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from conveyor.tasks.video import video_id

INTERNAL = ".conveyor"


class OutputLayout:
    """Paths and atomic writes under one output directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.clips = self.root / "clips"
        self.filtered_clips = self.root / "filtered_clips"
        self.metas = self.root / "metas"
        self.embeddings = self.root / "embeddings"
        self.text_embeddings = self.root / "text_embeddings"
        self.videos = self.root / "videos"
        self.summary = self.root / "summary.json"
        self.internal = self.root / INTERNAL
        self.tmp = self.internal / "tmp"
        self.staging = self.internal / "staging"
        self.config = self.internal / "config.json"

    # -- paths ----------------------------------------------------------------------------
    def clip_path(self, clip_id: str, kept: bool = True) -> Path:
        return (self.clips if kept else self.filtered_clips) / f"{clip_id}.mp4"

    def meta_path(self, clip_id: str) -> Path:
        return self.metas / f"{clip_id}.json"

    def embedding_path(self, vid: str) -> Path:
        return self.embeddings / f"{vid}.parquet"

    def text_embedding_path(self, vid: str) -> Path:
        return self.text_embeddings / f"{vid}.parquet"

    def video_record(self, relative_path: str) -> Path:
        return self.videos / f"{relative_path}.json"

    def staging_dir(self, vid: str) -> Path:
        return self.staging / vid

    # -- atomic writes --------------------------------------------------------------------
    @contextlib.contextmanager
    def _replacing(self, final: Path) -> Iterator[str]:
        """A temporary file's path to write; renamed to ``final`` when the block ends, removed
        if it raises."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=final.name[:40] + ".", dir=self.tmp)
        os.close(fd)
        try:
            yield temp
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    def write_bytes(self, path: Path, data: bytes) -> None:
        """Write ``data`` to a temporary file and rename it to ``path``."""
        with self._replacing(path) as temp, open(temp, "wb") as out:
            out.write(data)

    def write_json(self, path: Path, obj: Any) -> None:
        self.write_bytes(path, (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode())

    def write_parquet(self, path: Path, table: Any) -> None:
        import pyarrow.parquet as pq

        with self._replacing(path) as temp:
            pq.write_table(table, temp, compression="zstd")

    # -- resume ---------------------------------------------------------------------------
    def read_record(self, relative_path: str) -> dict[str, Any] | None:
        """A complete video's record, or ``None`` (absent or unreadable: not complete)."""
        try:
            record = json.loads(self.video_record(relative_path).read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def is_complete(self, relative_path: str, size: int, mtime: float) -> bool:
        """Finished in an earlier run from this very file (same size and modification time)."""
        record = self.read_record(relative_path)
        if record is None:
            return False
        source = record.get("source", {})
        return source.get("size_bytes") == size and source.get("mtime") == mtime

    def reset(self, relative_path: str) -> int:
        """Remove what an unfinished (or outdated) run of this video left; returns files
        removed. Clip files are found through the staging intents and the old record."""
        vid = video_id(relative_path)
        removed = 0
        ids: set[str] = set()
        staging = self.staging_dir(vid)
        for intent in staging.glob("intent-*.json"):
            with contextlib.suppress(OSError, ValueError):
                ids.update(json.loads(intent.read_text()).get("clip_ids", []))
        record = self.read_record(relative_path)
        if record is not None:
            ids.update(record.get("clips", []))
        for cid in ids:
            for path in (self.clip_path(cid), self.clip_path(cid, False), self.meta_path(cid)):
                removed += _unlink(path)
        for path in (
            self.embedding_path(vid),
            self.text_embedding_path(vid),
            self.video_record(relative_path),
        ):
            removed += _unlink(path)
        shutil.rmtree(staging, ignore_errors=True)
        return removed

    def sweep_tmp(self) -> int:
        """Delete temporary files a killed run left (only one run may use ``root`` at once)."""
        if not self.tmp.is_dir():
            return 0
        removed = 0
        for path in self.tmp.iterdir():
            removed += _unlink(path)
        return removed


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1


def relative_paths(records: Iterable[Path], videos_dir: Path) -> list[str]:
    """Relative source paths of the records under ``videos_dir``."""
    return sorted(str(p.relative_to(videos_dir))[: -len(".json")] for p in records)
