"""Typed tasks that travel between stages. Any picklable object may travel too."""

from conveyor.tasks.base import EmptyTask, StagePerf, Task
from conveyor.tasks.document import DocumentBatch
from conveyor.tasks.file_group import FileGroupTask

__all__ = ["DocumentBatch", "EmptyTask", "FileGroupTask", "StagePerf", "Task"]
