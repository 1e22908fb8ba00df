"""Video engines as resources on the two-node loopback Ray cluster (2 fake GPUs a node):
declared NVDEC units bound a decoding stage's workers, and each worker sees a device."""

from __future__ import annotations

import os
import time

import pytest

ray = pytest.importorskip("ray")

from conveyor import Pipeline, ProcessingStage, Resources  # noqa: E402
from conveyor.backends import RayBackend  # noqa: E402
from conveyor.cluster import WorkerInfo  # noqa: E402
from conveyor.executors import StreamingExecutor  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


class Decode(ProcessingStage[int, str]):
    """One NVDEC unit, a tenth of a CPU, no GPU compute; says which device it sees."""

    resources = Resources(cpus=0.1, nvdecs=1)

    def setup(self, worker: WorkerInfo) -> None:
        self.devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")

    def process(self, task: int) -> str:
        time.sleep(0.1)
        return self.devices


def test_declared_decoders_bound_the_workers_on_the_cluster(address: str) -> None:
    # 2 nodes x 2 GPUs x 1 unit: at most 4 decoding workers, however much work there is
    backend = RayBackend(address, nvdecs_per_gpu=1, nvencs_per_gpu=0)
    # work for the autoscaler to reach the bound on a busy machine too (24 s of it: with 12 s
    # a suite at load 8 once saw the run end at 3 workers)
    result = Pipeline("engines", [Decode()]).run(StreamingExecutor(backend), range(240))
    assert len(result.outputs) == 240 and result.stats["Decode"].peak_workers == 4
    assert all(result.outputs)  # every worker saw a GPU
    with pytest.raises(ValueError, match="nvencs_per_gpu must be >= 0"):
        RayBackend(address, nvencs_per_gpu=-2)
