"""NeMo Curator-style pipelines on Conveyor (``conveyor.curator``): the imports, the stage
methods Curator users write, its task and pipeline constructors, the executors' settings,
and the mistakes our own API now refuses instead of accepting silently."""

from __future__ import annotations

import importlib
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pytest

from conveyor.backends.local import LocalBackend
from conveyor.curator.backends.base import NodeInfo, StageFailures, WorkerMetadata
from conveyor.curator.backends.xenna import XennaExecutor
from conveyor.curator.pipeline import Pipeline
from conveyor.curator.stages.base import CompositeStage, ProcessingStage
from conveyor.curator.stages.function_definitions import processing_stage
from conveyor.curator.stages.resources import Resources
from conveyor.curator.tasks import DocumentBatch, EmptyTask, FileGroupTask, Task


def batch(i: int, rows: int = 3) -> DocumentBatch:
    return DocumentBatch(f"b{i}", "ds", pd.DataFrame({"n": [i * 10 + r for r in range(rows)]}))


class AddOne(ProcessingStage[DocumentBatch, DocumentBatch]):
    name = "add_one"
    resources = Resources(cpus=0.5)

    def process(self, task: DocumentBatch) -> DocumentBatch:
        df = task.to_pandas().copy()
        df["n"] += 1
        return DocumentBatch(task.task_id, task.dataset_name, df, task._metadata)


def run(stages: list[Any], tasks: list[Any], **config: Any) -> list[Any]:
    return Pipeline("t", stages=stages).run(XennaExecutor(config or None), tasks)


# -- the imports a port changes --------------------------------------------------------------
@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("conveyor.curator.stages.base", ["ProcessingStage", "CompositeStage"]),
        ("conveyor.curator.stages.core", ["ProcessingStage", "CompositeStage"]),
        ("conveyor.curator.stages.resources", ["Resources"]),
        ("conveyor.curator.stages.function_definitions", ["processing_stage"]),
        ("conveyor.curator.stages.function_decorators", ["processing_stage"]),
        ("conveyor.curator.backends.base", ["WorkerResources", "GpuAllocation"]),
        ("conveyor.curator.stages", ["ProcessingStage", "Resources", "processing_stage"]),
        ("conveyor.curator.tasks", ["Task", "DocumentBatch", "FileGroupTask", "EmptyTask"]),
        ("conveyor.curator.tasks", ["VideoTask", "TransientDrop", "NoneTask", "FailedTask"]),
        ("conveyor.curator.tasks.sentinels", ["SentinelTask", "EmptyTask", "NoneTask"]),
        ("conveyor.curator.tasks.video", ["Video", "Clip", "VideoMetadata", "ClipStats"]),
        ("conveyor.curator.tasks.video", ["_Window", "VideoTask"]),
        ("conveyor.curator.utils.decoder_utils", ["FrameExtractionSignature", "FramePurpose"]),
        ("conveyor.curator.pipeline", ["Pipeline"]),
        ("conveyor.curator.pipeline.pipeline", ["Pipeline"]),
        ("conveyor.curator.backends.xenna", ["XennaExecutor"]),
        ("conveyor.curator.backends.xenna.executor", ["XennaExecutor"]),
        ("conveyor.curator.backends.ray_data", ["RayDataExecutor"]),
        ("conveyor.curator.backends.ray_actor_pool", ["RayActorPoolExecutor"]),
        # where they were until NeMo Curator moved them out of experimental
        ("conveyor.curator.backends.experimental.ray_data", ["RayDataExecutor"]),
        ("conveyor.curator.backends.experimental.ray_actor_pool", ["RayActorPoolExecutor"]),
        ("conveyor.curator.backends.base", ["BaseExecutor", "NodeInfo", "WorkerMetadata"]),
    ],
)
def test_nemo_curator_module_paths(module: str, names: list[str]) -> None:
    found = importlib.import_module(module)
    for name in names:
        assert getattr(found, name) is not None


# -- Resources -----------------------------------------------------------------------------
def test_resources_take_curators_order_and_video_fields() -> None:
    r = Resources(2, 10)  # cpus, gpu_memory_gb
    assert (r.cpus, r.gpu_memory_gb, r.gpus) == (2, 10, 0.0)
    assert Resources(cpus=1, gpus=0.25).native() == __import__("conveyor").Resources(1, 0.25)
    whole = Resources(entire_gpu=True, nvdecs=2, nvencs=1)
    assert whole.native().gpus == 1.0 and (whole.nvdecs, whole.nvencs) == (2, 1)
    engines = Resources(nvdecs=3, nvencs=0.5).native()  # Conveyor's own resources
    assert (engines.nvdecs, engines.nvencs, engines.gpus) == (3, 0.5, 0.0)
    assert engines.video_engines and not engines.requires_gpu  # a device, no compute share
    with pytest.raises(ValueError, match="entire_gpu=True reserves one whole GPU"):
        Resources(gpus=0.5, entire_gpu=True)
    with pytest.raises(ValueError, match=r"Resources\.nvdecs must be >= 0"):
        Resources(nvdecs=-1)
    with pytest.raises(ValueError, match="either gpus or gpu_memory_gb"):
        Resources(gpus=0.5, gpu_memory_gb=4)


