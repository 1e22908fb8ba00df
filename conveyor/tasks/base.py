"""Task base class: a payload plus a framework-owned lineage id, metadata and per-stage timings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class StagePerf:
    """One stage's record on a task: how long the call that produced it took, and where."""

    stage: str
    process_s: float
    worker: str
    batch_size: int


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
