"""Semantic deduplication: similar pairs, transitive groups (exact and k-means), and the
marks it leaves in the metas of a written output."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from conveyor.stages.video import dedup
from conveyor.stages.video.dedup import (
    SemanticDedup,
    deduplicate,
    find_duplicate_groups,
    read_dedup_report,
    similar_pairs,
)
from conveyor.stages.video.layout import OutputLayout
from conveyor.stages.video.writer import ClipWriter
from conveyor.tasks.video import Clip, Video, VideoMetadata, VideoTask, clip_id

DIM = 16
META = VideoMetadata(duration_s=10.0, fps=10.0, num_frames=100, width=64, height=48, codec="h264")


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def near(base: np.ndarray, rng: np.random.Generator, noise: float = 0.01) -> np.ndarray:
    return base + noise * rng.standard_normal(base.shape)


# -- pairs and groups ------------------------------------------------------------------------
def test_similar_pairs_in_blocks_agree_with_every_pair() -> None:
    rng = np.random.default_rng(0)
    matrix = unit(rng.standard_normal((37, 3)))  # few dimensions: many similar pairs
    brute = [(i, j) for i, j in combinations(range(37), 2) if float(matrix[i] @ matrix[j]) >= 0.9]
    assert brute
    for block in (1, 5, 2048):
        assert sorted(similar_pairs(matrix, 0.9, block=block)) == brute


def test_similar_pairs_threshold_is_inclusive() -> None:
    matrix = unit(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    assert similar_pairs(matrix, 1.0) == [(0, 1)]
    assert similar_pairs(matrix, 0.0) == [(0, 1), (0, 2), (1, 2)]


def test_groups_are_transitive() -> None:
    angles = np.radians([0.0, 10.0, 20.0, 90.0])  # 0~1 and 1~2 at cos 10 deg, not 0~2
    matrix = unit(np.stack([np.cos(angles), np.sin(angles)], axis=1))
    threshold = float(np.cos(np.radians(15.0)))
    assert similar_pairs(matrix, threshold) == [(0, 1), (1, 2)]
    assert find_duplicate_groups(["a", "b", "c", "d"], matrix, threshold) == [[0, 1, 2]]


def test_no_clips_no_groups() -> None:
    assert find_duplicate_groups([], np.zeros((0, 0), np.float32), 0.9) == []


def test_the_k_means_path_finds_the_same_groups_in_tight_clusters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(1)
    centres = unit(rng.standard_normal((4, DIM)))
    sizes = [6, 5, 5, 5]  # 21 rows; exact_limit 20 -> clusters of 5 -> k = 4
    rows = [near(centres[c], rng) for c, size in enumerate(sizes) for _ in range(size)]
    order = rng.permutation(len(rows))
    matrix = unit(np.stack(rows)[order])
    ids = [f"c{i}" for i in range(len(rows))]
    exact = find_duplicate_groups(ids, matrix, 0.95)
    assert sorted(len(g) for g in exact) == [5, 5, 5, 6]

    calls: list[int] = []
    clusters = dedup._clusters

    def spy(m: np.ndarray, size: int, seed: int = 0) -> list[np.ndarray]:
        calls.append(size)
        return clusters(m, size, seed)

    monkeypatch.setattr(dedup, "_clusters", spy)
    approximate = find_duplicate_groups(ids, matrix, 0.95, exact_limit=20)
    assert calls == [5]
    assert sorted(approximate) == sorted(exact)


def test_the_k_means_path_only_misses_pairs_never_invents_them() -> None:
    rng = np.random.default_rng(2)
    centres = unit(rng.standard_normal((3, DIM)))
    matrix = unit(np.stack([near(centres[i % 3], rng, 0.05) for i in range(30)]))
    ids = [str(i) for i in range(30)]
    exact = {frozenset(g) for g in find_duplicate_groups(ids, matrix, 0.9)}
    for group in find_duplicate_groups(ids, matrix, 0.9, exact_limit=8):
        assert any(set(group) <= big for big in exact)


def test_a_tiny_exact_limit_still_groups() -> None:
    rng = np.random.default_rng(7)
    base = unit(rng.standard_normal((1, DIM)))[0]
    matrix = unit(np.stack([near(base, rng) for _ in range(3)] + [-base, base[::-1]]))
    ids = [str(i) for i in range(5)]
    groups = find_duplicate_groups(ids, matrix, 0.95, exact_limit=3)  # k-means: may miss
    assert all(set(group) <= {0, 1, 2} for group in groups)


# -- over a written output -------------------------------------------------------------------
def write_output(
    root: Path, vectors: dict[tuple[str, int], np.ndarray]
) -> dict[tuple[str, int], str]:
    """Write one single-chunk video per source with a kept clip at each start (s): returns
    the clip ids."""
    writer = ClipWriter(root)
    ids: dict[tuple[str, int], str] = {}
    sources = sorted({source for source, _ in vectors})
    for source in sources:
        clips = []
        for (name, start), vector in sorted(vectors.items()):
            if name != source:
                continue
            frames = (start * 10, start * 10 + 10)
            cid = clip_id(name, *frames)
            ids[(name, start)] = cid
            clips.append(
                Clip(
                    cid,
                    name,
                    (float(start), start + 1.0),
                    frames,
                    encoded=b"mp4",
                    num_frames=10,
                    embedding=vector.astype(np.float32),
                )
            )
        video = Video(f"/in/{source}", source, metadata=META, clips=clips, last_chunk=True)
        writer.process(VideoTask(data=video))
    return ids


def meta(root: Path, cid: str) -> dict:  # type: ignore[type-arg]
    return json.loads((root / "metas" / f"{cid}.json").read_text())


def test_duplicates_are_marked_against_the_first_clip(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    a, b = unit(rng.standard_normal((2, DIM)))
    ids = write_output(
        tmp_path,
        {
            ("b.mp4", 0): near(a, rng),
            ("a.mp4", 5): near(a, rng),  # the first by source video: the one kept
            ("a.mp4", 7): near(a, rng),
            ("a.mp4", 1): near(b, rng),
            ("b.mp4", 3): -b,
        },
    )
    result = deduplicate(tmp_path, threshold=0.95)

    keeper = ids[("a.mp4", 5)]
    assert result.clips == 5 and result.duplicates == 2
    assert result.groups == [[keeper, ids[("a.mp4", 7)], ids[("b.mp4", 0)]]]
    assert meta(tmp_path, ids[("a.mp4", 7)])["duplicate_of"] == keeper
    assert meta(tmp_path, ids[("b.mp4", 0)])["duplicate_of"] == keeper
    for key in (("a.mp4", 5), ("a.mp4", 1), ("b.mp4", 3)):
        assert meta(tmp_path, ids[key])["duplicate_of"] is None
    report = read_dedup_report(OutputLayout(tmp_path))
    assert report == {
        "threshold": 0.95,
        "clips": 5,
        "duplicates": 2,
        "groups": [[keeper, ids[("a.mp4", 7)], ids[("b.mp4", 0)]]],
    }
    assert list(OutputLayout(tmp_path).tmp.iterdir()) == []


def test_a_later_run_clears_marks_that_no_longer_hold(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    a, b = unit(rng.standard_normal((2, DIM)))
    ids = write_output(tmp_path, {("v.mp4", 0): near(a, rng), ("v.mp4", 2): near(a, rng)})
    assert deduplicate(tmp_path).duplicates == 1
    assert meta(tmp_path, ids[("v.mp4", 2)])["duplicate_of"] == ids[("v.mp4", 0)]

    # the video is done again and its second clip now shows something else
    OutputLayout(tmp_path).reset("v.mp4")
    ids = write_output(tmp_path, {("v.mp4", 0): near(a, rng), ("v.mp4", 2): b})
    stale = meta(tmp_path, ids[("v.mp4", 2)])
    stale["duplicate_of"] = ids[("v.mp4", 0)]  # as if the reset had missed it
    OutputLayout(tmp_path).write_json(tmp_path / "metas" / f"{ids[('v.mp4', 2)]}.json", stale)

    result = deduplicate(tmp_path)
    assert result.duplicates == 0 and result.groups == []
    assert meta(tmp_path, ids[("v.mp4", 2)])["duplicate_of"] is None
    assert read_dedup_report(OutputLayout(tmp_path))["duplicates"] == 0  # type: ignore[index]


def test_an_output_without_embeddings(tmp_path: Path) -> None:
    assert read_dedup_report(OutputLayout(tmp_path)) is None
    result = deduplicate(tmp_path)
    assert (result.clips, result.duplicates, result.groups) == (0, 0, [])
    assert read_dedup_report(OutputLayout(tmp_path)) == {
        "threshold": 0.95,
        "clips": 0,
        "duplicates": 0,
        "groups": [],
    }


def test_the_k_means_path_over_an_output(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    centres = unit(rng.standard_normal((4, DIM)))
    vectors = {
        (f"v{c}.mp4", k): near(centres[c], rng)
        for c, size in enumerate([6, 5, 5, 5])
        for k in range(size)
    }
    ids = write_output(tmp_path, vectors)
    result = deduplicate(tmp_path, threshold=0.95, exact_limit=20)
    assert result.clips == 21 and result.duplicates == 17
    assert sorted(group[0] for group in result.groups) == sorted(
        ids[(f"v{c}.mp4", 0)] for c in range(4)
    )


def test_threshold_is_validated(tmp_path: Path) -> None:
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="threshold"):
            deduplicate(tmp_path, threshold=bad)
        with pytest.raises(ValueError, match="threshold"):
            SemanticDedup(tmp_path, threshold=bad)


def test_the_stage_runs_deduplicate(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    a = unit(rng.standard_normal((1, DIM)))[0]
    write_output(tmp_path, {("v.mp4", 0): near(a, rng), ("v.mp4", 3): near(a, rng)})
    result = SemanticDedup(tmp_path, threshold=0.9).process(None)
    assert result.duplicates == 1 and result.clips == 2
