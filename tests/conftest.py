"""Shared fixtures: every test checks it left no process behind."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest

#: fixtures for the object-storage tests (an S3 server on 127.0.0.1, a bucket per test)
pytest_plugins = ("tests.s3_server",)

#: pids of process trees a session-scoped fixture owns and stops itself (a Ray cluster's
#: nodes): they and their descendants are not "left behind" by the test that is running
SESSION_ROOTS: set[int] = set()


def _session_pids() -> set[int]:
    pids = set(SESSION_ROOTS)
    for pid in SESSION_ROOTS:
        try:
            pids.update(p.pid for p in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return pids


def live_children() -> list[psutil.Process]:
    alive = []
    exempt = _session_pids() if SESSION_ROOTS else set()
    for child in psutil.Process().children(recursive=True):
        if child.pid in exempt:
            continue
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (``make test``): the tests on the session's
    loopback Ray cluster in two groups of about equal time (each worker that runs one starts
    its own cluster, on ports of its own, and stops it after the group's last test), and the
    tests that start private clusters in a third, so that no two of those race. A no-op
    without pytest-xdist."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            half = "a" if item.path.name == "test_ray.py" else "b"
            item.add_marker(pytest.mark.xdist_group(f"ray-cluster-{half}"))
        elif item.path.name.startswith("test_ray"):
            item.add_marker(pytest.mark.xdist_group("ray-private"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist sends the ids to be scheduled
def pytest_collection_finish(session: pytest.Session) -> None:
    """Put each group in its tests' ids, where pytest-xdist could not: it appends
    ``@group`` to ``Item._nodeid``, which pytest 9 no longer reads (an id is a ``NodeId``
    in ``Item._id``), so without this every group was spread over the workers."""
    if not session.config.getoption("loadgroup", default=False):
        return
    for item in session.items:
        marker = item.get_closest_marker("xdist_group")
        if marker is None or not marker.args or "@" in item.nodeid:
            continue
        name = f"{item.nodeid}@{marker.args[0]}"
        node_id = getattr(item, "_id", None)
        if node_id is not None and hasattr(type(node_id), "parse"):
            item._id = type(node_id).parse(name)
        else:
            item._nodeid = name


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
