"""``examples/curator/`` run on XennaExecutor (streaming and batch) on this machine; the Ray
executors run them in ``tests/backends/test_ray_curator.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.backends.local import LocalBackend
from conveyor.curator.backends.xenna import XennaExecutor
from tests.curator.examples import check_seeds, check_text, check_video, example


@pytest.mark.parametrize("mode", ["streaming", "batch"])
def test_seeds_example(mode: str) -> None:
    executor = XennaExecutor({"execution_mode": mode}, backend=LocalBackend(num_gpus=2))
    check_seeds(example("seeds_stages").main(executor))


@pytest.mark.parametrize("mode", ["streaming", "batch"])
def test_text_example(mode: str, tmp_path: Path) -> None:
    executor = XennaExecutor({"execution_mode": mode}, backend=LocalBackend(num_gpus=1))
    check_text(tmp_path, example("text_pipeline").main(tmp_path, executor))


def test_video_example(tmp_path: Path) -> None:
    check_video(tmp_path, example("video_pipeline").main(tmp_path))
