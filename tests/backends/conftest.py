"""A two-node Ray cluster for the whole session (only when Ray is installed and asked for).

Started on first use by ``ray_cluster``: a head on 127.0.0.2 and a worker node on 127.0.0.3,
2 CPUs and 2 fake GPUs each, private ports and temp dir, token authentication with a token
of its own (``RAY_AUTH_TOKEN_PATH``, so ``~/.ray`` is never touched; this process uses the
same settings). Stopped by process id once the last test of this process that needs it has
run (an idle cluster takes about 5% of a core, and the Ray tests end early in a run), or at
the end of the session; its processes are exempt from the per-test leftover check while it
runs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import conftest as root_conftest

# Ray reads its authentication settings when it is imported, so they are set here, before
# any test module imports it. The token file itself is written when the cluster starts.
TOKEN = Path(tempfile.gettempdir()) / f"cvy-ray-token-{os.getpid()}"
RAY_ENV = {
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN_PATH": str(TOKEN),
    "RAY_USAGE_STATS_ENABLED": "0",
}
os.environ.update(RAY_ENV)


class _SessionCluster:
    """The cluster, started when a test first asks for it, and the tests still to use it.

    Under ``pytest -n`` every test of an ``xdist_group`` runs in one process (``--dist
    loadgroup``), so a process that has begun a group knows all of the group's tests are
    its own; without pytest-xdist every test asking for the cluster is this process's."""

    def __init__(self) -> None:
        self.cluster: object | None = None
        self.root: Path | None = None
        self.waiting: dict[str, set[str]] | None = None  # group -> node ids not yet run
        self.begun: set[str] = set()
        self.failed: Exception | None = None

    def get(self, item: pytest.Item) -> object:
        if self.waiting is None:
            self.waiting = {}
            for each in item.session.items:
                if "ray_cluster" in getattr(each, "fixturenames", ()):
                    self.waiting.setdefault(_group(each), set()).add(each.nodeid)
        self.begun.add(_group(item))
        if self.failed is not None:  # as a session fixture would: no second try
            raise self.failed
        if self.cluster is None:
            from tests.backends.ray_cluster import LocalRayCluster

            # a short path: Ray's unix sockets live below it (108 characters at most)
            self.root = Path(tempfile.mkdtemp(prefix="cvy-ray-"))
            TOKEN.write_text(secrets.token_hex(32))
            TOKEN.chmod(0o600)
            self.cluster = LocalRayCluster(
                self.root, env=RAY_ENV, registry=root_conftest.SESSION_ROOTS
            )
            try:
                self.cluster.start(workers=1)
            except Exception as exc:
                self.failed = exc
                self.stop()
                raise
        return self.cluster

    def done(self, item: pytest.Item) -> None:
        """``item`` has run: the cluster stops once no group begun here has a test left."""
        if self.waiting is None or "ray_cluster" not in getattr(item, "fixturenames", ()):
            return
        self.waiting.get(_group(item), set()).discard(item.nodeid)
        if not any(self.waiting.get(group) for group in self.begun):
            self.stop()

    def stop(self) -> None:
        if self.cluster is None:
            return
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()
        try:
            self.cluster.stop()  # type: ignore[attr-defined]
        finally:
            self.cluster = None
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)


def _group(item: pytest.Item) -> str:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return "all"
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker and marker.args else "all"


_SESSION = _SessionCluster()


@pytest.fixture
def ray_cluster(request: pytest.FixtureRequest) -> object:
    pytest.importorskip("ray")
    return _SESSION.get(request.node)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield  # after the test's own fixtures (its connection to the cluster) are torn down
    _SESSION.done(item)


def pytest_sessionfinish() -> None:
    _SESSION.stop()
    TOKEN.unlink(missing_ok=True)


@pytest.fixture
def address(ray_cluster: object) -> Iterator[str]:
    """The session cluster's address, with this process connected to it."""
    from conveyor.backends.ray import RayConnection

    where = ray_cluster.address  # type: ignore[attr-defined]
    RayConnection(where).connect()
    yield where
