"""How a NeMo Curator-style stage runs on Conveyor's engine: an adapter stage per stage.

The adapter is an ordinary Conveyor ``ProcessingStage``. It reads the Curator stage's
sizing methods and spec dicts once, when the pipeline is built (``adapt``), and calls the
stage's hooks with NeMo Curator's arguments while the run goes. What each spec key means
here is in ``XENNA_KEYS`` and ``RAY_KEYS``: honoured, ignored with a warning saying why, or
an error. A key NeMo Curator does not know either is an error (a typo would otherwise be
dropped).
"""

from __future__ import annotations

import itertools
import math
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from conveyor.cluster import NodeInfo as _NodeInfo
from conveyor.cluster import WorkerInfo
from conveyor.curator.backends.base import NodeInfo, WorkerMetadata, WorkerResources
from conveyor.curator.stages.base import CompositeStage, ProcessingStage
from conveyor.curator.stages.resources import as_resources
from conveyor.curator.tasks import FailedTask, NoneTask, TransientDrop
from conveyor.curator.video_model import Call as VideoCall
from conveyor.errors import DeferredError
from conveyor.stage import CompositeStage as _CompositeStage
from conveyor.stage import InputContract, several
from conveyor.stage import ProcessingStage as _ProcessingStage
from conveyor.tasks.base import Task

#: ``xenna_stage_spec()`` keys: ``None`` where honoured, else why it has no effect here
XENNA_KEYS: dict[str, str | None] = {
    "num_workers_per_node": None,
    "slots_per_actor": "a worker holds one message, two where the round trip would show: "
    "the engine decides",
    "num_run_attempts_python": None,  # the stage's max_attempts
    "ignore_failures": "failures are the run's: XennaExecutor(config={'ignore_failures': ...})",
    "num_setup_attempts_python": "a worker whose setup fails stops the run with its error",
    "reset_workers_on_failure": "a failed batch leaves its worker running; a dead worker is "
    "replaced",
    "worker_max_lifetime_m": "workers are renewed by count, not time: the stage's "
    "max_batches_per_worker (ray_stage_spec's max_calls_per_worker)",
    "worker_restart_interval_m": "workers are renewed by count, not time: the stage's "
    "max_batches_per_worker (ray_stage_spec's max_calls_per_worker)",
    "max_setup_failure_percentage": "a worker whose setup fails stops the run with its error",
}

#: ``ray_stage_spec()`` keys, as ``XENNA_KEYS``; ``"error"`` where running would be wrong
RAY_KEYS: dict[str, str | None] = {
    "is_actor_stage": None,  # every worker is long-lived and set up once
    "is_fanout_stage": None,  # outputs of a fan-out spread over workers anyway
    "min_workers": "the autoscaler sizes the pool (num_workers() pins it)",
    "max_workers": "the autoscaler sizes the pool (num_workers() pins it)",
    "initial_workers": "the autoscaler sizes the pool (num_workers() pins it)",
    "max_calls_per_worker": None,  # the stage's max_batches_per_worker
    "ray_remote_args": "workers get the stage's Resources; other Ray options are not passed",
    "ray_num_cpus": "a worker reserves the stage's Resources(cpus=...) on every executor",
    "is_raft_actor": "error",
    "is_lsh_stage": "error",
    "is_shuffle_stage": "error",
}


def adapt_all(
    stages: Sequence[Any], nodes: Callable[[], int] = lambda: 1
) -> list[_ProcessingStage[Any, Any]]:
    """``stages`` with composites expanded and each Curator-style stage adapted; Conveyor's
    own stages pass through. ``nodes`` is asked once, and only when a stage sizes itself
    per node."""
    counted: list[int] = []

    def count() -> int:
        if not counted:
            counted.append(max(1, int(nodes())))
        return counted[0]

    adapted = [adapt(s, count) for s in expand(stages)]
    for stage, following in itertools.pairwise(adapted):
        if isinstance(stage, CuratorStage):
            stage.to_conveyor = not isinstance(following, CuratorStage)
    return adapted


