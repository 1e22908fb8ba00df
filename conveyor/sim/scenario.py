"""Scenario files: a cluster, a pipeline of modelled stages, a source and the autoscaler's knobs.

A scenario is what one needs to ask "what would the controller do on 2,000 GPUs?" without the
GPUs: it is loaded from YAML into typed dataclasses (every field checked, unknown keys refused
with the file and the field named), then turned into a ``Pipeline`` of placeholder stages and
a ``SimulatedBackend`` whose models carry the behaviour. ``conveyor.sim.report`` runs it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, Literal

import yaml

from conveyor.backends.simulated import Distribution, SimNode, SimulatedBackend, StageModel
from conveyor.engine.policies.autoscale import AutoscaleConfig
from conveyor.pipeline import Pipeline
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage, validate_stage

__all__ = [
    "ClusterGroup",
    "DistributionSpec",
    "ExecutorSpec",
    "ModelSpec",
    "PhaseSpec",
    "ReportSpec",
    "ResourcesSpec",
    "Scenario",
    "ScenarioError",
    "SourceSpec",
    "StageScenario",
    "load_scenario",
    "parse_scenario",
    "shipped_scenarios",
]


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file and the field."""


# -- the format ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DistributionSpec:
    """Seconds per task (or per batch): ``constant``, ``uniform``, ``exponential``, ``lognormal``.

    ``spread`` is the relative half-width for ``uniform`` and the log-space sigma for
    ``lognormal``; the mean is always ``mean``.
    """

    mean: float
    kind: Literal["constant", "uniform", "exponential", "lognormal"] = "constant"
    spread: float = 0.0

    def build(self) -> Distribution:
        return Distribution(self.mean, self.kind, self.spread)


@dataclass(frozen=True)
class PhaseSpec:
    """From virtual second ``at`` on, the stage's service time follows ``service``."""

    at: float
    service: DistributionSpec


@dataclass(frozen=True)
class ModelSpec:
    """How a stage behaves in the simulation (see ``conveyor.backends.simulated.StageModel``)."""

    service: DistributionSpec
    per_batch: bool = False
    setup_s: float = 0.0
    output_ratio: float = 1.0
    failure_rate: float = 0.0
    hang_rate: float = 0.0
    output_bytes: int = 1024
    phases: list[PhaseSpec] = field(default_factory=list)
    #: peak host memory one worker reports (what the engine would measure), in GB
    memory_gb: float = 0.0

    def build(self) -> StageModel:
        return StageModel(
            service=self.service.build(),
            setup_s=self.setup_s,
            output_ratio=self.output_ratio,
            failure_rate=self.failure_rate,
            hang_rate=self.hang_rate,
            output_bytes=self.output_bytes,
            per_batch=self.per_batch,
            phases=tuple((p.at, p.service.build()) for p in self.phases),
            memory_bytes=int(self.memory_gb * 2**30),
        )


@dataclass(frozen=True)
class ResourcesSpec:
    """Per worker, as ``conveyor.Resources``."""

    cpus: float = 1.0
    gpus: float = 0.0
    gpu_memory_gb: float = 0.0
    memory_gb: float = 0.0
    nvdecs: float = 0.0
    nvencs: float = 0.0

    def build(self) -> Resources:
        return Resources(
            cpus=self.cpus,
            gpus=self.gpus,
            gpu_memory_gb=self.gpu_memory_gb,
            memory_gb=self.memory_gb,
            nvdecs=self.nvdecs,
            nvencs=self.nvencs,
        )


@dataclass(frozen=True)
class StageScenario:
    """One stage: its shape, batch size, optional pin, and its model."""

    name: str
    model: ModelSpec
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    batch_size: int = 1
    #: a partial batch goes once its oldest task waited this long
    #: (``ProcessingStage.batch_wait_s``; a ``per_batch`` model shows what it saves)
    batch_wait_s: float | None = None
    num_workers: int | None = None
    #: seconds a batch may run before its worker is killed (``ProcessingStage.timeout_s``)
    timeout_s: float | None = None
    #: its ``process`` is a generator: each output goes on as it is made (evenly over the
    #: task's service time), and the stage pauses while the next has no room
    streams: bool = False
    #: free text: where the numbers come from
    note: str = ""

    def placeholder(self) -> ModelledStage:
        """The stage the pipeline holds; the backend runs its model."""
        return (YieldingModelledStage if self.streams else ModelledStage)(
            self.name,
            self.resources.build(),
            self.batch_size,
            self.num_workers,
            self.timeout_s,
            self.batch_wait_s,
        )


