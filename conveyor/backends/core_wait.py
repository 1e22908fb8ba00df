"""How long a worker's thread has waited for a core: Linux's scheduler statistics.

A batch's wall time on a machine whose cores are all busy includes the time its thread was
ready to run but waited on a run queue. That time is the machine's, not the stage's: more
workers of the stage cannot shorten it (they add to it), and an autoscaler that sized the
stage by its wall time would keep adding workers to a stage that only waits for cores. A
worker measures the wait over each batch and reports it apart (``BatchOutcome.queued_s``).

``/proc/thread-self/schedstat`` gives, in its second field, the nanoseconds the calling
thread has spent runnable but waiting; its file is opened once per thread and read with
``pread`` (1-2 us a read). Where it is missing (not Linux, a kernel without scheduler
statistics) the wait reads 0 and nothing changes.
"""

from __future__ import annotations

import os
import threading

_local = threading.local()
_PATH = "/proc/thread-self/schedstat"


def _forget_in_child() -> None:
    """A forked child's thread is not its parent's: the file the parent's thread opened
    names that thread (``thread-self`` is resolved when opened), so the child opens its own."""
    global _local
    fd = getattr(_local, "fd", None)
    if fd is not None and fd >= 0:
        os.close(fd)
    _local = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def core_wait_s() -> float:
    """Seconds the calling thread has waited for a core since it started (0.0: unknown)."""
    fd = getattr(_local, "fd", None)
    if fd is None:
        try:
            fd = os.open(_PATH, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            fd = -1
        _local.fd = fd
    if fd < 0:
        return 0.0
    try:
        return int(os.pread(fd, 96, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0
