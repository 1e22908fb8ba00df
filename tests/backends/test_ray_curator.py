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


def test_a_tutorial_s_ray_client_starts_a_cluster_its_executors_run_on_and_stops_it() -> None:
    """NeMo Curator's tutorials start ``RayClient()`` first; there was none to import. In a
    process of its own (this one is joined to the session's cluster)."""
    import json
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import json, warnings, psutil, ray
        import pandas as pd
        from conveyor.curator.core.client import RayClient
        from conveyor.curator.backends.ray_data import RayDataExecutor
        from conveyor.curator.pipeline import Pipeline
        from conveyor.curator.stages.base import ProcessingStage
        from conveyor.curator.tasks import DocumentBatch

        class Double(ProcessingStage):
            name = "double"

            def process(self, task):
                return DocumentBatch(task.dataset_name, task.to_pandas() * 2)

        client = RayClient(num_cpus=2, include_dashboard=False)
        client.start()
        cpus = ray.cluster_resources().get("CPU")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "experimental"
            executor = RayDataExecutor()
        tasks = [DocumentBatch("ds", pd.DataFrame({"n": [i]})) for i in range(3)]
        out = Pipeline("p", stages=[Double()]).run(executor, tasks)
        up = ray.is_initialized()
        client.stop()
        left = [p.name() for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE]
        print(json.dumps({"cpus": cpus, "n": sorted(int(t.to_pandas()["n"][0]) for t in out),
                          "up": up, "after": ray.is_initialized(), "left": left}))
        """
    )
    # a cluster of its own: not the session cluster's address or token
    env = {
        k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("RAY_AUTH")
    }
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=repo, env=env, capture_output=True, text=True,
        timeout=200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"cpus": 2.0, "n": [0, 2, 4], "up": True, "after": False, "left": []}