# -- tasks ---------------------------------------------------------------------------------
def test_tasks_take_curators_order_and_are_conveyors() -> None:
    import conveyor.tasks as ours

    df = pd.DataFrame({"text": ["a b"]})
    task = DocumentBatch("id-1", "ds", df, {"k": 1})
    assert (task.task_id, task.dataset_name, task._metadata) == ("id-1", "ds", {"k": 1})
    assert task.data is df and task.num_items == 1
    assert isinstance(task, ours.DocumentBatch) and isinstance(task, Task)
    task._metadata["more"] = 2
    assert task.metadata == {"k": 1, "more": 2}
    assert task._stage_perf is task.stage_perf
    files = FileGroupTask("f", "ds", ["a.jsonl"], reader_config={"lines": True})
    assert files.data == ["a.jsonl"] and files.reader_config == {"lines": True}
    assert EmptyTask().num_items == 0
    # NeMo Curator 1.4's order (no task_id: the framework sets it), and 1.0's tail
    newer = DocumentBatch("ds", df, [], {"k": 2})
    assert (newer.dataset_name, newer.data is df, newer._metadata) == ("ds", True, {"k": 2})
    assert FileGroupTask("ds", ["b.jsonl"]).data == ["b.jsonl"] and FileGroupTask().data == []
    older = DocumentBatch("id", "ds", df, [], {"k": 3})  # 1.0: _stage_perf, then _metadata
    assert (older.task_id, older._metadata) == ("id", {"k": 3})
    with pytest.raises(TypeError, match="metadata given twice"):
        DocumentBatch("id", "ds", df, {"a": 1}, metadata={"b": 2})


class TextTask(Task[str]):
    """A task of one string, in NeMo Curator's way (no dataclass)."""

    @property
    def num_items(self) -> int:
        return 1


@dataclass
class Tagged(Task[dict]):
    """A task as NeMo Curator's users make theirs: a dataclass with fields of its own."""

    extra: int = 0
    tags: list[str] = field(default_factory=list)
    checked: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.checked += 1

    @property
    def num_items(self) -> int:
        return len(self.data)


def test_a_single_name_before_data_and_string_data_read_in_curators_newer_order() -> None:
    """One positional with ``data=``, or data that is a string, went into 1.0's order:
    the dataset's name became the task_id (and was lost), the text its dataset_name."""
    df = pd.DataFrame({"text": ["a"]})
    named = DocumentBatch("my_dataset", data=df)
    assert (named.dataset_name, named.data is df, named.task_id) == ("my_dataset", True, "")
    assert FileGroupTask("ds", data=["a.jsonl"]).dataset_name == "ds"
    assert DocumentBatch("id", dataset_name="ds", data=df).task_id == "id"  # 1.0's
    text = TextTask("ds", "hello world")
    assert (text.dataset_name, text.data, text.task_id) == ("ds", "hello world", "")
    tail = TextTask("ds", "hello", [], {"k": 1})
    assert (tail.data, tail._metadata) == ("hello", {"k": 1})
    older = TextTask("id", "ds", "hello")  # a third string: only 1.0's order reads it
    assert (older.task_id, older.dataset_name, older.data) == ("id", "ds", "hello")


def test_a_dataclass_task_keeps_curators_constructor_and_its_own_fields() -> None:
    """``@dataclass`` made its ``__init__`` in Conveyor's field order: ``Tagged("ds", {})``
    put the name in data, and ``_metadata=`` was refused."""
    task = Tagged("ds", {"a": 1}, extra=5)
    assert (task.dataset_name, task.data, task.extra, task.tags) == ("ds", {"a": 1}, 5, [])
    assert task.checked == 1  # its own __post_init__, once
    meta = Tagged(dataset_name="ds", data={}, _metadata={"m": 1})
    assert meta._metadata == {"m": 1} and meta.extra == 0 and meta.tags == []
    assert meta.tags is not Tagged(dataset_name="ds", data={}).tags
    tail = Tagged("ds", {}, [], {"m": 2}, 7, ["x"])  # its own fields after NeMo Curator's
    assert (tail._metadata, tail.extra, tail.tags) == ({"m": 2}, 7, ["x"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        Tagged("ds", {}, nope=1)
    with pytest.raises(TypeError, match=r"then extra, tags, got str"):
        Tagged("ds", {}, [], {}, 1, [], "too many")
    (out,) = run([AddTag()], [Tagged("ds", {"a": 1}, extra=2)])
    assert isinstance(out, Tagged) and out.tags == ["seen"] and out.extra == 2


class AddTag(ProcessingStage[Tagged, Tagged]):
    name = "add_tag"

    def process(self, task: Tagged) -> Tagged:
        return Tagged(task.dataset_name, task.data, extra=task.extra, tags=[*task.tags, "seen"])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DocumentBatch("id", "ds", "not a table"), r"DocumentBatch\.data must be a"),
        (
            lambda: DocumentBatch(task_id="id", dataset_name=7),
            r"DocumentBatch\.dataset_name must be a str",
        ),
        (lambda: FileGroupTask("id", "ds", "one.jsonl"), r"FileGroupTask\.data must be a list"),
        (lambda: DocumentBatch(task_id="id", _metadata=["x"]), r"metadata must be a dict"),
        (lambda: DocumentBatch("id", "ds", None, 5), r"_stage_perf \(a list\) and _metadata"),
        (lambda: DocumentBatch("ds", 42), r"DocumentBatch\.data must be a"),
    ],
)
def test_curator_tasks_name_the_field_a_wrong_argument_lands_in(make: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message) as caught:
        make()
    assert "NeMo Curator" in str(caught.value)


