"""A run's journal: which source tasks are finished, so a re-run skips them.

A source task is finished when everything made from it reached the end of the pipeline,
was filtered, or failed. A source that failed is recorded as such (``"f": 1``), and the
next run tries it again (a failure may have been the moment's: a full disk, a lost store,
a killed worker) until a run finishes it without one; one whose failure was a
``PermanentError`` (trying again cannot help) is finished. The journal is a plain text
file of JSON lines, one per finished source, only ever appended to (with ``fsync``): it
works on a network file system, where databases that lock do not, and a crash can at worst
tear its last line, which the next run ignores. Records are written in groups (at most
every ``sync_s``): a crash loses the last fraction of a second of records, whose sources
then run again, and writers that name outputs deterministically and rename into place make
that harmless.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

from conveyor.errors import JournalError

log = logging.getLogger(__name__)

FORMAT = 1
#: at most this long between a source finishing and its record reaching the disk
SYNC_S = 0.5

JournalKey = Callable[[Any], Any]


def _plain(value: Any, path: str) -> Any:
    """The JSON form of a key: text stays text, a path becomes its text, bytes are tagged."""
    if isinstance(value, str):
        return value
    if isinstance(value, PurePath):
        return os.fspath(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (tuple, list)) and value:
        return [_plain(v, path) for v in value]
    raise JournalError(
        f"{path} is a {type(value).__name__} ({value!r:.80}); a journal key must be a str, "
        "int, bytes, pathlib.Path, or a non-empty tuple of them"
    )


def source_key(task: Any, journal_key: JournalKey | None = None) -> str:
    """The stable key of a source task, as the canonical text the journal stores.

    ``journal_key(task)`` when given; else the value itself for ``str``, ``int``, ``bytes``
    and ``pathlib.Path``; else the ``key`` its task type defines (``FileGroupTask``: its
    paths). Anything else is a ``JournalError`` naming the task.
    """
    kind = type(task)
    if journal_key is not None:
        plain = _plain(journal_key(task), f"journal_key({task!r:.80})")
    elif kind is int:
        return str(task)  # what JSON makes of it, without the encoder
    elif kind is str:
        plain = task
    elif isinstance(task, (str, int, bytes, PurePath)) and not isinstance(task, bool):
        plain = _plain(task, "the source task")
    else:
        key = getattr(task, "key", None)
        if key is None:
            raise JournalError(
                f"a journal needs a stable key for each source task, and "
                f"{type(task).__name__} ({task!r:.80}) has none: pass str, int, bytes or "
                "pathlib.Path tasks, a task type that defines `key` (FileGroupTask: its "
                "paths), or run(..., journal_key=lambda task: ...)"
            )
        plain = _plain(key, f"{type(task).__name__}.key")
    return _canonical(plain)


def _canonical(plain: Any) -> str:
    return json.dumps(plain, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def key_label(key: str) -> str:
    """A lineage id for a journaled source that does not depend on its position in the
    input, so a resumed run (which skips some sources) names its outputs as the first did."""
    return "k" + hashlib.sha1(key.encode()).hexdigest()[:16]


def _digest(key: str) -> bytes:
    """What the journal holds in memory for a key: 16 bytes however long the key (a path
    of a million-video folder is ~100 characters), with no collision to fear at any count
    of sources a run can have."""
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


class Journal:
    """Append-only record of finished source tasks (see the module docstring).

    Open it before the run (``open``), ``record`` each finished key, ``sync`` now and then
    and ``close`` at the end. ``key in journal`` says whether a key is finished (recorded
    by an earlier run or this one); ``len(journal)`` counts them.

    ``skip_finished=False`` is for a pipeline whose sources leave out by themselves what is
    finished, from records of their own (the video and image pipelines): the run then
    takes every source it is given, the journal naming them and recording them still. A
    source whose record was deleted (the way to have one done again) was skipped for ever
    by the journal while the pipeline said it would be tried again.
    """

    def __init__(
        self, path: str | os.PathLike[str], sync_s: float = SYNC_S, *, skip_finished: bool = True
    ) -> None:
        self.path = Path(path)
        self.sync_s = sync_s
        self.skip_finished = skip_finished
        self._finished: set[bytes] = set()  # digests of the finished keys
        #: sources an earlier run recorded as failed: this run tries them again
        self.retried = 0
        self._pending: list[str] = []
        self._file: Any = None
        self._last_sync = float("-inf")  # monotonic time starts near 0 at boot

    def open(self, pipeline: str) -> Journal:
        """Read what earlier runs finished and open the file for appending."""
        if self.path.is_dir():
            raise JournalError(f"journal {self.path} is a directory, expected a file")
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if not fresh:
            self._read()
            if self.retried:
                log.warning(
                    "journal %s: %d source task(s) that failed in an earlier run are tried again",
                    self.path,
                    self.retried,
                )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 - held for the whole run
        except OSError as exc:
            raise JournalError(f"journal {self.path} cannot be written: {exc}") from None
        if fresh:
            header = {"conveyor_journal": FORMAT, "pipeline": pipeline}
            self._file.write(json.dumps(header).encode() + b"\n")
            self._flush()
        return self

    def check(self) -> None:
        """``JournalError`` where the file is there and is not a journal (read its first
        line only): a command says so before it writes anything."""
        if self.path.is_dir():
            raise JournalError(f"journal {self.path} is a directory, expected a file")
        try:
            with open(self.path, "rb") as f:
                first = f.readline()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise JournalError(f"journal {self.path} cannot be read: {exc}") from None
        if first:
            self._check_header(first if first.endswith(b"\n") else b"")

    def _check_header(self, line: bytes) -> None:
        try:
            header = json.loads(line) if line else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("conveyor_journal") != FORMAT:
            raise JournalError(
                f"journal {self.path} is not a Conveyor journal (its first line should be a "
                f'{{"conveyor_journal": {FORMAT}, ...}} header); pass another path'
            )

    def _read(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        torn = lines.pop()  # after the last newline: empty, or a record a crash cut short
        if torn:
            log.warning("journal %s: ignoring a torn last record (%d bytes)", self.path, len(torn))
        self._check_header(lines[0] if lines else b"")
        failed: set[bytes] = set()
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
                digest = _digest(_canonical(record["k"]))
            except (ValueError, KeyError, TypeError):
                raise JournalError(
                    f"journal {self.path}, line {number}: not a record ({line[:80]!r})"
                ) from None
            if record.get("f"):
                failed.add(digest)
            else:
                self._finished.add(digest)
        self.retried = len(failed - self._finished)
        if torn:
            with open(self.path, "r+b") as f:  # the next record must start on its own line
                f.truncate(len(data) - len(torn))

    def __contains__(self, key: str) -> bool:
        return _digest(key) in self._finished

    def __len__(self) -> int:
        return len(self._finished)

    def skips(self, key: str) -> bool:
        """Whether the run leaves the source of ``key`` out: finished, where it does that."""
        return self.skip_finished and key in self

    def record(self, key: str, failed: bool = False) -> None:
        """``key`` is finished for this run; ``failed``: something made from it failed,
        and the next run tries it again."""
        self._finished.add(_digest(key))
        self._pending.append(key + ',"f":1' if failed else key)  # a line: {"k":KEY,"f":1}

    def sync(self, force: bool = False) -> None:
        """Write the pending records when ``sync_s`` has passed (or ``force``)."""
        if not self._pending or self._file is None:
            return
        now = time.monotonic()
        if not force and now - self._last_sync < self.sync_s:
            return
        self._file.write(b"".join(b'{"k":' + k.encode() + b"}\n" for k in self._pending))
        self._pending.clear()
        self._flush()
        self._last_sync = now

    def _flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is None:
            return
        try:
            self.sync(force=True)
        finally:
            self._file.close()
            self._file = None
