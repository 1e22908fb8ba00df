"""The image pipeline on the two-node loopback Ray cluster: the stages and the semantic
dedup's passes on RayBackend write the metadata and the shards the local backend writes."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from conveyor.backends import LocalBackend, RayBackend  # noqa: E402
from conveyor.executors import StreamingExecutor  # noqa: E402
from conveyor.pipelines.image import ImageConfig, run_image  # noqa: E402
from tests.pipelines.test_image import make_inputs, metadata  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def shard_ids(output: Path) -> list[str]:
    ids = []
    for tar in sorted((output / "shards").glob("*.tar")):
        with tarfile.open(tar) as shard:
            ids += [m.name.split(".")[0] for m in shard if m.name.endswith(".json")]
    return ids


def config(inputs: Path, output: Path) -> ImageConfig:
    options: dict[str, Any] = {
        "dedup": "semantic", "semantic_clusters": 1, "nsfw": False, "tags": False,
        "images_per_task": 6, "shard_mb": 0.05, "gpus": False,
    }  # fmt: skip
    return ImageConfig(str(inputs), str(output), **options)


def test_ray_backend_curates_images_like_the_local_backend(address: str, tmp_path: Path) -> None:
    inputs = make_inputs(tmp_path)
    local = run_image(config(inputs, tmp_path / "local"), StreamingExecutor(LocalBackend()))
    on_ray = run_image(config(inputs, tmp_path / "ray"), StreamingExecutor(RayBackend(address)))
    assert on_ray.result.completed and not on_ray.result.failures, on_ray.result.failures
    assert on_ray.summary["images"] == local.summary["images"]
    assert on_ray.summary["images"]["duplicates"] == 2  # the copy and the mirrored one
    assert metadata(tmp_path / "ray") == metadata(tmp_path / "local")
    assert shard_ids(tmp_path / "ray") == shard_ids(tmp_path / "local")
