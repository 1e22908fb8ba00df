"""NeMo Curator's ``nemo_curator.tasks.tasks``: ``Task`` and the empty task a pipeline starts
from (also in ``conveyor.curator.tasks``)."""

from conveyor.curator.tasks import EmptyTask, Task, _EmptyTask

__all__ = ["EmptyTask", "Task", "_EmptyTask"]
