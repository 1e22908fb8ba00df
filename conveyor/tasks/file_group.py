"""A group of files to be read together by one call (the unit a partitioning stage emits)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from conveyor.tasks.base import Task, wrong_data


@dataclass
class FileGroupTask(Task[list[str]]):
    """Paths (local or URLs) plus options for the reader that consumes them."""

    data: list[str] = field(default_factory=list)
    reader_config: dict[str, Any] = field(default_factory=dict)

    def check_data(self, data: Any) -> None:
        if isinstance(data, (list, tuple)) and all(isinstance(p, str) for p in data):
            return
        raise wrong_data(self, "a list of paths (str)", data)

    @property
    def key(self) -> tuple[str, ...]:
        """What a journal knows this task by across runs: its paths, in order."""
        return tuple(self.data)

    @property
    def content_id(self) -> str:
        """Stable id from the sorted paths: the same files give the same id across runs."""
        digest = hashlib.sha1("\n".join(sorted(self.data)).encode()).hexdigest()
        return digest[:16]