@dataclass(frozen=True)
class ClusterGroup:
    """``count`` identical nodes ``<name>-0``, ``<name>-1``, ... present from ``joins_at``
    until ``leaves_at`` (the simulated backend loses their workers then)."""

    name: str
    cpus: float
    count: int = 1
    gpus: int = 0
    gpu_memory_gb: float | None = None
    joins_at: float = 0.0
    leaves_at: float | None = None
    #: host memory of one node for workers (``None``: not a limit)
    memory_gb: float | None = None
    #: video decoder and encoder units of each GPU (``None``: not a limit): an H100 has 7
    #: NVDEC and no NVENC, an L40S 3 of each
    nvdecs_per_gpu: float | None = None
    nvencs_per_gpu: float | None = None

    def nodes(self) -> list[SimNode]:
        return [
            SimNode(
                f"{self.name}-{i}",
                cpus=self.cpus,
                gpus=self.gpus,
                gpu_memory_gb=self.gpu_memory_gb,
                joins_at=self.joins_at,
                leaves_at=self.leaves_at,
                memory_gb=self.memory_gb,
                nvdecs_per_gpu=self.nvdecs_per_gpu,
                nvencs_per_gpu=self.nvencs_per_gpu,
            )
            for i in range(self.count)
        ]


@dataclass(frozen=True)
class SourceSpec:
    """How much input: ``tasks`` source tasks, or tasks until virtual second ``duration_s``.

    With both, the source stops at whichever comes first. Tasks are admitted lazily, as the
    first stage's queue has room, so a duration-bound source never runs ahead of the pipeline.
    """

    tasks: int | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class ExecutorSpec:
    """Which executor runs the pipeline, and its settings (``conveyor.executors.Executor``)."""

    kind: Literal["streaming", "batch"] = "streaming"
    max_attempts: int = 3
    autoscale_interval_s: float = 1.0
    edge_max_tasks: int = 1024
    edge_max_bytes: int | None = None


@dataclass(frozen=True)
class ReportSpec:
    """What the report measures: the steady window starts after ``warmup_s``.

    The window ends at ``until_s`` if given, else when the first stage has finished all its
    input (from then on the pipeline drains, which is not steady state). ``bucket_s`` is the
    resolution of the per-stage time series.
    """

    warmup_s: float = 0.0
    until_s: float | None = None
    bucket_s: float = 1.0


@dataclass(frozen=True)
class Scenario:
    """A whole scenario file."""

    name: str
    cluster: list[ClusterGroup]
    stages: list[StageScenario]
    source: SourceSpec
    description: str = ""
    seed: int = 0
    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    #: ``AutoscaleConfig`` fields by name (unknown names are refused)
    autoscale: dict[str, Any] = field(default_factory=dict)
    report: ReportSpec = field(default_factory=ReportSpec)
    #: the backend's queue memory budget (split across edges unless ``edge_max_bytes``)
    memory_budget_bytes: int = 1 << 34
    #: end the run at this virtual second even if work remains (one hour of a longer job)
    stop_at_s: float | None = None
    #: where the scenario came from (a path or a package resource); not read from the file
    origin: str = field(default="<memory>", compare=False)

    # -- what the run needs ----------------------------------------------------------------
    def nodes(self) -> list[SimNode]:
        return [node for group in self.cluster for node in group.nodes()]

    def models(self) -> dict[str, StageModel]:
        return {s.name: s.model.build() for s in self.stages}

    def autoscale_config(self) -> AutoscaleConfig:
        return AutoscaleConfig(**self.autoscale)

    def pipeline(self) -> Pipeline:
        """Placeholder stages with the declared shapes; the backend runs their models."""
        return Pipeline(
            self.name,
            [s.placeholder() for s in self.stages],
            description=self.description or None,
        )

    def backend(
        self, seed: int | None = None, backend_class: type[SimulatedBackend] = SimulatedBackend
    ) -> SimulatedBackend:
        """A fresh backend for one run (``seed`` overrides the scenario's)."""
        return backend_class(
            self.nodes(),
            self.models(),
            seed=self.seed if seed is None else seed,
            memory_budget_bytes=self.memory_budget_bytes,
            bucket_s=self.report.bucket_s,
        )

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus for g in self.cluster)

    @property
    def total_cpus(self) -> float:
        return sum(g.count * g.cpus for g in self.cluster)


