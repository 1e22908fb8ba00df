"""The stage API: class-attribute defaults, process/process_batch, with_(), @processing_stage."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from conveyor import CompositeStage, Pipeline, ProcessingStage, Resources, processing_stage
from conveyor.backends import LocalBackend
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.errors import PipelineBuildError
from conveyor.executors import StreamingExecutor
from conveyor.stage import FunctionStage, declared_names, validate_stage
from conveyor.tasks import DocumentBatch


class Double(ProcessingStage[int, int]):
    def process(self, task: int) -> int:
        return 2 * task


class Named(ProcessingStage[int, int]):
    name = "custom-name"

    def process(self, task: int) -> int:
        return task


class ChildOfNamed(Named):
    """Inherits process but not the explicit name: gets its own class name."""


class Explode(ProcessingStage[int, int]):
    """0 -> filtered (None), 1 -> [] (nothing), n -> n copies, negative -> one tuple."""

    def process(self, task: int) -> int | list[int] | Any | None:
        if task == 0:
            return None
        if task == 1:
            return []
        if task < 0:
            return (task, task)
        return [task] * task


class SumBatch(ProcessingStage[int, int]):
    batch_size = 4

    def process_batch(self, tasks: list[int]) -> list[int]:
        return [sum(tasks)]


class Configured(ProcessingStage[int, int]):
    """A subclass with its own __init__ that does not call super().__init__()."""

    def __init__(self, factor: int, batch: int) -> None:
        self.factor = factor
        self.batch_size = batch
        self.seen: list[int] = []

    def process(self, task: int) -> int:
        return task * self.factor


class Lazy(ProcessingStage[int, int]):
    """Implements neither process nor process_batch."""


# -- class attributes ---------------------------------------------------------------------
def test_stage_is_generic_and_subscriptable() -> None:
    alias = ProcessingStage[int, str]
    assert alias.__origin__ is ProcessingStage  # type: ignore[attr-defined]
    assert issubclass(Double, ProcessingStage)


def test_defaults_come_from_class_attributes() -> None:
    stage = Double()
    assert stage.name == "Double"
    assert stage.resources == Resources(cpus=1)
    assert stage.batch_size == 1
    assert stage.num_workers is None


def test_name_defaults_to_the_class_name_unless_set() -> None:
    assert Named().name == "custom-name"
    assert ChildOfNamed().name == "ChildOfNamed"
    assert Double.name == "Double"


def test_subclass_need_not_call_super_init() -> None:
    stage = Configured(factor=3, batch=8)
    assert stage.name == "Configured"
    assert stage.batch_size == 8
    assert stage.resources == Resources(cpus=1)
    assert stage.process_batch([1, 2]) == [3, 6]
    validate_stage(stage)


def test_instance_overrides_do_not_touch_the_class() -> None:
    stage = Double()
    stage.batch_size = 16
    stage.name = "dbl"
    stage.num_workers = 2
    stage.resources = Resources(cpus=0.5)
    assert (Double.batch_size, Double.name, Double.num_workers) == (1, "Double", None)
    assert Double.resources == Resources(cpus=1)
    assert Double().batch_size == 1


# -- process / process_batch --------------------------------------------------------------
def test_default_process_batch_calls_process_per_task() -> None:
    assert Double().process_batch([1, 2, 3]) == [2, 4, 6]
    assert Double().process_batch([]) == []


def test_default_process_batch_flattens_lists_and_drops_none() -> None:
    stage = Explode()
    assert stage.process_batch([0]) == []
    assert stage.process_batch([1]) == []
    assert stage.process_batch([3, 0, 2, 1]) == [3, 3, 3, 2, 2]
    # only lists are flattened: a tuple is one output
    assert stage.process_batch([-1, 2]) == [(-1, -1), 2, 2]


def test_process_batch_only_stage() -> None:
    stage = SumBatch()
    assert stage.batch_size == 4
    assert stage.process_batch([1, 2, 3, 4]) == [10]
    validate_stage(stage)


def test_stage_with_neither_process_nor_process_batch() -> None:
    stage = Lazy()
    with pytest.raises(ValueError, match=r"'Lazy' implements neither process nor process_batch"):
        validate_stage(stage)
    with pytest.raises(NotImplementedError, match="'Lazy'"):
        stage.process(1)


def test_an_attribute_hiding_a_method_the_engine_calls_is_a_clear_build_error() -> None:
    class Counts(ProcessingStage[int, int]):
        outputs = 3  # meant as "three outputs per input"

        def process(self, task: int) -> int:
            return task

    with pytest.raises(ValueError, match=r"'Counts': its outputs = 3 hides the method outputs\(\)"):
        validate_stage(Counts())
    with pytest.raises(ValueError, match="rename the attribute"):
        Pipeline("p", [Counts()]).build()
    stage = Double()
    stage.setup = None  # type: ignore[assignment]  # an instance attribute hides it as well
    with pytest.raises(ValueError, match=r"its setup = None hides the method setup\(\)"):
        validate_stage(stage)
    described = Double()
    described.kind = "numpy"  # type: ignore[assignment]  # only describe() reads kind()
    validate_stage(described)
    assert "[Double]" in Pipeline("p", [described]).describe()


def test_overrides_reports_which_methods_a_class_replaces() -> None:
    assert Double().overrides("process")
    assert not Double().overrides("process_batch")
    assert SumBatch().overrides("process_batch")
    assert not SumBatch().overrides("process")
    assert not Double().overrides("setup_on_node")


def test_lifecycle_hooks_default_to_no_ops_and_contracts_to_undeclared() -> None:
    stage = Double()
    node = NodeInfo("n0", cpus=4)
    worker = WorkerInfo("w0", "Double", "n0")
    assert stage.setup_on_node(node, worker) is None  # type: ignore[func-returns-value]
    assert stage.setup(worker) is None  # type: ignore[func-returns-value]
    assert stage.teardown() is None  # type: ignore[func-returns-value]
    assert stage.inputs() is None
    assert stage.outputs() is None


def test_repr_names_class_and_stage() -> None:
    assert repr(Double().with_(name="x")) == "<Double 'x'>"


# -- validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "", "name must be a non-empty string"),
        ("name", 3, "name must be a non-empty string"),
        ("resources", {"cpus": 1}, "resources must be a conveyor.Resources"),
        ("batch_size", 0, "batch_size must be >= 1"),
        ("batch_size", -2, "batch_size must be >= 1"),
        ("batch_size", 2.0, "batch_size must be an int"),
        ("batch_size", True, "batch_size must be an int"),
        ("num_workers", 0, "num_workers must be None or an int >= 1"),
        ("num_workers", 1.5, "num_workers must be None or an int >= 1"),
        ("num_workers", True, "num_workers must be None or an int >= 1"),
        ("max_threads", 0, "max_threads must be None or an int >= 1"),
        ("max_threads", 2.5, "max_threads must be None or an int >= 1"),
    ],
)
def test_validate_stage_rejects_bad_settings(field: str, value: object, message: str) -> None:
    stage = Double()
    setattr(stage, field, value)
    with pytest.raises(ValueError, match=message):
        validate_stage(stage)


def test_validate_stage_accepts_good_settings() -> None:
    stage = Double()
    stage.num_workers = 3
    stage.batch_size = 64
    stage.resources = Resources(cpus=0, gpus=0.5)
    stage.max_threads = 8
    validate_stage(stage)
    assert stage.threads == 1  # outside a worker: its own CPUs, one at least


# -- with_ --------------------------------------------------------------------------------
def test_with_returns_a_modified_copy_and_leaves_the_original() -> None:
    original = Configured(factor=2, batch=1)
    copy = original.with_(
        name="renamed", resources=Resources(cpus=2, gpus=1), batch_size=32, num_workers=4
    )
    assert copy is not original
    assert type(copy) is Configured
    assert (copy.name, copy.batch_size, copy.num_workers) == ("renamed", 32, 4)
    assert copy.resources == Resources(cpus=2, gpus=1)
    assert (original.name, original.batch_size, original.num_workers) == ("Configured", 1, None)
    assert original.resources == Resources(cpus=1)
    assert copy.process(5) == 10


def test_with_changes_only_the_given_fields() -> None:
    original = Double()
    original.batch_size = 7
    copy = original.with_(num_workers=2)
    assert (copy.name, copy.batch_size, copy.num_workers) == ("Double", 7, 2)
    assert copy.resources == original.resources


def test_with_copies_mutable_state() -> None:
    original = Configured(factor=2, batch=1)
    copy = original.with_(batch_size=2)
    copy.seen.append(1)
    assert original.seen == []


def test_with_num_workers_none_unpins() -> None:
    pinned = Double().with_(num_workers=3)
    assert pinned.with_(num_workers=None).num_workers is None
    assert pinned.num_workers == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"num_workers": 0}, "num_workers"),
        ({"name": ""}, "name must be a non-empty string"),
        ({"resources": 2}, "resources must be a conveyor.Resources"),
    ],
)
def test_with_validates_and_leaves_original_untouched(kwargs: dict[str, Any], message: str) -> None:
    original = Double()
    with pytest.raises(ValueError, match=message):
        original.with_(**kwargs)
    assert (original.name, original.batch_size, original.num_workers) == ("Double", 1, None)


def test_with_rejects_positional_arguments() -> None:
    with pytest.raises(TypeError):
        Double().with_("name")  # type: ignore[misc]


# -- @processing_stage --------------------------------------------------------------------
def test_bare_decorator_makes_a_stage_instance() -> None:
    @processing_stage
    def add_one(task: int) -> int:
        return task + 1

    assert isinstance(add_one, ProcessingStage)
    assert isinstance(add_one, FunctionStage)
    assert add_one.name == "add_one"
    assert add_one.resources == Resources(cpus=1)
    assert add_one.batch_size == 1
    assert add_one.process(1) == 2
    assert add_one.process_batch([1, 2]) == [2, 3]
    validate_stage(add_one)


def test_decorator_with_arguments() -> None:
    @processing_stage(name="tok", resources=Resources(cpus=0.5, gpus=0.25), batch_size=8)
    def tokenize(task: str) -> list[str]:
        return task.split()

    assert tokenize.name == "tok"
    assert tokenize.resources == Resources(cpus=0.5, gpus=0.25)
    assert tokenize.batch_size == 8
    assert tokenize.process_batch(["a b", "c"]) == ["a", "b", "c"]


def test_decorator_with_empty_parentheses() -> None:
    @processing_stage()
    def keep(task: int) -> int:
        return task

    assert keep.name == "keep"
    assert keep.process(4) == 4


def test_decorated_function_may_filter() -> None:
    @processing_stage
    def evens(task: int) -> int | None:
        return task if task % 2 == 0 else None

    assert evens.process_batch([1, 2, 3, 4]) == [2, 4]


def test_function_with_extra_optional_arguments_is_accepted() -> None:
    @processing_stage
    def scale(task: int, factor: int = 3, *rest: int, flag: bool = False) -> int:
        return task * factor

    assert scale.process(2) == 6


def test_lambda_gets_a_name() -> None:
    stage = processing_stage(lambda task: task)
    assert stage.name == "<lambda>"
    assert processing_stage(lambda task: task, name="ident").name == "ident"


def test_decorated_stage_supports_with() -> None:
    @processing_stage(batch_size=2)
    def ident(task: int) -> int:
        return task

    copy = ident.with_(batch_size=5, name="ident2")
    assert (copy.name, copy.batch_size) == ("ident2", 5)
    assert (ident.name, ident.batch_size) == ("ident", 2)
    assert copy.process(7) == 7


@pytest.mark.parametrize(
    "function",
    [
        lambda: None,
        lambda a, b: None,
        lambda *args: None,
        lambda *, task: None,
        lambda a, b, c=1: None,
    ],
    ids=["none", "two", "varargs-only", "keyword-only", "two-required"],
)
def test_decorator_rejects_functions_without_exactly_one_required_positional(
    function: Any,
) -> None:
    with pytest.raises(TypeError, match="exactly one required positional argument"):
        processing_stage(function)


def test_decorator_rejects_required_keyword_only_arguments() -> None:
    def needs_option(task: int, *, option: int) -> int:
        return task + option

    with pytest.raises(TypeError, match=r"'needs_option'.*keyword-only.*option"):
        processing_stage(needs_option)


def test_decorator_rejection_names_the_function() -> None:
    def two(a: int, b: int) -> int:
        return a + b

    with pytest.raises(TypeError, match=r"'two' must take exactly one.*it takes 2"):
        processing_stage(name="x")(two)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"batch_size": 0}, "batch_size"), ({"name": ""}, "name"), ({"resources": 1}, "resources")],
)
def test_decorator_validates_its_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        processing_stage(**kwargs)(lambda task: task)


# -- CompositeStage -----------------------------------------------------------------------
def test_composite_without_decompose_and_never_runs() -> None:
    class Pair(CompositeStage[int, int]):
        pass

    pair = Pair()
    assert pair.name == "Pair"
    validate_stage(pair)  # composites need no process of their own
    with pytest.raises(NotImplementedError, match="'Pair' must implement decompose"):
        pair.decompose()
    with pytest.raises(RuntimeError, match="expanded at build time"):
        pair.process(1)


# -- declared_names -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, None),
        ([], None),
        (([], []), None),
        (["text", "id"], {"text", "id"}),
        (("text", "id"), {"text", "id"}),
        ("text", {"text"}),
        ((["data"], ["text", "score"]), {"data", "text", "score"}),
        ((("data",), ("text",)), {"data", "text"}),
        (iter(["a", "b"]), {"a", "b"}),
    ],
    ids=[
        "none",
        "empty-list",
        "empty-tuple-form",
        "list",
        "tuple-of-names",
        "single-string",
        "curator-tuple",
        "curator-tuple-of-tuples",
        "iterator",
    ],
)
def test_declared_names_normalizes_both_forms(spec: Any, expected: set[str] | None) -> None:
    assert declared_names(spec) == expected


def test_a_generator_stage_called_directly_gives_its_outputs_as_a_list() -> None:
    from conveyor.stage import yields_outputs

    class Split(ProcessingStage[int, int]):
        def process(self, task: int):  # type: ignore[override]
            yield from range(task)

    assert yields_outputs(Split())
    assert Split().process_batch([2, 0, 3]) == [0, 1, 0, 1, 2]


class HoldsALock(ProcessingStage[int, int]):
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def process(self, task: int) -> int:
        return task


def test_a_stage_that_cannot_reach_its_workers_says_what_to_do() -> None:
    """A lock made in ``__init__`` failed deep in the engine with "cannot pickle
    '_thread.lock' object", naming neither the stage nor the fix."""
    message = r"stage 'HoldsALock' cannot be copied to its workers \(TypeError: .*lock.*setup\(\)"
    with pytest.raises(PipelineBuildError, match=message):
        HoldsALock().with_(batch_size=2)
    with pytest.raises(PipelineBuildError, match=message):
        Pipeline("p", [HoldsALock()]).run(StreamingExecutor(LocalBackend(num_cpus=1)), [1])


