"""Semantic dedup as passes on the engine: the plan, the keep rule, planted duplicates against
all pairs, big clusters in parts, the keep order, bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conveyor.dedup import SemanticDedupError, semantic_dedup
from conveyor.dedup.plan import (
    Chunk,
    CompareTask,
    InputFile,
    buckets,
    chunks,
    compare_tasks,
)
from conveyor.dedup.similarity import BestEarlier, best_earlier_within, normalise
from conveyor.executors.batch import BatchExecutor


def planted(
    n: int, dim: int = 32, centers: int = 20, share: float = 0.1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` items around ``centers`` topics plus ``share * n`` near-copies of random items,
    shuffled: (vectors, ids)."""
    rng = np.random.default_rng(seed)
    topics = rng.normal(size=(centers, dim)).astype(np.float32)
    base = topics[rng.integers(0, centers, n)] + rng.normal(scale=0.6, size=(n, dim))
    copies = base[rng.integers(0, n, int(n * share))]
    copies = copies + rng.normal(scale=0.03, size=copies.shape)
    vectors = np.concatenate([base, copies]).astype(np.float32)
    order = rng.permutation(len(vectors))
    return vectors[order], np.arange(len(vectors))[order]


def write(folder: Path, vectors: np.ndarray, ids: list | np.ndarray, files: int = 3, **extra):
    folder.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(vectors)), files)):
        flat = pa.array(vectors[part].reshape(-1))
        columns = {
            "id": pa.array([ids[j] for j in part]),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]),
        }
        columns.update({k: pa.array([v[j] for j in part]) for k, v in extra.items()})
        pq.write_table(pa.table(columns), folder / f"part-{i}.parquet", row_group_size=700)


def all_pairs(vectors: np.ndarray, threshold: float) -> set[int]:
    """Rows marked by the keep rule over every pair (input order)."""
    found, _, _ = best_earlier_within(normalise(vectors), np.arange(len(vectors)), threshold)
    return set(found.tolist())


def marked(output: Path) -> pa.Table:
    return pq.read_table(output / "duplicates.parquet")


# -- the plan ----------------------------------------------------------------------------------
def test_chunks_pack_whole_row_groups_per_file() -> None:
    files = [InputFile("a", 0, (3, 3, 3)), InputFile("b", 1, (10,)), InputFile("c", 2, ())]
    assert chunks(files, chunk_rows=6) == [
        Chunk(0, "a", 0, (0, 1), 0, 6),
        Chunk(1, "a", 0, (2,), 6, 3),
        Chunk(2, "b", 1, (0,), 0, 10),  # a row group larger than a chunk is one chunk
    ]


def test_buckets_pack_clusters_by_estimated_size() -> None:
    assert buckets([4, 4, 4, 20, 1], partition_rows=10) == [0, 0, 1, 2, 3]


def test_compare_tasks_pack_real_sizes_and_split_big_clusters() -> None:
    counts = [4, 1, 5, 25, 3, 0]
    tasks = compare_tasks(counts, [0, 0, 0, 1, 2, 2], partition_rows=10)
    assert tasks == [
        CompareTask(0, 0, (0, 2), 9),  # cluster 1 has one item: no pair, no task
        CompareTask(1, 1, (3,), 25, 0, 3),
        CompareTask(2, 1, (3,), 25, 1, 3),
        CompareTask(3, 1, (3,), 25, 2, 3),
        CompareTask(4, 2, (4,), 3),
    ]


# -- the keep rule -----------------------------------------------------------------------------
def test_each_item_points_at_its_most_similar_earlier_item() -> None:
    vectors = normalise(np.array([[1, 0], [1, 0.05], [1, 0.02], [0, 1]], np.float32))
    found, match, sims = best_earlier_within(vectors, np.arange(4), 0.99)
    assert found.tolist() == [1, 2] and match.tolist() == [0, 0]
    assert np.all(sims >= 0.99)
    # the same rows in another order: the earliest in rank is kept whatever the row order
    found, match, _ = best_earlier_within(vectors[::-1].copy(), np.arange(4)[::-1].copy(), 0.99)
    assert sorted(zip(found.tolist(), match.tolist(), strict=True)) == [(1, 3), (2, 3)]