def test_our_tasks_refuse_curators_positional_order() -> None:
    import conveyor.tasks as ours

    with pytest.raises(TypeError, match=r"DocumentBatch\.data must be a pyarrow Table") as e:
        ours.DocumentBatch("id", "ds", pd.DataFrame({"a": [1]}))
    assert "conveyor.curator.tasks.DocumentBatch" in str(e.value)
    with pytest.raises(TypeError, match=r"FileGroupTask\.data must be a list of paths"):
        ours.FileGroupTask("a.jsonl")
    with pytest.raises(TypeError, match=r"VideoTask\.data must be a conveyor\.tasks\.Video"):
        ours.VideoTask("id")


# -- pipelines -----------------------------------------------------------------------------
def test_pipeline_takes_curators_order_and_runs_on_xenna_by_default() -> None:
    pipeline = Pipeline("p", "adds one", [AddOne()], config={"kept": True})
    assert pipeline.add_stage(AddOne().with_(name="again")) is pipeline
    out = pipeline.run(initial_tasks=[batch(0), batch(1)])
    assert sorted(n for t in out for n in t.to_pandas()["n"]) == [2, 3, 4, 12, 13, 14]
    assert "AddOne, NeMo Curator-style" in pipeline.describe()


def test_pipeline_constructors_refuse_the_other_order() -> None:
    from conveyor import Pipeline as Ours

    with pytest.raises(TypeError, match=r"description must be a string.*pass stages="):
        Pipeline("p", [AddOne()])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stages must be a list of stages, got 'text'"):
        Ours("p", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pass an instance"):
        Pipeline("p").add_stage(AddOne)
    with pytest.raises(TypeError, match=r"takes a conveyor\.curator executor"):
        Pipeline("p", stages=[AddOne()]).run(object())


def test_our_executors_refuse_a_settings_dict_for_a_backend() -> None:
    from conveyor.executors.batch import BatchExecutor
    from conveyor.executors.streaming import StreamingExecutor

    for kind in (StreamingExecutor, BatchExecutor):
        with pytest.raises(TypeError, match=r"the first argument is the backend.*XennaExecutor"):
            kind({"execution_mode": "streaming"})  # type: ignore[arg-type]


# -- stage methods Curator users write ---------------------------------------------------------
class Sized(ProcessingStage[Any, Any]):
    name = "sized"

    def __init__(self, fixed: Any = None, per_node: Any = None, xenna: Any = None) -> None:
        self.fixed, self.per_node, self.xenna = fixed, per_node, xenna or {}

    def num_workers(self) -> Any:
        return self.fixed

    def num_workers_per_node(self) -> Any:
        return self.per_node

    def xenna_stage_spec(self) -> dict[str, Any]:
        return self.xenna

    def process(self, task: Any) -> Any:
        return task


def test_sizing_methods_pin_the_pool() -> None:
    from conveyor.curator.adapter import adapt

    assert adapt(Sized()).num_workers is None
    assert adapt(Sized(fixed=3)).num_workers == 3
    assert adapt(Sized(per_node=1.5), lambda: 3).num_workers == 5  # ceil(1.5 x 3 nodes)
    assert adapt(Sized(xenna={"num_workers_per_node": 2}), lambda: 2).num_workers == 4
    assert adapt(Sized().with_(num_workers=2)).num_workers == 2  # with_ wins
    assert adapt(Sized(fixed=1).with_(num_workers=4)).num_workers == 4


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (Sized(fixed=2, per_node=1), "set num_workers or num_workers_per_node, not both"),
        (Sized(fixed=0), r"num_workers\(\) must be None or an int >= 1"),
        (Sized(per_node=-1), "num_workers_per_node must be None or a number > 0"),
        (Sized(xenna={"num_workers": 2}), "belongs in the num_workers"),
        (Sized(xenna={"slots_per_actr": 2}), "'slots_per_actr' is not one NeMo Curator knows"),
        (
            Sized(per_node=1, xenna={"num_workers_per_node": 1}),
            "set both by the method and in xenna_stage_spec",
        ),
        (Sized().with_(ray_stage_spec={"is_raft_actor": True}), "RAFT, shuffles"),
        (Sized().with_(runtime_env={"pip": ["x"]}), "runtime_env .* is not supported"),
        (Sized().with_(batch_size=0), "batch_size must be None or an int >= 1"),
    ],
)
def test_stage_settings_that_cannot_run_are_errors(stage: Any, message: str) -> None:
    from conveyor.curator.adapter import adapt

    with pytest.raises(ValueError, match=message):
        adapt(stage)


