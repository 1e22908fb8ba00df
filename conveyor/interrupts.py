"""Cleanup that an interrupt must not cut short.

A second Ctrl-C (or a SIGTERM) landing while a backend removed its processes and shared
memory left both behind, for the life of the process and after it. ``deferred_interrupts``
holds such signals for the length of a block and raises them when it ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

#: the signals a run is stopped by (the commands turn SIGTERM and SIGHUP into Ctrl-C's)
DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Within the block, the stop signals whose handlers are Python functions (Ctrl-C's
    ``KeyboardInterrupt``) are noted, not handled; once it ends, the first one noted is
    handed to its handler. Only the main thread can do this: elsewhere (and for signals
    left to the system) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[tuple[int, FrameType | None]] = []

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append((signum, frame))

    saved: dict[int, Any] = {}
    for sig in DEFERRED:
        handler = signal.getsignal(sig)
        if callable(handler):
            saved[sig] = signal.signal(sig, note)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if noted:
            signum, frame = noted[0]
            saved[signum](signum, frame)