def test_a_copy_a_few_ulps_closer_does_not_take_the_match_from_the_original() -> None:
    # an image and its byte-for-byte copy, embedded in different batches, differ by ~1e-7
    # (here: their similarities with the mirror differ by ~3e-6, under TIE);
    # a third item (its mirror) names the original (rank 0) whichever is a hair closer
    original = normalise(np.array([[1.0, 0.2, 0.1]], np.float32))[0]
    mirror = normalise(np.array([[1.0, 0.25, 0.05]], np.float32))[0]
    for sign in (1, -1):
        copy = normalise((original + sign * 2e-3 * (mirror - original))[None])[0]
        vectors = np.stack([original, copy, mirror])
        assert (vectors[2] @ vectors[1] > vectors[2] @ vectors[0]) == (sign == 1)
        found, match, _ = best_earlier_within(vectors, np.arange(3), 0.9)
        assert dict(zip(found.tolist(), match.tolist(), strict=True)) == {1: 0, 2: 0}
        # and so when the rows come in parts, the copy's part first
        best = BestEarlier(vectors, np.arange(3), 0.9)
        for part in ([1, 2], [0]):
            best.feed(vectors[part], np.array(part))
        q, m, _ = best.duplicates()
        assert dict(zip(q.tolist(), m.tolist(), strict=True)) == {1: 2, 2: 2}  # fed index 2: row 0


def test_a_cluster_fed_in_parts_gives_what_it_gives_whole() -> None:
    vectors, _ = planted(600, seed=3)
    vectors = normalise(vectors)
    ranks = np.random.default_rng(1).permutation(len(vectors))
    whole = dict(zip(*best_earlier_within(vectors, ranks, 0.9)[:2], strict=True))
    best = BestEarlier(vectors, ranks, 0.9)
    for part in np.array_split(np.arange(len(vectors)), 7):
        best.feed(vectors[part], ranks[part])
    q, m, s = best.duplicates()
    assert dict(zip(q.tolist(), m.tolist(), strict=True)) == {
        int(k): int(v) for k, v in whole.items()
    }
    assert np.all(s >= np.float32(0.9))


# -- end to end --------------------------------------------------------------------------------
def test_planted_duplicates_found_against_all_pairs(tmp_path: Path) -> None:
    vectors, ids = planted(4_000)
    write(tmp_path / "in", vectors, [f"v{i}" for i in ids])
    result = semantic_dedup(tmp_path / "in", tmp_path / "out", threshold=0.95, n_clusters=6)
    truth = {f"v{ids[i]}" for i in all_pairs(vectors, 0.95)}
    table = marked(tmp_path / "out")
    ours = set(table.column("id").to_pylist())
    assert len(truth) >= 350 and result.duplicates == len(ours) == table.num_rows
    assert ours <= truth  # precision 1.0: every mark is a real pair above the threshold
    assert len(ours & truth) / len(truth) >= 0.95
    assert all(s >= np.float32(0.95) for s in table.column("similarity").to_pylist())
    # duplicate_of always points earlier in input order (files as listed, rows as stored)
    place = {f"v{i}": n for n, i in enumerate(ids)}
    for row in table.to_pylist():
        assert place[row["duplicate_of"]] < place[row["id"]]
    report = json.loads((tmp_path / "out" / "dedup.json").read_text())
    assert report["items"] == len(vectors) and report["duplicates"] == len(ours)
    assert report["clusters"] == 6 and report["threshold"] == 0.95
    assert set(report["passes"]) == {"train", "assign", "compare", "write"}
    assert not (tmp_path / "out" / ".conveyor").exists()  # work removed, and its folder