def expand(stages: Sequence[Any]) -> list[Any]:
    """Composites replaced by their sub-stages (Curator-style ones with their ``with_``
    settings applied), recursively."""
    flat: list[Any] = []
    for stage in stages:
        if isinstance(stage, type) and issubclass(stage, _ProcessingStage):
            raise TypeError(f"got the class {stage.__name__}; pass an instance: {stage.__name__}()")
        if isinstance(stage, CompositeStage):
            flat += expand(stage.decompose_and_apply_with())
        elif isinstance(stage, _CompositeStage):
            flat += expand(stage.decompose())
        elif isinstance(stage, _ProcessingStage):
            flat.append(stage)
        else:
            raise TypeError(f"expected a ProcessingStage, got {stage!r}")
    return flat


def adapt(stage: Any, nodes: Callable[[], int] = lambda: 1) -> _ProcessingStage[Any, Any]:
    """One stage as the engine runs it (see the module docstring)."""
    if not isinstance(stage, ProcessingStage):
        return stage  # a Conveyor stage
    _legacy_attributes(stage)
    name = stage.name
    if not isinstance(name, str) or not name:
        raise ValueError(f"stage {type(stage).__name__}: name must be a non-empty string")
    for method in ("num_workers", "num_workers_per_node"):
        if not callable(getattr(stage, method)):
            raise TypeError(
                f"stage {name!r}: {method} = {getattr(stage, method)!r} hides the method "
                f"{method}(); NeMo Curator's stages define def {method}(self) -> ... (or "
                f"use with_({method}=...))"
            )
    if not stage.overrides("process") and not stage.overrides("process_batch"):
        raise TypeError(f"stage {name!r} implements neither process nor process_batch")
    if stage.runtime_env:
        raise ValueError(
            f"stage {name!r}: runtime_env (a Ray environment per stage) is not supported: "
            "install the stage's packages where the workers run"
        )
    batch = stage.batch_size
    if batch is None:
        batch = 1  # NeMo Curator: "the executor decides"; one task per call here
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"stage {name!r}: batch_size must be None or an int >= 1, got {batch!r}")
    xenna = {**_spec(stage, "xenna_stage_spec"), **_keys(stage._with_xenna_stage_spec)}
    ray = {**_spec(stage, "ray_stage_spec"), **_keys(stage._with_ray_stage_spec)}
    if "num_workers" in xenna:
        raise ValueError(
            f"stage {name!r}: num_workers belongs in the num_workers() method (or "
            "with_(num_workers=...)), not in xenna_stage_spec"
        )
    _check_keys(name, "xenna_stage_spec", xenna, XENNA_KEYS)
    _check_keys(name, "ray_stage_spec", ray, RAY_KEYS)
    fixed = stage._with_num_workers
    if fixed is None:
        fixed = stage.num_workers()
    per_node = stage._with_num_workers_per_node
    if per_node is None:
        per_node = stage.num_workers_per_node()
    if per_node is None:
        per_node = xenna.get("num_workers_per_node")
    elif "num_workers_per_node" in xenna:
        raise ValueError(
            f"stage {name!r}: num_workers_per_node is set both by the method and in "
            "xenna_stage_spec; keep one"
        )
    if fixed is not None and per_node is not None:
        raise ValueError(
            f"stage {name!r}: set num_workers or num_workers_per_node, not both "
            f"(got {fixed!r} and {per_node!r})"
        )
    if fixed is not None and (isinstance(fixed, bool) or not isinstance(fixed, int) or fixed < 1):
        raise ValueError(
            f"stage {name!r}: num_workers() must be None or an int >= 1, got {fixed!r}"
        )
    if per_node is not None:
        if (
            isinstance(per_node, bool)
            or not isinstance(per_node, (int, float))
            or math.isnan(per_node)
            or per_node <= 0
        ):
            raise ValueError(
                f"stage {name!r}: num_workers_per_node must be None or a number > 0, got "
                f"{per_node!r}"
            )
        fixed = max(1, math.ceil(per_node * nodes()))
    node_setup = type(stage).setup_on_node is not ProcessingStage.setup_on_node
    kind = _KINDS[(stage.supports_batch_processing(), node_setup)]
    adapted = kind(stage, name, as_resources(stage.resources, name), batch, fixed)
    attempts = xenna.get("num_run_attempts_python")
    if attempts is not None:
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(
                f"stage {name!r}: num_run_attempts_python must be an int >= 1, got {attempts!r}"
            )
        adapted.max_attempts = attempts
    calls = ray.get("max_calls_per_worker")
    if calls:  # Ray's 0 and Curator's None: no limit
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise ValueError(
                f"stage {name!r}: max_calls_per_worker must be None or an int >= 1, got {calls!r}"
            )
        adapted.max_batches_per_worker = calls
    return adapted