class ModelledStage(ProcessingStage[Any, Any]):
    """A stage whose behaviour lives in the simulated backend's model, never in ``process``."""

    def __init__(
        self,
        name: str,
        resources: Resources,
        batch_size: int,
        num_workers: int | None,
        timeout_s: float | None = None,
        batch_wait_s: float | None = None,
    ) -> None:
        self.name = name
        self.resources = resources
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.batch_wait_s = batch_wait_s

    def process(self, task: Any) -> Any:
        raise RuntimeError(
            f"stage {self.name!r} is a simulation placeholder: run it on SimulatedBackend"
        )


class YieldingModelledStage(ModelledStage):
    """A placeholder whose ``process`` is a generator (``StageScenario.streams``)."""

    def process(self, task: Any) -> Iterator[Any]:
        yield super().process(task)


# -- loading ------------------------------------------------------------------------------
class _ScenarioLoader(yaml.SafeLoader):
    """PyYAML's safe loader, made stricter where YAML 1.1 surprises: ``1e6`` is a number (a
    string to PyYAML, which wants ``1.0e+6``), and a key given twice in one mapping is an
    error (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        _refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)


#: YAML 1.2's floats with an exponent, where PyYAML (YAML 1.1) needs a dot and a signed
#: exponent: ``1e6``, ``1e-9``, ``2.5e3``, ``.5E+2``
_ScenarioLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _refuse_duplicate_keys(loader: _ScenarioLoader, node: yaml.MappingNode) -> None:
    """A second ``name:`` would silently replace the first; say where both are. Merge keys
    (``<<``) are left out: overriding what they bring in is their purpose."""
    first: dict[Any, str] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        mark = key_node.start_mark
        if key in first:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"key {key!r} appears twice (first at {first[key]})",
                mark,
            )
        first[key] = f"line {mark.line + 1}, column {mark.column + 1}"


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario from a YAML file; errors name the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start}); a scenario is a YAML file"
        ) from None
    return parse_scenario_text(text, str(path))


def parse_scenario_text(text: str, origin: str = "<memory>") -> Scenario:
    """Parse YAML text (``origin`` is what error messages call it)."""
    try:
        data = yaml.load(text, Loader=_ScenarioLoader)  # a SafeLoader: builds no objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(f"{origin}: not valid YAML{where}: {problem}") from None
    return parse_scenario(data, origin)


def parse_scenario(data: Any, origin: str = "<memory>") -> Scenario:
    """Validate a mapping (as read from YAML) into a ``Scenario``."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{origin}: a scenario is a mapping, got {_kind(data)}")
    scenario = _convert(Scenario, data, "", origin)
    scenario = dataclasses.replace(scenario, origin=origin)
    _check(scenario, origin)
    return scenario


def shipped_scenarios() -> dict[str, str]:
    """Names of the scenarios shipped with Conveyor, mapped to their YAML text."""
    folder = importlib_resources.files("conveyor.sim") / "scenarios"
    return {
        entry.name.removesuffix(".yaml"): entry.read_text()
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    }


def resolve_scenario(name_or_path: str | Path) -> Scenario:
    """A path to a YAML file, or the name of a shipped scenario (``conveyor.sim.scenarios``)."""
    path = Path(name_or_path)
    if path.exists():
        return load_scenario(path)
    shipped = shipped_scenarios()
    key = str(name_or_path).removesuffix(".yaml")
    if key in shipped:
        return parse_scenario_text(shipped[key], f"conveyor/sim/scenarios/{key}.yaml")
    close = difflib.get_close_matches(key, shipped, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ScenarioError(
        f"{name_or_path}: no such file, and no shipped scenario by that name{hint} "
        f"(shipped: {', '.join(shipped)})"
    )


# -- validation ---------------------------------------------------------------------------
def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"{type(value).__name__} {value!r}"
    )


