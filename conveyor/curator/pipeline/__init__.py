"""NeMo Curator's ``nemo_curator.pipeline``."""

from conveyor.curator.pipeline.pipeline import Pipeline

__all__ = ["Pipeline"]