def test_the_outputs_of_earlier_runs_in_a_folder_are_read(tmp_path: Path) -> None:
    """Unlike ``conveyor text``, which leaves earlier outputs inside its INPUT out, dedup
    reads them: embeddings of several video runs are what it is for."""
    vectors = np.eye(4, dtype=np.float32)
    for run in ("run1", "run2"):
        (tmp_path / "runs" / run / ".conveyor").mkdir(parents=True)
        write(tmp_path / "runs" / run / "embeddings", vectors, [f"{run}-{i}" for i in range(4)], 1)
    result = semantic_dedup(tmp_path / "runs", tmp_path / "out", n_clusters=1)
    assert result.items == 8 and result.duplicates == 4


def test_exact_copies_have_a_similarity_of_one_at_most(tmp_path: Path) -> None:
    """Rounding made copies 1.0000001 similar (an arccos of it is NaN)."""
    vectors = np.random.default_rng(3).normal(size=(200, 48)).astype(np.float32)
    write(tmp_path / "in", np.concatenate([vectors, vectors]), list(range(400)), 1)
    semantic_dedup(tmp_path / "in", tmp_path / "out", n_clusters=2)
    similarity = marked(tmp_path / "out").column("similarity").to_numpy()
    assert len(similarity) == 200 and similarity.max() == np.float32(1)


def test_identical_embeddings_keep_one_whatever_chunk_they_come_in(tmp_path: Path) -> None:
    """3,000 copies of one vector kept two: k-means on them returned 20 centroids that
    coincide, and faiss put the copies of the 10-row file (its own kernel) in another
    cluster than those of the big one (BLAS), so the two sets were never compared."""
    v = np.random.default_rng(0).normal(size=(1, 64)).astype(np.float32)
    vectors = np.repeat(v, 3000, axis=0)
    for i, (a, b) in enumerate([(0, 2990), (2990, 3000)]):
        flat = pa.array(vectors[a:b].reshape(-1))
        table = pa.table(
            {"id": pa.array(range(a, b)), "embedding": pa.FixedSizeListArray.from_arrays(flat, 64)}
        )
        (tmp_path / "in").mkdir(exist_ok=True)
        pq.write_table(table, tmp_path / "in" / f"part-{i}.parquet")
    result = semantic_dedup(tmp_path / "in", tmp_path / "out", n_clusters=20)
    table = marked(tmp_path / "out")
    assert result.duplicates == table.num_rows == 2999
    assert set(table.column("duplicate_of").to_pylist()) == {0}
    assert result.clusters == 1  # the 20 coinciding centroids are one


def test_groups_of_copies_and_near_copies_among_other_items(tmp_path: Path) -> None:
    """Groups of exact copies (the biggest over half the items) and one of near-copies
    (1e-4 apart) among a few other items: every pair the keep rule finds over all pairs is
    found. Four were missed: k-means gave some groups centroids that coincide, and copies
    went to one or another of them on a rounding error."""
    rng = np.random.default_rng(1)
    dim = 64
    groups = [np.repeat(rng.normal(size=(1, dim)), n, axis=0) for n in (1500, 800, 400)]
    near = rng.normal(size=(1, dim)) + rng.normal(scale=1e-4, size=(300, dim))
    vectors = np.concatenate([rng.normal(size=(10, dim)), *groups, near]).astype(np.float32)
    vectors = vectors[rng.permutation(len(vectors))]
    vectors = np.concatenate([vectors, vectors[:12]])  # again, in a file of their own
    n = len(vectors)
    (tmp_path / "in").mkdir()
    for i, (a, b) in enumerate([(0, n - 12), (n - 12, n)]):
        flat = pa.array(vectors[a:b].reshape(-1))
        table = pa.table(
            {"id": pa.array(range(a, b)), "embedding": pa.FixedSizeListArray.from_arrays(flat, dim)}
        )
        pq.write_table(table, tmp_path / "in" / f"part-{i}.parquet")
    result = semantic_dedup(tmp_path / "in", tmp_path / "out", n_clusters=40)
    truth = all_pairs(vectors, 0.95)
    assert len(truth) == 1499 + 799 + 399 + 299 + 12
    assert set(marked(tmp_path / "out").column("id").to_pylist()) == truth
    assert result.duplicates == len(truth)


