"""Executors run a built pipeline on a backend (``RayDataExecutor`` loads Ray on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr
from conveyor.executors.base import Executor, Run
from conveyor.executors.batch import BatchExecutor
from conveyor.executors.streaming import StreamingExecutor

_EXPORTS = {"RayDataExecutor": "conveyor.executors.ray_data"}

__all__ = ["BatchExecutor", "Executor", "RayDataExecutor", "Run", "StreamingExecutor"]

if TYPE_CHECKING:
    from conveyor.executors.ray_data import RayDataExecutor

if not TYPE_CHECKING:  # a type checker sees the names imported above, and no others
    __getattr__ = lazy_getattr("conveyor.executors", _EXPORTS, globals())