def test_processing_stage_slips_are_said_at_definition() -> None:
    """A name given where the function goes said "'tok' is not a callable object"; an async
    function made every task fail on its unpicklable coroutine."""
    with pytest.raises(TypeError, match=r"takes the function, or settings as keywords"):
        processing_stage("tok")  # type: ignore[arg-type]

    async def fetch(task: int) -> int:
        return task

    for decorate in (processing_stage, processing_stage(name="fetch")):
        with pytest.raises(TypeError, match="'fetch' is async"):
            decorate(fetch)


class AsyncProcess(ProcessingStage[int, int]):
    async def process(self, task: int) -> int:  # type: ignore[override]
        return task


def test_an_async_process_is_refused_when_the_pipeline_is_built() -> None:
    with pytest.raises(ValueError, match=r"stage 'AsyncProcess': process\(\) is async"):
        Pipeline("p", [AsyncProcess()]).build()


def test_declared_names_read_curators_dict_by_task_type() -> None:
    spec = {DocumentBatch: (["data"], ["text"]), dict: (["id"], [])}
    assert declared_names(spec) == {"data", "text", "id"}


def test_an_input_contract_checks_each_form_as_its_library_does() -> None:
    """Conveyor's names: an attribute, a key, or a DocumentBatch's column. NeMo Curator's
    pair: attributes of the task, columns of its data (a DataFrame's, a table's, a mapping's
    keys, or an attribute of the data). Its dict: the most specific type's pair."""
    import pandas as pd
    import pyarrow as pa

    from conveyor.stage import InputContract

    assert InputContract.of(None) is None and InputContract.of(([], [])) is None
    names = InputContract.of(["text", "id"])
    assert names is not None and names.missing({"text": 1}) == ["id"]
    rows = DocumentBatch(data=pa.table({"text": ["a"]}))
    assert names.missing(rows) == ["id"]
    pair = InputContract.of((["data"], ["text"]))
    assert pair is not None
    assert pair.missing(rows) == []
    assert pair.missing(DocumentBatch(data=pd.DataFrame({"text": ["a"]}))) == []
    assert pair.missing(DocumentBatch(data=pd.DataFrame({"other": [1]}))) == ["data.text"]
    assert pair.missing(SimpleNamespace(data={"text": 1})) == []
    assert pair.missing(SimpleNamespace(data=SimpleNamespace(text=1))) == []
    assert pair.missing(SimpleNamespace(other=1)) == ["data", "data.text"]
    # a table's columns, not its methods: a DataFrame has a count() but no column "count"
    counted = InputContract.of((["data"], ["count"]))
    assert counted is not None
    assert counted.missing(DocumentBatch(data=pd.DataFrame({"n": [1]}))) == ["data.count"]
    assert counted.missing(SimpleNamespace(data=pa.table({"n": [1]}))) == ["data.count"]

    class Special(DocumentBatch):
        pass

    by_type = InputContract.of({DocumentBatch: (["data"], ["text"]), dict: ([], [])})
    assert by_type is not None
    assert by_type.missing(Special(data=pa.table({"x": [1]}))) == ["data.text"]
    assert by_type.missing({}) == []
    assert by_type.missing(5) == ["a task of a declared type (DocumentBatch, dict), not int"]
    with pytest.raises(TypeError, match="maps task types to"):
        InputContract.of({"DocumentBatch": ([], ["text"])})


def test_metrics_a_stage_logs_reach_its_outputs_stage_perf() -> None:
    from conveyor.backends.runtime import StageRunner

    class Timed(ProcessingStage[DocumentBatch, DocumentBatch]):
        def process(self, task: DocumentBatch) -> DocumentBatch:
            with self.time_metric("parse_s"):
                self.log_metric("rows", task.num_items)
            return task

    runner = StageRunner(Timed(), "timed", WorkerInfo("w", "timed", "n"))
    (out,), _, _ = runner.run([DocumentBatch(data=pa_table(3))], ["0"])
    assert out.stage_perf[-1].custom_metrics["rows"] == 3.0
    assert out.stage_perf[-1].custom_metrics["parse_s"] >= 0
    (again,), _, _ = runner.run([DocumentBatch(data=pa_table(1))], ["1"])
    assert again.stage_perf[-1].custom_metrics["rows"] == 1.0  # each batch its own
    with pytest.raises(TypeError, match="metric 'rows' must be a number, got 'many'"):
        Timed().log_metric("rows", "many")  # type: ignore[arg-type]


def pa_table(rows: int) -> Any:
    import pyarrow as pa

    return pa.table({"n": list(range(rows))})
