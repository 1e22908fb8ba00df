"""``examples/curator/`` on NeMo Curator's Ray executors (``RayDataExecutor``,
``RayActorPoolExecutor`` from ``conveyor.curator``) on the two-node loopback Ray cluster with
fake GPUs; XennaExecutor runs them in ``tests/curator/test_examples.py``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from conveyor.curator.backends.ray_actor_pool import RayActorPoolExecutor  # noqa: E402
from conveyor.curator.backends.ray_data import RayDataExecutor  # noqa: E402
from tests.curator.examples import check_seeds, check_text, check_video, example  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def executors(address: str) -> dict[str, Callable[[], Any]]:
    def quiet(make: Callable[[], Any]) -> Callable[[], Any]:
        def made() -> Any:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "experimental", tested elsewhere
                return make()

        return made

    return {
        "ray_data": quiet(lambda: RayDataExecutor(address=address)),
        "actor_pool": quiet(lambda: RayActorPoolExecutor(address=address, show_progress=False)),
    }


@pytest.mark.parametrize("kind", ["ray_data", "actor_pool"])
def test_examples_on_the_ray_executors(kind: str, address: str, tmp_path: Path) -> None:
    make = executors(address)[kind]
    check_seeds(example("seeds_stages").main(make()))
    check_text(tmp_path / "text", example("text_pipeline").main(tmp_path / "text", make()))
    check_video(tmp_path / "video", example("video_pipeline").main(tmp_path / "video", make()))


def test_workers_per_node_count_the_clusters_nodes(address: str) -> None:
    from conveyor.curator.pipeline import Pipeline
    from conveyor.curator.stages.base import ProcessingStage
    from conveyor.curator.tasks import DocumentBatch

    class PerNode(ProcessingStage[Any, Any]):
        name = "per_node"

        def num_workers_per_node(self) -> float:
            return 1

        def process(self, task: Any) -> Any:
            import os

            task._metadata["pid"] = os.getpid()
            return task

    import pandas as pd

    tasks = [DocumentBatch(f"{i}", "ds", pd.DataFrame({"n": [i]})) for i in range(20)]
    executor = executors(address)["actor_pool"]()
    out = Pipeline("per-node", stages=[PerNode()]).run(executor, tasks)
    assert len(out) == 20
    assert executor.nodes(executor.conveyor_executor()) == 2  # a head and a worker node
