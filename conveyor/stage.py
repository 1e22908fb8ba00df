"""The stage API: ``ProcessingStage``, ``@processing_stage`` and ``CompositeStage``.

A stage is plain configuration plus code. Everything the engine needs is a class attribute with
a default, so subclasses need not call ``super().__init__()``; ``with_()`` returns a modified copy.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.errors import PipelineBuildError
from conveyor.resources import Resources

In = TypeVar("In")
Out = TypeVar("Out")

_UNSET: Any = object()


class ProcessingStage(Generic[In, Out]):
    """One step of a pipeline, run as a pool of workers.

    Override ``process`` (one task in; one output, a list, or ``None`` out) or ``process_batch``
    (``batch_size`` tasks in, a list out). Either may be a generator instead: each output it
    yields goes on to the next stage at once, while the rest are still being made (see
    ``yields_outputs``). ``setup`` runs once per worker (load a model there),
    ``setup_on_node`` once per stage per node before any ``setup`` on that node (download
    weights there), ``teardown`` once per worker at the end, also after a failure.
    """

    name: str = "ProcessingStage"
    resources: Resources = Resources(cpus=1.0)
    batch_size: int = 1
    #: with ``batch_size`` > 1, the longest (seconds) a task waits in the stage's queue for
    #: its batch to fill: then what is there goes as a smaller batch. For a stage whose
    #: batches cost mostly per call (one file for the whole batch), so that it batches
    #: when its input trickles in. ``None``: a batch goes full, or smaller only once the
    #: stage's input has ended. Either way nothing waits while the run has yet to make its
    #: first output (no task has reached the last stage)
    batch_wait_s: float | None = None
    #: a fixed pool size (``None``: autoscaled); typed ``Any`` so that NeMo Curator's form,
    #: a ``num_workers()`` method in a subclass, type-checks too
    num_workers: Any = None
    #: modules the stage's code imports lazily that are slow to import (``"torch"``): the local
    #: backend imports them once per machine, before forking the stage's workers, so workers
    #: share them instead of each importing them again
    preload_modules: tuple[str, ...] = ()
    #: seconds one batch may take; a batch that runs longer has its worker killed and
    #: replaced, is retried (each input alone) and finally recorded as a ``TaskTimeout``
    #: failure, so a hung input cannot hold a worker forever. ``None``: no limit
    timeout_s: float | None = None
    #: times an input of this stage is tried before it is recorded as failed (a stage that
    #: calls a paid service or writes to a database: 1). ``None``: the executor's
    #: ``max_attempts``. An input that failed in a batch of several is tried again alone
    #: without spending one (it may have been a batch-mate's fault)
    max_attempts: int | None = None
    #: batches one worker runs before it is replaced by a fresh one (its ``teardown`` runs,
    #: a new process does ``setup``): for a stage whose library leaks memory or state over
    #: time (Ray's ``max_calls``). ``None``: workers live for the run
    max_batches_per_worker: int | None = None
    #: the most CPU threads one batch of this stage can put to use (a model's intra-op
    #: threads, an encoder's): a batch sent while cores of the run's budget sit idle (the
    #: start of a run, its end) may use up to this many, and ``self.threads`` says how many
    #: the current batch has. ``None``: always the stage's own CPUs
    max_threads: int | None = None
    #: threads of the batch being processed, set by the worker (see ``threads``)
    _threads: int | None = None
    #: what the batch being processed recorded (``log_metric``), emptied by the worker
    _batch_metrics: dict[str, float] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    # -- the work -------------------------------------------------------------------------
    def process(self, task: In) -> Out | list[Out] | Iterator[Out] | None:
        raise NotImplementedError(
            f"stage {self.name!r} implements neither process nor process_batch"
        )

    def process_batch(self, tasks: list[In]) -> list[Out] | Iterator[Out]:
        outputs: list[Out] = []
        for task in tasks:
            result = self.process(task)
            if result is None:
                continue
            if several(result):
                outputs.extend(result)
            else:
                outputs.append(result)
        return outputs

    @property
    def threads(self) -> int:
        """CPU threads the batch being processed may use: the stage's CPUs (one at least),
        or up to ``max_threads`` when the batch was sent while cores idled."""
        return self._threads or max(1, round(self.resources.cpus))

    def log_metric(self, name: str, value: float) -> None:
        """Record a number about the batch being processed (a sub-step's seconds, a count):
        it goes on the ``stage_perf`` record of each of the batch's outputs, in
        ``custom_metrics`` (logged twice in a batch, a name keeps its last value)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"stage {self.name!r}: metric {name!r} must be a number, got {value!r}")
        if self._batch_metrics is None:
            self._batch_metrics = {}
        self._batch_metrics[str(name)] = float(value)

    @contextlib.contextmanager
    def time_metric(self, name: str) -> Iterator[None]:
        """Record the seconds the block takes as metric ``name`` (see ``log_metric``)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.log_metric(name, time.perf_counter() - started)

    # -- lifecycle ------------------------------------------------------------------------
    def setup_on_node(self, node: NodeInfo, worker: WorkerInfo) -> None:
        """Once per stage per node, before that node's ``setup`` calls."""

    def setup(self, worker: WorkerInfo) -> None:
        """Once per worker, before its first batch."""

    def teardown(self) -> None:
        """Once per worker at the end of the run, also when the run fails."""

    # -- declared contract ----------------------------------------------------------------
    def inputs(self) -> Sequence[str] | tuple[Sequence[str], Sequence[str]] | None:
        """Attributes (or data columns) every input task must have; ``None`` = undeclared."""
        return None

    def outputs(self) -> Sequence[str] | tuple[Sequence[str], Sequence[str]] | None:
        """Attributes (or data columns) every output task has; ``None`` = undeclared."""
        return None

    # -- configuration --------------------------------------------------------------------
    def with_(
        self,
        *,
        name: str = _UNSET,
        resources: Resources = _UNSET,
        batch_size: int = _UNSET,
        batch_wait_s: float | None = _UNSET,
        num_workers: int | None = _UNSET,
        timeout_s: float | None = _UNSET,
        max_attempts: int | None = _UNSET,
        max_batches_per_worker: int | None = _UNSET,
    ) -> Self:
        """A copy with the given settings replaced; ``num_workers`` pins the pool size."""
        try:
            new = copy.deepcopy(self)
        except Exception as exc:  # TypeError, PicklingError, ...: whatever it holds
            raise PipelineBuildError.not_copyable(self.name, exc) from exc
        for key, value in (
            ("name", name),
            ("resources", resources),
            ("batch_size", batch_size),
            ("batch_wait_s", batch_wait_s),
            ("num_workers", num_workers),
            ("timeout_s", timeout_s),
            ("max_attempts", max_attempts),
            ("max_batches_per_worker", max_batches_per_worker),
        ):
            if value is not _UNSET:
                setattr(new, key, value)
        validate_stage(new)
        return new

    def kind(self) -> str:
        """What ``Pipeline.describe`` calls the stage: its class (an adapter names what it
        runs)."""
        return type(self).__name__

    def overrides(self, method: str) -> bool:
        """Whether this stage's class replaces the base implementation of ``method``."""
        return getattr(type(self), method) is not getattr(ProcessingStage, method)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def validate_stage(stage: ProcessingStage[Any, Any]) -> None:
    """Raise ``ValueError`` naming the stage and field when its settings are unusable."""
    label = getattr(stage, "name", type(stage).__name__)
    if not isinstance(stage.name, str) or not stage.name:
        raise ValueError(f"stage {type(stage).__name__}: name must be a non-empty string")
    if not isinstance(stage.resources, Resources):
        raise ValueError(
            f"stage {label!r}: resources must be a conveyor.Resources, got {stage.resources!r}"
        )
    if isinstance(stage.batch_size, bool) or not isinstance(stage.batch_size, int):
        raise ValueError(f"stage {label!r}: batch_size must be an int, got {stage.batch_size!r}")
    if stage.batch_size < 1:
        raise ValueError(f"stage {label!r}: batch_size must be >= 1, got {stage.batch_size}")
    wait = stage.batch_wait_s
    if wait is not None and (
        isinstance(wait, bool)
        or not isinstance(wait, (int, float))
        or not math.isfinite(wait)
        or wait < 0
    ):
        raise ValueError(
            f"stage {label!r}: batch_wait_s must be None or seconds >= 0, got {wait!r}"
        )
    preload = stage.preload_modules
    if not isinstance(preload, tuple) or not all(isinstance(m, str) and m for m in preload):
        raise ValueError(
            f"stage {label!r}: preload_modules must be a tuple of module names, got {preload!r}"
        )
    hidden = [m for m in _METHODS if not callable(getattr(stage, m, None))]
    if hidden:
        raise ValueError(
            f"stage {label!r}: "
            + "; ".join(f"its {m} = {getattr(stage, m)!r} hides the method {m}()" for m in hidden)
            + " of ProcessingStage, which the engine calls: rename the attribute"
        )
    asynchronous = [
        m for m in ("process", "process_batch") if inspect.iscoroutinefunction(getattr(stage, m))
    ]
    if asynchronous:
        raise ValueError(
            f"stage {label!r}: {asynchronous[0]}() is async; the engine calls it in a worker "
            "and takes what it returns: make it a plain method (asyncio.run inside if need be)"
        )
    if any(c.__module__ == "conveyor.curator.stages.base" for c in type(stage).__mro__):
        raise ValueError(
            f"stage {label!r} is a NeMo Curator-style stage (conveyor.curator's "
            "ProcessingStage): run it in conveyor.curator.pipeline.Pipeline, whose "
            "conveyor_pipeline() gives the conveyor.Pipeline of its stages"
        )
    curator = _curator_style(stage)
    if curator:
        raise ValueError(
            f"stage {label!r} {curator}: NeMo Curator's stage methods are read by "
            "conveyor.curator (subclass conveyor.curator.stages.base.ProcessingStage and run "
            "it in conveyor.curator.pipeline.Pipeline), never by conveyor.ProcessingStage; "
            "here, pin workers with num_workers = N (an attribute) or with_(num_workers=N)"
        )
    workers = stage.num_workers
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ValueError(
            f"stage {label!r}: num_workers must be None or an int >= 1, got {workers!r}"
        )
    most = stage.max_threads
    if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
        raise ValueError(f"stage {label!r}: max_threads must be None or an int >= 1, got {most!r}")
    timeout = stage.timeout_s
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < math.inf
    ):
        raise ValueError(
            f"stage {label!r}: timeout_s must be None or a number of seconds > 0, got {timeout!r}"
        )
    for key in ("max_attempts", "max_batches_per_worker"):
        count = getattr(stage, key)
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise ValueError(f"stage {label!r}: {key} must be None or an int >= 1, got {count!r}")
    if not isinstance(stage, CompositeStage) and not (
        stage.overrides("process") or stage.overrides("process_batch")
    ):
        raise ValueError(f"stage {label!r} implements neither process nor process_batch")


