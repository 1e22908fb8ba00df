"""What the policies are told of the stages: an observation of each for the autoscaler, and
the CPUs per GPU that placement keeps free on GPU nodes for GPU stages still short of
workers. Pure functions of the controller's records (``engine.state``) and the ledger."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.engine.policies.autoscale import StageObservation
from conveyor.engine.policies.placement import Ledger
from conveyor.engine.state import StageState


def observations(
    stages: Sequence[StageState], ledger: Ledger, source_done: bool
) -> list[StageObservation]:
    """Each stage as the autoscaler sees it: its shape (a GPU share measured in GPU memory
    where it asks for memory), its workers, measurements, backlog and whether its upstream
    is done (``source_done`` for the first)."""
    node = next(iter(ledger.nodes.values()), None)
    obs = []
    for index, stage in enumerate(stages):
        spec = stage.spec
        res = spec.resources
        gpus = float(res.whole_gpus) if res.gpus >= 1 else res.gpus
        if res.gpu_memory_gb and node is not None and node.gpu_memory_gb:
            gpus = res.gpu_fraction(node.gpu_memory_gb)
        obs.append(
            StageObservation(
                name=spec.name,
                cpus=res.cpus,
                gpus=gpus,
                batch_size=spec.batch_size,
                pinned=spec.num_workers,
                workers=stage.pool.live_count,
                task_time_s=stage.meter.task_time.value,
                cpu_time_s=stage.meter.cpu_time.value,
                fanout=stage.meter.fanout.value,
                backlog=stage.backlog,
                upstream_done=source_done if index == 0 else stages[index - 1].done,
                setup_s=stage.meter.setup_s.value,
                memory_bytes=(
                    float(stage.worker_resources().memory_bytes)
                    if stage.memory_known or res.memory_gb
                    else None
                ),
                nvdecs=res.nvdecs,
                nvencs=res.nvencs,
            )
        )
    return obs


def cpus_per_gpu(stages: Sequence[StageState], ledger: Ledger) -> float:
    """CPUs per GPU that GPU stages still wanting workers need: kept free on GPU nodes.

    Only stages short of their target count: a reserve for GPUs that no stage will use
    would only starve the CPU stages (and a stage-at-a-time run, where a CPU stage runs
    alone).
    """
    memory = next((n.gpu_memory_gb for n in ledger.nodes.values() if n.gpu_memory_gb), None)
    ratios = [0.0]
    for stage in stages:
        if stage.done or stage.pool.live_count >= stage.target:
            continue
        res = stage.spec.resources
        share = float(res.whole_gpus) if res.gpus >= 1 else res.gpus
        if res.gpu_memory_gb and memory:
            share = res.gpu_memory_gb / memory
        if share > 0:
            ratios.append(res.cpus / share)
    return max(ratios)