def test_spec_keys_without_an_effect_here_warn_naming_the_key() -> None:
    from conveyor.curator.adapter import adapt

    with pytest.warns(UserWarning, match="'slots_per_actor' has no effect here") as said:
        adapt(Sized(xenna={"slots_per_actor": 2}))
    # it points at the user's line, however deep in Conveyor it is said (it pointed at ours)
    assert said[0].filename == __file__
    with pytest.warns(UserWarning, match="'slots_per_actor' has no effect here") as said:
        Pipeline("p", stages=[Sized(xenna={"slots_per_actor": 2})]).describe()
    assert said[0].filename == __file__
    with pytest.warns(UserWarning, match="'min_workers' has no effect here"):
        adapt(Sized().with_(ray_stage_spec={"min_workers": 5, "is_actor_stage": True}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adapt(Sized().with_(ray_stage_spec={"is_fanout_stage": True}))  # honoured: no warning


class Hooks(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Records what its hooks receive in the task's metadata."""

    name = "hooks"
    resources = Resources(cpus=0.5)
    batch_size = 2

    def setup_on_node(self, node_info: Any = None, worker_metadata: Any = None) -> None:
        self.node = (type(node_info).__name__, type(worker_metadata).__name__)

    def setup(self, worker_metadata: Any = None) -> None:
        self.worker = (type(worker_metadata).__name__, worker_metadata.worker_id)
        allocation = worker_metadata.allocation  # Cosmos-Xenna's shape, Conveyor's fields
        assert allocation.cpus == 0.5 and allocation.gpus == ()
        assert allocation.node == allocation.node_id and allocation.gpu_ids == ()

    def inputs(self) -> tuple[list[str], list[str]]:
        return ["data"], ["n"]

    def process_batch(self, tasks: list[DocumentBatch]) -> list[DocumentBatch | None]:
        out: list[DocumentBatch | None] = []
        for task in tasks:
            assert self.validate_input(task)
            task._metadata.update(node=self.node, worker=self.worker)
            out.append(task if task.num_items else None)  # an empty batch is dropped
        return out


def test_hooks_get_curators_arguments_and_batches_drop_none() -> None:
    tasks = [batch(0), batch(1, rows=0), batch(2)]
    out = run([Hooks()], tasks)
    assert len(out) == 2
    for task in out:
        assert task._metadata["node"] == ("NodeInfo", "WorkerMetadata")
        kind, worker_id = task._metadata["worker"]
        assert kind == "WorkerMetadata" and worker_id.startswith("hooks")


class AddId(ProcessingStage[DocumentBatch, DocumentBatch]):
    """NeMo Curator's AddId pattern: ``outputs()`` lists the column it adds, not the rest."""

    name = "add_id"

    def inputs(self) -> tuple[list[str], list[str]]:
        return ["data"], []

    def outputs(self) -> tuple[list[str], list[str]]:
        return ["data"], ["doc_id"]

    def process(self, task: DocumentBatch) -> DocumentBatch:
        df = task.to_pandas().copy()
        df["doc_id"] = [f"{task.task_id}-{i}" for i in range(len(df))]
        return DocumentBatch(dataset_name=task.dataset_name, data=df)


class NeedsN(ProcessingStage[Any, Any]):
    """Needs data column ``n`` of any task (NeMo Curator's quickstart declares so)."""

    name = "needs_n"

    def inputs(self) -> tuple[list[str], list[str]]:
        return ["data"], ["n"]

    def process(self, task: Any) -> Any:
        return task


def test_curators_outputs_list_what_a_stage_adds_and_inputs_are_checked_as_it_does() -> None:
    """``outputs()`` in NeMo Curator's form is what a stage adds or changes, not all its
    outputs have: a stage needing a column from before it builds (it was refused). Inputs
    are checked on each task: attributes on it, columns of its data (a DataFrame's, a
    table's, a plain task's, NeMo Curator's own test: an attribute of the data)."""
    import pyarrow as pa

    out = run([AddId(), NeedsN()], [batch(0), batch(1)])
    assert sorted(t.to_pandas()["doc_id"][0] for t in out) == ["0-0", "1-0"]
    assert "n" in out[0].to_pandas()

    class SampleTask(Task[pd.DataFrame]):  # the quickstart's task: not a DocumentBatch
        @property
        def num_items(self) -> int:
            return len(self.data)

    frames = [SampleTask("ds", pd.DataFrame({"n": [i]})) for i in range(3)]
    assert len(run([NeedsN()], frames)) == 3
    tables = [DocumentBatch("ds", pa.table({"n": [1]})), DocumentBatch("ds", pa.table({"n": [2]}))]
    assert len(run([NeedsN()], tables)) == 2
    with pytest.raises(StageFailures) as failed:
        run([NeedsN()], [DocumentBatch("ds", pd.DataFrame({"other": [1]}))])
    assert "'needs_n'" in str(failed.value) and "lacks declared input(s) data.n" in str(
        failed.value
    )


def test_inputs_by_task_type_and_a_stage_s_own_validate_input() -> None:
    class ByType(NeedsN):
        def inputs(self) -> dict[type, tuple[list[str], list[str]]]:
            return {DocumentBatch: (["data"], ["n"]), FileGroupTask: (["data"], [])}

    files = FileGroupTask("ds", ["a.jsonl"])
    assert len(run([ByType()], [batch(0), files])) == 2
    with pytest.raises(StageFailures, match=r"lacks declared input\(s\) data\.n"):
        run([ByType()], [DocumentBatch("ds", pd.DataFrame({"m": [1]}))])

    class Lenient(NeedsN):
        """Checks its inputs itself: what it lets through is processed, whatever inputs()."""

        def validate_input(self, task: Any) -> bool:
            return task.dataset_name != "bad"

    assert len(run([Lenient()], [DocumentBatch("ds", pd.DataFrame({"m": [1]}))])) == 1
    with pytest.raises(StageFailures, match="validate_input\\(\\) refused task"):
        run([Lenient()], [DocumentBatch("bad", pd.DataFrame({"n": [1]}))])


def test_function_stage_passes_metadata_on_and_checks_its_function() -> None:
    @processing_stage(name="double", resources={"cpus": 0.5}, batch_size=1)
    def double(task: DocumentBatch) -> DocumentBatch:
        return DocumentBatch(task.task_id, task.dataset_name, task.to_pandas() * 2)

    assert double.name == "double" and double.resources.cpus == 0.5
    source = batch(1)
    source._metadata["origin"] = "jsonl"
    (out,) = run([double], [source])
    assert out._metadata["origin"] == "jsonl" and list(out.to_pandas()["n"]) == [20, 22, 24]
    with pytest.raises(TypeError, match="exactly one positional argument"):
        processing_stage(name="two")(lambda a, b: a)
    with pytest.raises(TypeError, match="name must be a non-empty string"):
        processing_stage(name="")


class Twice(CompositeStage[DocumentBatch, DocumentBatch]):
    name = "twice"

    def decompose(self) -> list[ProcessingStage[Any, Any]]:
        return [AddOne(), AddOne().with_(name="add_again")]


def test_composites_expand_and_take_per_sub_stage_settings() -> None:
    pipeline = Pipeline("p", stages=[Twice().with_({"add_again": {"num_workers": 1}})])
    assert [s.name for s in pipeline.build()] == ["add_one", "add_again"]
    assert "workers: 1 (pinned)" in pipeline.describe()
    (out,) = pipeline.run(initial_tasks=[batch(0, rows=1)])
    assert list(out.to_pandas()["n"]) == [2]
    with pytest.raises(ValueError, match="'nope', which are not among its sub-stages"):
        Pipeline("p", stages=[Twice().with_({"nope": {"num_workers": 1}})]).build()

    class Both(CompositeStage[Any, Any]):
        name = "both"

        def decompose(self) -> list[ProcessingStage[Any, Any]]:
            return [NeedsN(), AddId()]

    # a composite's inputs are its first sub-stage's, its outputs its last one's
    assert (Both().inputs(), Both().outputs()) == ((["data"], ["n"]), (["data"], ["doc_id"]))
    # each call adds to the ones before, in order: a renamed sub-stage by its new name
    twice = Twice().with_({"add_again": {"batch_size": 4}})
    twice.with_({"add_again": {"resources": Resources(cpus=0.25)}})
    twice.with_({"add_again": {"name": "again"}}).with_({"again": {"num_workers": 2}})
    again = Pipeline("p", stages=[twice]).build()[1]
    assert (again.name, again.batch_size, again.resources.cpus) == ("again", 4, 0.25)
    assert again._with_num_workers == 2


def test_with_none_leaves_a_setting_as_it_was() -> None:
    """As in NeMo Curator (``with_(batch_size=cfg.get("batch_size"))``): ``None`` set batch
    size 1, and refused a name or resources."""
    sized = AddOne().with_(batch_size=8, resources=Resources(cpus=0.25))
    same = sized.with_(name=None, resources=None, batch_size=None, runtime_env=None)
    assert (same.name, same.batch_size, same.resources.cpus) == ("add_one", 8, 0.25)
    assert "batch_size: 8" in Pipeline("p", stages=[same]).describe()
    # the worker counts' None is "the executor decides", as there
    pinned = AddOne().with_(num_workers=2)
    assert "(pinned)" not in Pipeline("p", stages=[pinned.with_(num_workers=None)]).describe()


# -- the executors' settings ---------------------------------------------------------------
class Fails(ProcessingStage[DocumentBatch, DocumentBatch]):
    name = "fails"
    resources = Resources(cpus=0.5)

    def process(self, task: DocumentBatch) -> DocumentBatch:
        if task.to_pandas()["n"].iloc[0] == 10:
            raise ValueError("bad batch")
        return task


def test_ignore_failures_off_raises_after_the_run_with_its_outputs() -> None:
    with pytest.raises(StageFailures, match=r"1 input.*'fails'.*bad batch") as caught:
        run([Fails()], [batch(0), batch(1), batch(2)])
    assert len(caught.value.result.outputs) == 2
    out = run([Fails()], [batch(0), batch(1), batch(2)], ignore_failures=True)
    assert len(out) == 2


def test_xenna_settings_map_onto_ours() -> None:
    ex = XennaExecutor(
        {
            "execution_mode": "batch",
            "autoscale_interval_s": 5,
            "max_workers_per_stage": 2,
            "cpu_allocation_percentage": 0.5,
            "logging_interval": 0.5,
        }
    )
    ours = ex.conveyor_executor()
    assert type(ours).__name__ == "BatchExecutor"
    assert ours.config.autoscale_interval_s == 5.0
    assert ours.config.autoscale.max_workers_per_stage == 2
    from conveyor.backends.devices import detect_cpus

    assert ours.backend.num_cpus == pytest.approx(max(0.1, 0.5 * detect_cpus()))
    default = XennaExecutor().conveyor_executor()
    assert type(default).__name__ == "StreamingExecutor"
    assert default.config.autoscale_interval_s == 1.0


@pytest.mark.parametrize(
    ("config", "kwargs", "message"),
    [
        ({"executon_mode": "batch"}, {}, "'executon_mode' have no meaning here"),
        ({"execution_mode": "stream"}, {}, "must be 'streaming' or 'batch'"),
        ({"cpu_allocation_percentage": 1.5}, {}, r"must be a number > 0 and <= 1"),
        ({"cpu_allocation_percentage": 0.5}, {"backend": "b"}, "set its CPUs there"),
        ({"ignore_failures": "no"}, {}, "must be True or False"),
        ({"max_workers_per_stage": 0}, {}, "must be an int >= 1"),
        ({"logging_interval": 0}, {}, "must be a number > 0"),
        (None, {"ignore_head_node": True}, "ignore_head_node=True is not supported"),
    ],
)
def test_xenna_settings_that_cannot_be_honoured_are_errors(
    config: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        XennaExecutor(config, **kwargs)


def test_a_settings_dict_is_not_taken_for_a_backend() -> None:
    with pytest.raises(TypeError, match="takes a dict of settings"):
        XennaExecutor(["execution_mode"])  # type: ignore[arg-type]


def test_the_status_table_is_logged_every_logging_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.curator")
    executor = XennaExecutor({"logging_interval": 0.05}, backend=LocalBackend(num_cpus=2))

    class Slow(AddOne):
        def process(self, task: DocumentBatch) -> DocumentBatch:
            import time

            time.sleep(0.1)
            return super().process(task)

    Pipeline("logged", stages=[Slow()]).run(executor, [batch(i) for i in range(4)])
    # a subclass naming no stage keeps its parent's name, as in NeMo Curator
    tables = [r.getMessage() for r in caplog.records if "add_one:" in r.getMessage()]
    assert tables and "workers" in tables[0] and "done" in tables[0]
    assert any("finished in" in r.getMessage() for r in caplog.records)


def test_the_ray_executors_warn_that_they_are_experimental() -> None:
    from conveyor.curator.backends.ray_actor_pool import RayActorPoolExecutor
    from conveyor.curator.backends.ray_data import RayDataExecutor

    with pytest.warns(UserWarning, match="RayDataExecutor is experimental"):
        RayDataExecutor()
    with pytest.warns(UserWarning, match="RayActorPoolExecutor is experimental"):
        RayActorPoolExecutor({"resource_wait_timeout_s": 30})
    with pytest.raises(ValueError, match=r"reserved_cpus.*must be 0"):
        RayActorPoolExecutor({"reserved_cpus": 1})
    with pytest.raises(ValueError, match=r"runtime_env.*not supported"):
        RayActorPoolExecutor({"runtime_env": {"pip": ["x"]}})
    with pytest.warns(UserWarning) as caught:
        RayActorPoolExecutor({"resource_wait_interval_s": 1})
    assert any("resource_wait_interval_s'] has no effect" in str(w.message) for w in caught)
    with pytest.raises(ValueError, match="config key\\(s\\) 'execution_mode'"):
        RayDataExecutor({"execution_mode": "batch"})


def test_worker_metadata_and_node_info_are_curators_shapes() -> None:
    assert WorkerMetadata("w1").worker_id == "w1" and NodeInfo("n").node_id == "n"


def test_curators_methods_on_our_own_stage_are_an_error_not_ignored() -> None:
    from conveyor import Pipeline as Ours
    from conveyor import ProcessingStage as OurStage
    from conveyor.errors import PipelineBuildError

    class Method(OurStage[Any, Any]):
        def num_workers(self) -> int:  # type: ignore[override]
            return 2

        def process(self, task: Any) -> Any:
            return task

    class Spec(OurStage[Any, Any]):
        def xenna_stage_spec(self) -> dict[str, Any]:
            return {"num_workers_per_node": 1}

        def process(self, task: Any) -> Any:
            return task

    with pytest.raises(
        PipelineBuildError, match=r"has a num_workers\(\) method.*conveyor\.curator"
    ):
        Ours("p", [Method()]).build()
    with pytest.raises(PipelineBuildError, match=r"defines xenna_stage_spec\(\)"):
        Ours("p", [Spec()]).build()
    # a Curator-style stage in our own Pipeline: where it goes (it has done nothing wrong)
    with pytest.raises(PipelineBuildError, match=r"'add_one' is a NeMo Curator-style stage"):
        Ours("p", [AddOne()]).build()
    assert Pipeline("p", stages=[AddOne()]).conveyor_pipeline().build()[0].name == "add_one"


def test_curator_1_0_underscored_attributes_and_spec_key_enums() -> None:
    from conveyor.curator.adapter import adapt
    from conveyor.curator.backends.utils import RayStageSpecKeys

    class Old(ProcessingStage[Any, Any]):
        _name = "old_style"
        _resources = Resources(cpus=0.5)
        _batch_size = 4

        def ray_stage_spec(self) -> dict[str, Any]:
            return {RayStageSpecKeys.IS_ACTOR_STAGE: True}

        def process(self, task: Any) -> Any:
            return task

    stage = adapt(Old())
    assert (stage.name, stage.resources.cpus, stage.batch_size) == ("old_style", 0.5, 4)
    assert batch(0).get_columns() == ["n"]


def test_the_allocation_has_cosmos_xennas_shape() -> None:
    from conveyor.cluster import WorkerInfo
    from conveyor.curator.backends.base import GpuAllocation, WorkerResources

    shared = WorkerResources.of(WorkerInfo("w", "s", "n", (1,), 0.25), cpus=2.0)
    assert shared.gpus == (GpuAllocation(1, 0.25),) and (shared.node, shared.cpus) == ("n", 2.0)
    assert shared.gpu_ids == (1,) and shared.worker_id == "w"  # Conveyor's, read through
    whole = WorkerResources.of(WorkerInfo("w", "s", "n", (0, 1), 1.0), cpus=1.0)
    assert [g.used_fraction for g in whole.gpus] == [1.0, 1.0]


class Odd(ProcessingStage[DocumentBatch, Any]):
    """Gives what it is told to: NeMo Curator's stages give tasks (a ``None`` in a list is
    an input filtered)."""

    name = "odd"

    def __init__(self, gives: Any) -> None:
        self.gives = gives

    def process(self, task: DocumentBatch) -> Any:
        return self.gives(task)


def test_a_none_in_a_list_is_dropped_and_what_is_not_a_task_is_refused() -> None:
    """``[task, None]`` sent ``None`` on as a task; a DataFrame, a dict or a nested list
    went on silently, to fail in the next stage or come back from the run."""
    out = run([Odd(lambda t: [t, None]), AddOne()], [batch(0)])
    assert len(out) == 1 and list(out[0].to_pandas()["n"]) == [1, 2, 3]
    for gives, kind in (
        (lambda t: t.to_pandas(), "DataFrame"),
        (lambda t: {"n": 1}, "dict"),
        (lambda t: [[t]], "list"),
    ):
        with pytest.raises(StageFailures, match=rf"'odd': process\(\) gave {kind} .*not a task"):
            run([Odd(gives)], [batch(0)])

    class Forgets(ProcessingStage[DocumentBatch, DocumentBatch]):
        name = "forgets"

        def process_batch(self, tasks: list[DocumentBatch]) -> list[DocumentBatch]:
            _ = [t for t in tasks]

    with pytest.raises(StageFailures, match="process_batch must return a list, got NoneType"):
        run([Forgets()], [batch(0)])


class Metered(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Records NeMo Curator's custom metrics."""

    name = "metered"
    batch_size = 2

    def process_batch(self, tasks: list[DocumentBatch]) -> list[DocumentBatch]:
        with self._time_metric("sort_s"):
            self._log_metrics({"rows": sum(t.num_items for t in tasks), "label": "x"})
        self._log_metric("batches", 1)
        return tasks


def test_custom_metrics_reach_each_output_s_stage_perf() -> None:
    """``_log_metric``, ``_log_metrics`` and ``_time_metric`` did not exist: every task
    failed on an AttributeError."""
    out = run([Metered()], [batch(0), batch(1, rows=2)])
    for task in out:
        metrics = task._stage_perf[-1].custom_metrics
        assert metrics["rows"] == 5 and metrics["batches"] == 1 and metrics["sort_s"] >= 0
        assert "label" not in metrics
    with pytest.warns(UserWarning, match="metric 'label' is not a number"):
        Metered()._log_metrics({"label": "x"})


def test_slips_a_curator_user_makes_are_named() -> None:
    class Counted(AddOne):
        num_workers = 2  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"num_workers = 2 hides the method num_workers\(\)"):
        Pipeline("p", stages=[Counted()]).describe()

    class Nothing(ProcessingStage[Any, Any]):
        name = "nothing"

    with pytest.raises(TypeError, match="'nothing' implements neither process nor"):
        Pipeline("p", stages=[Nothing()]).describe()
    with pytest.raises(TypeError, match=r"initial_tasks must be a list of tasks.*\[task\]"):
        Pipeline("p", stages=[AddOne()]).run(XennaExecutor(), batch(0))


def test_spec_keys_given_to_with_as_enums_are_read_as_names() -> None:
    from conveyor.curator.adapter import adapt
    from conveyor.curator.backends.utils import RayStageSpecKeys

    stage = AddOne().with_(ray_stage_spec={RayStageSpecKeys.MAX_WORKERS: 4})
    with pytest.warns(UserWarning, match="key 'max_workers' has no effect here"):
        adapt(stage)


class FailsFirst(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Fails the first call of each input (counted in a file, across workers)."""

    name = "fails_first"

    def __init__(self, marks: str, attempts: int | None) -> None:
        self.marks = marks
        self.attempts = attempts

    def xenna_stage_spec(self) -> dict[str, Any]:
        return {} if self.attempts is None else {"num_run_attempts_python": self.attempts}

    def process(self, task: DocumentBatch) -> DocumentBatch:
        from pathlib import Path

        mark = Path(self.marks) / task.dataset_name
        if not mark.exists():
            mark.touch()
            raise RuntimeError("the service timed out")
        return task


def test_num_run_attempts_python_is_the_stage_s_attempts(tmp_path: Any) -> None:
    """It was a warning: a stage that must call a paid service once was called three
    times. Without it the executor's three attempts hold."""
    once = [DocumentBatch(name, pd.DataFrame({"n": [1]})) for name in ("a", "b")]
    (tmp_path / "1").mkdir()
    with pytest.raises(StageFailures, match=r"2 input.*the service timed out") as failed:
        run([FailsFirst(str(tmp_path / "1"), 1)], once)
    assert [f.attempts for f in failed.value.result.failures] == [1, 1]
    (tmp_path / "3").mkdir()
    assert len(run([FailsFirst(str(tmp_path / "3"), None)], once)) == 2
    with pytest.raises(ValueError, match="num_run_attempts_python must be an int >= 1"):
        Pipeline("p", stages=[FailsFirst(str(tmp_path), 0)]).describe()


def test_max_calls_per_worker_is_the_stage_s_worker_lifetime() -> None:
    """It was a warning ("workers live for the run"); a leaking stage set it for a reason."""
    from conveyor.curator.adapter import adapt

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stage = adapt(Sized().with_(ray_stage_spec={"max_calls_per_worker": 5}))
        assert stage.max_batches_per_worker == 5
        for unlimited in (0, None):
            spec = {"max_calls_per_worker": unlimited}
            assert adapt(Sized().with_(ray_stage_spec=spec)).max_batches_per_worker is None
    with pytest.raises(ValueError, match="max_calls_per_worker must be None or an int >= 1"):
        adapt(Sized().with_(ray_stage_spec={"max_calls_per_worker": 2.5}))


def test_ray_client_settings_it_cannot_take_are_said() -> None:
    from conveyor.curator.core.client import RayClient

    with pytest.warns(UserWarning, match="ray_port=7000 has no effect here"):
        RayClient(ray_port=7000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RayClient(num_cpus=2, ray_dashboard_port=8300)  # taken: no warning
    RayClient().stop()  # nothing started: nothing to stop


def test_a_subclass_naming_no_stage_keeps_its_parent_s_name() -> None:
    """It took its class name, so ``with_`` and a composite's settings by the name its
    parent gave it missed it."""

    class Faster(AddOne):
        batch_size = 4

    class Again(Faster):
        pass

    class Mine(ProcessingStage[Any, Any]):  # no name above it: its class name
        def process(self, task: Any) -> Any:
            return task

    class Renamed(AddOne):
        name = "renamed"

    assert (Faster.name, Again.name, Mine.name, Renamed.name) == (
        "add_one",
        "add_one",
        "Mine",
        "renamed",
    )

    class Child(Mine):
        pass

    assert Child.name == "Child"  # Mine's name was its class's, not given


def test_curators_module_paths_and_stage_registry() -> None:
    from conveyor.curator.stages.base import get_stage_class
    from conveyor.curator.tasks.document import DocumentBatch as Doc
    from conveyor.curator.tasks.file_group import FileGroupTask as Files
    from conveyor.curator.tasks.tasks import EmptyTask as Empty
    from conveyor.curator.tasks.tasks import _EmptyTask

    assert (Doc, Files, Empty) == (DocumentBatch, FileGroupTask, EmptyTask)
    assert _EmptyTask is EmptyTask
    assert get_stage_class("AddOne") is AddOne
    with pytest.raises(KeyError, match="no stage class named 'Nope'"):
        get_stage_class("Nope")