#: the methods the engine calls on every stage, which an attribute of the same name would hide
_METHODS = ("process", "process_batch", "setup_on_node", "setup", "teardown", "inputs", "outputs")

#: NeMo Curator's stage methods, which a stage of Conveyor's own would have ignored
_CURATOR_METHODS = ("xenna_stage_spec", "ray_stage_spec", "num_workers_per_node")


def _curator_style(stage: ProcessingStage[Any, Any]) -> str | None:
    """What NeMo Curator-only method a Conveyor stage defines (``None``: none)."""
    if callable(stage.num_workers):
        return "has a num_workers() method"
    found = [m for m in _CURATOR_METHODS if callable(getattr(stage, m, None))]
    return f"defines {', '.join(f'{m}()' for m in found)}" if found else None


def yields_outputs(stage: ProcessingStage[Any, Any]) -> bool:
    """Whether the stage's ``process`` (or ``process_batch``) is a generator function.

    The engine then forwards each output as it is yielded instead of when the batch ends, and
    pauses the generator (at its ``yield``) while the next stage has no room. What that asks
    of a stage's author (docs/engine.md, "Outputs as they are made"): every attempt at an
    input yields the same outputs in the same order, so that a retry after a failure part way
    can be told apart from new outputs by position (the engine drops the ones it forwarded
    already), and side effects are idempotent (a writer writes to a temporary name and
    renames).
    """
    fn: Any = getattr(stage, "fn", None) if isinstance(stage, FunctionStage) else None
    if fn is None:
        method = "process_batch" if stage.overrides("process_batch") else "process"
        fn = getattr(type(stage), method)
    return inspect.isgeneratorfunction(fn)


