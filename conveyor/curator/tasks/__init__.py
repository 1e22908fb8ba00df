"""NeMo Curator's task types with its constructor order, as Conveyor's own tasks.

``DocumentBatch(task_id, dataset_name, data, _metadata, _stage_perf)`` is NeMo Curator's
order; these classes take it (positionally or by name) and *are* Conveyor's task types
(``isinstance(t, conveyor.tasks.DocumentBatch)`` holds), so Conveyor's own stages take them
and theirs take Conveyor's. ``_metadata`` and ``_stage_perf`` are the same objects as
Conveyor's ``metadata`` and ``stage_perf``. ``task_id`` is set by the engine as each task is
made (a path through the stages, such as ``"3.0.12"``); a value given here is kept only on
the tasks a run starts from.
"""

from __future__ import annotations

from typing import Any, TypeVar

from conveyor.tasks.base import EmptyTask as _ConveyorEmptyTask
from conveyor.tasks.base import StagePerf
from conveyor.tasks.base import Task as _Task
from conveyor.tasks.document import DocumentBatch as _DocumentBatch
from conveyor.tasks.file_group import FileGroupTask as _FileGroupTask

T = TypeVar("T")

__all__ = ["DocumentBatch", "EmptyTask", "FileGroupTask", "StagePerf", "Task", "VideoTask"]


class Task(_Task[T]):
    """Base of NeMo Curator-style tasks (see the module docstring)."""

    def __init__(
        self,
        task_id: str = "",
        dataset_name: str = "",
        data: Any = None,
        _metadata: dict[str, Any] | None = None,
        _stage_perf: list[Any] | None = None,
        *,
        metadata: dict[str, Any] | None = None,
        stage_perf: list[Any] | None = None,
    ) -> None:
        # Conveyor's own field names too: ``dataclasses.replace`` and copies pass those
        if _metadata is not None and metadata is not None:
            raise TypeError(f"{type(self).__name__}: give _metadata or metadata, not both")
        if _stage_perf is not None and stage_perf is not None:
            raise TypeError(f"{type(self).__name__}: give _stage_perf or stage_perf, not both")
        self.data = data
        self.dataset_name = dataset_name
        self.metadata = _first(_metadata, metadata, {})
        self.task_id = task_id
        self.stage_perf = _first(_stage_perf, stage_perf, [])
        self.__post_init__()

    @property
    def _metadata(self) -> dict[str, Any]:
        return self.metadata

    @_metadata.setter
    def _metadata(self, value: dict[str, Any]) -> None:
        self.metadata = value

    @property
    def _stage_perf(self) -> list[Any]:
        return self.stage_perf

    @_stage_perf.setter
    def _stage_perf(self, value: list[Any]) -> None:
        self.stage_perf = value

    @classmethod
    def _order_hint(cls) -> str:
        return " (NeMo Curator's order: task_id, dataset_name, data, _metadata, _stage_perf)"

    def add_stage_perf(self, perf: Any) -> None:
        self.stage_perf.append(perf)

    def validate(self) -> bool:
        """NeMo Curator's hook: whether the task is usable (the constructor already checks
        the fields' types)."""
        return True


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


class DocumentBatch(Task[Any], _DocumentBatch):
    """Rows of documents (a ``pyarrow.Table`` or a ``pandas.DataFrame``)."""

    def get_columns(self) -> list[str]:
        return self.columns


class FileGroupTask(Task[list[str]], _FileGroupTask):
    """Paths read together; ``reader_config`` holds the reader's options."""

    def __init__(
        self,
        task_id: str = "",
        dataset_name: str = "",
        data: list[str] | None = None,
        _metadata: dict[str, Any] | None = None,
        _stage_perf: list[Any] | None = None,
        *,
        reader_config: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        stage_perf: list[Any] | None = None,
    ) -> None:
        if reader_config is not None and not isinstance(reader_config, dict):
            raise TypeError(f"FileGroupTask.reader_config must be a dict, got {reader_config!r}")
        self.reader_config = reader_config or {}
        super().__init__(
            task_id,
            dataset_name,
            [] if data is None else data,
            _metadata,
            _stage_perf,
            metadata=metadata,
            stage_perf=stage_perf,
        )


class EmptyTask(Task[None], _ConveyorEmptyTask):
    """The seed a pipeline starts from when it is given no tasks (``EmptyTask()``)."""


#: NeMo Curator's name for the class before ``EmptyTask`` became one
_EmptyTask = EmptyTask


def __getattr__(name: str) -> Any:
    if name == "VideoTask":  # NumPy and the video types load on first use
        from conveyor.curator.tasks._video import VideoTask

        globals()[name] = VideoTask
        return VideoTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
