"""Resuming a text run: what an interrupted run finished, and how the next one takes it up.

A text run's unit of work is a read task (``ReadTask``: about 16 MB of the input); its
batches reach the end of a pass as ``FileGroupTask``s whose metadata holds the counts the
summary adds up. The driver appends each one's metadata to its pass's log, one JSON line
(``OUTPUT/.conveyor/resume/pass-1.jsonl``), written through at once: a killed process
(``kill -9``, an OOM kill) loses none of it, and what it names was written before it. A
read task is finished once every batch it made is in the log (its last batch says how
many). The data files are not ``fsync``ed: after an OS crash or a power loss, the log
(``fsync``ed now and then) may name files the disk lost, and such an output is started
over by removing ``OUTPUT/.conveyor``.

The next run with the same input (paths, sizes and modification times), the same options and
the same Conveyor version (``run.json``) leaves the finished tasks out
(``TextPartitioner(skip=...)``), adds their counts from the log and does the rest: the
outputs a redone task writes have the names they had, and the dedup keys and embeddings it
spills replace theirs or are read as the repeats they are. Anything else, a changed option
or input, starts over. Deduplication is resolved again (it needs every document's keys);
pass 2's log counts only while the ids to remove and the staged rows are those it was made
with (``pass-2.json``). Publishing rewrites the parts to one schema (atomically, file by
file), then forgets the state: a run stopped while it moves them is done again whole rather
than published from a half-moved folder. An output in an object store does not resume (the
logs are appended to, which a bucket cannot do).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.pipelines.text import TextLayout
    from conveyor.pipelines.text_config import TextConfig
    from conveyor.stages.text.readers import InputListing

log = logging.getLogger(__name__)

FORMAT = 1
#: at most this long between an output reaching the driver and its line reaching the disk
SYNC_S = 0.5


@dataclass
class Finished:
    """A pass's read tasks an earlier run finished (their indices) and the metadata of
    their outputs, in task order."""

    tasks: frozenset[int] = frozenset()
    outputs: list[dict[str, Any]] = field(default_factory=list)


def read_log(path: Path) -> Finished:
    """The finished tasks of the log at ``path`` (none when there is no log). A line a
    crash cut short, or one that is not an output's metadata, is passed over: its task is
    not finished, and runs again."""
    from conveyor.stages.text.readers import BATCHES, SHARD

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Finished()
    parts: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    made: dict[int, int] = {}
    for line in data.split(b"\n"):
        try:
            metadata = json.loads(line)
            index, batch = (int(n) for n in str(metadata[SHARD]).split("-"))
        except (ValueError, TypeError, KeyError):
            continue  # blank, torn or foreign: its task counts as not finished
        parts[index][batch] = metadata
        if isinstance(metadata.get(BATCHES), int):
            made[index] = metadata[BATCHES]
    done = sorted(i for i, got in parts.items() if i in made and set(got) == set(range(made[i])))
    outputs = [parts[i][j] for i in done for j in sorted(parts[i])]
    return Finished(frozenset(done), outputs)


class PassLog:
    """The log of one pass: the earlier run's finished outputs, then this run's."""

    def __init__(self, path: Path, kept: Finished, sync_s: float = SYNC_S) -> None:
        from conveyor.storage import atomic_write

        self.path = path
        self.sync_s = sync_s
        path.parent.mkdir(parents=True, exist_ok=True)
        # the lines of unfinished tasks go: their tasks run again and write them anew
        with atomic_write(path) as out:
            out.write(b"".join(_line(metadata) for metadata in kept.outputs))
        self._file = open(path, "ab")  # noqa: SIM115 - held for the pass
        self._synced = time.monotonic()

    def add(self, metadata: dict[str, Any]) -> None:
        self._file.write(_line(metadata))
        self._file.flush()
        if time.monotonic() - self._synced >= self.sync_s:
            self._sync()

    def _sync(self) -> None:
        os.fsync(self._file.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self._sync()
        finally:
            self._file.close()


def _line(metadata: dict[str, Any]) -> bytes:
    return json.dumps(metadata, default=str).encode() + b"\n"


def fingerprint(config: TextConfig, listing: InputListing) -> dict[str, Any]:
    """What a run must share with an interrupted one to take up its work: the options
    (the dedup keys' partitions too: spilled keys are made for them), and each input
    file's path, size and, on a disk, modification time (a file rewritten to the same
    size was resumed with its old documents); a digest of them: a million files' names
    would make a big file."""
    from conveyor.storage import is_url

    files = hashlib.sha256()
    for f in listing.files:
        when = None if is_url(f.path) else _modified(f.path)
        files.update(json.dumps([f.path, f.size, when]).encode() + b"\n")
    from conveyor import __version__

    state = {
        "format": FORMAT,
        "conveyor": __version__,  # a filter or reader changed by an upgrade: not mixed
        "options": {**config.options(), "dedup_partitions": config.dedup_partitions},
        "input": {"files": len(listing.files), "sha256": files.hexdigest()},
    }
    return _as_read(state)


def _as_read(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as a file holding it reads back (tuples as lists, ...), to compare."""
    result: dict[str, Any] = json.loads(json.dumps(state, default=str))
    return result


