"""One run at a time per output folder.

A run sweeps its output's temporary files, resets the videos or parts it will redo, clears
its work folders and, with ``--overwrite``, the whole output: a second run started on the
same output by mistake would do that to the first one's work in flight. So every run that
writes an output holds an exclusive ``flock`` on ``OUTPUT/.conveyor.lock`` from before it
touches anything until it ends, and a second one stops at once with ``OutputInUse``, naming
the run that holds it. The kernel drops the lock when its process ends, however it ends
(``kill -9`` too), so a crashed run never blocks the next.

Only a local (or mounted) folder is locked: an object store has no lock to take, so two
runs into one bucket prefix are the user's to avoid.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

from conveyor.errors import OutputInUse

#: the lock file, at the output's top (``--overwrite`` clears ``.conveyor/`` under a held lock)
LOCK_NAME = ".conveyor.lock"

P = ParamSpec("P")
R = TypeVar("R")

#: the lock files this process holds (the command and the pipeline it runs both take the
#: lock: the inner hold is the outer one's; threads of one process are not told apart)
_held: set[Path] = set()


def lock_path(output: str | os.PathLike[str]) -> Path | None:
    """Where ``output``'s lock is, or ``None`` where there is none to take: a URL, or a path
    that cannot be a folder (the run's own checks say why)."""
    from conveyor.storage import is_url, nearest_existing

    if is_url(output) or not nearest_existing(output).is_dir():
        return None
    return Path(output).expanduser().absolute() / LOCK_NAME


@contextlib.contextmanager
def output_lock(output: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``output``'s lock for the ``with`` block, creating the folder; raise
    ``OutputInUse`` if another run holds it."""
    path = lock_path(output)
    if path is None:
        yield
        return
    if path in _held:
        yield
        return
    made = not path.parent.exists()
    fd = _acquire(path, output)
    _held.add(path)
    try:
        yield
    finally:
        _held.discard(path)
        with contextlib.suppress(OSError):
            os.unlink(path)  # before the lock goes: whoever opens the path next gets a new file
        os.close(fd)
        if made:  # a run that stopped before writing leaves no empty output behind
            with contextlib.suppress(OSError):
                path.parent.rmdir()


def locks_output(
    output_of: Callable[..., str | os.PathLike[str]],
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated entry point (``run_video``...) holding the lock of the output that
    ``output_of`` finds in its arguments."""

    def decorate(run: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(run)
        def locked(*args: P.args, **kwargs: P.kwargs) -> R:
            with output_lock(output_of(*args, **kwargs)):
                return run(*args, **kwargs)

        return locked

    return decorate


def _acquire(path: Path, output: str | os.PathLike[str]) -> int:
    import fcntl

    for _ in range(5):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # said in a line, not a traceback out of pathlib
            reason = exc.strerror or str(exc)
            raise type(exc)(f"cannot create the output {output}: {reason}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputInUse(
                f"{output} is being written by another run ({holder}): wait for it to end, "
                "or write to another output"
            ) from None
        # a run that ends unlinks the file before unlocking it: a file locked after that
        # is no longer the one at the path, and the next one is made afresh
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            _describe_self(fd)
            return fd
        os.close(fd)
    raise OutputInUse(f"{output}: its lock file {path} keeps being replaced by other runs")


def _describe_self(fd: int) -> None:
    """Who holds the lock, for the message of a run that finds it taken."""
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)


def _holder(fd: int) -> str:
    try:
        me = json.loads(os.pread(fd, 4096, 0))
        return f"pid {me['pid']} on {me['host']}, since {me['since']}: {me['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "it has not said which yet"
