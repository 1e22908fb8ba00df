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
    """Base of NeMo Curator-style tasks (see the module docstring).

    Positional arguments are read in either of NeMo Curator's orders: 1.0's ``(task_id,
    dataset_name, data, ...)`` and 1.4's ``(dataset_name, data, ...)`` (where ``task_id`` is
    set by the framework), told apart by the type of the second (a ``str`` there is the
    dataset's name). After ``data`` come ``_stage_perf`` (a list) and ``_metadata`` (a dict)
    in either order. Keywords are NeMo Curator's names or Conveyor's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = _parse(type(self).__name__, args, kwargs)
        self.data = fields.get("data")
        self.dataset_name = fields.get("dataset_name", "")
        self.metadata = fields.get("metadata", {})
        self.task_id = fields.get("task_id", "")
        self.stage_perf = fields.get("stage_perf", [])
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
        return (
            " (NeMo Curator's orders: task_id, dataset_name, data (1.0), or dataset_name, "
            "data (1.4); then _stage_perf, _metadata)"
        )

    def add_stage_perf(self, perf: Any) -> None:
        self.stage_perf.append(perf)

    def validate(self) -> bool:
        """NeMo Curator's hook: whether the task is usable (the constructor already checks
        the fields' types)."""
        return True


#: keyword -> field (NeMo Curator's underscored names and Conveyor's own)
_KEYWORDS = {
    "task_id": "task_id",
    "dataset_name": "dataset_name",
    "data": "data",
    "_metadata": "metadata",
    "metadata": "metadata",
    "_stage_perf": "stage_perf",
    "stage_perf": "stage_perf",
}


def _parse(cls: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The fields a NeMo Curator-style constructor call gives (see ``Task``)."""
    fields: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        if name in fields:
            raise TypeError(f"{cls}: {name} given twice")
        fields[name] = value

    rest = list(args)
    curator_1_4 = len(rest) >= 2 and isinstance(rest[0], str) and not isinstance(rest[1], str)
    order = ["dataset_name", "data"] if curator_1_4 else ["task_id", "dataset_name", "data"]
    for name in order:
        if rest:
            put(name, rest.pop(0))
    for value in rest:
        if isinstance(value, dict):
            put("metadata", value)
        elif isinstance(value, list):
            put("stage_perf", value)
        else:
            raise TypeError(
                f"{cls}: after data come _stage_perf (a list) and _metadata (a dict), got "
                f"{type(value).__name__} {value!r:.60} (NeMo Curator's orders: task_id, "
                "dataset_name, data (1.0), or dataset_name, data (1.4))"
            )
    for key, value in kwargs.items():
        if key not in _KEYWORDS:
            raise TypeError(f"{cls}() got an unexpected keyword argument {key!r}")
        if value is not None:
            put(_KEYWORDS[key], value)
    return fields


class DocumentBatch(Task[Any], _DocumentBatch):
    """Rows of documents (a ``pyarrow.Table`` or a ``pandas.DataFrame``)."""

    def get_columns(self) -> list[str]:
        return self.columns


class FileGroupTask(Task[list[str]], _FileGroupTask):
    """Paths read together; ``reader_config`` (a keyword) holds the reader's options."""

    def __init__(self, *args: Any, reader_config: dict[str, Any] | None = None, **kwargs: Any):
        if reader_config is not None and not isinstance(reader_config, dict):
            raise TypeError(f"FileGroupTask.reader_config must be a dict, got {reader_config!r}")
        self.reader_config = reader_config or {}
        if (
            len(args) < 3
            and "data" not in kwargs
            and not (len(args) == 2 and not isinstance(args[1], str))
        ):
            kwargs["data"] = []  # no paths given: an empty group
        super().__init__(*args, **kwargs)


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
