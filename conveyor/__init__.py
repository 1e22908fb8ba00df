"""Conveyor: streaming, resource-aware, auto-balanced pipelines for curating datasets.

Names are imported on first use so that worker processes, which need only a few modules,
start fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr

__version__ = "0.1.0"

_EXPORTS = {
    "AutoscaleConfig": "conveyor.engine.policies.autoscale",
    "CompositeStage": "conveyor.stage",
    "ConveyorError": "conveyor.errors",
    "DeferredError": "conveyor.errors",
    "EngineStalled": "conveyor.errors",
    "FailureRecord": "conveyor.result",
    "JournalError": "conveyor.errors",
    "OutputInUse": "conveyor.errors",
    "PermanentError": "conveyor.errors",
    "Pipeline": "conveyor.pipeline",
    "PipelineBuildError": "conveyor.errors",
    "ProcessingStage": "conveyor.stage",
    "Resources": "conveyor.resources",
    "RunResult": "conveyor.result",
    "StageSetupError": "conveyor.errors",
    "StageStats": "conveyor.result",
    "TaskTimeout": "conveyor.errors",
    "UnpicklablePayload": "conveyor.errors",
    "processing_stage": "conveyor.stage",
}

__all__ = [
    "AutoscaleConfig",
    "CompositeStage",
    "ConveyorError",
    "DeferredError",
    "EngineStalled",
    "FailureRecord",
    "JournalError",
    "OutputInUse",
    "PermanentError",
    "Pipeline",
    "PipelineBuildError",
    "ProcessingStage",
    "Resources",
    "RunResult",
    "StageSetupError",
    "StageStats",
    "TaskTimeout",
    "UnpicklablePayload",
    "__version__",
    "processing_stage",
]

if TYPE_CHECKING:
    from conveyor.engine.policies.autoscale import AutoscaleConfig
    from conveyor.errors import (
        ConveyorError,
        DeferredError,
        EngineStalled,
        JournalError,
        OutputInUse,
        PermanentError,
        PipelineBuildError,
        StageSetupError,
        TaskTimeout,
        UnpicklablePayload,
    )
    from conveyor.pipeline import Pipeline
    from conveyor.resources import Resources
    from conveyor.result import FailureRecord, RunResult, StageStats
    from conveyor.stage import CompositeStage, ProcessingStage, processing_stage


if not TYPE_CHECKING:  # a type checker sees the names imported above, and no others
    __getattr__ = lazy_getattr("conveyor", _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted(__all__)
