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

import copy
from typing import Any, ClassVar, TypeVar

from conveyor.curator.stages.resources import Resources
from conveyor.stage import CompositeStage as _CompositeStage
from conveyor.stage import ProcessingStage as _ProcessingStage

X = TypeVar("X")
Y = TypeVar("Y")

_UNSET: Any = object()


class ProcessingStage(_ProcessingStage[X, Y]):
    """A stage in NeMo Curator's terms (see the module docstring)."""

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

    def validate_input(self, task: Any) -> bool:
        """Whether ``task`` has the attributes and data columns ``inputs()`` lists."""
        from conveyor.curator.adapter import has_inputs

        return has_inputs(task, self.inputs())

    def with_(  # type: ignore[override]
        self,
        name: str = _UNSET,
        resources: Resources = _UNSET,
        batch_size: int | None = _UNSET,
        runtime_env: dict[str, Any] | None = _UNSET,
        ray_stage_spec: dict[str, Any] | None = _UNSET,
        xenna_stage_spec: dict[str, Any] | None = _UNSET,
        num_workers: int | None = _UNSET,
        num_workers_per_node: float | None = _UNSET,
    ) -> ProcessingStage[X, Y]:
        """A copy with the given settings replaced; the two spec dicts are merged over what
        the stage returns, the given keys winning."""
        new = copy.deepcopy(self)
        for key, value in (
            ("name", name),
            ("resources", resources),
            ("batch_size", batch_size),
            ("runtime_env", runtime_env),
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


class CompositeStage(ProcessingStage[X, Y], _CompositeStage[X, Y]):
    """A stage that expands into several when the pipeline is built (``decompose``)."""

    _sub_stage_with: dict[str, dict[str, Any]] | None = None

    def decompose(self) -> list[Any]:
        raise NotImplementedError(f"composite stage {self.name!r} must implement decompose()")

    def with_(self, stage_with_dict: dict[str, dict[str, Any]]) -> CompositeStage[X, Y]:  # type: ignore[override]
        """NeMo Curator's form: ``{sub-stage name: {with_ arguments}}``, applied to the
        sub-stages when the pipeline is built. Changes and returns this stage."""
        if not isinstance(stage_with_dict, dict) or not all(
            isinstance(v, dict) for v in stage_with_dict.values()
        ):
            raise TypeError(
                f"composite stage {self.name!r}: with_ takes {{sub-stage name: {{settings}}}}, "
                f"got {stage_with_dict!r}"
            )
        self._sub_stage_with = {**(self._sub_stage_with or {}), **stage_with_dict}
        return self

    def decompose_and_apply_with(self) -> list[Any]:
        """The sub-stages with ``with_``'s settings applied (an unknown name is an error)."""
        stages = self.decompose()
        settings = self._sub_stage_with or {}
        names = [getattr(s, "name", None) for s in stages]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise ValueError(
                f"composite stage {self.name!r}: with_ names {', '.join(map(repr, unknown))}, "
                f"which are not among its sub-stages ({', '.join(map(repr, names))})"
            )
        if settings and len(set(names)) != len(names):
            raise ValueError(
                f"composite stage {self.name!r}: with_ needs unique sub-stage names, got {names}"
            )
        return [s.with_(**settings[s.name]) if s.name in settings else s for s in stages]

    def process(self, task: X) -> Y:
        raise RuntimeError(f"composite stage {self.name!r} is expanded at build time, never run")
