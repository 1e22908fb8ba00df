"""``semantic_dedup``'s passes on the two-node loopback Ray cluster: the marks are those the
local backend finds on the same input."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

from conveyor.backends import RayBackend  # noqa: E402
from conveyor.dedup import semantic_dedup  # noqa: E402
from conveyor.executors import StreamingExecutor  # noqa: E402
from tests.dedup.test_semantic import planted, write  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_semantic_dedup_on_ray_marks_what_local_marks(address: str, tmp_path: Path) -> None:
    vectors, ids = planted(3_000, seed=2)
    write(tmp_path / "in", vectors, ids.tolist(), files=4)
    options = {"threshold": 0.95, "n_clusters": 3, "partition_rows": 1_500, "chunk_rows": 1_000}
    on_ray = semantic_dedup(
        tmp_path / "in",
        tmp_path / "ray",
        executor=StreamingExecutor(RayBackend(address)),
        **options,
    )
    local = semantic_dedup(tmp_path / "in", tmp_path / "local", **options)
    assert on_ray.duplicates == local.duplicates > 250
    marks = {
        name: {
            r["id"]: r["duplicate_of"]
            for r in pq.read_table(tmp_path / name / "duplicates.parquet").to_pylist()
        }
        for name in ("ray", "local")
    }
    assert marks["ray"] == marks["local"]


@pytest.mark.parametrize("command", ["dedup", "text"])
def test_the_commands_join_a_running_cluster(command: str, address: str, tmp_path: Path) -> None:
    """``--backend ray --address`` failed at once for ``conveyor text`` and ``conveyor
    dedup``: they declared 0 GPUs, which only a private cluster takes. (A process of its
    own: in this one Ray is already connected, and declared resources are not looked at.)"""
    import subprocess
    import sys

    if command == "dedup":
        vectors, ids = planted(200, seed=3)
        write(tmp_path / "in", vectors, ids.tolist(), files=1)
        source = tmp_path / "in"
    else:
        source = tmp_path / "docs.jsonl"
        source.write_text('{"text": "a short document about the weather and the sea"}\n')
    args = [command, str(source), str(tmp_path / "out"), "--backend", "ray", "--address", address]
    args += ["--no-live"] if command == "text" else []
    done = subprocess.run(
        [sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "out" / ("dedup.json" if command == "dedup" else "summary.json")).exists()
