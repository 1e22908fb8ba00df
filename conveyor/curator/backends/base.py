"""What NeMo Curator's executors share: ``BaseExecutor`` and the objects a stage's ``setup``
and ``setup_on_node`` receive (``WorkerMetadata``, ``NodeInfo``)."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    ) -> list[Any]:
        """Run ``stages`` over ``initial_tasks`` (``[EmptyTask()]`` when none) and return the
        last stage's outputs; with ``ignore_failures`` off, an input that failed for good
        raises ``StageFailures`` once the run has ended (the outputs are on the error)."""
        from conveyor.curator.adapter import adapt_all
        from conveyor.curator.tasks import EmptyTask
        from conveyor.pipeline import Pipeline as _Pipeline

        executor = self.conveyor_executor()
        adapted = adapt_all(list(stages), nodes=lambda: self.nodes(executor))
        pipeline = _Pipeline(name, adapted)
        tasks = list(initial_tasks) if initial_tasks is not None else [EmptyTask()]
        result = pipeline.run(executor, tasks)
        return self.outputs(result)

    def outputs(self, result: RunResult) -> list[Any]:
        if result.failures and not self.ignore_failures:
            raise StageFailures(result)
        return list(result.outputs)


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
