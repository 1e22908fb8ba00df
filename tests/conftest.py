"""Shared fixtures: every test checks it left no process behind."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest


def live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail a test that leaves a worker or host process running after it returns."""
    yield
    deadline = time.monotonic() + 5
    while live_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = live_children()
    for proc in left:
        proc.kill()
    assert not left, f"processes left behind: {[p.cmdline() for p in left]}"
