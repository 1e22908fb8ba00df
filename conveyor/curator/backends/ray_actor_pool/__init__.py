"""NeMo Curator's ``RayActorPoolExecutor``: one stage at a time on Ray actors (experimental).

It runs on Conveyor's ``BatchExecutor`` with a ``RayBackend``: each stage gets the whole
cluster and finishes before the next starts, as NeMo Curator's does, with Conveyor's
retries, failure records and memory limits. Config keys:

- ``resource_wait_timeout_s``: how long a worker may wait for Ray to grant its resources
  (``RayBackend(schedule_timeout_s=)``);
- ``resource_wait_interval_s``: no effect (Ray tells when it grants them): a warning;
- ``reserved_cpus``, ``reserved_gpus``: only 0 (keeping part of a joined cluster free is
  not supported);
- ``runtime_env``: only empty (install the stages' packages where the workers run);
- ``ignore_failures``: as ``XennaExecutor``.

``show_progress`` logs a status table every ``progress_interval`` seconds.
"""

from __future__ import annotations

import warnings
from typing import Any

from conveyor.curator.backends.base import BaseExecutor, experimental, positive
from conveyor.curator.backends.status_log import StatusLog

__all__ = ["RayActorPoolExecutor", "ray_nodes"]


class RayActorPoolExecutor(BaseExecutor):
    """Stage by stage on Ray actors (experimental: ``XennaExecutor`` is the one to use)."""

    defaults = {
        "ignore_failures": False,
        "runtime_env": None,
        "reserved_cpus": 0.0,
        "reserved_gpus": 0.0,
        "resource_wait_timeout_s": 300.0,
        "resource_wait_interval_s": None,
    }

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        ignore_head_node: bool = False,
        show_progress: bool = True,
        progress_interval: float = 10.0,
        *,
        address: str | None = None,
        num_cpus: float | None = None,
        num_gpus: int | None = None,
    ) -> None:
        super().__init__(config, ignore_head_node)
        config = self.config
        if config["runtime_env"]:
            raise ValueError(
                "RayActorPoolExecutor: config['runtime_env'] is not supported: install the "
                "stages' packages where the workers run"
            )
        for key in ("reserved_cpus", "reserved_gpus"):
            if config[key]:
                raise ValueError(
                    f"RayActorPoolExecutor: config[{key!r}] must be 0: keeping part of the "
                    "cluster free is not supported (start the cluster with fewer resources)"
                )
        if config["resource_wait_interval_s"] is not None:
            warnings.warn(
                "RayActorPoolExecutor: config['resource_wait_interval_s'] has no effect: Ray "
                "says when it grants a worker's resources",
                UserWarning,
                stacklevel=2,
            )
        self.schedule_timeout_s = positive(
            config["resource_wait_timeout_s"], "resource_wait_timeout_s"
        )
        if not isinstance(show_progress, bool):
            raise TypeError(f"show_progress must be True or False, got {show_progress!r}")
        self.status = (
            StatusLog(positive(progress_interval, "progress_interval")) if show_progress else None
        )
        experimental("RayActorPoolExecutor")
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus

    def conveyor_executor(self) -> Any:
        from conveyor.backends.ray import RayBackend
        from conveyor.executors.batch import BatchExecutor

        backend = RayBackend(
            self.address, self.num_cpus, self.num_gpus, schedule_timeout_s=self.schedule_timeout_s
        )
        return BatchExecutor(backend, monitors=[self.status] if self.status else [])

    def nodes(self, executor: Any) -> int:
        executor.backend.open()
        return len(executor.backend.nodes())


def ray_nodes() -> int:
    """Nodes of the connected Ray cluster that have CPUs or GPUs to give."""
    import ray

    return sum(
        1
        for node in ray.nodes()
        if node.get("Alive")
        and (
            node.get("Resources", {}).get("CPU", 0) > 0
            or node.get("Resources", {}).get("GPU", 0) > 0
        )
    )
