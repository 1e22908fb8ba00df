"""Pipeline: an ordered list of stages, built into engine specs and handed to an executor."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, overload

from conveyor.engine.journal import Journal, JournalKey, source_key
from conveyor.engine.spec import StageSpec
from conveyor.errors import JournalError, PipelineBuildError
from conveyor.result import RunResult
from conveyor.stage import (
    CompositeStage,
    ProcessingStage,
    complete_outputs,
    declared_names,
    validate_stage,
    yields_outputs,
)

if TYPE_CHECKING:
    from conveyor.executors.base import Executor, Run
    from conveyor.executors.ray_data import RayDataExecutor, RayDataRun


def check_stage(pipeline: str, stage: Any) -> None:
    """``TypeError`` unless ``stage`` is a stage instance (a class is a common slip)."""
    if isinstance(stage, type) and issubclass(stage, ProcessingStage):
        raise TypeError(
            f"Pipeline {pipeline!r}: add_stage got the class {stage.__name__}; pass an "
            f"instance, e.g. {stage.__name__}()"
        )
    if not isinstance(stage, ProcessingStage):
        raise TypeError(
            f"Pipeline {pipeline!r}: add_stage expects a ProcessingStage, got {stage!r}"
        )


class Pipeline:
    """An ordered chain of stages.

    ``run()`` returns a ``RunResult``; ``stream()`` yields outputs.
    """

    def __init__(
        self,
        name: str,
        stages: Sequence[ProcessingStage[Any, Any]] | None = None,
        description: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Pipeline: name must be a non-empty string, got {name!r}")
        if isinstance(stages, (str, dict, ProcessingStage)) or (
            stages is not None and not isinstance(stages, Iterable)
        ):
            raise TypeError(
                f"Pipeline {name!r}: stages must be a list of stages, got {stages!r} (the "
                "order is name, stages, description: pass description=... by name; NeMo "
                "Curator's order, name, description, stages, is conveyor.curator's Pipeline)"
            )
        if description is not None and not isinstance(description, str):
            raise TypeError(f"Pipeline {name!r}: description must be a string, got {description!r}")
        self.name = name
        self.description = description
        self.stages: list[ProcessingStage[Any, Any]] = []
        for stage in stages or []:
            self.add_stage(stage)

    def add_stage(self, stage: ProcessingStage[Any, Any]) -> Pipeline:
        check_stage(self.name, stage)
        self.stages.append(stage)
        return self

    # -- build ----------------------------------------------------------------------------
    def _expand(self) -> list[ProcessingStage[Any, Any]]:
        flat: list[ProcessingStage[Any, Any]] = []

        def visit(stage: ProcessingStage[Any, Any], depth: int) -> None:
            if depth > 16:
                raise PipelineBuildError(f"composite stage {stage.name!r} nests too deeply")
            if isinstance(stage, CompositeStage):
                parts = stage.decompose()
                if not parts:
                    raise PipelineBuildError(
                        f"composite stage {stage.name!r} decomposed to nothing"
                    )
                for part in parts:
                    if not isinstance(part, ProcessingStage):
                        raise PipelineBuildError(
                            f"composite stage {stage.name!r} decomposed into {part!r}, "
                            "which is not a ProcessingStage"
                        )
                    visit(part, depth + 1)
            else:
                flat.append(stage)

        for stage in self.stages:
            visit(stage, 0)
        return flat

    def build(self) -> list[StageSpec]:
        """Expand composites, validate every stage and the declared contracts between them."""
        if not self.stages:
            raise PipelineBuildError(f"pipeline {self.name!r} has no stages")
        flat = self._expand()
        used: set[str] = set()
        suffix: dict[str, int] = {}
        specs: list[StageSpec] = []
        for index, stage in enumerate(flat):
            try:
                validate_stage(stage)
            except ValueError as exc:
                raise PipelineBuildError(f"pipeline {self.name!r}: {exc}") from None
            # a clash gets the next free ``name_N``; checking against every name already given
            # out keeps the result unique even when a stage is literally called ``name_2``
            name = stage.name
            if name in used:
                n = suffix.get(stage.name, 1)
                while name in used:
                    n += 1
                    name = f"{stage.name}_{n}"
                suffix[stage.name] = n
            used.add(name)
            specs.append(
                StageSpec(
                    index=index,
                    name=name,
                    resources=stage.resources,
                    batch_size=stage.batch_size,
                    batch_wait_s=stage.batch_wait_s,
                    num_workers=stage.num_workers,
                    stage=stage,
                    has_node_setup=stage.overrides("setup_on_node"),
                    timeout_s=stage.timeout_s,
                    max_threads=stage.max_threads,
                    max_attempts=stage.max_attempts,
                    max_batches_per_worker=stage.max_batches_per_worker,
                    streams=yields_outputs(stage),
                )
            )
        for up, down in itertools.pairwise(specs):
            # NeMo Curator's (attributes, columns) outputs() lists what a stage adds or
            # changes, not all its outputs have: only Conveyor's list is checked
            produced = complete_outputs(up.stage.outputs())
            needed = declared_names(down.stage.inputs())
            if produced is not None and needed is not None and not needed <= produced:
                missing = ", ".join(sorted(needed - produced))
                raise PipelineBuildError(
                    f"pipeline {self.name!r}: stage {down.name!r} needs {missing}, which the "
                    f"previous stage {up.name!r} does not declare in outputs() "
                    f"(it declares: {', '.join(sorted(produced)) or 'nothing'})"
                )
        return specs

    def describe(self) -> str:
        """Human-readable plan: each stage's resources, batch size and declared contract."""
        specs = self.build()
        lines = [f"Pipeline {self.name!r}" + (f": {self.description}" if self.description else "")]
        for spec in specs:
            stage = spec.stage
            pin = f"{spec.num_workers} (pinned)" if spec.num_workers else "autoscaled"
            # a stage may have an attribute of its own named ``kind`` (a payload's kind...)
            kind = stage.kind() if callable(stage.kind) else type(stage).__name__
            lines.append(f"  {spec.index + 1}. {spec.name} [{kind}]")
            lines.append(f"     resources: {spec.resources.describe()}")
            batch = f"{spec.batch_size}"
            if spec.batch_size > 1 and spec.batch_wait_s is not None:
                batch += f" (or what came within {spec.batch_wait_s:g} s)"
            lines.append(f"     batch_size: {batch}   workers: {pin}")
            if spec.timeout_s is not None:
                lines.append(f"     timeout_s: {spec.timeout_s:g} per batch")
            if spec.max_attempts is not None:
                lines.append(f"     max_attempts: {spec.max_attempts}")
            if spec.max_batches_per_worker is not None:
                lines.append(
                    f"     max_batches_per_worker: {spec.max_batches_per_worker} "
                    "(then a fresh worker)"
                )
            ins, outs = declared_names(stage.inputs()), declared_names(stage.outputs())
            if ins:
                lines.append(f"     inputs: {', '.join(sorted(ins))}")
            if outs:
                lines.append(f"     outputs: {', '.join(sorted(outs))}")
        return "\n".join(lines)

    # -- run ------------------------------------------------------------------------------
    def _executor(
        self, executor: Executor | RayDataExecutor | None, initial_tasks: Any
    ) -> Executor | RayDataExecutor:
        """The executor to run on (``StreamingExecutor()`` unless given), once the two
        arguments are known to be what they should: swapped or a class, they failed deep in
        the engine with an ``AttributeError`` naming neither."""
        if executor is None:
            from conveyor.executors.streaming import StreamingExecutor

            executor = StreamingExecutor()
        if isinstance(executor, type) or not callable(getattr(executor, "start", None)):
            what = (
                f"the class {executor.__name__}"
                if isinstance(executor, type)
                else _a(type(executor).__name__)
            )
            raise TypeError(
                f"pipeline {self.name!r}: run(executor, initial_tasks) takes an executor "
                f"first, such as StreamingExecutor(LocalBackend()), got {what}"
            )
        if initial_tasks is not None and (
            isinstance(initial_tasks, (str, bytes)) or not hasattr(initial_tasks, "__iter__")
        ):
            raise TypeError(
                f"pipeline {self.name!r}: initial_tasks must be an iterable of tasks, got "
                f"{_a(type(initial_tasks).__name__)} (one task: [task])"
            )
        return executor

    def run(
        self,
        executor: Executor | RayDataExecutor | None = None,
        initial_tasks: Iterable[Any] | None = None,
        *,
        journal: str | os.PathLike[str] | Journal | None = None,
        journal_key: JournalKey | None = None,
    ) -> RunResult:
        """Run to completion and return every last-stage output with the run's records.

        With ``journal=PATH`` the run records each source task once everything made from it
        is done, and skips the source tasks an earlier run with the same journal finished
        (``result.counts["skipped"]``). A source task's key is the value itself for ``str``,
        ``int``, ``bytes`` and ``pathlib.Path``, its type's ``key`` (``FileGroupTask``: its
        paths), or ``journal_key(task)``.
        """
        run = self.stream(executor, initial_tasks, journal=journal, journal_key=journal_key)
        outputs = list(run)
        result = run.result
        result.outputs = outputs
        return result

    @overload
    def stream(
        self,
        executor: Executor | None = None,
        initial_tasks: Iterable[Any] | None = None,
        *,
        journal: str | os.PathLike[str] | Journal | None = None,
        journal_key: JournalKey | None = None,
    ) -> Run: ...

    @overload
    def stream(
        self,
        executor: RayDataExecutor,
        initial_tasks: Iterable[Any] | None = None,
        *,
        journal: str | os.PathLike[str] | Journal | None = None,
        journal_key: JournalKey | None = None,
    ) -> RayDataRun: ...

    def stream(
        self,
        executor: Executor | RayDataExecutor | None = None,
        initial_tasks: Iterable[Any] | None = None,
        *,
        journal: str | os.PathLike[str] | Journal | None = None,
        journal_key: JournalKey | None = None,
    ) -> Run | RayDataRun:
        """Iterator of last-stage outputs, each yielded as soon as it is ready.

        The returned ``Run`` is also a context manager; ``close()`` (or leaving the ``with``)
        stops the run early. After exhaustion ``run.result`` holds the records. ``journal``
        and ``journal_key`` as in ``run`` (``journal`` may also be a ``Journal`` not yet
        opened, with its settings); an output counts as delivered once the caller asks for
        the next one.
        """
        specs = self.build()
        chosen = self._executor(executor, initial_tasks)
        opened = None
        if journal is not None:
            opened = self._journal(journal, initial_tasks, journal_key)
        elif journal_key is not None:
            raise TypeError(f"pipeline {self.name!r}: journal_key= needs journal=PATH")
        try:
            return chosen.start(
                specs,
                initial_tasks,
                pipeline_name=self.name,
                journal=opened,
                journal_key=journal_key,
                description=self.description or "",
            )
        except BaseException:
            if opened is not None:
                opened.close()
            raise

    def _journal(
        self,
        path: str | os.PathLike[str] | Journal,
        initial_tasks: Iterable[Any] | None,
        journal_key: JournalKey | None,
    ) -> Journal:
        """Check every source task has a key (where they are known before the run), then
        open the journal."""
        if initial_tasks is None:
            raise JournalError(
                f"pipeline {self.name!r}: a journal follows source tasks, and this run has "
                "none (pass initial_tasks, e.g. the input files, to run with journal=)"
            )
        if isinstance(initial_tasks, Sequence):
            for task in initial_tasks:
                source_key(task, journal_key)
        return (path if isinstance(path, Journal) else Journal(path)).open(self.name)

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, stages={[s.name for s in self.stages]})"


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
