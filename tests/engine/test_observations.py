"""What the policies are told of the stages: observations, measured memory, the GPU nodes'
CPU reserve."""

from __future__ import annotations

from conveyor.cluster import NodeInfo
from conveyor.engine.observations import cpus_per_gpu, observations
from conveyor.engine.policies.placement import Ledger
from conveyor.engine.pool import Worker
from conveyor.engine.spec import StageSpec
from conveyor.engine.state import StageState
from conveyor.resources import Resources
from conveyor.result import StageStats


def stage(index: int, resources: Resources, workers: int = 0, target: int = 0) -> StageState:
    spec = StageSpec(index, f"s{index}", resources, 2, None, None)
    state = StageState(spec, StageStats(spec.name))
    for n in range(workers):
        state.pool.add(Worker(f"s{index}-{n}", index))
    state.target = target
    return state


def test_each_stage_is_observed_with_its_shape_workers_and_upstream() -> None:
    ledger = Ledger.of([NodeInfo("n", 16, 2, 80.0)])
    first = stage(0, Resources(cpus=2), workers=3)
    second = stage(1, Resources(cpus=1, gpu_memory_gb=20), workers=1)
    first.done = True
    obs = observations([first, second], ledger, source_done=False)
    assert [o.name for o in obs] == ["s0", "s1"]
    assert (obs[0].cpus, obs[0].gpus, obs[0].workers, obs[0].batch_size) == (2, 0.0, 3, 2)
    assert obs[1].gpus == 0.25  # 20 of the node's 80 GB
    assert not obs[0].upstream_done and obs[1].upstream_done  # the source, then stage 0
    assert obs[0].memory_bytes is None  # nothing declared, nothing measured yet


def test_a_stage_measured_heavier_than_declared_takes_what_it_was_measured_at() -> None:
    heavy = stage(0, Resources(cpus=1, memory_gb=1))
    assert heavy.worker_resources() is heavy.spec.resources
    heavy.note_memory(3 * 2**30)
    heavy.note_memory(2 * 2**30)  # the peak counts
    assert heavy.memory_known and heavy.worker_resources().memory_gb == 3
    ledger = Ledger.of([NodeInfo("n", 4)])
    assert observations([heavy], ledger, source_done=True)[0].memory_bytes == 3 * 2**30


def test_gpu_nodes_keep_cpus_for_gpu_stages_still_short_of_workers() -> None:
    ledger = Ledger.of([NodeInfo("n", 16, 2, 80.0)])
    short = stage(0, Resources(cpus=4, gpus=0.5), workers=1, target=3)
    full = stage(1, Resources(cpus=8, gpus=1), workers=2, target=2)
    assert cpus_per_gpu([short, full], ledger) == 8.0  # 4 CPUs per half a GPU
    short.target = 1
    assert cpus_per_gpu([short, full], ledger) == 0.0  # nobody wants more
