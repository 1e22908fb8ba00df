"""What NeMo Curator's executors share: ``BaseExecutor`` and the objects a stage's ``setup``
and ``setup_on_node`` receive (``WorkerMetadata``, ``NodeInfo``)."""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.engine.journal import source_key
from conveyor.errors import JournalError

if TYPE_CHECKING:
    from conveyor.executors.base import Executor
    from conveyor.result import RunResult

log = logging.getLogger("conveyor.curator")


@dataclass(frozen=True)
class NodeInfo:
    """The node a ``setup_on_node`` call runs on."""

    node_id: str = ""


@dataclass(frozen=True)
class GpuAllocation:
    """One GPU a worker holds: its index on the node and the share of it."""

    index: int
    used_fraction: float


@dataclass(frozen=True)
class WorkerResources:
    """What a worker holds, in the shape NeMo Curator's stages read from
    ``worker_metadata.allocation`` (Cosmos-Xenna's): ``node``, ``cpus`` and ``gpus`` (one
    ``GpuAllocation`` per device). Conveyor's ``WorkerInfo`` is ``info``, and its fields
    (``gpu_ids``, ``gpu_fraction``, ``node_id``, ``worker_id``) read through, so a
    Conveyor stage wrapped in a NeMo Curator-style one can be set up with it."""

    node: str
    cpus: float
    gpus: tuple[GpuAllocation, ...]
    info: Any

    @classmethod
    def of(cls, worker: Any, cpus: float) -> WorkerResources:
        share = worker.gpu_fraction if len(worker.gpu_ids) == 1 else 1.0
        gpus = tuple(GpuAllocation(int(i), share or 1.0) for i in worker.gpu_ids)
        return cls(worker.node_id, cpus, gpus, worker)

    def __getattr__(self, name: str) -> Any:
        if name == "info":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.info, name)


@dataclass(frozen=True)
class WorkerMetadata:
    """The worker a ``setup`` (or ``setup_on_node``) call runs in; ``allocation`` is a
    ``WorkerResources``."""

    worker_id: str = ""
    allocation: Any = None


class BaseExecutor:
    """An executor in NeMo Curator's terms: ``execute(stages, initial_tasks)`` runs the
    stages (any ``ProcessingStage``, Curator-style or Conveyor's) on a Conveyor executor and
    returns the last stage's outputs. ``config`` keys are read by each subclass; a key it
    cannot honour is an error naming it, never dropped."""

    #: the config keys this executor reads, with their defaults
    defaults: Mapping[str, Any] = {}

    def __init__(self, config: dict[str, Any] | None = None, ignore_head_node: bool = False):
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(
                f"{type(self).__name__}(config=...) takes a dict of settings, got {config!r}"
            )
        unknown = sorted(set(config or {}) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: config key(s) {', '.join(map(repr, unknown))} have "
                "no meaning here (known: "
                f"{', '.join(sorted(self.defaults)) or 'none'}; docs/curator.md says why)"
            )
        if not isinstance(ignore_head_node, bool):
            raise TypeError(f"ignore_head_node must be True or False, got {ignore_head_node!r}")
        if ignore_head_node:
            raise ValueError(
                f"{type(self).__name__}: ignore_head_node=True is not supported (work goes to "
                "every node that has resources: give the head node none, or run the driver "
                "off the cluster)"
            )
        self.config: dict[str, Any] = {**self.defaults, **(config or {})}
        self.ignore_failures = _flag(self.config.get("ignore_failures", False), "ignore_failures")

    def conveyor_executor(self) -> Executor:
        """The Conveyor executor the stages run on."""
        raise NotImplementedError

    def nodes(self, executor: Executor) -> int:
        """How many nodes the run will have (``num_workers_per_node`` sizing)."""
        return 1

    def execute(
        self,
        stages: Sequence[Any],
        initial_tasks: Sequence[Any] | None = None,
        *,
        name: str = "curator-pipeline",
        checkpoint_path: str | os.PathLike[str] | None = None,
    ) -> list[Any]:
        """Run ``stages`` over ``initial_tasks`` (``[EmptyTask()]`` when none) and return the
        last stage's outputs; with ``ignore_failures`` off, an input that failed for good
        raises ``StageFailures`` once the run has ended (the outputs are on the error). An
        input a stage dropped for this run (``TransientDrop``, ``FailedTask``) is a warning,
        as in NeMo Curator, not a failure.

        With ``checkpoint_path`` (a folder) the run is resumable, as NeMo Curator's: the
        source partitions (the outputs of the last stage whose ``is_source_stage()`` is true,
        else the tasks given) are journaled by their ``_metadata["resumability_key"]`` (else
        their ``key``: a ``FileGroupTask``'s paths), and a run with the same folder skips
        those an earlier one finished. The stages up to that source stage run first, on
        their own; the rest stream over what they made.
        """
        from conveyor.curator.adapter import CuratorStage, adapt_all, expand
        from conveyor.curator.tasks import EmptyTask
        from conveyor.curator.video_model import to_conveyor_task
        from conveyor.pipeline import Pipeline as _Pipeline

        executor = self.conveyor_executor()
        flat = expand(list(stages))
        adapted = adapt_all(flat, nodes=lambda: self.nodes(executor))
        tasks = list(initial_tasks) if initial_tasks is not None else [EmptyTask()]
        if adapted and not isinstance(adapted[0], CuratorStage):
            # NeMo Curator's video tasks, given to one of Conveyor's stages
            tasks = [to_conveyor_task(t, "initial_tasks") for t in tasks]
        if checkpoint_path is None:
            return self.outputs(_Pipeline(name, adapted).run(executor, tasks))
        journal = _journal_path(checkpoint_path)
        split = max((i + 1 for i, stage in enumerate(flat) if _is_source(stage)), default=0)
        if split:
            sources = _Pipeline(f"{name}-sources", adapted[:split]).run(executor, tasks)
            tasks = self.outputs(sources)
            if split == len(adapted):
                return tasks
            executor = self.conveyor_executor()
        result = _Pipeline(name, adapted[split:]).run(
            executor, tasks, journal=journal, journal_key=resumability_key
        )
        return self.outputs(result)

    def outputs(self, result: RunResult) -> list[Any]:
        dropped = [f for f in result.failures if f.deferred]
        if dropped:
            log.warning(
                "%d input(s) dropped for this run (TransientDrop, FailedTask): first at "
                "stage %r: %s; a run with the same checkpoint_path tries them again",
                len(dropped),
                dropped[0].stage,
                dropped[0].message,
            )
        if len(dropped) < len(result.failures) and not self.ignore_failures:
            raise StageFailures(result)
        return list(result.outputs)