def _is_pair(spec: Any) -> bool:
    """NeMo Curator's form: ``(attributes, data attributes)``, two lists."""
    return (
        isinstance(spec, tuple)
        and len(spec) == 2
        and all(isinstance(p, (list, tuple)) for p in spec)
    )


def declared_names(spec: Any) -> set[str] | None:
    """Normalize ``inputs()``/``outputs()``: a list of names, NeMo Curator's (attributes,
    data attributes), or its dict of such pairs by task type (every name of them)."""
    if spec is None:
        return None
    if isinstance(spec, str):
        names = [spec]  # one name, not its characters
    elif isinstance(spec, dict):
        names = [n for pair in spec.values() for n in declared_names(pair) or ()]
    elif _is_pair(spec):
        names = [*spec[0], *spec[1]]
    else:
        names = list(spec)
    return {str(n) for n in names} or None


def complete_outputs(spec: Any) -> set[str] | None:
    """What every output of a stage has, where its ``outputs()`` says so: a list of names.
    NeMo Curator's pair lists only what the stage adds or changes (the rest of its input
    goes on too), so it says nothing of the whole (``None``), as an undeclared one."""
    if spec is None or _is_pair(spec) or isinstance(spec, dict):
        return None
    return declared_names(spec)


@dataclass(frozen=True)
class InputContract:
    """What ``inputs()`` asks of every input, in any of its forms: ``names``, each an
    attribute of the task or a column of its data (Conveyor's list); NeMo Curator's pair,
    ``attrs`` of the task and ``columns`` (or attributes) of its ``data``; or NeMo Curator's
    dict of pairs by task type (``by_type``), the most specific type of the task's winning."""

    names: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    by_type: tuple[tuple[type, InputContract], ...] = ()

    @classmethod
    def of(cls, spec: Any) -> InputContract | None:
        """The contract ``inputs()`` declares (``None``: nothing to check)."""
        if spec is None:
            return None
        if isinstance(spec, dict):
            pairs = tuple((kind, cls.of(pair) or cls()) for kind, pair in spec.items())
            if not all(isinstance(kind, type) for kind, _ in pairs):
                raise TypeError(
                    f"inputs() as a dict maps task types to (attributes, columns), got keys "
                    f"{list(spec)!r}"
                )
            return cls(by_type=pairs) if pairs else None
        if _is_pair(spec):
            contract = cls(attrs=tuple(map(str, spec[0])), columns=tuple(map(str, spec[1])))
            return contract if contract.attrs or contract.columns else None
        names = declared_names(spec)
        return cls(names=tuple(sorted(names))) if names else None

    def missing(self, task: Any) -> list[str]:
        """What ``task`` lacks of it, each said as a name (a data column: ``data.text``)."""
        if self.by_type:
            declared = dict(self.by_type)
            for kind in type(task).__mro__:
                if kind in declared:
                    return declared[kind].missing(task)
            kinds = ", ".join(kind.__name__ for kind, _ in self.by_type)
            return [f"a task of a declared type ({kinds}), not {type(task).__name__}"]
        missing = [name for name in self.names if not _has_input(task, name)]
        missing += [name for name in self.attrs if not _attribute(task, name)]
        data = getattr(task, "data", None)
        return missing + [f"data.{c}" for c in self.columns if not _column(task, data, c)]