def _legacy_attributes(stage: ProcessingStage[Any, Any]) -> None:
    """NeMo Curator 1.0's ``_name``, ``_resources`` and ``_batch_size`` (its stages set the
    underscored attributes then), where the plain ones are left at their defaults."""
    for legacy, plain in (
        ("_name", "name"),
        ("_resources", "resources"),
        ("_batch_size", "batch_size"),
    ):
        if not hasattr(stage, legacy):
            continue
        value = getattr(stage, plain)
        if value is getattr(ProcessingStage, plain) or (
            plain == "name" and value == type(stage).__name__
        ):
            setattr(stage, plain, getattr(stage, legacy))


def _spec(stage: ProcessingStage[Any, Any], method: str) -> dict[str, Any]:
    value = getattr(stage, method)()
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"stage {stage.name!r}: {method}() must return a dict, got {value!r}")
    return _keys(value)


def _keys(spec: dict[Any, Any] | None) -> dict[str, Any]:
    """A spec dict's keys as names (``RayStageSpecKeys.MAX_WORKERS``: ``"max_workers"``)."""
    return {str(getattr(k, "value", k)): v for k, v in (spec or {}).items()}


def _check_keys(name: str, method: str, spec: dict[str, Any], known: dict[str, str | None]) -> None:
    for key, value in spec.items():
        if key not in known:
            raise ValueError(
                f"stage {name!r}: {method}() key {key!r} is not one NeMo Curator knows "
                f"(known: {', '.join(sorted(known))})"
            )
        why = known[key]
        if why == "error":
            if value:
                raise ValueError(
                    f"stage {name!r}: {method}() asks for {key}, which needs NeMo Curator's "
                    "Ray actor pool internals (RAFT, shuffles) that Conveyor does not have"
                )
        elif why is not None:
            warnings.warn(
                f"stage {name!r}: {method}() key {key!r} has no effect here: {why}",
                UserWarning,
                stacklevel=_callers_level(),
            )


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside Conveyor: a warning points at the
    user's line (the pipeline's run or build), not at this module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("conveyor."):
        frame, level = frame.f_back, level + 1
    return level


def has_inputs(task: Any, spec: Any) -> bool:
    """Whether ``task`` has every attribute and data column ``spec`` (``inputs()``) lists."""
    contract = InputContract.of(spec)
    return contract is None or not contract.missing(task)


# -- the adapter stages --------------------------------------------------------------------
class CuratorStage(_ProcessingStage[Any, Any]):
    """A NeMo Curator-style stage as the engine runs it (``adapt`` makes these)."""

    def __init__(
        self,
        stage: ProcessingStage[Any, Any],
        name: str,
        resources: Any,
        batch_size: int,
        num_workers: int | None,
    ) -> None:
        self.stage = stage
        self.name = name
        self.resources = resources
        self.batch_size = batch_size
        self.num_workers = num_workers
        # Conveyor's own settings, where a Curator-style stage also sets them
        self.timeout_s = stage.timeout_s
        self.max_attempts = stage.max_attempts
        self.preload_modules = stage.preload_modules
        self.max_threads = stage.max_threads
        #: the next stage is one of Conveyor's: NeMo Curator's video model is converted
        #: to Conveyor's on the way out (``conveyor.curator.video_model``)
        self.to_conveyor = False

    def setup(self, worker: WorkerInfo) -> None:
        self.stage.setup(self.metadata(worker))

    def metadata(self, worker: WorkerInfo) -> WorkerMetadata:
        """What NeMo Curator passes a stage's hooks about its worker."""
        return WorkerMetadata(worker.worker_id, WorkerResources.of(worker, self.resources.cpus))

    def teardown(self) -> None:
        self.stage.teardown()

    def inputs(self) -> Any:
        """What the engine checks of every input: the stage's ``inputs()``, unless it checks
        them itself (its own ``validate_input``, called before each ``process`` as NeMo
        Curator does)."""
        return None if self.validates else self.stage.inputs()

    @property
    def validates(self) -> bool:
        return type(self.stage).validate_input is not ProcessingStage.validate_input

    def outputs(self) -> Any:
        return self.stage.outputs()

    def kind(self) -> str:
        return f"{type(self.stage).__name__}, NeMo Curator-style"

    def __repr__(self) -> str:
        return f"<{self.kind()} {self.name!r}>"

    def _outputs(self, result: Any, method: str, inputs: Sequence[Any]) -> Any:
        """What a call of the stage gave, as NeMo Curator takes it: ``None`` and
        ``NoneTask`` in a list dropped (an input filtered), a ``TransientDrop`` or
        ``FailedTask`` the input's failure for this run (``DeferredError``; a batch's is
        told apart by running its inputs one by one), and anything but a task refused,
        naming it (the next stage failed on it, or the run returned it); its metrics moved
        to the adapter, whose outputs carry them (``log_metric``)."""
        metrics = self.stage._batch_metrics
        if metrics:
            self._batch_metrics = {**(self._batch_metrics or {}), **metrics}
            self.stage._batch_metrics = None
        if not isinstance(result, list) and several(result):
            result = list(result)
        if isinstance(result, (NoneTask, TransientDrop, FailedTask)):
            result = [result]
        if isinstance(result, list):
            _raise_dropped(self.name, method, result, inputs)
            result = [t for t in result if t is not None and not isinstance(t, NoneTask)]
        for output in result if isinstance(result, list) else (result,):
            if output is not None and not isinstance(output, Task):
                raise TypeError(
                    f"stage {self.name!r}: {method}() gave {type(output).__name__} "
                    f"{' '.join(repr(output).split())[:60]}, not a task: NeMo Curator's "
                    "stages give tasks "
                    "(DocumentBatch(dataset_name=..., data=df) for a table)"
                )
        return result

    def _call(self, tasks: list[Any], method: str, call: Callable[[list[Any]], Any]) -> Any:
        """``call`` of the stage on ``tasks``; video tasks in NeMo Curator's model on the
        way in, and in Conveyor's on the way out where a Conveyor stage is next."""
        videos = VideoCall(self.name, tasks)
        given = videos.inputs
        result = self._outputs(call(given), method, given) if given else []
        return videos.outputs(result, self.to_conveyor)


