"""DocumentAnnotator: word counts as the filters count them, hashes that find exact duplicates."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from conveyor.stages.text import DocumentAnnotator, content_hash
from conveyor.tasks import DocumentBatch


def test_adds_word_count_and_content_hash() -> None:
    texts = ["one two three", "  spaced\n out  ", "one two three", "", None]
    task = DocumentBatch(
        data=pa.table({"id": [1, 2, 3, 4, 5], "text": pa.array(texts, pa.string())}),
        dataset_name="web",
        metadata={"k": "v"},
    )
    out = DocumentAnnotator().process(task)
    assert out.columns == ["id", "text", "word_count", "content_hash"]
    assert out.data.column("word_count").to_pylist() == [3, 2, 3, 0, 0]
    hashes = out.data.column("content_hash").to_pylist()
    assert hashes[0] == hashes[2] != hashes[1]
    assert hashes[3] == content_hash("")
    assert hashes[4] is None  # a null text is not a duplicate of an empty one
    assert out.data.schema.field("word_count").type == pa.int64()
    assert (out.dataset_name, out.metadata) == ("web", {"k": "v"})


def test_content_hash_is_blake2b_of_utf8() -> None:
    expected = hashlib.blake2b("café".encode(), digest_size=16).hexdigest()
    assert content_hash("café") == expected
    assert len(expected) == 32


def test_existing_columns_are_replaced_in_place() -> None:
    task = DocumentBatch(data=pa.table({"word_count": ["stale"], "text": ["a b"]}))
    out = DocumentAnnotator().process(task)
    assert out.columns == ["word_count", "text", "content_hash"]
    assert out.data.column("word_count").to_pylist() == [2]


def test_custom_names_and_declared_columns() -> None:
    stage = DocumentAnnotator(text_field="body", word_count_field="n", hash_field="h")
    assert stage.inputs() == ([], ["body"])
    assert stage.outputs() is None  # pass-through plus two columns
    out = stage.process(DocumentBatch(data=pa.table({"body": ["x y"]})))
    assert out.data.column("n").to_pylist() == [2]


def test_missing_text_column_is_named() -> None:
    task = DocumentBatch(data=pa.table({"body": ["x"]}), task_id="0.2")
    with pytest.raises(ValueError, match=r"task 0\.2 .* has no column 'text' \(columns: body\)"):
        DocumentAnnotator().process(task)


def test_field_names_must_differ() -> None:
    with pytest.raises(ValueError, match="distinct non-empty names"):
        DocumentAnnotator(word_count_field="text")
    with pytest.raises(ValueError, match="distinct non-empty names"):
        DocumentAnnotator(hash_field="")