def _has_input(task: Any, name: str) -> bool:
    """Conveyor's check of one declared input: a key of a mapping, what the task says it
    has (``has_attribute``: a ``DocumentBatch``'s columns too), or an attribute."""
    if isinstance(task, Mapping):
        return name in task
    checker = getattr(task, "has_attribute", None)
    if checker is not None:
        return bool(checker(name))
    return hasattr(task, name)


def _attribute(task: Any, name: str) -> bool:
    return name in task if isinstance(task, Mapping) else hasattr(task, name)


def _column(task: Any, data: Any, name: str) -> bool:
    """Whether ``data`` has column ``name``: a table's (pandas, pyarrow: its columns, not
    its methods), a mapping's key, or else an attribute of the data (NeMo Curator's test)."""
    if isinstance(data, Mapping):
        return name in data
    names = getattr(data, "column_names", None)  # pyarrow
    if names is None and not callable(getattr(data, "columns", None)):
        names = getattr(data, "columns", None)  # pandas
    if names is None:
        names = getattr(task, "columns", None)
    if names is not None and not isinstance(names, (str, bytes)):
        try:
            return name in list(names)
        except TypeError:
            pass
    return hasattr(data, name)


class FunctionStage(ProcessingStage[Any, Any]):
    """A stage made from a one-argument function by ``@processing_stage``."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", "function_stage")

    def process(self, task: Any) -> Any:
        return self.fn(task)


def processing_stage(
    fn: Callable[[Any], Any] | None = None,
    *,
    name: str | None = None,
    resources: Resources | None = None,
    batch_size: int | None = None,
) -> Any:
    """Turn a one-argument function into a stage instance (usable bare or with arguments)."""

    def wrap(function: Callable[[Any], Any]) -> FunctionStage:
        if inspect.iscoroutinefunction(function):  # every task would fail on its coroutine
            raise TypeError(
                f"@processing_stage: {function.__name__!r} is async; a stage's function runs "
                "in a worker as fn(task): make it a plain function (asyncio.run inside if need "
                "be)"
            )
        params = [
            p
            for p in inspect.signature(function).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) != 1:
            raise TypeError(
                f"@processing_stage: {getattr(function, '__name__', function)!r} must take "
                f"exactly one required positional argument (the task), it takes {len(params)}"
            )
        keyword_only = [
            p.name
            for p in inspect.signature(function).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind == p.KEYWORD_ONLY
        ]
        if keyword_only:
            # fn(task) would fail on every task at run time; say so at definition time
            raise TypeError(
                f"@processing_stage: {getattr(function, '__name__', function)!r} has required "
                f"keyword-only argument(s) {', '.join(keyword_only)}; it is called as fn(task), "
                "so give them defaults"
            )
        stage = FunctionStage(function)
        if name is not None:
            stage.name = name
        if resources is not None:
            stage.resources = resources
        if batch_size is not None:
            stage.batch_size = batch_size
        validate_stage(stage)
        return stage

    if fn is not None:
        if not callable(fn):  # @processing_stage("name"): the name given where fn goes
            raise TypeError(
                f"@processing_stage takes the function, or settings as keywords "
                f"(@processing_stage(name=...)), got {fn!r}"
            )
        return wrap(fn)
    return wrap


def several(result: Any) -> bool:
    """Whether what ``process`` gave is several outputs: a list, or an iterator (a
    generator, ``map()``, ``iter(...)``) that is not a file (a ``BytesIO`` is one output,
    not its lines)."""
    return isinstance(result, list) or (
        isinstance(result, Iterator) and not isinstance(result, io.IOBase)
    )


class CompositeStage(ProcessingStage[In, Out]):
    """A stage that expands into several stages when the pipeline is built."""

    def decompose(self) -> Sequence[ProcessingStage[Any, Any]]:
        raise NotImplementedError(f"composite stage {self.name!r} must implement decompose()")

    def process(self, task: In) -> Out | list[Out] | Iterator[Out] | None:
        raise RuntimeError(f"composite stage {self.name!r} is expanded at build time, never run")