def test_a_file_given_twice_is_read_once(tmp_path: Path) -> None:
    """Its every id was on two rows: the run failed after its passes, blaming the ids."""
    write(tmp_path / "in", np.eye(4, dtype=np.float32), list("abcd"), 1)
    given = [tmp_path / "in", tmp_path / "in" / "part-0.parquet", str(tmp_path / "in" / "*")]
    result = semantic_dedup(given, tmp_path / "out", n_clusters=1)
    assert result.items == 4 and result.duplicates == 0


def test_the_input_folder_as_output_is_refused(tmp_path: Path) -> None:
    """Its own two files were written among the inputs, which then no longer read as one
    dataset (``pyarrow.dataset``: "Parquet magic bytes not found" in dedup.json)."""
    write(tmp_path / "emb", np.eye(4, dtype=np.float32), list("abcd"), 1)
    for given in (tmp_path / "emb", str(tmp_path / "emb" / "*.parquet")):
        with pytest.raises(SemanticDedupError, match="OUTPUT is the INPUT folder"):
            semantic_dedup(given, tmp_path / "emb")
    assert sorted(p.name for p in (tmp_path / "emb").iterdir()) == ["part-0.parquet"]
    semantic_dedup(tmp_path / "emb", tmp_path)  # an output holding the input is fine


def test_big_clusters_split_in_parts_mark_the_same(tmp_path: Path) -> None:
    vectors, ids = planted(2_500, centers=3, seed=5)
    write(tmp_path / "in", vectors, ids.tolist())
    semantic_dedup(tmp_path / "in", tmp_path / "whole", n_clusters=2, threshold=0.9)
    semantic_dedup(
        tmp_path / "in",
        tmp_path / "parts",
        n_clusters=2,
        threshold=0.9,
        partition_rows=400,  # every cluster in 4+ parts
        chunk_rows=900,
        executor=BatchExecutor(),
    )
    whole, parts = marked(tmp_path / "whole"), marked(tmp_path / "parts")
    assert parts.schema.field("id").type == pa.int64()
    pairs = {r["id"]: (r["duplicate_of"], r["similarity"]) for r in whole.to_pylist()}
    assert pairs.keys() == set(parts.column("id").to_pylist())
    for row in parts.to_pylist():
        assert row["duplicate_of"] == pairs[row["id"]][0]
        assert row["similarity"] == pytest.approx(pairs[row["id"]][1], abs=1e-5)


def test_order_by_keeps_the_earliest_by_its_columns(tmp_path: Path) -> None:
    a = np.array([1.0, 0.0, 0.0], np.float32)
    vectors = np.stack([a, a + 0.01, a + 0.02, np.array([0, 1, 0], np.float32)])
    ids = ["late", "early", "middle", "other"]
    write(tmp_path / "in", vectors, ids, files=1, when=[3.0, 1.0, 2.0, 0.0])
    semantic_dedup(tmp_path / "in", tmp_path / "out", threshold=0.99, order_by="when")
    rows = {r["id"]: r["duplicate_of"] for r in marked(tmp_path / "out").to_pylist()}
    assert rows == {"middle": "early", "late": "early"}


