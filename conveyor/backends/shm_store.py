"""Payloads in shared memory for the local backend: the controller moves paths, never bytes.

Small payloads travel inline in the handle (a syscall costs more than copying them). Larger
ones are written once by their producer to a file under ``/dev/shm`` and mapped by their
consumer; pickle protocol 5 keeps array and Arrow buffers out of band, so those are read
straight from the mapping without a copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import itertools
import logging
import mmap
import os
import pickle
import shutil
import struct
import uuid
import weakref
from pathlib import Path
from typing import Any

import cloudpickle

from conveyor.engine.messages import Handle
from conveyor.errors import UnpicklablePayload
from conveyor.scratch import MIN_FREE_BYTES, SHM, scratch_dir, scratch_dirs, writable

log = logging.getLogger(__name__)

INLINE_LIMIT = 32 * 1024
#: payloads from this size on are mapped, not copied: a copy of less takes microseconds, and
#: a process may hold only so many mappings (vm.max_map_count, 65,530 by default)
MAP_MIN_BYTES = 1 << 20
_MAGIC = b"CVY1"
_HEADER = struct.Struct("<4sIQ")  # magic, number of out-of-band buffers, pickle length
_LEN = struct.Struct("<Q")
_ALIGN = 64


def _mapped(fd: int, size: int) -> memoryview:
    """The file ``fd`` mapped private and writable (copy on write), without keeping ``fd``.

    ``mmap.mmap`` keeps a duplicate of the descriptor for as long as the mapping lives
    (``trackfd=False`` came in 3.13), so each output a caller holds kept one: a run's
    thousand outputs of arrays hit the common limit of 1,024 open files, and the process
    could open no more. The mapping is made with libc instead and unmapped once nothing
    views it any more."""
    if size == 0:
        return memoryview(bytearray())
    address = _LIBC.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot map a payload of {size} bytes: {os.strerror(code)}")
    region = (ctypes.c_char * size).from_address(address)
    # not at exit: an array read by an earlier atexit handler, or by a daemon thread still
    # running then, would read unmapped memory (a segfault); the system unmaps at exit
    weakref.finalize(region, _LIBC.munmap, address, size).atexit = False
    return memoryview(region).cast("B")


def _read(file: Any) -> memoryview:
    """A payload file's bytes: mapped from ``MAP_MIN_BYTES`` on, else copied (and copied
    past the mappings a process may have: a caller holding that many outputs)."""
    size = os.fstat(file.fileno()).st_size
    if size >= MAP_MIN_BYTES:
        try:
            return _mapped(file.fileno(), size)
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
    copied = bytearray(size)
    file.readinto(copied)
    return memoryview(copied)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64
    ]  # fmt: skip
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_LIBC = _libc()
_MAP_FAILED = ctypes.c_void_p(-1).value


def default_root() -> Path:
    """``/dev/shm`` where it has room, else the temporary folder (``conveyor.scratch``)."""
    return Path(scratch_dir())


#: a file in each run directory that its driver holds an exclusive ``flock`` on while it runs
LOCK_NAME = ".lock"


def _owner_gone(entry: Path) -> bool:
    """Whether the driver that made run directory ``entry`` is gone.

    The driver holds a lock on the directory's lock file for its whole life; the kernel drops
    it when the process dies, even by ``kill -9``. That survives what a pid in the name does
    not: a recycled pid, or a driver in another pid namespace sharing ``/dev/shm``. A
    directory without a lock file (made before the lock existed, or crashed before taking
    it) falls back to its pid: gone only if no such process exists.
    """
    try:
        fd = os.open(entry / LOCK_NAME, os.O_RDWR)
    except FileNotFoundError:
        pass
    except OSError:
        return False  # not ours to judge (another user's)
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its driver is alive
        finally:
            os.close(fd)
        return True
    try:
        pid = int(entry.name.split("-")[1])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def claim_dir(root: Path) -> int:
    """Lock run directory ``root`` for as long as the returned descriptor stays open.

    The lock is taken on a temporary name and renamed into place, so a concurrent sweep
    never finds this directory's lock file unlocked. The descriptor is not inherited by
    programs this process starts, so the lock dies with this process alone.
    """
    taking = root / f"{LOCK_NAME}.new"
    fd = os.open(taking, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(taking, root / LOCK_NAME)
    return fd


def sweep_stale(base: Path, pattern: str = "conveyor-*") -> None:
    """Remove run directories whose driver is gone (a hard crash that took the root along).

    Cheap enough for every start: one ``flock`` attempt per run directory present.
    """
    for entry in base.glob(pattern):
        if entry.is_dir() and _owner_gone(entry):
            shutil.rmtree(entry, ignore_errors=True)


#: types pickle writes itself, before it would ask cloudpickle's ``reducer_override``
#: (which sees only other objects) or its dispatch table: for an object of exactly one of
#: these, ``pickle.dumps`` gives the bytes ``cloudpickle.dumps`` gives, with no buffer out
#: of band, without building cloudpickle's pickler (~2.5 us, most of an int's put)
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})


class ShmStore:
    """One run's payload directory; each process names its files with its own prefix."""

    def __init__(self, root: Path, owner: str) -> None:
        self.root = root
        self.owner = owner
        self._seq = itertools.count()
        self._lock: int | None = None  # the driver's: held while the run may use the store
        self._full_said = False

    @classmethod
    def create(cls, base: Path | None = None) -> ShmStore:
        """A new run directory, locked by this process (after sweeping those of dead runs)."""
        if base is None:
            # both places: a crashed run's payloads in a /dev/shm left short of room would
            # keep every later run off it, and never be swept
            for folder in scratch_dirs():
                sweep_stale(Path(folder))
            base = default_root()
            if str(base) != SHM and Path(SHM).is_dir():
                log.warning(
                    "payloads between stages go to %s: %s %s",
                    base,
                    SHM,
                    f"has less than {MIN_FREE_BYTES >> 20} MiB free"
                    if writable(SHM)
                    else "may not be written",
                )
        else:
            sweep_stale(base)
        root = base / f"conveyor-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        root.mkdir(mode=0o700)
        store = cls(root, "d")
        store._lock = claim_dir(root)
        return store

    def put(self, obj: Any, label: str) -> Handle:
        buffers: list[pickle.PickleBuffer] = []
        try:
            if type(obj) in _PLAIN:  # the same bytes as cloudpickle's, a tenth of its cost
                data = pickle.dumps(obj, protocol=5)
            else:
                data = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        except UnpicklablePayload.CAUSES as exc:
            raise UnpicklablePayload.of(obj, exc) from exc
        except Exception as exc:  # its own __reduce__ raised: tried again, said where
            raise RuntimeError(
                f"pickling output {label} (a {type(obj).__name__}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        size = len(data) + sum(b.raw().nbytes for b in buffers)
        if size <= INLINE_LIMIT and not buffers:
            return Handle(data, size, label)
        path = os.path.join(self.root, f"{self.owner}-{next(self._seq)}")
        try:
            with open(path, "wb") as f:
                f.write(_HEADER.pack(_MAGIC, len(buffers), len(data)))
                f.write(data)
                offset = _HEADER.size + len(data)
                for buf in buffers:
                    raw = buf.raw()
                    offset += _LEN.size
                    pad = -offset % _ALIGN
                    f.write(_LEN.pack(raw.nbytes) + b"\0" * pad)
                    f.write(raw)
                    offset += pad + raw.nbytes
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # the store's disk is full (a small /dev/shm filled after the run began): the
            # payload travels in the message instead, slower, rather than fail its task
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self._say_full(exc)
            return Handle(cloudpickle.dumps(obj, protocol=5), size, label)
        return Handle(path, size, label)

    def _say_full(self, exc: OSError) -> None:
        if not self._full_said:
            self._full_said = True
            log.warning(
                "%s is full (%s): payloads go in the messages between processes instead, "
                "slower; give it more room (a container: docker run --shm-size=2g)",
                self.root.parent,
                exc.strerror,
            )

    @staticmethod
    def get(handle: Handle) -> Any:
        ref = handle.ref
        if isinstance(ref, bytes):
            return pickle.loads(ref)
        with open(ref, "rb") as f:
            view = _read(f)
        magic, count, length = _HEADER.unpack_from(view, 0)
        if magic != _MAGIC:
            raise ValueError(f"payload {ref} is corrupt (bad header)")
        offset = _HEADER.size
        data = view[offset : offset + length]
        offset += length
        buffers = []
        for _ in range(count):
            (nbytes,) = _LEN.unpack_from(view, offset)
            offset += _LEN.size
            offset += -offset % _ALIGN
            buffers.append(view[offset : offset + nbytes])
            offset += nbytes
        return pickle.loads(data, buffers=buffers)

    @staticmethod
    def delete(handles: Any) -> None:
        for handle in handles:
            if isinstance(handle.ref, str):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(handle.ref)

    def bytes_on_disk(self) -> int:
        total = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    total += entry.stat().st_size
        return total

    def destroy(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
