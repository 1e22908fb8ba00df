"""NeMo Curator's ``ProcessingStage`` and ``CompositeStage``, on Conveyor's engine.

A stage written for NeMo Curator subclasses these and keeps its code: ``process`` /
``process_batch``, ``setup(worker_metadata)``, ``setup_on_node(node_info,
worker_metadata)``, ``teardown``, ``inputs()``/``outputs()`` as (attributes, columns), the
sizing methods ``num_workers()`` / ``num_workers_per_node()``, and ``xenna_stage_spec()`` /
``ray_stage_spec()``. The Curator-style ``Pipeline`` (``conveyor.curator.pipeline``) hands
each such stage to the engine through an adapter (``conveyor.curator.adapter``) that reads
those methods once, when the pipeline is built: a setting with a meaning here is honoured,
one without is a warning naming it, a wrong value an error naming the stage.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Any, ClassVar, Self, TypeVar

from conveyor.curator.stages.resources import Resources
from conveyor.stage import CompositeStage as _CompositeStage
from conveyor.stage import ProcessingStage as _ProcessingStage

X = TypeVar("X")
Y = TypeVar("Y")

_UNSET: Any = object()


#: every NeMo Curator-style stage class by its class name (``get_stage_class``)
_STAGES: dict[str, type[Any]] = {}


def get_stage_class(name: str) -> type[Any]:
    """A stage class defined so far, by its class name (NeMo Curator's registry, for
    pipelines described in configuration files); ``KeyError`` naming those there are."""
    try:
        return _STAGES[name]
    except KeyError:
        raise KeyError(
            f"no stage class named {name!r} (defined: {', '.join(sorted(_STAGES)) or 'none'})"
        ) from None


class ProcessingStage(_ProcessingStage[X, Y]):
    """A stage in NeMo Curator's terms (see the module docstring)."""

    #: the class's ``name`` is its class name, given where it named none (Conveyor's rule)
    _named_by_class: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that names no stage keeps its parent's name, as in NeMo Curator
        (``with_`` and a composite's settings find it by that name); where no class above
        named one, it is the class's own name (NeMo Curator's would be "ProcessingStage")."""
        own = "name" in cls.__dict__
        inherited, by_class = cls.name, cls._named_by_class
        super().__init_subclass__(**kwargs)  # Conveyor's: the class name, where none given
        if own:
            cls._named_by_class = False
        elif inherited != ProcessingStage.name and not by_class:
            cls.name = inherited
        else:
            cls._named_by_class = True
        if not cls.__module__.startswith("conveyor.curator."):  # a user's, not ours
            _STAGES[cls.__name__] = cls

    name: str = "ProcessingStage"
    resources: Resources = Resources(cpus=1.0)  # type: ignore[assignment]
    batch_size: int | None = 1  # type: ignore[assignment]
    #: a Ray runtime environment for this stage alone: not supported here (an error at build)
    runtime_env: ClassVar[dict[str, Any] | None] = None
    #: set by ``with_``: they win over what the methods return, as in NeMo Curator
    _with_num_workers: int | None = None
    _with_num_workers_per_node: float | None = None
    _with_xenna_stage_spec: dict[str, Any] | None = None
    _with_ray_stage_spec: dict[str, Any] | None = None

    # -- lifecycle, with NeMo Curator's arguments ---------------------------------------------
    def setup_on_node(self, node_info: Any = None, worker_metadata: Any = None) -> None:
        """Once per stage per node, before that node's ``setup`` calls."""

    def setup(self, worker_metadata: Any = None) -> None:
        """Once per worker, before its first batch."""

    def teardown(self) -> None:
        """Once per worker at the end of the run."""

    # -- sizing and engine hints ------------------------------------------------------------
    def num_workers(self) -> int | None:  # type: ignore[override]
        """A fixed number of workers for this stage (``None``: autoscaled)."""
        return None

    def num_workers_per_node(self) -> float | None:
        """Workers per node of the cluster (``None``: autoscaled)."""
        return None

    def xenna_stage_spec(self) -> dict[str, Any]:
        return {}

    def ray_stage_spec(self) -> dict[str, Any]:
        return {}

    def supports_batch_processing(self) -> bool:
        return self.overrides("process_batch")

    def is_source_stage(self) -> bool:
        """Whether this stage makes the run's source partitions, each with a
        ``_metadata["resumability_key"]``: with ``checkpoint_path`` they are what a rerun
        skips once finished."""
        return False

    def validate_input(self, task: Any) -> bool:
        """Whether ``task`` has the attributes and data columns ``inputs()`` lists."""
        from conveyor.curator.adapter import has_inputs

        return has_inputs(task, self.inputs())

    def with_(  # type: ignore[override]
        self,
        name: str | None = None,
        resources: Resources | None = None,
        batch_size: int | None = None,
        runtime_env: dict[str, Any] | None = None,
        ray_stage_spec: dict[str, Any] | None = _UNSET,
        xenna_stage_spec: dict[str, Any] | None = _UNSET,
        num_workers: int | None = _UNSET,
        num_workers_per_node: float | None = _UNSET,
    ) -> Self:
        """A copy with the given settings replaced; the two spec dicts are merged over what
        the stage returns, the given keys winning. As in NeMo Curator, ``None`` leaves a
        name, resources, batch size or runtime_env as they were (``with_(batch_size=
        cfg.get("batch_size"))``); for the worker counts it sets "the executor decides"."""
        new = copy.deepcopy(self)
        for key, value in (
            ("name", name),
            ("resources", resources),
            ("batch_size", batch_size),
            ("runtime_env", runtime_env),
        ):
            if value is not None:
                setattr(new, key, value)
        for key, value in (
            ("_with_num_workers", num_workers),
            ("_with_num_workers_per_node", num_workers_per_node),
        ):
            if value is not _UNSET:
                setattr(new, key, value)
        for key, value in (
            ("_with_xenna_stage_spec", xenna_stage_spec),
            ("_with_ray_stage_spec", ray_stage_spec),
        ):
            if value is not _UNSET:
                if value is not None and not isinstance(value, dict):
                    raise TypeError(f"stage {new.name!r}: {key[6:]} must be a dict, got {value!r}")
                setattr(new, key, {**(getattr(new, key) or {}), **(value or {})})
        return new

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "resources": self.resources, "batch_size": self.batch_size}

    # -- NeMo Curator's custom metrics: on each output's ``_stage_perf[-1].custom_metrics`` --
    def _log_metrics(self, metrics: dict[str, float]) -> None:
        """Record numbers about the batch being processed; a value that is not a number is
        left out with a warning, as NeMo Curator does."""
        for name, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                warnings.warn(
                    f"stage {self.name!r}: metric {name!r} is not a number ({value!r}): "
                    "not recorded",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            self.log_metric(name, value)

    def _log_metric(self, name: str, value: float) -> None:
        self._log_metrics({name: value})

    def _time_metric(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.time_metric(name)


class CompositeStage(ProcessingStage[X, Y], _CompositeStage[X, Y]):
    """A stage that expands into several when the pipeline is built (``decompose``)."""

    #: each ``with_`` call's settings, applied in order when the pipeline is built
    _sub_stage_with: tuple[dict[str, dict[str, Any]], ...] = ()

    def decompose(self) -> list[Any]:
        raise NotImplementedError(f"composite stage {self.name!r} must implement decompose()")

    def inputs(self) -> Any:
        """Its first sub-stage's, as in NeMo Curator."""
        return self.decompose()[0].inputs()

    def outputs(self) -> Any:
        """Its last sub-stage's, as in NeMo Curator."""
        return self.decompose()[-1].outputs()

    def with_(self, stage_with_dict: dict[str, dict[str, Any]]) -> CompositeStage[X, Y]:  # type: ignore[override]
        """NeMo Curator's form: ``{sub-stage name: {with_ arguments}}``, applied to the
        sub-stages when the pipeline is built, each call's after the one before (a second
        call for a sub-stage adds to the first; a renamed one goes by its new name).
        Changes and returns this stage."""
        if not isinstance(stage_with_dict, dict) or not all(
            isinstance(v, dict) for v in stage_with_dict.values()
        ):
            raise TypeError(
                f"composite stage {self.name!r}: with_ takes {{sub-stage name: {{settings}}}}, "
                f"got {stage_with_dict!r}"
            )
        self._sub_stage_with = (*self._sub_stage_with, dict(stage_with_dict))
        return self

    def decompose_and_apply_with(self) -> list[Any]:
        """The sub-stages with ``with_``'s settings applied (an unknown name is an error)."""
        stages = self.decompose()
        for settings in self._sub_stage_with:
            names = [getattr(s, "name", None) for s in stages]
            unknown = sorted(set(settings) - set(names))
            if unknown:
                raise ValueError(
                    f"composite stage {self.name!r}: with_ names "
                    f"{', '.join(map(repr, unknown))}, which are not among its sub-stages "
                    f"({', '.join(map(repr, names))})"
                )
            if len(set(names)) != len(names):
                raise ValueError(
                    f"composite stage {self.name!r}: with_ needs unique sub-stage names, got "
                    f"{names}"
                )
            stages = [s.with_(**settings[s.name]) if s.name in settings else s for s in stages]
        return stages

    def process(self, task: X) -> Y:
        raise RuntimeError(f"composite stage {self.name!r} is expanded at build time, never run")