@pytest.mark.slow  # the command's test keeps the largest in make test; this adds the parts
def test_order_by_with_a_dash_keeps_the_largest(tmp_path: Path) -> None:
    """``-score`` keeps the best-scored item of a set (items without a score come last),
    whole clusters or in parts, ties broken by the next column."""
    a = np.array([1.0, 0.0, 0.0], np.float32)
    vectors = np.stack([a, a + 0.01, a + 0.02, a + 0.03, np.array([0, 1, 0], np.float32)])
    ids = ["good", "best", "unscored", "tied", "other"]
    score = [2.0, 5.0, None, 5.0, 9.0]
    write(tmp_path / "in", vectors, ids, files=1, score=score, when=[1, 3, 0, 2, 0])
    for partition_rows in (50_000, 2):
        out = tmp_path / f"out-{partition_rows}"
        semantic_dedup(
            tmp_path / "in",
            out,
            threshold=0.99,
            order_by=("-score", "-when"),
            partition_rows=partition_rows,
        )
        rows = {r["id"]: r["duplicate_of"] for r in marked(out).to_pylist()}
        assert rows == {"good": "best", "unscored": "best", "tied": "best"}
        assert json.loads((out / "dedup.json").read_text())["order_by"] == ["-score", "-when"]
    with pytest.raises(SemanticDedupError, match="order_by '-' names no column"):
        semantic_dedup(tmp_path / "in", tmp_path / "x", order_by="-")


def test_order_by_of_a_column_named_with_a_dash_says_what_the_dash_means(tmp_path: Path) -> None:
    """A column literally named ``-x`` (ordered by before the dash meant descending) is not
    'x' descending: the error says so rather than only that 'x' is missing."""
    vectors = np.eye(3, dtype=np.float32)
    write(tmp_path / "in", vectors, ["a", "b", "c"], files=1, **{"-x": [1.0, 2.0, 3.0]})
    with pytest.raises(SemanticDedupError, match=r"'-x' is 'x' descending\): rename"):
        semantic_dedup(tmp_path / "in", tmp_path / "out", order_by="-x")


def test_order_by_may_name_the_id_column(tmp_path: Path) -> None:
    """Ids that say the keep order (a pipeline's document ids) order it themselves, whatever
    order the files list the rows in, whole clusters or in parts."""
    a = np.array([1.0, 0.0, 0.0], np.float32)
    vectors = np.stack([a, a + 0.01, a + 0.02, np.array([0, 1, 0], np.float32)])
    write(tmp_path / "in", vectors, [30, 10, 20, 0], files=2)
    for partition_rows in (50_000, 2):  # the second splits the cluster in parts
        out = tmp_path / f"out-{partition_rows}"
        semantic_dedup(
            tmp_path / "in", out, threshold=0.99, order_by="id", partition_rows=partition_rows
        )
        rows = {r["id"]: r["duplicate_of"] for r in marked(out).to_pylist()}
        assert rows == {20: 10, 30: 10}


def test_columns_named_like_the_spilled_ones_do_not_clash(tmp_path: Path) -> None:
    """An id or order column called pos, cluster or embedding met the spilled files' own
    columns of those names: "Multiple matches for FieldRef" after two passes."""
    a = np.array([1.0, 0.0, 0.0], np.float32)
    vectors = np.stack([a, a + 0.01, np.array([0, 1, 0], np.float32), a + 0.02])
    write(tmp_path / "in", vectors, [10, 11, 12, 13], files=1, cluster=[9, 3, 1, 0])
    table = pq.read_table(tmp_path / "in" / "part-0.parquet")
    table = table.rename_columns(["pos", "vec", "cluster"])
    pq.write_table(table, tmp_path / "in" / "part-0.parquet")
    for partition_rows in (50_000, 2):  # whole clusters, then in parts
        out = tmp_path / f"out-{partition_rows}"
        semantic_dedup(
            tmp_path / "in",
            out,
            id_column="pos",
            embedding_column="vec",
            order_by=("cluster", "pos"),
            threshold=0.99,
            partition_rows=partition_rows,
        )
        rows = {r["id"]: r["duplicate_of"] for r in marked(out).to_pylist()}
        assert rows == {11: 13, 10: 11}  # 13 is first by cluster, 11 nearer 10 than 13 is


def test_an_empty_conveyor_folder_made_by_the_dedup_only_is_removed(tmp_path: Path) -> None:
    """``OUTPUT/.conveyor/`` that was there before (a video output's) stays."""
    write(tmp_path / "in", np.eye(3, dtype=np.float32), ["a", "b", "c"], files=1)
    (tmp_path / "out" / ".conveyor").mkdir(parents=True)
    semantic_dedup(tmp_path / "in", tmp_path / "out")
    assert list((tmp_path / "out" / ".conveyor").iterdir()) == []


