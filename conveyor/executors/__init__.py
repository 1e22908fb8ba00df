"""Executors run a built pipeline on a backend."""

from conveyor.executors.base import Executor, Run
from conveyor.executors.batch import BatchExecutor
from conveyor.executors.streaming import StreamingExecutor

__all__ = ["BatchExecutor", "Executor", "Run", "StreamingExecutor"]
