"""A headless Chromium (Debian's, never a downloaded one) shared by the browser tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import SESSION_ROOTS

CHROMIUM_PATHS = ("/usr/bin/chromium",)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str | None:
    for path in CHROMIUM_PATHS:
        if Path(path).is_file():
            return path
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, started once per module. Its processes belong to the fixture, not to the
    test that happens to be running (the leftover-process check exempts them)."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's Chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install -e '.[dev]')")
    before = {p.pid for p in psutil.Process().children()}
    manager = sync_playwright().start()
    try:
        roots = {p.pid for p in psutil.Process().children()} - before
        SESSION_ROOTS.update(roots)  # the driver, and Chromium below it
        try:
            chromium = manager.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        except Error as exc:
            pytest.skip(f"Chromium at {executable} does not start: {str(exc).splitlines()[0]}")
        try:
            yield chromium
        finally:
            chromium.close()
    finally:
        manager.stop()
        SESSION_ROOTS.difference_update(roots)