def test_items_without_an_embedding_are_skipped_and_counted(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": ["a", "b", "c", "d"],
            "embedding": pa.array([[1.0, 0.0], None, [], [1.0, 0.001]], pa.list_(pa.float64())),
        }
    )
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "x.parquet")
    result = semantic_dedup(tmp_path / "in", tmp_path / "out", threshold=0.99)
    assert (result.items, result.skipped, result.duplicates) == (2, 2, 1)
    assert marked(tmp_path / "out").to_pylist()[0]["duplicate_of"] == "a"


@pytest.mark.parametrize("fixed", [False, True])
def test_items_whose_embedding_is_not_finite_are_skipped_and_counted(
    tmp_path: Path, fixed: bool
) -> None:
    """A NaN or an infinity (or a float64 beyond float32's range) made k-means fail with a
    message naming nothing; such rows are left out like missing ones, and counted apart."""
    nan, inf = float("nan"), float("inf")
    rows = [[1.0, 0.0], [nan, 0.0], [0.0, inf], [1e300, 0.0], [1.0, 0.001], [0.0, 1.0]]
    kind = pa.list_(pa.float64(), 2) if fixed else pa.list_(pa.float64())
    table = pa.table({"id": list("abcdef"), "embedding": pa.array(rows, kind)})
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "x.parquet")
    result = semantic_dedup(tmp_path / "in", tmp_path / "out", threshold=0.99, n_clusters=2)
    assert (result.items, result.skipped, result.nonfinite, result.duplicates) == (3, 3, 3, 1)
    assert marked(tmp_path / "out").to_pylist()[0]["id"] == "e"
    report = json.loads((tmp_path / "out" / "dedup.json").read_text())
    assert (report["skipped"], report["nonfinite"]) == (3, 3)


def test_no_rows_gives_an_empty_table(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    empty = pa.table(
        {"id": pa.array([], pa.string()), "embedding": pa.array([], pa.list_(pa.float32()))}
    )
    pq.write_table(empty, tmp_path / "in" / "x.parquet")
    result = semantic_dedup(tmp_path / "in", tmp_path / "out")
    assert (result.items, result.duplicates) == (0, 0)
    assert marked(tmp_path / "out").num_rows == 0


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("table", "kwargs", "message"),
    [
        (pa.table({"key": ["a"], "embedding": [[1.0]]}), {}, "has no column 'id'"),
        (pa.table({"id": ["a"], "embedding": ["x"]}), {}, "expected a list of numbers"),
        (
            pa.table({"id": ["a"], "vec": [[1.0]]}),
            {"order_by": "when"},
            "'embedding', 'when' .*; name yours with id_column=, embedding_column=, order_by=",
        ),
        (
            pa.table({"id": [{"a": 1}], "embedding": [[1.0]]}),
            {},
            r"column 'id' is struct<a: int64>; ids must be integers or strings",
        ),
        # a NaN id came out as {'id': nan}: ids are integers or strings
        (
            pa.table({"id": [float("nan")], "embedding": [[1.0]]}),
            {},
            "column 'id' is double; ids must be integers or strings",
        ),
        (
            pa.table({"id": ["a"], "embedding": [[1.0]], "tags": [[1]]}),
            {"order_by": "tags"},
            "column 'tags' is list<element: int64>; the keep order needs a number, string",
        ),
        (
            pa.table({"id": ["a"], "embedding": [[1.0]]}),
            {"id_column": "embedding"},
            "column 'embedding' is both the embedding and the id column",
        ),
        (
            pa.table({"id": ["a"], "embedding": [[1.0]]}),
            {"order_by": ("id", "embedding")},
            "column 'embedding' is both the embedding and the keep order column",
        ),
        (
            pa.table({"id": ["a", "b"], "embedding": [[1.0, 0.0], [1.0]]}),
            {},
            "embeddings of 2 and of 1 numbers",
        ),
    ],
)
def test_bad_input_names_the_file_and_what_is_wrong(
    tmp_path: Path, table: pa.Table, kwargs: dict, message: str
) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "bad.parquet")
    with pytest.raises(SemanticDedupError, match=message) as error:
        semantic_dedup(tmp_path / "in", tmp_path / "out", **kwargs)
    assert "bad.parquet" in str(error.value)


