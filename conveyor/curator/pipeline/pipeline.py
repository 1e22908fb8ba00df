"""NeMo Curator's ``Pipeline(name, description, stages, config)``, run by its executors."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from conveyor.pipeline import check_stage


class Pipeline:
    """An ordered list of stages in NeMo Curator's terms.

    ``run(executor)`` returns the last stage's outputs as a list (``XennaExecutor()``, which
    is Conveyor's streaming engine on this machine, when no executor is given). Conveyor's
    own ``conveyor.Pipeline`` takes ``(name, stages, description)`` and returns a
    ``RunResult`` with the run's records; ``conveyor_pipeline()`` gives one of these.
    ``config`` is kept as given: NeMo Curator reads nothing from it either.
    """

    def __init__(
        self,
        name: str,
        description: str | None = None,
        stages: Sequence[Any] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Pipeline: name must be a non-empty string, got {name!r}")
        if description is not None and not isinstance(description, str):
            raise TypeError(
                f"Pipeline {name!r}: description must be a string, got {description!r} (NeMo "
                "Curator's order is name, description, stages: pass stages=[...])"
            )
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"Pipeline {name!r}: config must be a dict, got {config!r}")
        self.name = name
        self.description = description
        self.config = config
        self.stages: list[Any] = []
        for stage in stages or []:
            self.add_stage(stage)

    def add_stage(self, stage: Any) -> Pipeline:
        check_stage(self.name, stage)
        self.stages.append(stage)
        return self

    def build(self) -> list[Any]:
        """The stages with composites expanded (what an executor's ``execute`` takes)."""
        from conveyor.curator.adapter import expand

        if not self.stages:
            raise ValueError(f"Pipeline {self.name!r} has no stages")
        return expand(self.stages)

    def conveyor_pipeline(self) -> Any:
        """The same stages as a ``conveyor.Pipeline`` (each Curator-style stage adapted)."""
        from conveyor.curator.adapter import adapt_all
        from conveyor.pipeline import Pipeline as _Pipeline

        return _Pipeline(self.name, adapt_all(self.build()), description=self.description)

    def describe(self) -> str:
        """Each stage's resources, batch size, workers and declared inputs and outputs."""
        return self.conveyor_pipeline().describe()

    def run(
        self,
        executor: Any = None,
        initial_tasks: Sequence[Any] | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
    ) -> list[Any]:
        """Run on ``executor`` (``XennaExecutor()`` by default) and return the last stage's
        outputs. With ``checkpoint_path`` (a folder) a rerun skips the source partitions an
        earlier run finished (``BaseExecutor.execute``)."""
        from conveyor.curator.backends.base import BaseExecutor

        if initial_tasks is not None and (
            isinstance(initial_tasks, (str, bytes)) or not hasattr(initial_tasks, "__iter__")
        ):
            raise TypeError(
                f"Pipeline {self.name!r}: initial_tasks must be a list of tasks, got "
                f"{type(initial_tasks).__name__} (one task: [task])"
            )
        if executor is None:
            from conveyor.curator.backends.xenna import XennaExecutor

            executor = XennaExecutor()
        if not isinstance(executor, BaseExecutor):
            raise TypeError(
                f"Pipeline {self.name!r}: run() takes a conveyor.curator executor "
                f"(XennaExecutor, RayDataExecutor, RayActorPoolExecutor), got {executor!r}"
            )
        return executor.execute(
            self.build(), initial_tasks, name=self.name, checkpoint_path=checkpoint_path
        )

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, stages={[s.name for s in self.stages]})"
