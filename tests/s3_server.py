"""A real S3 endpoint for the object-storage tests: moto in server mode, on 127.0.0.1, in a
process of its own (not a mocked client: s3fs speaks HTTP to it as it would to AWS).

``tests/conftest.py`` loads these fixtures for every test module. The server starts once per
session, for the first test that asks for it; each test gets fake credentials and the endpoint
through the environment, exactly where a user's configuration would put them
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), and a bucket of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from conveyor.storage import ObjectPath
from tests.conftest import SESSION_ROOTS

#: what a user's configuration would otherwise contribute, cleared for every test
_AWS_VARIABLES = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start() -> tuple[subprocess.Popen[bytes], str]:
    """moto's server on a free loopback port, once it answers (a port taken meanwhile by
    someone else makes it exit: then another port is tried)."""
    for _ in range(3):
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return proc, f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    raise RuntimeError("moto's S3 server did not start on 127.0.0.1")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint URL of an S3 server that lives for the whole session."""
    pytest.importorskip("moto.server", reason="moto[server] is in the dev extra")
    pytest.importorskip("s3fs", reason="s3fs is in the s3 extra")
    proc, endpoint = _start()
    SESSION_ROOTS.add(proc.pid)
    try:
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        SESSION_ROOTS.discard(proc.pid)


def _forget_clients() -> None:
    """Drop fsspec's cached S3 filesystems: the next one reads the environment again."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Fake credentials and the endpoint in the environment (inherited by worker processes);
    nothing is read from this machine's AWS configuration or its metadata service."""
    for name in _AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    _forget_clients()
    yield s3_server
    _forget_clients()


@pytest.fixture
def bucket(s3_env: str) -> str:
    """``s3://<a new bucket>``, empty."""
    import fsspec

    name = f"test-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3").mkdir(name)
    return f"s3://{name}"


@pytest.fixture
def memory() -> Iterator[ObjectPath]:
    """A fresh prefix of fsspec's in-process ``memory://`` store (this process only)."""
    root = ObjectPath(f"memory://test-{uuid.uuid4().hex[:12]}")
    yield root
    root.remove_tree()


def put(url: ObjectPath, data: bytes) -> str:
    """Write ``data`` at ``url`` directly (as another program would) and return the URL."""
    fs, key = url.filesystem()
    fs.pipe_file(key, data)
    return str(url)