def _is_source(stage: Any) -> bool:
    """Whether ``stage`` says it makes the run's source partitions (NeMo Curator's
    ``is_source_stage()``; Conveyor's stages have no such method)."""
    method = getattr(stage, "is_source_stage", None)
    return bool(method()) if callable(method) else False


def _journal_path(checkpoint_path: str | os.PathLike[str]) -> Path:
    """The journal in NeMo Curator's checkpoint folder (made where missing)."""
    text = os.fspath(checkpoint_path)
    if not isinstance(text, str) or not text:
        raise TypeError(f"checkpoint_path must be a folder's path, got {checkpoint_path!r}")
    if "://" in text:
        raise ValueError(
            f"checkpoint_path {text!r}: the journal is a local file (or one on a mounted "
            "file system such as NFS); object stores are not supported for it"
        )
    folder = Path(text)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"checkpoint_path {text!r} is a file; NeMo Curator's is a folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "conveyor.journal"


def resumability_key(task: Any) -> Any:
    """A source partition's key in the journal: NeMo Curator's
    ``_metadata["resumability_key"]``, else what Conveyor knows the task by (its ``key``, or
    the value of a ``str``, ``int``, ``bytes`` or ``Path`` task)."""
    metadata = getattr(task, "metadata", None)
    key = metadata.get("resumability_key") if isinstance(metadata, dict) else None
    if key:
        return str(key)
    try:
        return source_key(task)
    except JournalError:
        raise JournalError(
            f"checkpoint_path: the source task {task!r:.80} has no "
            "_metadata['resumability_key'] and no key of its own; its source stage (the last "
            "whose is_source_stage() is true) must set one per partition, as NeMo Curator's "
            "file partitioning does"
        ) from None


class StageFailures(RuntimeError):
    """Inputs failed for good while ``ignore_failures`` was off: ``result`` holds the
    run's outputs and each failure's record."""

    def __init__(self, result: RunResult) -> None:
        self.result = result
        first = result.failures[0]
        more = len(result.failures) - 1
        super().__init__(
            f"{len(result.failures)} input(s) failed: first at stage {first.stage!r}: "
            f"{first.error_type}: {first.message}"
            + (f" (and {more} more: see .result.failures)" if more else "")
            + "; set config={'ignore_failures': True} to get the other outputs back"
        )


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"config[{key!r}] must be True or False, got {value!r}")
    return value


def positive(value: Any, key: str, *, upper: float = math.inf) -> float:
    """A config number in (0, upper], or an error naming the key."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or not 0 < value <= upper
    ):
        bound = "" if math.isinf(upper) else f" and <= {upper:g}"
        raise ValueError(f"config[{key!r}] must be a number > 0{bound}, got {value!r}")
    return float(value)


def experimental(name: str) -> None:
    """Warn, as NeMo Curator's Ray executors did, that this one is experimental."""
    warnings.warn(
        f"{name} is experimental in conveyor.curator: XennaExecutor (Conveyor's streaming "
        "engine) is the one to use",
        UserWarning,
        stacklevel=3,
    )
