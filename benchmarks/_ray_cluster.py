"""A two-node Ray cluster on loopback for a benchmark (the tests' cluster, with its own token
and temp dir), connected from this process and stopped by process id afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

_PREPARED: tuple[Path, dict[str, str]] | None = None


def prepare() -> None:
    """Make the cluster's token and set Ray's token settings in this process's environment.

    Call it before anything imports ``ray``: Ray reads ``RAY_AUTH_MODE`` once, on import, and a
    process that imported it without them cannot join a token-authenticated cluster."""
    global _PREPARED
    if _PREPARED is not None:
        return
    root = Path(tempfile.mkdtemp(prefix="cvy-bench-ray-"))
    token = root / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    os.environ.update(env)
    _PREPARED = (root, env)


@contextlib.contextmanager
def two_node_cluster(cpus_per_node: int = 1, gpus_per_node: int = 0) -> Iterator[str]:
    """Yields the address of a head (127.0.0.2) and a worker node (127.0.0.3)."""
    global _PREPARED
    prepare()
    assert _PREPARED is not None
    root, env = _PREPARED
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' cluster helper
    from tests.backends.ray_cluster import LocalRayCluster

    cluster = LocalRayCluster(
        root, cpus_per_node=cpus_per_node, gpus_per_node=gpus_per_node, env=env
    )
    try:
        cluster.start(workers=1)
        from conveyor.backends.ray import RayConnection

        RayConnection(cluster.address).connect()
        yield cluster.address
    finally:
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        _PREPARED = None
