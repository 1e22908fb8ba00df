"""Where fast scratch files go: ``/dev/shm`` (memory) when it is writable and has room, else
the temporary folder.

The local backend's payloads between stages and the clips being encoded live there for
seconds. A container's ``/dev/shm`` is often 64 MB (Docker's default, many Kubernetes
pods), which a few payloads or clips fill: every image and every video of a run failed
with "No space left on device", and again on every run. ``/dev/shm`` is taken only with
``MIN_FREE_BYTES`` free; the temporary folder (a disk, its pages cached) is slower only
where memory is short anyway.
"""

from __future__ import annotations

import os
import tempfile

SHM = "/dev/shm"
#: ``/dev/shm`` is chosen only with this much free (a run's payloads in flight and a few
#: clips being written fit in it many times over)
MIN_FREE_BYTES = 1 << 30


def scratch_dir() -> str:
    """``/dev/shm`` when it is writable and has ``MIN_FREE_BYTES`` free, else the
    temporary folder."""
    return SHM if _roomy(SHM) else tempfile.gettempdir()


def scratch_dirs() -> list[str]:
    """Every folder ``scratch_dir`` may give (what a run left in either is swept)."""
    return [*([SHM] if writable(SHM) else []), tempfile.gettempdir()]


def writable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


def free_bytes(path: str) -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _roomy(path: str) -> bool:
    if not writable(path):
        return False
    free = free_bytes(path)
    return free is not None and free >= MIN_FREE_BYTES
