"""WebDataset shards filled by appending samples: ``shard-NNNNNN.tar``, each with its index.

A shard is a plain tar, which is all WebDataset reads. Samples come in *groups* (a video's
clips, a part of an image dataset), and a ``TarShardBook`` appends each group's samples, in
order, to the shard being filled under a work folder. A shard that a sample would take past
the target size is closed first: its index ``shard-NNNNNN.json`` (sample ids by group, and
the groups whose last sample it holds) is written, then the tar is renamed into the shards
folder. A shard exists there only once closed.

Resuming never puts a sample in two shards. After each group the shard being filled records
what it holds and its length in bytes (``open.json`` in the work folder), so whoever comes
next (a restarted worker, the next run) takes it up there, cutting off what a crash left
half-written after it. A group counts as done once a closed shard or that record lists it
complete; a group cut across a rollover adds only the samples no closed shard holds. Shards
are only ever added to.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: ``--shard-mb``'s default: shards of about 1 GiB, as WebDataset's own writer makes
DEFAULT_SHARD_MB = 1024.0
#: what a tar is written in: 512-byte blocks, ended by two zero blocks and padded to a record
BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE
_NAME = re.compile(r"^shard-(\d{6,})\.(tar|json)$")
OPEN_STATE = "open.json"

#: a sample's tar members: (name, bytes)
Members = list[tuple[str, bytes]]
#: the samples of the given ids, as (id, members), in order
SampleSource = Callable[[list[str]], Iterator[tuple[str, Members]]]


def shard_name(number: int, suffix: str = "tar") -> str:
    return f"shard-{number:06d}.{suffix}"


def member_size(length: int) -> int:
    """Bytes a member of ``length`` bytes takes in a tar: its header and padded data."""
    return BLOCK + -(-length // BLOCK) * BLOCK


def shard_bytes(shard_mb: float) -> int:
    """``--shard-mb`` (MiB) in bytes."""
    return max(1, round(shard_mb * 2**20))


def check_key(key: str, what: str = "sample id") -> None:
    """A WebDataset key holds no dot (it would split the key from its extension) and no
    slash."""
    if "." in key or "/" in key:
        raise ValueError(
            f"{what} {key!r} cannot be a WebDataset key (a dot or slash would split it)"
        )


@dataclass
class _Filling:
    """The shard being filled: its number, bytes of whole samples (no end of archive yet),
    and what it holds (``open.json``)."""

    shard: int
    size: int = 0
    samples: int = 0
    groups: dict[str, list[str]] = field(default_factory=dict)
    complete: list[str] = field(default_factory=list)


class TarShardBook:
    """The shards under ``shards``: which groups and samples they hold, and the shard being
    filled in ``work`` (``load`` takes it up where it was). ``write_json(path, obj)`` writes
    a file atomically; ``group_field`` is what the index calls the groups."""

    group_field = "groups"

    def __init__(
        self,
        shards: Path,
        work: Path,
        target_bytes: int,
        write_json: Callable[[Path, Any], None],
    ) -> None:
        self.shards = shards
        self.work = work
        self.target_bytes = target_bytes
        self.write_json = write_json
        #: groups whose every sample is in a shard (closed, or the one being filled)
        self.done: set[str] = set()
        #: samples of groups not done yet that shards hold already (a group cut by a rollover)
        self.partial: dict[str, set[str]] = {}
        self.next_shard = 0
        self.filling: _Filling | None = None

    def take_up(self) -> None:
        """Read the shards as the folders hold them. An index whose tar is absent (a crash
        before the rename) is removed; a tar without its index is refused (``listing``)."""
        closed, indexes = listing(self.shards)
        for number in indexes - closed:
            (self.shards / shard_name(number, "json")).unlink(missing_ok=True)
        for number in sorted(closed):
            index = json.loads((self.shards / shard_name(number, "json")).read_bytes())
            self._note(index[self.group_field], index["complete"])
        self.next_shard = max(closed, default=-1) + 1
        self._take_up_filling(closed)

    @classmethod
    def packed(cls, shards: Path, work: Path) -> set[str]:
        """The groups the shards under ``shards`` hold, whole or in part (the shard being
        filled too), read without touching them (``take_up`` tidies as it reads)."""
        return set(cls.held(shards, work))

    @classmethod
    def held(cls, shards: Path, work: Path) -> dict[str, set[str]]:
        """The samples the shards under ``shards`` hold (the shard being filled too), by
        group, read without touching them."""
        held: dict[str, set[str]] = {}

        def note(groups: dict[str, list[str]]) -> None:
            for group, ids in groups.items():
                held.setdefault(group, set()).update(ids)

        closed, _ = listing(shards)
        for number in closed:
            note(json.loads((shards / shard_name(number, "json")).read_bytes())[cls.group_field])
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
            note(json.loads((work / OPEN_STATE).read_bytes())[cls.group_field])
        return held

    def _note(self, groups: dict[str, list[str]], complete: Iterable[str]) -> None:
        for group, ids in groups.items():
            self.partial.setdefault(group, set()).update(ids)
        for group in complete:
            self.done.add(group)
            self.partial.pop(group, None)

    def _take_up_filling(self, closed: set[int]) -> None:
        """Go on with the shard an earlier worker or run was filling, cut to the length it
        recorded; drop it if it was closed meanwhile or is shorter than recorded."""
        state_path = self.work / OPEN_STATE
        try:
            state = json.loads(state_path.read_bytes())
            filling = _Filling(
                state["shard"],
                state["size"],
                state["samples"],
                state[self.group_field],
                state["complete"],
            )
        except (OSError, ValueError, TypeError, KeyError):
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
        self._note(filling.groups, filling.complete)
        self.next_shard = max(self.next_shard, filling.shard + 1)

    # -- adding ---------------------------------------------------------------------------
    def add_group(self, group: str, ids: Sequence[str], samples: SampleSource) -> int:
        """Append the samples of a complete group that no shard holds yet, in order (those
        of ``ids`` not held, made by ``samples``); returns how many were added."""
        if group in self.done:
            return 0
        have = self.partial.get(group, set())
        todo = [sid for sid in ids if sid not in have]
        for sid, members in samples(todo) if todo else ():
            size = sum(member_size(len(data)) for _, data in members)
            filling = self._filling()
            if filling.samples and filling.size + size > self.target_bytes:
                self._close_filling()
                filling = self._filling()
            self._append(filling, members)
            filling.samples += 1
            filling.groups.setdefault(group, []).append(sid)
            self.partial.setdefault(group, set()).add(sid)
        filling = self._filling()
        filling.complete.append(group)
        self.done.add(group)
        self.partial.pop(group, None)
        self.write_json(self.work / OPEN_STATE, self._state(filling))
        return len(todo)

    def close(self) -> None:
        """Close the shard being filled. One without a sample is not written; where it
        completed groups (each with nothing to pack: every sample failed, filtered or a
        duplicate), it stays open, empty, and records them for the next run: closed with
        nothing, their completion was lost while their staged samples were let go, and the
        next run stopped, asking for what was gone."""
        filling, self.filling = self.filling, None
        if filling is not None and filling.samples:
            self._close(filling)
        elif filling is not None and filling.complete:
            self.work.mkdir(parents=True, exist_ok=True)
            (self.work / shard_name(filling.shard)).touch()  # the empty tar it goes on with
            self.write_json(self.work / OPEN_STATE, self._state(filling))
            return
        elif filling is not None:
            (self.work / shard_name(filling.shard)).unlink(missing_ok=True)
        (self.work / OPEN_STATE).unlink(missing_ok=True)

    def _state(self, filling: _Filling) -> dict[str, Any]:
        return {
            "shard": filling.shard,
            "size": filling.size,
            "samples": filling.samples,
            self.group_field: filling.groups,
            "complete": filling.complete,
        }

    def _filling(self) -> _Filling:
        if self.filling is None:
            self.filling = _Filling(self.next_shard)
            self.next_shard += 1
        return self.filling

    def _close_filling(self) -> None:
        filling, self.filling = self.filling, None
        assert filling is not None
        self._close(filling)

    def _append(self, filling: _Filling, members: Members) -> None:
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
        """End the tar, write its index, then rename the tar into the shards folder."""
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
            self.group_field: filling.groups,
            "complete": filling.complete,
        }
        self.write_json(self.shards / shard_name(filling.shard, "json"), index)
        os.replace(tar, self.shards / shard_name(filling.shard))


def listing(shards: Path) -> tuple[set[int], set[int]]:
    """The numbers of the closed shards and of the indexes under ``shards``; refuses a tar
    without its index (``FileNotFoundError``): only a hand can remove one, and which samples
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
            "(removed by hand?): which samples it holds is unknown; remove the tar too and "
            "run again to write its samples into a new shard"
        )
    return closed, indexes
