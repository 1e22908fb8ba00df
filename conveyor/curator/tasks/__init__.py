"""NeMo Curator's task types with its constructor order, as Conveyor's own tasks.

``DocumentBatch(task_id, dataset_name, data, _metadata, _stage_perf)`` is NeMo Curator's
order; these classes take it (positionally or by name) and *are* Conveyor's task types
(``isinstance(t, conveyor.tasks.DocumentBatch)`` holds), so Conveyor's own stages take them
and theirs take Conveyor's. ``_metadata`` and ``_stage_perf`` are the same objects as
Conveyor's ``metadata`` and ``stage_perf``. ``task_id`` is set by the engine as each task is
made (a path through the stages, such as ``"3.0.12"``); a value given here is kept only on
the tasks a run starts from.

``VideoTask`` is the exception: its data is NeMo Curator's video model
(``conveyor.curator.tasks.video``), which Conveyor's video stages do not read; the adapter
converts between the two where a Curator-style stage meets one of Conveyor's.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, TypeVar

from conveyor.tasks.base import EmptyTask as _ConveyorEmptyTask
from conveyor.tasks.base import StagePerf
from conveyor.tasks.base import Task as _Task
from conveyor.tasks.document import DocumentBatch as _DocumentBatch
from conveyor.tasks.file_group import FileGroupTask as _FileGroupTask

T = TypeVar("T")

__all__ = [
    "DocumentBatch",
    "EmptyTask",
    "FailedTask",
    "FileGroupTask",
    "NoneTask",
    "SentinelTask",
    "StagePerf",
    "Task",
    "TransientDrop",
    "VideoTask",
]


class Task(_Task[T]):
    """Base of NeMo Curator-style tasks (see the module docstring).

    Positional arguments are read in either of NeMo Curator's orders: 1.4's ``(dataset_name,
    data, ...)`` (where ``task_id`` is set by the framework), and 1.0's ``(task_id,
    dataset_name, data, ...)``: the newer where its data is of the class's type, else the
    older. After ``data`` come ``_stage_perf`` (a list) and ``_metadata`` (a dict) in either
    order, then a subclass's own fields. Keywords are NeMo Curator's names or Conveyor's.

    A subclass made with ``@dataclass`` (as NeMo Curator's tasks and its users' are) keeps
    this constructor, its own fields taken as keywords or after those: the dataclass's would
    read Conveyor's field order.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            # ``@dataclass`` makes an ``__init__`` only where the class has none of its own
            cls.__init__ = cls.__init__  # type: ignore[misc]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        own = _own_fields(cls)
        errors: list[TypeError] = []
        for order in _orders(args, kwargs):
            try:
                fields = _parse(cls.__name__, order, args, kwargs, own)
                self._assign(fields)
                _Task.__post_init__(self)  # the data of this order's type?
            except TypeError as exc:
                errors.append(exc)
                continue
            if cls.__post_init__ is not _Task.__post_init__:
                self.__post_init__()  # a subclass's own, once its fields are set
            return
        older = len(args) >= 3 and all(isinstance(a, str) for a in args[:2])
        raise errors[-1 if older else 0]

    def _assign(self, fields: dict[str, Any]) -> None:
        """Each field given, the rest at the class's defaults (a ``FileGroupTask``'s data at
        ``[]``); a field with no default that is not given is an error, as a dataclass's."""
        for spec in _all_fields(type(self)):
            name = spec.name
            if name in fields:
                setattr(self, name, fields[name])
            elif spec.default is not MISSING:
                setattr(self, name, spec.default)
            elif spec.default_factory is not MISSING:
                setattr(self, name, spec.default_factory())
            else:
                raise TypeError(f"{type(self).__name__}() missing the argument {name!r}")

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
_BASE_FIELDS = frozenset(_KEYWORDS.values())


def _all_fields(cls: type) -> list[Any]:
    """The fields a constructor sets: a task's own, then a dataclass subclass's."""
    return [f for f in dataclass_fields(cls) if f.init or f.name in _BASE_FIELDS]


def _own_fields(cls: type) -> dict[str, Any]:
    """A dataclass subclass's fields beyond a task's own, in order."""
    return {f.name: f for f in _all_fields(cls) if f.name not in _BASE_FIELDS}


def _orders(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[list[str]]:
    """The fields the leading positional arguments may stand for: NeMo Curator 1.4's order
    first, then 1.0's (without those given as keywords)."""
    named = {_KEYWORDS.get(k) for k, v in kwargs.items() if v is not None}
    newer = [f for f in ("dataset_name", "data") if f not in named]
    older = [f for f in ("task_id", "dataset_name", "data") if f not in named]
    return [newer, older] if args and older != newer else [newer]


def _parse(
    cls: str,
    order: list[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    own: dict[str, Any],
) -> dict[str, Any]:
    """The fields a NeMo Curator-style constructor call gives, its leading positional
    arguments read as ``order`` (see ``Task``)."""
    fields: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        if name in fields:
            raise TypeError(f"{cls}: {name} given twice")
        fields[name] = value

    rest = list(args)
    for name in order:
        if rest:
            put(name, rest.pop(0))
    while rest and len(fields) < len(order) + 2:
        value = rest[0]
        if isinstance(value, dict) and "metadata" not in fields:
            put("metadata", rest.pop(0))
        elif isinstance(value, list) and "stage_perf" not in fields:
            put("stage_perf", rest.pop(0))
        else:
            break
    extra = [name for name in own if name not in kwargs]
    if len(rest) > len(extra):
        surplus = rest[len(extra)]
        raise TypeError(
            f"{cls}: after data come _stage_perf (a list) and _metadata (a dict)"
            + (f", then {', '.join(extra)}" if extra else "")
            + f", got {type(surplus).__name__} {surplus!r:.60} (NeMo Curator's orders: "
            "task_id, dataset_name, data (1.0), or dataset_name, data (1.4))"
        )
    for name, value in zip(extra, rest, strict=False):
        put(name, value)
    for key, value in kwargs.items():
        if key in own:
            put(key, value)
            continue
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

    def __post_init__(self) -> None:
        _FileGroupTask.__post_init__(self)
        if not isinstance(self.reader_config, dict):
            raise TypeError(
                f"FileGroupTask.reader_config must be a dict, got {self.reader_config!r}"
            )


class SentinelTask(Task[None]):
    """A task without data that marks something (NeMo Curator's base of the three below)."""

    @property
    def num_items(self) -> int:
        return 0


class EmptyTask(SentinelTask, _ConveyorEmptyTask):
    """The seed a pipeline starts from when it is given no tasks (``EmptyTask()``)."""


class NoneTask(SentinelTask):
    """What a stage gives for an input it filters, as ``None``: nothing goes on, and the
    input's source is finished."""


class FailedTask(SentinelTask):
    """What a stage gives for an input that failed in a way only a later run can help: the
    input fails at once (``conveyor.DeferredError``), and with a journal the next run tries
    its source again."""


@dataclass(frozen=True)
class TransientDrop:
    """NeMo Curator's newer ``FailedTask``, not a task: ``return TransientDrop("rate
    limited")`` from ``process`` fails that input for this run only (``DeferredError``,
    its reason in the failure's message)."""

    reason: str = ""


#: NeMo Curator's name for the class before ``EmptyTask`` became one
_EmptyTask = EmptyTask


def __getattr__(name: str) -> Any:
    if name == "VideoTask":  # NumPy and the video types load on first use
        from conveyor.curator.tasks.video import VideoTask

        globals()[name] = VideoTask
        return VideoTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
