"""NeMo Curator's ``nemo_curator.tasks.sentinels``: the tasks without data (also in
``conveyor.curator.tasks``)."""

from conveyor.curator.tasks import EmptyTask, FailedTask, NoneTask, SentinelTask

__all__ = ["EmptyTask", "FailedTask", "NoneTask", "SentinelTask"]
