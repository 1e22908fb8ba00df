"""NeMo Curator's ``XennaExecutor``: here, Conveyor's own streaming engine.

NeMo Curator's Xenna executor runs every stage as an actor pool at once and balances them;
so does Conveyor's ``StreamingExecutor``, without a Ray cluster on one machine
(``LocalBackend``) and on one with ``backend=RayBackend(...)``. Its documented settings map
onto Conveyor's (docs/curator.md):

- ``execution_mode``: ``"streaming"`` runs ``StreamingExecutor``, ``"batch"``
  ``BatchExecutor``;
- ``autoscale_interval_s``: how often the autoscaler decides (when not given, Conveyor's
  1 s: its decisions are cheap);
- ``cpu_allocation_percentage``: the share of this machine's CPUs the run may use;
- ``max_workers_per_stage``: ``AutoscaleConfig.max_workers_per_stage``;
- ``ignore_failures``: ``False`` raises ``StageFailures`` after the run where inputs failed
  for good;
- ``logging_interval``: a status table on the ``conveyor.curator`` logger every so many
  seconds.

Any other key is an error naming it.
"""

from __future__ import annotations

from typing import Any

from conveyor.curator.backends.base import BaseExecutor, positive
from conveyor.curator.backends.status_log import StatusLog

__all__ = ["XennaExecutor"]


class XennaExecutor(BaseExecutor):
    """Stages as worker pools that run at once, balanced toward the bottleneck."""

    defaults = {
        "execution_mode": "streaming",
        "logging_interval": 60,
        "ignore_failures": False,
        "cpu_allocation_percentage": None,
        "autoscale_interval_s": None,
        "max_workers_per_stage": None,
    }

    def __init__(
        self,
        config: dict[str, Any] | None = None,
        ignore_head_node: bool = False,
        *,
        backend: Any = None,
    ) -> None:
        super().__init__(config, ignore_head_node)
        config = self.config
        mode = config["execution_mode"]
        if mode not in ("streaming", "batch"):
            raise ValueError(
                f"config['execution_mode'] must be 'streaming' or 'batch', got {mode!r}"
            )
        self.logging_interval = positive(config["logging_interval"], "logging_interval")
        share = config["cpu_allocation_percentage"]
        if share is not None:
            share = positive(share, "cpu_allocation_percentage", upper=1.0)
            if backend is not None:
                raise ValueError(
                    "XennaExecutor: config['cpu_allocation_percentage'] sizes the local "
                    "backend this executor makes; with backend= given, set its CPUs there"
                )
        self.cpu_share = share
        interval = config["autoscale_interval_s"]
        self.autoscale_interval_s = (
            1.0 if interval is None else positive(interval, "autoscale_interval_s")
        )
        most = config["max_workers_per_stage"]
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
            raise ValueError(f"config['max_workers_per_stage'] must be an int >= 1, got {most!r}")
        self.max_workers_per_stage = most
        self.backend = backend
        self.status = StatusLog(self.logging_interval)

    def _backend(self) -> Any:
        if self.backend is None:
            from conveyor.backends.devices import detect_cpus
            from conveyor.backends.local import LocalBackend

            cpus = None if self.cpu_share is None else max(0.1, self.cpu_share * detect_cpus())
            self.backend = LocalBackend(num_cpus=cpus)
        return self.backend

    def conveyor_executor(self) -> Any:
        from conveyor.engine.policies.autoscale import AutoscaleConfig
        from conveyor.executors.batch import BatchExecutor
        from conveyor.executors.streaming import StreamingExecutor

        kind = StreamingExecutor if self.config["execution_mode"] == "streaming" else BatchExecutor
        return kind(
            self._backend(),
            autoscale=AutoscaleConfig(max_workers_per_stage=self.max_workers_per_stage),
            autoscale_interval_s=self.autoscale_interval_s,
            monitors=[self.status],
        )

    def nodes(self, executor: Any) -> int:
        backend = executor.backend
        backend.open()
        return len(backend.nodes())