def batch_problem(scenario: Scenario, executor: str) -> str | None:
    """Why ``scenario`` cannot run on ``executor`` (``None``: it can). The batch executor
    takes in the whole input before its first stage ends, and a source bound by a virtual
    duration never ends while it does (the clock stands still): it took tasks until the
    machine's memory ran out."""
    if executor == "batch" and scenario.source.tasks is None:
        return (
            "the batch executor takes in the whole input first, so it needs a number of "
            f"source tasks (source.tasks); this source runs for duration_s "
            f"({scenario.source.duration_s:g} s), which only the streaming executor can end"
        )
    return None


def _fail(origin: str, path: str, message: str) -> ScenarioError:
    return ScenarioError(f"{origin}: {path or 'scenario'}: {message}")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _convert(tp: Any, value: Any, path: str, origin: str) -> Any:
    """Check ``value`` against the annotation ``tp``, building dataclasses on the way."""
    origin_tp = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin_tp in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _convert(options[0], value, path, origin)
        raise _fail(origin, path, f"unsupported type {tp}")  # pragma: no cover - format bug
    if value is None:
        raise _fail(origin, path, "a value is required, got nothing (null)")
    if tp is Any:
        return value
    if origin_tp is Literal:
        if value not in args:
            raise _fail(origin, path, f"must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin_tp is list:
        if not isinstance(value, list):
            raise _fail(origin, path, f"must be a list, got {_kind(value)}")
        return [_convert(args[0], item, _join(path, i), origin) for i, item in enumerate(value)]
    if origin_tp is dict:
        if not isinstance(value, dict):
            raise _fail(origin, path, f"must be a mapping, got {_kind(value)}")
        return {str(k): _convert(args[1], v, _join(path, str(k)), origin) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, value, path, origin)
    if tp is bool:
        if not isinstance(value, bool):
            raise _fail(origin, path, f"must be true or false, got {_kind(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(origin, path, f"must be a whole number, got {_kind(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(origin, path, f"must be a number, got {_kind(value)}")
        if not math.isfinite(value):
            raise _fail(origin, path, f"must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _fail(origin, path, f"must be a string, got {_kind(value)}")
        return value
    raise _fail(origin, path, f"unsupported type {tp}")  # pragma: no cover - format bug


def _convert_dataclass(tp: Any, value: Any, path: str, origin: str) -> Any:
    if not isinstance(value, dict):
        raise _fail(origin, path, f"must be a mapping, got {_kind(value)}")
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.name != "origin"}
    unknown = [k for k in value if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _fail(
            origin,
            _join(path, str(key)),
            f"unknown field{hint}; allowed: {', '.join(fields)}",
        )
    kwargs = {}
    for name, f in fields.items():
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _fail(origin, _join(path, name), "is required")
            continue
        kwargs[name] = _convert(hints[name], value[name], _join(path, name), origin)
    return tp(**kwargs)


def _check(s: Scenario, origin: str) -> None:
    """Checks across fields, with the same ``file: field: problem`` messages."""

    def fail(path: str, message: str) -> ScenarioError:
        return _fail(origin, path, message)

    problem = _name_problem(s.name)
    if problem:
        raise fail("name", problem)
    if not s.cluster:
        raise fail("cluster", "needs at least one node group")
    if not s.stages:
        raise fail("stages", "needs at least one stage")
    seen: set[str] = set()
    for i, group in enumerate(s.cluster):
        at = f"cluster[{i}]"
        if group.name in seen:
            raise fail(f"{at}.name", f"node group {group.name!r} appears twice")
        seen.add(group.name)
        if group.count < 1:
            raise fail(f"{at}.count", f"must be >= 1, got {group.count}")
        if group.cpus <= 0:
            raise fail(f"{at}.cpus", f"must be > 0, got {group.cpus:g}")
        if group.gpus < 0:
            raise fail(f"{at}.gpus", f"must be >= 0, got {group.gpus}")
        for label in ("gpu_memory_gb", "memory_gb"):
            value = getattr(group, label)
            if value is not None and value <= 0:
                raise fail(f"{at}.{label}", f"must be > 0, got {value:g}")
        for label in ("nvdecs_per_gpu", "nvencs_per_gpu"):
            value = getattr(group, label)
            if value is not None and value < 0:
                raise fail(f"{at}.{label}", f"must be >= 0, got {value:g}")
        if group.joins_at < 0:
            raise fail(f"{at}.joins_at", f"must be >= 0, got {group.joins_at:g}")
        if group.leaves_at is not None and group.leaves_at <= group.joins_at:
            raise fail(f"{at}.leaves_at", "must be after joins_at")
    if not any(g.joins_at == 0 for g in s.cluster):
        raise fail("cluster", "at least one node group must be present at t=0 (joins_at: 0)")
    names: set[str] = set()
    for i, stage in enumerate(s.stages):
        at = f"stages[{i}]"
        if not stage.name:
            raise fail(f"{at}.name", "must not be empty")
        if stage.name in names:
            raise fail(f"{at}.name", f"stage {stage.name!r} appears twice")
        names.add(stage.name)
        if stage.batch_size < 1:
            raise fail(f"{at}.batch_size", f"must be >= 1, got {stage.batch_size}")
        if stage.batch_wait_s is not None and not stage.batch_wait_s >= 0:
            raise fail(f"{at}.batch_wait_s", f"must be >= 0, got {stage.batch_wait_s}")
        if stage.num_workers is not None and stage.num_workers < 1:
            raise fail(f"{at}.num_workers", f"must be >= 1 (or left out), got {stage.num_workers}")
        if stage.timeout_s is not None and stage.timeout_s <= 0:
            raise fail(f"{at}.timeout_s", f"must be > 0 (or left out), got {stage.timeout_s:g}")
        try:
            resources = stage.resources.build()
        except (TypeError, ValueError) as exc:
            raise fail(f"{at}.resources", str(exc)) from None
        try:
            validate_stage(stage.placeholder())
        except ValueError as exc:
            raise fail(at, str(exc)) from None
        _check_model(stage.model, f"{at}.model", fail)
        if stage.model.hang_rate > 0 and stage.timeout_s is None:
            raise fail(
                f"{at}.model.hang_rate",
                "a hung batch never returns, and without the stage's timeout_s the run could "
                "never end: give the stage a timeout_s",
            )
        _check_fits(s, resources, f"{at}.resources", stage.name, fail)
    try:
        s.pipeline().build()
    except (TypeError, ValueError) as exc:
        raise fail("stages", str(exc)) from None
    if s.source.tasks is None and s.source.duration_s is None:
        raise fail("source", "give tasks (a number of source tasks) or duration_s (or both)")
    if s.source.tasks is not None and s.source.tasks < 1:
        raise fail("source.tasks", f"must be >= 1, got {s.source.tasks}")
    if s.source.duration_s is not None and s.source.duration_s <= 0:
        raise fail("source.duration_s", f"must be > 0, got {s.source.duration_s:g}")
    problem = batch_problem(s, s.executor.kind)
    if problem:
        raise fail("source", problem)
    try:
        s.autoscale_config()
    except TypeError:
        allowed = ", ".join(f.name for f in dataclasses.fields(AutoscaleConfig))
        bad = next(k for k in s.autoscale if k not in AutoscaleConfig.__dataclass_fields__)
        raise fail(f"autoscale.{bad}", f"unknown field; allowed: {allowed}") from None
    except ValueError as exc:
        raise fail("autoscale", str(exc)) from None
    e = s.executor
    if e.max_attempts < 1:
        raise fail("executor.max_attempts", f"must be >= 1, got {e.max_attempts}")
    if e.autoscale_interval_s <= 0:
        raise fail("executor.autoscale_interval_s", f"must be > 0, got {e.autoscale_interval_s}")
    if e.edge_max_tasks < 1:
        raise fail("executor.edge_max_tasks", f"must be >= 1, got {e.edge_max_tasks}")
    if e.edge_max_bytes is not None and e.edge_max_bytes < 1:
        raise fail("executor.edge_max_bytes", f"must be >= 1, got {e.edge_max_bytes}")
    r = s.report
    if r.warmup_s < 0:
        raise fail("report.warmup_s", f"must be >= 0, got {r.warmup_s:g}")
    if r.bucket_s <= 0:
        raise fail("report.bucket_s", f"must be > 0, got {r.bucket_s:g}")
    if r.until_s is not None and r.until_s <= r.warmup_s:
        raise fail("report.until_s", "must be after warmup_s")
    if s.stop_at_s is not None and s.stop_at_s <= r.warmup_s:
        raise fail("stop_at_s", f"must be after report.warmup_s ({r.warmup_s:g})")
    if s.memory_budget_bytes < 1:
        raise fail("memory_budget_bytes", f"must be >= 1, got {s.memory_budget_bytes}")


#: the longest scenario name, in bytes: with ``-streaming-seed<N>.json`` after it, it stays
#: within the 255 bytes a file name may have
NAME_MAX_BYTES = 200


def _name_problem(name: str) -> str | None:
    """Why ``name`` cannot name the output files (``<name>-<executor>-seed<N>.json`` in
    ``--out``; ``None``: it can): a separator or ``..`` would write outside ``--out`` or into
    a folder that is not there, a line break into a file name nobody can type."""
    if not name.strip():
        return "must not be empty"
    why = "(it names the output files)"
    if "/" in name or "\\" in name:
        return f"must not contain a path separator ('/' or '\\') {why}, got {name!r}"
    if ".." in name:
        return f"must not contain '..' {why}, got {name!r}"
    if not name.isprintable():
        bad = next(c for c in name if not c.isprintable())
        kind = unicodedata.name(bad, f"U+{ord(bad):04X}")
        return f"must have printable characters only {why}, got {name!r} (with {kind})"
    if len(name.encode()) > NAME_MAX_BYTES:
        return f"must be at most {NAME_MAX_BYTES} bytes {why}, got {len(name.encode())}"
    return None


def _check_model(model: ModelSpec, at: str, fail: Any) -> None:
    for label, dist in [("service", model.service)] + [
        (f"phases[{i}].service", p.service) for i, p in enumerate(model.phases)
    ]:
        try:
            dist.build()
        except ValueError as exc:
            raise fail(f"{at}.{label}", str(exc)) from None
    if model.memory_gb < 0:
        raise fail(f"{at}.memory_gb", f"must be >= 0, got {model.memory_gb:g}")
    try:
        model.build()
    except ValueError as exc:
        raise fail(at, str(exc)) from None
    times = [p.at for p in model.phases]
    if any(t < 0 for t in times) or times != sorted(times):
        raise fail(f"{at}.phases", f"phase times must be >= 0 and increasing, got {times}")


def _check_fits(s: Scenario, res: Resources, at: str, stage: str, fail: Any) -> None:
    """A stage whose one worker fits no node would only fail at run time: say so now."""
    for group in s.cluster:
        if res.cpus > group.cpus:
            continue
        if res.gpus >= 1 and res.whole_gpus > group.gpus:
            continue
        if res.requires_gpu and group.gpus == 0:
            continue
        if res.gpu_memory_gb and (
            not group.gpu_memory_gb or res.gpu_memory_gb > group.gpu_memory_gb
        ):
            continue
        if res.video_engines and (
            group.gpus == 0
            or res.nvdecs > (math.inf if group.nvdecs_per_gpu is None else group.nvdecs_per_gpu)
            or res.nvencs > (math.inf if group.nvencs_per_gpu is None else group.nvencs_per_gpu)
        ):
            continue
        return
    raise fail(
        at,
        f"one worker of stage {stage!r} ({res.describe()}) fits on no node group "
        f"({'; '.join(f'{g.name}: {g.cpus:g} CPUs, {g.gpus} GPUs' for g in s.cluster)})",
    )
