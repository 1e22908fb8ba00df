"""NeMo Curator's ``nemo_curator.tasks.file_group``: ``FileGroupTask`` (also in
``conveyor.curator.tasks``)."""

from conveyor.curator.tasks import FileGroupTask

__all__ = ["FileGroupTask"]