def _read_json(path: Path) -> dict[str, Any] | None:
    """The object in the state file at ``path``; None where there is none (or a torn one)."""
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return state if isinstance(state, dict) else None


def _modified(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:  # gone since it was listed: the run says so when it reads it
        return None


def _digest(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:  # (8 bytes per removed document: not read at once)
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


class TextResume:
    """A text run's resume state under ``layout``: made at the run's start, it keeps an
    interrupted run's work when input and options are the same, else clears it."""

    def __init__(
        self,
        layout: TextLayout,
        config: TextConfig,
        listing: InputListing,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.layout = layout
        self.enabled = isinstance(layout.root, Path)
        self.folder = Path(str(layout.internal)) / "resume"
        self.state = self.folder / "run.json"
        self.first = Finished()
        #: told whether the run takes up an earlier one's work, or why not
        self.say = say or log.info
        if not self.enabled:
            layout.clear_work()
            return
        wanted = fingerprint(config, listing)
        earlier = _read_json(self.state)
        if earlier is not None and earlier == wanted:
            self.first = read_log(self.folder / "pass-1.jsonl")
            if self.first.tasks:
                self.say(
                    f"resuming: {len(self.first.tasks):,} read task(s) an earlier run finished "
                    "are not read again"
                )
            return
        if earlier is not None:
            self.say(
                f"starting over: {_changed(earlier, wanted)} changed since the interrupted run"
            )
        # the state goes before the files it names: a run stopped while they were removed
        # left logs vouching for files gone, which a run with the old options resumed from
        self.forget()
        layout.clear_work()
        self.folder.mkdir(parents=True, exist_ok=True)
        from conveyor.storage import atomic_write

        with atomic_write(self.state) as out:
            out.write(json.dumps(wanted).encode())

    def first_log(self) -> PassLog | None:
        return PassLog(self.folder / "pass-1.jsonl", self.first) if self.enabled else None

    def second(self) -> tuple[Finished, PassLog | None]:
        """Pass 2's finished tasks and its log, once dedup is resolved: kept while the ids
        to remove and the staged files are those the earlier pass 2 had, else cleared."""
        if not self.enabled:
            return Finished(), None
        from conveyor.storage import atomic_write, remove_tree

        staged = self.layout.staging
        wanted = {
            "removed": _digest(self.layout.removed),
            "staging": sorted(
                [p.name, p.stat().st_size] for p in Path(str(staged)).glob("*") if p.is_file()
            ),
        }
        path = self.folder / "pass-2.json"
        finished = Finished()
        log_path = self.folder / "pass-2.jsonl"
        if _read_json(path) == _as_read(wanted):
            finished = read_log(log_path)
        else:
            # in this order: a stop between two steps leaves no log naming parts gone
            path.unlink(missing_ok=True)
            log_path.unlink(missing_ok=True)
            remove_tree(self.layout.ready)
            with atomic_write(path) as out:
                out.write(json.dumps(wanted).encode())
        if finished.tasks:
            self.say(f"resuming pass 2: {len(finished.tasks):,} task(s) are not done again")
        return finished, PassLog(log_path, finished)

    def forget(self) -> None:
        """Remove the state: the next run starts over (before publishing, and at the end)."""
        import shutil

        if self.enabled:
            self.state.unlink(missing_ok=True)  # first: without it nothing resumes
            shutil.rmtree(self.folder, ignore_errors=True)


def _changed(earlier: dict[str, Any], wanted: dict[str, Any]) -> str:
    """What differs between two fingerprints, in words."""
    if earlier.get("format") != wanted["format"]:
        return "the resume format"
    if earlier.get("conveyor") != wanted["conveyor"]:
        return f"Conveyor's version (from {earlier.get('conveyor')})"
    names = [
        name
        for name in wanted["options"]
        if earlier.get("options", {}).get(name) != wanted["options"][name]
    ]
    if earlier.get("input") != wanted["input"]:
        names.append("the input (its files, their sizes or modification times)")
    return ", ".join(names) or "the run's state"
