"""NeMo Curator's ``nemo_curator.stages``: the stage base classes, resources and decorator."""

from conveyor.curator.stages.base import CompositeStage, ProcessingStage
from conveyor.curator.stages.function_definitions import processing_stage
from conveyor.curator.stages.resources import Resources

__all__ = ["CompositeStage", "ProcessingStage", "Resources", "processing_stage"]