def test_ids_of_two_types_and_files_that_are_not_parquet(tmp_path: Path) -> None:
    write(tmp_path / "in", np.eye(4, dtype=np.float32), ["a", "b", "c", "d"], files=1)
    pq.write_table(
        pa.table({"id": [1], "embedding": [[1.0, 0, 0, 0]]}), tmp_path / "in" / "z.parquet"
    )
    with pytest.raises(SemanticDedupError, match="the ids must have one type"):
        semantic_dedup(tmp_path / "in", tmp_path / "out")
    (tmp_path / "notes.jsonl").write_text("{}\n")
    with pytest.raises(SemanticDedupError, match=r"notes\.jsonl' is not Parquet"):
        semantic_dedup(tmp_path / "notes.jsonl", tmp_path / "out")
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.jsonl").write_text("{}\n")
    with pytest.raises(SemanticDedupError, match=r"text' has no Parquet file"):
        semantic_dedup(tmp_path / "text", tmp_path / "out")
    (tmp_path / "empty").mkdir()  # the text readers' message named their JSONL suffixes
    with pytest.raises(SemanticDedupError, match=r"empty' has no Parquet file$"):
        semantic_dedup(tmp_path / "empty", tmp_path / "out")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(SemanticDedupError, match=r"broken\.parquet' is not a readable Parquet"):
        semantic_dedup(tmp_path / "broken.parquet", tmp_path / "out")
    with pytest.raises(SemanticDedupError, match="does not exist"):
        semantic_dedup(tmp_path / "missing", tmp_path / "out")


def test_embeddings_of_different_lengths_across_files(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"id": ["a"], "embedding": [[1.0, 0.0]]}), tmp_path / "in" / "a.parquet"
    )
    pq.write_table(pa.table({"id": ["b"], "embedding": [[1.0]]}), tmp_path / "in" / "b.parquet")
    with pytest.raises(SemanticDedupError, match="must all have one length") as error:
        semantic_dedup(tmp_path / "in", tmp_path / "out")
    # before any pass: the plan reads each file's first embedding
    assert str(error.value) == (
        f"INPUT '{tmp_path / 'in' / 'b.parquet'}': column 'embedding' holds embeddings of 1 "
        f"numbers, '{tmp_path / 'in' / 'a.parquet'}' of 2; they must all have one length"
    )
    assert not (tmp_path / "out").exists()


def test_embeddings_of_different_lengths_in_later_row_groups(tmp_path: Path) -> None:
    """Lengths past a file's first embedding are checked after pass 1, still naming the
    file: k-means said only "different lengths ([4, 8])"."""
    from conveyor.dedup.semantic import PassFailed

    four, eight = [1.0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0, 0, 0]
    table = pa.table({"id": list("abcd"), "embedding": [four, four, eight, eight]})
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "x.parquet", row_group_size=2)
    with pytest.raises(SemanticDedupError, match="embeddings of 4 and of 8 numbers") as error:
        semantic_dedup(tmp_path / "in", tmp_path / "out", chunk_rows=2)
    assert "x.parquet" in str(error.value) and not isinstance(error.value, PassFailed)


