"""NeMo Curator's ``@processing_stage``: a one-argument function as a stage instance."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from conveyor.curator.stages.base import ProcessingStage
from conveyor.curator.stages.resources import Resources
from conveyor.tasks.base import Task


class FunctionStage(ProcessingStage[Any, Any]):
    """A stage whose ``process`` is a function; outputs that are new tasks get the input's
    metadata and stage timings (what NeMo Curator's decorator does)."""

    def __init__(self, fn: Callable[[Any], Any], name: str) -> None:
        self.fn = fn
        self.name = name

    def process(self, task: Any) -> Any:
        result = self.fn(task)
        for out in result if isinstance(result, list) else [result]:
            if out is not task and isinstance(out, Task) and isinstance(task, Task):
                out.metadata = {**task.metadata, **out.metadata}
                out.stage_perf = [*task.stage_perf, *out.stage_perf]
        return result


def processing_stage(
    *, name: str, resources: Resources | dict[str, Any] | None = None, batch_size: int | None = None
) -> Callable[[Callable[[Any], Any]], FunctionStage]:
    """``@processing_stage(name="f", resources=Resources(cpus=1))`` over ``def f(task)``
    gives a stage instance named ``name``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"@processing_stage: name must be a non-empty string, got {name!r}")

    def wrap(fn: Callable[[Any], Any]) -> FunctionStage:
        if not callable(fn):
            raise TypeError(f"@processing_stage({name!r}) decorates a function, got {fn!r}")
        required = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind is not p.VAR_KEYWORD
            and p.kind is not p.VAR_POSITIONAL
        ]
        if len(required) != 1 or required[0].kind is inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(
                f"@processing_stage({name!r}): {getattr(fn, '__name__', fn)!r} must take "
                f"exactly one positional argument (the task), it requires {len(required)}"
            )
        stage = FunctionStage(fn, name)
        if resources is not None:
            stage.resources = (
                resources if isinstance(resources, Resources) else Resources(**resources)
            )
        if batch_size is not None:
            stage.batch_size = batch_size
        return stage

    return wrap
