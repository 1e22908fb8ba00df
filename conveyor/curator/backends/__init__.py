"""NeMo Curator's ``nemo_curator.backends``: its three executors on Conveyor's engine."""

from conveyor.curator.backends.base import BaseExecutor, NodeInfo, StageFailures, WorkerMetadata

__all__ = ["BaseExecutor", "NodeInfo", "StageFailures", "WorkerMetadata"]
