"""The video pipeline on the two-node loopback Ray cluster: RayBackend (streaming, with the
shot splitter's single stateful worker) and RayDataExecutor give the clips the local backend
gives, in the same layout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from conveyor.backends import LocalBackend, RayBackend  # noqa: E402
from conveyor.backends.ray import RayConnection  # noqa: E402
from conveyor.executors import RayDataExecutor, StreamingExecutor  # noqa: E402
from conveyor.pipelines.video import VideoConfig, run_video  # noqa: E402
from conveyor.samples.video import Segment, write_bad_file, write_video  # noqa: E402
from tests.backends.ray_cluster import LocalRayCluster  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def address(ray_cluster: LocalRayCluster) -> Iterator[str]:
    RayConnection(ray_cluster.address).connect()
    yield ray_cluster.address


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-videos")
    write_video(
        root / "a.mp4", [Segment("pan", 4, 1), Segment("rings", 4, 2)], width=160, height=96
    )
    write_video(root / "b.mkv", [Segment("checker", 5, 3)], width=160, height=96)
    write_bad_file(root / "broken.mp4", "not_video")
    return root


def clips_by_video(output: Path) -> dict[str, list[str]]:
    return {
        str(p.relative_to(output / "videos"))[: -len(".json")]: json.loads(p.read_text())["clips"]
        for p in (output / "videos").rglob("*.json")
    }


def config(videos: Path, output: Path, **changes: Any) -> VideoConfig:
    values: dict[str, Any] = {"tags": False, "quality": False, "gpus": False}
    values.update(changes)
    return VideoConfig(str(videos), str(output), **values)


def test_ray_backend_runs_the_shot_pipeline_like_the_local_backend(
    address: str, videos: Path, tmp_path: Path
) -> None:
    shots = {"detector": "histogram", "max_clip_s": 3.0, "embed": True}
    local = run_video(
        config(videos, tmp_path / "local", **shots), StreamingExecutor(LocalBackend())
    )
    on_ray = run_video(
        config(videos, tmp_path / "ray", **shots), StreamingExecutor(RayBackend(address))
    )
    assert on_ray.result.completed, on_ray.result.failures
    assert clips_by_video(tmp_path / "ray") == clips_by_video(tmp_path / "local")
    assert on_ray.summary["clips"] == local.summary["clips"]
    assert on_ray.summary["videos"]["failed"] == 1
    assert len(list((tmp_path / "ray" / "embeddings").glob("*.parquet"))) == 2


def test_ray_data_executor_runs_the_fixed_stride_pipeline(
    address: str, videos: Path, tmp_path: Path
) -> None:
    fixed = {"splitter": "fixed", "clip_len_s": 3.0, "embed": False}
    local = run_video(
        config(videos, tmp_path / "local", **fixed), StreamingExecutor(LocalBackend())
    )
    data = run_video(config(videos, tmp_path / "data", **fixed), RayDataExecutor(address))
    assert data.result.completed, data.result.failures
    assert clips_by_video(tmp_path / "data") == clips_by_video(tmp_path / "local")
    assert data.summary["clips"] == local.summary["clips"]


def test_on_declared_gpus_the_decoding_stages_take_nvdec_units_and_fall_back_per_video(
    address: str, videos: Path, tmp_path: Path
) -> None:
    """On the cluster's declared GPUs the shot detector's decoder and the transcoder ask
    for NVDEC units, not compute: Ray gives their workers a device, NVDEC is asked for,
    and no driver takes it here, so every video is decoded on the CPU and says why."""
    from conveyor.media.decode import nvdec_works

    if nvdec_works():
        pytest.skip("NVDEC works here: the videos are decoded on it")
    changes = {"detector": "histogram", "max_clip_s": 3.0, "embed": False, "gpus": True}
    out = tmp_path / "ray"
    report = run_video(config(videos, out, **changes), StreamingExecutor(RayBackend(address)))
    assert report.result.completed, report.result.failures
    ok = [json.loads(p.read_text()) for p in (out / "videos").rglob("*.json")]
    ok = [r for r in ok if r["status"] == "ok"]
    assert len(ok) == 2
    for record in ok:
        assert record["decoders"] == record["shot_decoders"] == ["cpu"]
        assert "h264_cuvid does not open" in record["decoder_fallback"]
        assert "h264_cuvid does not open" in record["shot_decoder_fallback"]
    # the same frames, so the same clips, as decoding on the CPU without GPUs
    local = tmp_path / "local"
    on_cpu = config(videos, local, **{**changes, "gpus": False})
    assert run_video(on_cpu, StreamingExecutor(LocalBackend())).result.completed
    assert clips_by_video(out) == clips_by_video(local)
