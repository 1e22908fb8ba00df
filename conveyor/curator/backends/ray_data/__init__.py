"""NeMo Curator's ``RayDataExecutor``: the stages as a Ray Data plan (experimental here).

It runs on Conveyor's ``RayDataExecutor`` (each stage a ``map_batches``), on the cluster
in ``RAY_ADDRESS`` or ``address=``, else on a private local one (``num_cpus``/``num_gpus``).
The one config key is ``ignore_failures``; NeMo Curator's reads none.
"""

from __future__ import annotations

from typing import Any

from conveyor.curator.backends.base import BaseExecutor, experimental

__all__ = ["RayDataExecutor"]


class RayDataExecutor(BaseExecutor):
    """Stages as Ray Data operators (experimental: ``XennaExecutor`` is the one to use)."""

    defaults = {"ignore_failures": False}

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        ignore_head_node: bool = False,
        *,
        address: str | None = None,
        num_cpus: float | None = None,
        num_gpus: int | None = None,
    ) -> None:
        super().__init__(config, ignore_head_node)
        experimental("RayDataExecutor")
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus

    def conveyor_executor(self) -> Any:
        from conveyor.executors.ray_data import RayDataExecutor as _RayDataExecutor

        return _RayDataExecutor(self.address, self.num_cpus, self.num_gpus)

    def nodes(self, executor: Any) -> int:
        from conveyor.curator.backends.ray_actor_pool import ray_nodes

        executor.connection.connect()
        return ray_nodes()
