"""Typed tasks: lineage ids, item counts, DocumentBatch conversions, FileGroupTask ids."""

from __future__ import annotations

import pickle

import pandas as pd
import pyarrow as pa

from conveyor.tasks import DocumentBatch, EmptyTask, FileGroupTask, Task


def test_task_counts_items_and_describes_itself_briefly() -> None:
    assert Task(data=[1, 2, 3]).num_items == 3
    assert Task(data=object()).num_items == 1
    assert Task().num_items == 0
    assert EmptyTask().num_items == 0
    task = Task(data="x" * 10_000, task_id="4.1")
    assert task.short_repr() == "Task(id=4.1, items=10000)"


def test_task_id_and_timings_do_not_affect_equality() -> None:
    a = Task(data=1, task_id="0")
    b = Task(data=1, task_id="7")
    assert a == b


def test_document_batch_converts_both_ways() -> None:
    table = pa.table({"text": ["a b", "c"], "n": [2, 1]})
    batch = DocumentBatch(data=table)
    assert batch.num_items == 2 and batch.columns == ["text", "n"]
    frame = batch.to_pandas()
    assert list(frame["text"]) == ["a b", "c"]
    from_frame = DocumentBatch(data=pd.DataFrame({"text": ["x"]}))
    assert from_frame.num_items == 1 and from_frame.to_pyarrow().column_names == ["text"]
    assert from_frame.to_pandas() is from_frame.data
    assert batch.to_pyarrow() is table
    assert batch.has_attribute("text") and batch.has_attribute("metadata")
    assert not batch.has_attribute("missing")
    empty = DocumentBatch()
    assert empty.num_items == 0 and empty.columns == [] and empty.to_pandas().empty


def test_document_batch_survives_pickling() -> None:
    batch = DocumentBatch(data=pa.table({"text": ["hello"]}), task_id="3")
    back = pickle.loads(pickle.dumps(batch, protocol=5))
    assert back.to_pyarrow().equals(batch.to_pyarrow()) and back.task_id == "3"


def test_file_group_content_id_is_stable_and_order_free() -> None:
    a = FileGroupTask(data=["b.jsonl", "a.jsonl"])
    b = FileGroupTask(data=["a.jsonl", "b.jsonl"])
    c = FileGroupTask(data=["a.jsonl"])
    assert a.content_id == b.content_id != c.content_id
    assert len(a.content_id) == 16
