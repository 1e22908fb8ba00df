"""Typed tasks that travel between stages. Any picklable object may travel too.

The video types (which need NumPy) are imported on first use.
"""

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr
from conveyor.tasks.base import EmptyTask, StagePerf, Task
from conveyor.tasks.document import DocumentBatch
from conveyor.tasks.file_group import FileGroupTask

_VIDEO = "conveyor.tasks.video"
_EXPORTS = {
    "Clip": _VIDEO,
    "FrameWindow": _VIDEO,
    "MotionScores": _VIDEO,
    "Video": _VIDEO,
    "VideoMetadata": _VIDEO,
    "VideoTask": _VIDEO,
}

__all__ = [
    "Clip",
    "DocumentBatch",
    "EmptyTask",
    "FileGroupTask",
    "FrameWindow",
    "MotionScores",
    "StagePerf",
    "Task",
    "Video",
    "VideoMetadata",
    "VideoTask",
]

if TYPE_CHECKING:
    from conveyor.tasks.video import (
        Clip,
        FrameWindow,
        MotionScores,
        Video,
        VideoMetadata,
        VideoTask,
    )

if not TYPE_CHECKING:  # a type checker sees the names imported above, and no others
    __getattr__ = lazy_getattr("conveyor.tasks", _EXPORTS, globals())
