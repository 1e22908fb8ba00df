"""Pipeline construction: add_stage, build() into StageSpecs, contracts, describe(), payloads.

No pipeline is run here: only what happens on the driver before any worker starts.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import pytest

from conveyor import (
    CompositeStage,
    Pipeline,
    PipelineBuildError,
    ProcessingStage,
    Resources,
    processing_stage,
)
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.engine.spec import StageSpec


class Ident(ProcessingStage[Any, Any]):
    def process(self, task: Any) -> Any:
        return task


class Declares(ProcessingStage[Any, Any]):
    """A stage whose declared inputs/outputs are given per instance."""

    def __init__(
        self,
        name: str,
        inputs: Any = None,
        outputs: Any = None,
    ) -> None:
        self.name = name
        self._inputs = inputs
        self._outputs = outputs

    def process(self, task: Any) -> Any:
        return task

    def inputs(self) -> Any:
        return self._inputs

    def outputs(self) -> Any:
        return self._outputs


class NodeSetup(Ident):
    def setup_on_node(self, node: NodeInfo, worker: WorkerInfo) -> None:
        pass


class Lazy(ProcessingStage[Any, Any]):
    """Implements neither process nor process_batch."""


class Pair(CompositeStage[Any, Any]):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def decompose(self) -> list[ProcessingStage[Any, Any]]:
        return [Ident().with_(name=f"{self.prefix}-a"), Ident().with_(name=f"{self.prefix}-b")]


class Nested(CompositeStage[Any, Any]):
    def decompose(self) -> list[ProcessingStage[Any, Any]]:
        return [Pair("inner"), Ident().with_(name="middle"), Pair("inner2")]


def names(specs: Sequence[StageSpec]) -> list[str]:
    return [spec.name for spec in specs]


# -- construction -------------------------------------------------------------------------
def test_constructor_arguments() -> None:
    a, b = Ident(), Ident().with_(name="b")
    pipeline = Pipeline("p", stages=[a, b], description="two stages")
    assert pipeline.name == "p"
    assert pipeline.description == "two stages"
    assert pipeline.stages == [a, b]
    assert Pipeline("empty").stages == []
    assert Pipeline("empty").description is None


def test_add_stage_is_chainable_and_keeps_order() -> None:
    a, b, c = Ident(), Ident(), Ident()
    pipeline = Pipeline("p")
    assert pipeline.add_stage(a).add_stage(b) is pipeline
    pipeline.add_stage(c)
    assert pipeline.stages == [a, b, c]


def test_add_stage_with_a_class_gives_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match=r"got the class Ident; pass an instance, e.g. Ident\(\)"):
        Pipeline("p").add_stage(Ident)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got the class Ident"):
        Pipeline("p", stages=[Ident])  # type: ignore[list-item]


@pytest.mark.parametrize("thing", [lambda task: task, "stage", 3, None])
def test_add_stage_rejects_non_stages(thing: Any) -> None:
    with pytest.raises(TypeError, match="expects a ProcessingStage"):
        Pipeline("p").add_stage(thing)


def test_run_s_arguments_swapped_or_a_class_are_clear_type_errors() -> None:
    """Each failed deep in the engine with an AttributeError naming neither argument."""
    from conveyor.backends import LocalBackend
    from conveyor.executors import StreamingExecutor

    pipeline = Pipeline("p", [Ident()])
    for executor, got in (
        (StreamingExecutor, "got the class StreamingExecutor"),
        (LocalBackend(num_cpus=1), "got a LocalBackend"),
        ([1, 2], "got a list"),
    ):
        with pytest.raises(TypeError, match=f"takes an executor first, .*, {got}"):
            pipeline.run(executor, [1])  # type: ignore[arg-type]
    executor = StreamingExecutor(LocalBackend(num_cpus=1))
    for tasks, got in ((5, "got an int"), ("data.jsonl", "got a str")):
        with pytest.raises(TypeError, match=f"initial_tasks must be an iterable of tasks, {got}"):
            pipeline.run(executor, tasks)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must be an instance, LocalBackend\(\), not the class"):
        StreamingExecutor(LocalBackend)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_attempts must be an int >= 1, got '3'"):
        StreamingExecutor(LocalBackend(num_cpus=1), max_attempts="3")  # type: ignore[arg-type]


def test_repr_lists_stage_names() -> None:
    assert repr(Pipeline("p", [Ident(), Pair("x")])) == "Pipeline('p', stages=['Ident', 'Pair'])"


# -- build --------------------------------------------------------------------------------
def test_build_returns_one_spec_per_stage_with_its_settings() -> None:
    first = Ident().with_(name="read", resources=Resources(cpus=0.5), num_workers=2)
    second = NodeSetup().with_(resources=Resources(cpus=2, gpus=1), batch_size=16)
    specs = Pipeline("p", [first, second]).build()
    assert all(isinstance(s, StageSpec) for s in specs)
    assert [s.index for s in specs] == [0, 1]
    assert names(specs) == ["read", "NodeSetup"]
    assert specs[0].resources == Resources(cpus=0.5)
    assert specs[0].num_workers == 2
    assert specs[0].batch_size == 1
    assert specs[0].stage is first
    assert specs[0].has_node_setup is False
    assert specs[1].resources == Resources(cpus=2, gpus=1)
    assert specs[1].batch_size == 16
    assert specs[1].num_workers is None
    assert specs[1].has_node_setup is True


def test_build_of_an_empty_pipeline_raises() -> None:
    with pytest.raises(PipelineBuildError, match="'nothing' has no stages"):
        Pipeline("nothing").build()


def test_build_is_repeatable() -> None:
    pipeline = Pipeline("p", [Ident(), Pair("x"), Ident()])
    assert names(pipeline.build()) == names(pipeline.build())


def test_build_error_is_a_value_error() -> None:
    assert issubclass(PipelineBuildError, ValueError)


# -- names --------------------------------------------------------------------------------
def test_clashing_names_are_deduplicated_deterministically() -> None:
    pipeline = Pipeline("p", [Ident(), Ident(), Ident().with_(name="other"), Ident()])
    assert names(pipeline.build()) == ["Ident", "Ident_2", "other", "Ident_3"]


def test_same_instance_twice_gets_two_names() -> None:
    stage = Ident()
    specs = Pipeline("p", [stage, stage]).build()
    assert names(specs) == ["Ident", "Ident_2"]
    assert specs[0].stage is specs[1].stage is stage
    assert stage.name == "Ident"  # the stage object is not renamed


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["a", "a", "a_2"], ["a", "a_2", "a_2_2"]),
        (["a_2", "a", "a"], ["a_2", "a", "a_3"]),
        (["a", "a_2", "a", "a"], ["a", "a_2", "a_3", "a_4"]),
        (["x", "y", "x", "y", "x"], ["x", "y", "x_2", "y_2", "x_3"]),
    ],
)
def test_deduplicated_names_never_clash_with_given_names(
    given: list[str], expected: list[str]
) -> None:
    specs = Pipeline("p", [Ident().with_(name=n) for n in given]).build()
    assert names(specs) == expected
    assert len(set(names(specs))) == len(specs)


# -- composites ---------------------------------------------------------------------------
def test_composites_expand_at_build_time() -> None:
    specs = Pipeline(
        "p", [Ident().with_(name="src"), Pair("x"), Ident().with_(name="sink")]
    ).build()
    assert names(specs) == ["src", "x-a", "x-b", "sink"]
    assert [s.index for s in specs] == [0, 1, 2, 3]


def test_nested_composites_expand_depth_first() -> None:
    specs = Pipeline("p", [Nested()]).build()
    assert names(specs) == ["inner-a", "inner-b", "middle", "inner2-a", "inner2-b"]


def test_composite_decomposing_to_nothing_raises() -> None:
    class Empty(CompositeStage[Any, Any]):
        def decompose(self) -> list[ProcessingStage[Any, Any]]:
            return []

    with pytest.raises(PipelineBuildError, match="'Empty' decomposed to nothing"):
        Pipeline("p", [Empty()]).build()


def test_composite_decomposing_to_a_non_stage_raises() -> None:
    class Bad(CompositeStage[Any, Any]):
        def decompose(self) -> list[Any]:
            return [Ident(), "oops"]

    with pytest.raises(PipelineBuildError, match=r"'Bad' decomposed into 'oops'"):
        Pipeline("p", [Bad()]).build()


def test_self_nesting_composite_is_stopped() -> None:
    class Forever(CompositeStage[Any, Any]):
        def decompose(self) -> list[ProcessingStage[Any, Any]]:
            return [self]

    with pytest.raises(PipelineBuildError, match="'Forever' nests too deeply"):
        Pipeline("p", [Forever()]).build()


def test_stage_inside_a_composite_is_validated() -> None:
    class Wraps(CompositeStage[Any, Any]):
        def decompose(self) -> list[ProcessingStage[Any, Any]]:
            return [Ident(), Lazy()]

    with pytest.raises(PipelineBuildError, match="'Lazy' implements neither"):
        Pipeline("p", [Wraps()]).build()


# -- validation at build ------------------------------------------------------------------
def test_stage_without_process_is_rejected_naming_it() -> None:
    with pytest.raises(PipelineBuildError, match=r"pipeline 'p': stage 'Lazy' implements neither"):
        Pipeline("p", [Ident(), Lazy()]).build()


def test_invalid_stage_settings_are_rejected_at_build() -> None:
    stage = Ident()
    stage.batch_size = 0  # set directly, bypassing with_()
    with pytest.raises(PipelineBuildError, match="'Ident': batch_size must be >= 1"):
        Pipeline("p", [stage]).build()


# -- declared contracts -------------------------------------------------------------------
def test_missing_declared_input_names_both_stages_and_the_attribute() -> None:
    up = Declares("tokenize", outputs=["tokens", "id"])
    down = Declares("embed", inputs=["tokens", "lang"])
    with pytest.raises(PipelineBuildError) as info:
        Pipeline("p", [up, down]).build()
    message = str(info.value)
    assert "'embed'" in message
    assert "'tokenize'" in message
    assert "needs lang" in message
    assert "declares: id, tokens" in message


def test_contract_satisfied_in_list_form() -> None:
    up = Declares("a", outputs=["text", "id", "extra"])
    down = Declares("b", inputs=["text", "id"])
    assert names(Pipeline("p", [up, down]).build()) == ["a", "b"]


def test_contract_in_curator_tuple_form_lists_what_a_stage_adds() -> None:
    """NeMo Curator's (attributes, columns) outputs() is what a stage adds or changes (its
    AddId declares only the id column): what came before goes on, so nothing is refused."""
    up = Declares("add_id", outputs=(["data"], ["doc_id"]))
    Pipeline("p", [up, Declares("filter", inputs=(["data"], ["text"]))]).build()
    Pipeline("p", [up, Declares("filter", inputs=["text"])]).build()


def test_contract_mixes_list_and_tuple_forms() -> None:
    """A list says all an output has: a need in NeMo Curator's form is checked against it."""
    up = Declares("a", outputs=["data", "text"])
    down = Declares("b", inputs=(["data"], ["text"]))
    Pipeline("p", [up, down]).build()
    with pytest.raises(PipelineBuildError, match="needs score"):
        Pipeline("p", [up, Declares("c", inputs=(["data"], ["score"]))]).build()


