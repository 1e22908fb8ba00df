"""``deferred_interrupts``: cleanup that a Ctrl-C must not cut short."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from conveyor.interrupts import deferred_interrupts


@pytest.fixture(autouse=True)
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT as in a terminal (a shell's background job, ``make test &``, ignores it)."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


def test_an_interrupt_in_the_block_is_raised_once_it_ends() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between bytecodes: it would be by now
            done.append(1)
        done.append("end")
    assert done[-1] == "end"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_an_interrupt_nothing_is_raised_and_handlers_are_restored() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with deferred_interrupts():
        pass
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_off_the_main_thread_the_block_runs_as_it_is() -> None:
    seen: list[object] = []

    def body() -> None:
        with deferred_interrupts():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]
