"""``nemo_curator.stages.core``'s names (some of NeMo Curator's guides import from here)."""

from conveyor.curator.stages.base import CompositeStage, ProcessingStage

__all__ = ["CompositeStage", "ProcessingStage"]