def test_embeddings_of_different_lengths_inside_one_chunk(tmp_path: Path) -> None:
    """Lengths that differ inside a chunk are the input's fault, said as a bad input naming
    the file's row (it was a failed pass, exit 1, counting rows from the chunk's start), and
    read once (a ``PermanentError``: not retried)."""
    from conveyor.dedup.semantic import PassFailed

    four, eight = [1.0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0, 0, 0]
    table = pa.table({"id": list("abcd"), "embedding": [four, four, four, eight]})
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "x.parquet"
    pq.write_table(table, path, row_group_size=2)
    with pytest.raises(SemanticDedupError) as error:
        semantic_dedup(tmp_path / "in", tmp_path / "out", chunk_rows=2)
    assert not isinstance(error.value, PassFailed)
    assert str(error.value) == (
        f"{path}: column 'embedding' holds embeddings of 4 and of 8 numbers (row 3); they "
        "must all have one length"
    )


@pytest.mark.parametrize("statistics", [True, False])
def test_a_null_id_stops_the_plan_naming_its_row(tmp_path: Path, statistics: bool) -> None:
    """A null id came out as ``duplicate_of: None``; the footer's null counts say which row
    groups to read (a file written without them is read whole)."""
    v = [1.0, 0.0]
    table = pa.table({"id": pa.array([1, 2, 3, None], pa.int64()), "embedding": [v, v, v, v]})
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "x.parquet"
    pq.write_table(table, path, row_group_size=2, write_statistics=statistics)
    with pytest.raises(SemanticDedupError, match="column 'id' is null on row 3") as error:
        semantic_dedup(tmp_path / "in", tmp_path / "out")
    assert str(path) in str(error.value)
    assert not (tmp_path / "out").exists()  # before any pass


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 0}, "threshold must be in"),
        ({"n_clusters": 0}, "n_clusters must be"),
        ({"partition_rows": 1}, "partition_rows must be"),
        ({"chunk_rows": 0}, "chunk_rows must be"),
    ],
)
def test_bad_options(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        semantic_dedup(tmp_path, tmp_path / "out", **kwargs)


def test_an_id_on_two_near_duplicate_rows_fails_the_dedup(tmp_path: Path) -> None:
    """``a`` twice came out as ``a`` duplicate of ``a``: removing by id lost both rows."""
    from conveyor.dedup.semantic import PassFailed

    write(tmp_path / "in", np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]]), ["a", "a", "b"], 1)
    with pytest.raises(PassFailed, match="id 'a' is on two rows that are near-duplicates"):
        semantic_dedup(tmp_path / "in", tmp_path / "out")
    assert not (tmp_path / "out" / "duplicates.parquet").exists()


def test_the_plan_reads_a_page_of_each_file_not_its_row_group(tmp_path: Path) -> None:
    """The driver's look at each file's first embedding read (pre-buffered) the whole column
    chunk of its first row group: ~100 MB a file for 100,000 items of 256, 16 at once."""
    import subprocess
    import sys

    rows, dim = 100_000, 256
    vectors = np.random.default_rng(0).standard_normal((rows * dim,), dtype=np.float32)
    lists = pa.FixedSizeListArray.from_arrays(pa.array(vectors), dim).cast(pa.list_(pa.float32()))
    for name in ("a", "b"):  # one row group of 100 MB each
        pq.write_table(
            pa.table({"id": np.arange(rows), "embedding": lists}), tmp_path / f"{name}.parquet"
        )
    # the peak of this process's own memory (ru_maxrss keeps the forking parent's, pytest's)
    script = (
        "import re, sys\n"
        "from conveyor.dedup.plan import Columns, scan\n"
        "import pyarrow.compute\n"
        "def peak():\n"
        "    status = open('/proc/self/status').read()\n"
        "    return int(re.search(r'VmHWM:\\s+(\\d+)', status).group(1))\n"
        "base = peak()\n"
        "files = scan(sys.argv[1], Columns('id', 'embedding'), threads=2)\n"
        "print(len(files), files[0].rows, (peak() - base) // 1024)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    count, found_rows, grown_mb = out.stdout.split()
    assert (count, found_rows) == ("2", str(rows)), out.stderr
    assert int(grown_mb) < 150, f"the plan grew the driver by {grown_mb} MB for two files"
