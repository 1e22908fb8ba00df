"""``nemo_curator.stages.function_decorators`` (NeMo Curator 1.4's name for the module of
``processing_stage``; ``function_definitions`` is the name its guides use)."""

from conveyor.curator.stages.function_definitions import FunctionStage, processing_stage

__all__ = ["FunctionStage", "processing_stage"]