def test_contract_is_checked_only_where_both_sides_declare() -> None:
    undeclared_up = Declares("a")
    needs = Declares("b", inputs=["anything"])
    produces = Declares("c", outputs=["x"])
    undeclared_down = Declares("d")
    Pipeline("p", [undeclared_up, needs]).build()
    Pipeline("p", [produces, undeclared_down]).build()


def test_contract_is_checked_between_neighbours_only() -> None:
    # "a" produces x, "b" declares nothing, "c" needs y: no neighbouring pair both declare
    stages = [Declares("a", outputs=["x"]), Declares("b"), Declares("c", inputs=["y"])]
    Pipeline("p", stages).build()


def test_contract_is_checked_across_composite_boundaries() -> None:
    class Wrap(CompositeStage[Any, Any]):
        def decompose(self) -> list[ProcessingStage[Any, Any]]:
            return [Declares("inner", inputs=["needed"])]

    with pytest.raises(PipelineBuildError, match=r"'inner' needs needed.*'outer'"):
        Pipeline("p", [Declares("outer", outputs=["other"]), Wrap()]).build()


def test_contract_error_uses_deduplicated_names() -> None:
    stages = [Declares("s", outputs=["a"]), Declares("s", inputs=["b"])]
    with pytest.raises(PipelineBuildError, match=r"stage 's_2' needs b.*previous stage 's'"):
        Pipeline("p", stages).build()


