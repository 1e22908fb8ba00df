"""Stages that find input files and group them into tasks, shared by every modality."""

from conveyor.stages.io.partitioning import FilePartitioningStage, list_files

__all__ = ["FilePartitioningStage", "list_files"]
