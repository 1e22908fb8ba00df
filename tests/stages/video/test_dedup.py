"""Semantic deduplication of a written output: the clip kept, the marks it leaves in the metas
(and clears when they no longer hold), dedup.json and duplicates.parquet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conveyor.executors.batch import BatchExecutor
from conveyor.media.layout import OutputLayout
from conveyor.stages.video import dedup
from conveyor.stages.video.dedup import deduplicate, read_dedup_report
from conveyor.stages.video.writer import ClipWriter
from conveyor.tasks.video import Clip, Video, VideoMetadata, VideoTask, clip_id

DIM = 16
META = VideoMetadata(duration_s=10.0, fps=10.0, num_frames=100, width=64, height=48, codec="h264")


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def near(base: np.ndarray, rng: np.random.Generator, noise: float = 0.01) -> np.ndarray:
    return base + noise * rng.standard_normal(base.shape)


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
    group = [keeper, *sorted([ids[("a.mp4", 7)], ids[("b.mp4", 0)]])]
    assert result.clips == 5 and result.duplicates == 2
    assert result.groups == [group]
    assert meta(tmp_path, ids[("a.mp4", 7)])["duplicate_of"] == keeper
    # the most similar earlier clip: the kept one, or a7 (itself a duplicate of it)
    assert meta(tmp_path, ids[("b.mp4", 0)])["duplicate_of"] in {keeper, ids[("a.mp4", 7)]}
    for key in (("a.mp4", 5), ("a.mp4", 1), ("b.mp4", 3)):
        assert meta(tmp_path, ids[key])["duplicate_of"] is None
    report = read_dedup_report(OutputLayout(tmp_path))
    assert report is not None
    assert {k: report[k] for k in ("threshold", "clips", "duplicates", "groups")} == {
        "threshold": 0.95,
        "clips": 5,
        "duplicates": 2,
        "groups": [group],
    }
    assert report["order_by"] == ["source_video", "start_s"]
    table = pq.read_table(tmp_path / "duplicates.parquet").to_pylist()
    assert {r["id"]: r["duplicate_of"] for r in table} == {
        clip: meta(tmp_path, clip)["duplicate_of"] for clip in group[1:]
    }
    assert list(OutputLayout(tmp_path).tmp.iterdir()) == []
    # the clip tables say the same as the metas
    rows = pq.read_table(tmp_path / "metadata").to_pylist()
    assert {r["clip_id"]: r["duplicate_of"] for r in rows} == {
        clip: meta(tmp_path, clip)["duplicate_of"] for clip in ids.values()
    }


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        ("longest", "a5"),
        ("sharpest", "b0"),
        # the same mechanism as sharpest's, and first is every other test's
        pytest.param("first", "a0", marks=pytest.mark.slow),
        pytest.param("aesthetic", "a5", marks=pytest.mark.slow),
    ],
)
def test_keep_says_which_clip_of_a_set_stays(tmp_path: Path, keep: str, kept: str) -> None:
    rng = np.random.default_rng(4)
    a = unit(rng.standard_normal((1, DIM)))[0]
    # name -> (source, start, length, scores): all near-duplicates of one another
    clips = {
        "a0": ("a.mp4", 0, 1, {"quality_sharpness": 5.0}),
        "a5": ("a.mp4", 5, 3, {"quality_sharpness": 1.0, "aesthetic": 4.0}),
        "b0": ("b.mp4", 0, 2, {"quality_sharpness": 9.0}),  # no aesthetic score: after
    }
    writer, ids = ClipWriter(tmp_path), {}
    for source in ("a.mp4", "b.mp4"):
        made = []
        for name, (where, start, length, scores) in clips.items():
            if where != source:
                continue
            frames = (start * 10, (start + length) * 10)
            ids[name] = clip_id(source, *frames)
            span = (float(start), float(start + length))
            vector = near(a, rng).astype(np.float32)
            made.append(Clip(ids[name], source, span, frames, b"mp4", num_frames=10, scores=scores))
            made[-1].embedding = vector
        video = Video(f"/in/{source}", source, metadata=META, clips=made, last_chunk=True)
        writer.process(VideoTask(data=video))
    result = deduplicate(tmp_path, threshold=0.9, keep=keep)
    assert result.duplicates == 2 and result.groups is not None
    assert result.groups[0][0] == ids[kept]
    assert meta(tmp_path, ids[kept])["duplicate_of"] is None
    report = read_dedup_report(OutputLayout(tmp_path))
    assert report is not None and report["keep"] == keep
    with pytest.raises(ValueError, match="keep must be one of first, longest"):
        deduplicate(tmp_path, keep="best")


def test_keeping_by_a_score_an_older_output_lacks_is_a_clear_error(tmp_path: Path) -> None:
    from conveyor.dedup.plan import SemanticDedupError

    rng = np.random.default_rng(5)
    write_output(tmp_path, {("a.mp4", 0): unit(rng.standard_normal((1, DIM)))[0]})
    (path,) = (tmp_path / "embeddings").glob("*.parquet")
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["duration_s", "score_quality_sharpness"]), path)
    with pytest.raises(
        SemanticDedupError, match="earlier version wrote it, and keeping the longest"
    ):
        deduplicate(tmp_path, keep="longest")
    assert deduplicate(tmp_path).clips == 1  # the first, as it always could


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
        "keep": "first",
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
    result = deduplicate(tmp_path, threshold=0.95, n_clusters=4, executor=BatchExecutor())
    assert result.clips == 21 and result.duplicates == 17
    assert sorted(group[0] for group in result.groups) == sorted(
        ids[(f"v{c}.mp4", 0)] for c in range(4)
    )


def test_threshold_is_validated(tmp_path: Path) -> None:
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="threshold"):
            deduplicate(tmp_path, threshold=bad)


def test_groups_beyond_the_listed_number_stay_in_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(6)
    a = unit(rng.standard_normal((1, DIM)))[0]
    write_output(tmp_path, {("v.mp4", k): near(a, rng) for k in range(3)})
    monkeypatch.setattr(dedup, "GROUPS_LISTED", 1)
    result = deduplicate(tmp_path, threshold=0.9)
    assert result.duplicates == 2 and result.groups is None
    assert read_dedup_report(OutputLayout(tmp_path))["groups"] is None  # type: ignore[index]
    assert pq.read_table(tmp_path / "duplicates.parquet").num_rows == 2