# -- describe -----------------------------------------------------------------------------
def test_describe_lists_stages_resources_batches_pins_and_contracts() -> None:
    reader = Declares("reader", outputs=(["data"], ["text"])).with_(
        resources=Resources(cpus=0.5), num_workers=2
    )
    model = Declares("model", inputs=["text"], outputs=["text", "score"]).with_(
        resources=Resources(cpus=1, gpus=1), batch_size=32
    )
    text = Pipeline("demo", [reader, model], description="scores text").describe()
    assert text.splitlines() == [
        "Pipeline 'demo': scores text",
        "  1. reader [Declares]",
        "     resources: cpus=0.5",
        "     batch_size: 1   workers: 2 (pinned)",
        "     outputs: data, text",
        "  2. model [Declares]",
        "     resources: cpus=1, gpus=1",
        "     batch_size: 32   workers: autoscaled",
        "     inputs: text",
        "     outputs: score, text",
    ]


def test_describe_without_description_and_with_memory_request() -> None:
    stage = Ident().with_(resources=Resources(cpus=2, gpu_memory_gb=20))
    lines = Pipeline("p", [stage]).describe().splitlines()
    assert lines[0] == "Pipeline 'p'"
    assert "     resources: cpus=2, gpu_memory_gb=20" in lines


def test_describe_validates_like_build() -> None:
    with pytest.raises(PipelineBuildError, match="'Lazy'"):
        Pipeline("p", [Lazy()]).describe()


