"""Conveyor: streaming, resource-aware, auto-balanced pipelines for curating datasets."""

from conveyor.engine.policies.autoscale import AutoscaleConfig
from conveyor.errors import ConveyorError, PipelineBuildError, StageSetupError
from conveyor.pipeline import Pipeline
from conveyor.resources import Resources
from conveyor.result import FailureRecord, RunResult, StageStats
from conveyor.stage import CompositeStage, ProcessingStage, processing_stage

__version__ = "0.1.0"

__all__ = [
    "AutoscaleConfig",
    "CompositeStage",
    "ConveyorError",
    "FailureRecord",
    "Pipeline",
    "PipelineBuildError",
    "ProcessingStage",
    "Resources",
    "RunResult",
    "StageSetupError",
    "StageStats",
    "__version__",
    "processing_stage",
]
