"""``VideoTask`` in NeMo Curator's constructor order; ``data`` is Conveyor's ``Video``."""

from __future__ import annotations

from conveyor.curator.tasks import Task
from conveyor.tasks.video import Video
from conveyor.tasks.video import VideoTask as _VideoTask


class VideoTask(Task[Video], _VideoTask):
    """One video (or a chunk of its clips): ``VideoTask(task_id, dataset_name, Video(...))``."""
