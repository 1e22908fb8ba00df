"""A two-node Ray cluster for the whole session (only when Ray is installed and asked for).

Started on first use by ``ray_cluster``: a head on 127.0.0.2 and a worker node on 127.0.0.3,
2 CPUs and 2 fake GPUs each, private ports and temp dir, token authentication with a token
of its own (``RAY_AUTH_TOKEN_PATH``, so ``~/.ray`` is never touched; this process uses the
same settings). Stopped by process id
at the end of the session; its processes are exempt from the per-test leftover check while
it runs.
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


def pytest_sessionfinish() -> None:
    TOKEN.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    pytest.importorskip("ray")
    from tests.backends.ray_cluster import LocalRayCluster

    # a short path: Ray's unix sockets live below it (108 characters at most)
    root = Path(tempfile.mkdtemp(prefix="cvy-ray-"))
    TOKEN.write_text(secrets.token_hex(32))
    TOKEN.chmod(0o600)
    cluster = LocalRayCluster(root, env=RAY_ENV, registry=root_conftest.SESSION_ROOTS)
    try:
        cluster.start(workers=1)
        yield cluster
    finally:
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def address(ray_cluster: object) -> Iterator[str]:
    """The session cluster's address, with this process connected to it."""
    from conveyor.backends.ray import RayConnection

    where = ray_cluster.address  # type: ignore[attr-defined]
    RayConnection(where).connect()
    yield where
