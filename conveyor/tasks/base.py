"""Task base class: a payload plus a framework-owned lineage id, metadata and per-stage timings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class StagePerf:
    """One stage's record on a task: how long the call that produced it took, where, and
    what the stage recorded of that call (``ProcessingStage.log_metric``)."""

    stage: str
    process_s: float
    worker: str
    batch_size: int
    custom_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Task(Generic[T]):
    """Base of typed tasks.

    ``task_id`` is owned by the framework: source tasks get their position, outputs of a
    one-to-many call get ``parent.j``, so a failure record points back at the input that caused
    it. Stages should not set it; they may read it.
    """

    data: T = None  # type: ignore[assignment]
    dataset_name: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    task_id: str = field(default="", compare=False)
    stage_perf: list[StagePerf] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        # positional arguments in another library's order (NeMo Curator's is task_id,
        # dataset_name, data) would otherwise land in the wrong fields silently
        self.check_data(self.data)
        for name, kind in (("dataset_name", str), ("metadata", dict), ("task_id", str)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(
                    f"{type(self).__name__}.{name} must be a {kind.__name__}, got "
                    f"{_described(value)}{self._order_hint()}"
                )

    @classmethod
    def _order_hint(cls) -> str:
        """What a misplaced positional argument's error adds."""
        return _ORDER_HINT.format(cls=cls.__name__)

    def check_data(self, data: Any) -> None:
        """Raise ``TypeError`` naming the field when ``data`` is not what this task holds
        (a type that carries any payload accepts anything)."""

    @property
    def num_items(self) -> int:
        """Number of items the task carries (rows, files, clips); 1 for an opaque payload."""
        data = self.data
        if data is None:
            return 0
        try:
            return len(data)  # type: ignore[arg-type]
        except TypeError:
            return 1

    def short_repr(self) -> str:
        return f"{type(self).__name__}(id={self.task_id or '?'}, items={self.num_items})"


@dataclass
class EmptyTask(Task[None]):
    """The single seed task a pipeline starts from when no initial tasks are given."""

    @property
    def num_items(self) -> int:
        return 0


#: what a misplaced positional argument's error adds (``Task._order_hint``)
_ORDER_HINT = (
    " (the fields in order are data, dataset_name, metadata: pass them by name, or use "
    "conveyor.curator.tasks.{cls} for NeMo Curator's order task_id, dataset_name, data)"
)


def _described(value: Any) -> str:
    text = repr(value)
    if "\n" in text:  # a table's or array's repr: its type says enough
        return type(value).__name__
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def wrong_data(task: Task[Any], expected: str, data: Any) -> TypeError:
    """The error for a task given ``data`` that is not ``expected``."""
    return TypeError(
        f"{type(task).__name__}.data must be {expected}, got {_described(data)}{task._order_hint()}"
    )