# -- payload ------------------------------------------------------------------------------
def test_payload_is_cloudpickle_bytes_that_round_trip() -> None:
    stage = Ident().with_(name="ident", batch_size=3)
    spec = Pipeline("p", [stage]).build()[0]
    payload = spec.payload
    assert isinstance(payload, bytes)
    assert spec.payload is payload  # serialized once
    clone = pickle.loads(payload)
    assert type(clone) is Ident
    assert (clone.name, clone.batch_size) == ("ident", 3)
    assert clone.process(5) == 5


def test_payload_of_a_class_defined_inside_a_function_round_trips() -> None:
    offset = 10

    class LocalStage(ProcessingStage[int, int]):
        resources = Resources(cpus=0.25)

        def __init__(self, factor: int) -> None:
            self.factor = factor

        def process(self, task: int) -> int:
            return task * self.factor + offset

    spec = Pipeline("p", [LocalStage(3)]).build()[0]
    clone = pickle.loads(spec.payload)
    assert clone is not spec.stage
    assert clone.name == "LocalStage"
    assert clone.resources == Resources(cpus=0.25)
    assert clone.process(2) == 16
    assert clone.process_batch([1, 2]) == [13, 16]


def test_payload_of_a_decorated_local_function_round_trips() -> None:
    suffix = "!"

    @processing_stage(name="shout", batch_size=2)
    def shout(task: str) -> str:
        return task.upper() + suffix

    clone = pickle.loads(Pipeline("p", [shout]).build()[0].payload)
    assert (clone.name, clone.batch_size) == ("shout", 2)
    assert clone.process_batch(["a", "b"]) == ["A!", "B!"]