def _raise_dropped(name: str, method: str, outputs: list[Any], inputs: Sequence[Any]) -> None:
    """A ``TransientDrop`` or ``FailedTask`` among ``outputs`` as the ``DeferredError`` of
    the call's inputs (see ``CuratorStage._outputs``)."""
    dropped = next((o for o in outputs if isinstance(o, (TransientDrop, FailedTask))), None)
    if dropped is None:
        return
    reason = getattr(dropped, "reason", "") or ""
    if len(inputs) == 1:
        task = inputs[0]
        which = f"task {task.task_id!r}" if isinstance(task, Task) else type(task).__name__
    else:
        which = f"one of {len(inputs)} inputs (each is run alone to tell which)"
    raise DeferredError(
        f"stage {name!r}: {method}() gave {type(dropped).__name__} for {which}"
        + (f": {reason}" if reason else "")
        + "; a journaled run tries it again next time"
    )


class _PerTask(CuratorStage):
    def process(self, task: Any) -> Any:
        self.stage._threads = self._threads
        return self._call([task], "process", self._process_one)

    def _process_one(self, tasks: list[Any]) -> Any:
        stage, task = self.stage, tasks[0]
        if self.validates and not stage.validate_input(task):
            raise ValueError(
                f"stage {self.name!r}: validate_input() refused task {task.task_id!r}"
                if hasattr(task, "task_id")
                else f"stage {self.name!r}: validate_input() refused {type(task).__name__}"
            )
        return stage.process(task)


class _PerBatch(CuratorStage):
    def process_batch(self, tasks: list[Any]) -> list[Any]:
        self.stage._threads = self._threads
        outputs: list[Any] = self._call(tasks, "process_batch", self.stage.process_batch)
        return outputs


class _NodeSetup:
    stage: Any

    def setup_on_node(self, node: _NodeInfo, worker: WorkerInfo) -> None:
        self.stage.setup_on_node(NodeInfo(node.node_id), self.metadata(worker))  # type: ignore[attr-defined]


class _PerTaskNode(_NodeSetup, _PerTask):
    pass


class _PerBatchNode(_NodeSetup, _PerBatch):
    pass


#: (batches, node setup) -> the adapter class (the engine asks a stage's class what it
#: overrides, so each combination is its own class)
_KINDS: dict[tuple[bool, bool], type[CuratorStage]] = {
    (False, False): _PerTask,
    (True, False): _PerBatch,
    (False, True): _PerTaskNode,
    (True, True): _PerBatchNode,
}
