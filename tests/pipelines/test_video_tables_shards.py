"""The video run's clip tables, WebDataset shards and summary end to end, on the local
backend and through ``conveyor video``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.media.layout import OutputLayout
from conveyor.media.table import clip_metas
from conveyor.pipelines.video import VideoConfig, build_video_pipeline, run_video
from conveyor.pipelines.video_summary import RunTally, build_summary
from conveyor.stages.video.reader import list_videos
from tests.pipelines.test_video import fast_config, fixed_command, local, make_inputs, records

runner = CliRunner()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_inputs(tmp_path_factory.mktemp("videos"))


def table_metas(output: Path) -> dict[str, dict[str, Any]]:
    """Every clip's meta, from the clip tables."""
    table = ds.dataset(output / "metadata", format="parquet").to_table()
    metas = clip_metas(table)
    assert len(metas) == len({m["clip_id"] for m in metas})  # a row per clip, once
    return {m["clip_id"]: m for m in metas}


def shard_samples(output: Path) -> dict[str, dict[str, Any]]:
    """Every sample of the shards, read with webdataset, by clip id (each once)."""
    import webdataset as wds

    urls = sorted(str(p) for p in (output / "shards").glob("*.tar"))
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    by_key = {s["__key__"]: s for s in samples}
    assert len(by_key) == len(samples)
    return by_key


def test_a_run_writes_clip_tables_and_shards_and_a_rerun_adds_nothing(
    inputs: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    config = fast_config(inputs, output, meta_json=False, shards="webdataset", shard_mb=0.05)
    report = run_video(config, local())
    assert report.result.completed
    found = records(output)
    made = {c for r in found.values() for c in r["clips"]}
    kept = {c for r in found.values() for c in r["kept"]}
    assert not (output / "metas").exists()
    metas = table_metas(output)
    assert set(metas) == made
    assert {c for c, m in metas.items() if m["filtered_by"] is None} == kept
    samples = shard_samples(output)
    assert set(samples) == kept and len(list((output / "shards").glob("*.tar"))) >= 2
    vectors = {
        r["clip_id"]: r["embedding"]
        for p in (output / "embeddings").glob("*.parquet")
        for r in pq.read_table(p).to_pylist()
    }
    for cid, sample in samples.items():
        assert sample["mp4"] == (output / "clips" / f"{cid}.mp4").read_bytes()
        assert json.loads(sample["json"]) == metas[cid]
        np.testing.assert_array_equal(
            np.load(io.BytesIO(sample["npy"])), np.asarray(vectors[cid], np.float32)
        )
    # the summary the stream added up is the one the records on disk give
    sources = list_videos(config.input, exclude=[config.output])
    tally = RunTally.from_disk(OutputLayout(output), sources, sources)
    from_disk = build_summary(config, tally, report.result, 1.0, report.summary["pipeline"])
    streamed = dict(report.summary)
    for summary in (from_disk, streamed):
        for key in ("wall_s", "video_hours_per_wall_hour", "finished_at"):
            summary.pop(key)
    assert streamed == from_disk

    shards = {p.name: p.read_bytes() for p in (output / "shards").iterdir()}
    tables = {p.name: p.read_bytes() for p in (output / "metadata").iterdir()}
    again = run_video(config, local())
    assert again.summary["videos"]["skipped_as_complete"] == 3
    assert again.summary["clips"] == report.summary["clips"]
    assert {p.name: p.read_bytes() for p in (output / "shards").iterdir()} == shards
    assert {p.name: p.read_bytes() for p in (output / "metadata").iterdir()} == tables


def test_shards_asked_for_later_hold_the_clips_written_before(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    run_video(fast_config(inputs, output, embed=False, limit=1), local())
    assert not (output / "shards").exists()
    later = fast_config(inputs, output, embed=False, shards="webdataset")
    report = run_video(later, local())  # one video done before, two now
    assert report.summary["videos"]["skipped_as_complete"] == 1
    kept = {c for r in records(output).values() for c in r["kept"]}
    samples = shard_samples(output)
    assert set(samples) == kept and all("npy" not in s for s in samples.values())
    metas = {m["clip_id"]: m for m in clip_metas(ds.dataset(output / "metadata").to_table())}
    for cid, sample in samples.items():
        assert json.loads(sample["json"]) == metas[cid]
        on_disk = json.loads((output / "metas" / f"{cid}.json").read_text())
        assert on_disk == metas[cid]  # --meta-json (the default): both, the same


def test_the_shard_writer_is_one_worker_after_the_clip_writer(tmp_path: Path) -> None:
    config = VideoConfig(str(tmp_path), "o", shards="webdataset", shard_mb=64)
    specs = build_video_pipeline(config).build()
    assert [s.name for s in specs[-2:]] == ["ClipWriter", "ShardWriter"]
    assert specs[-1].stage.num_workers == 1 and specs[-1].stage.shard_mb == 64
    assert "WebDataset shards of 64 MiB" in build_video_pipeline(config).description
    assert specs[-2].stage.meta_json is True  # the default
    plain = build_video_pipeline(VideoConfig(str(tmp_path), "o", meta_json=False)).build()
    assert plain[-1].name == "ClipWriter" and plain[-1].stage.meta_json is False


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"shards": "zip"}, "shards must be one of none, webdataset, got 'zip'"),
        ({"shard_mb": 0}, "shard_mb must be a number of MiB > 0, got 0"),
        ({"shard_mb": float("inf")}, "shard_mb must be a finite number, got inf"),
        ({"shard_mb": True}, "shard_mb must be a number, got True"),
        ({"shards": "webdataset", "output": "s3://bucket/out"}, "shards needs a local output"),
    ],
)
def test_bad_table_and_shard_options_are_clear_errors(
    changes: dict[str, Any], message: str
) -> None:
    values = {"input": "in", "output": "out", **changes}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        VideoConfig(**values)


def test_the_meta_json_option_is_an_output_option(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    run_video(fast_config(inputs, output, embed=False, limit=1), local())
    from conveyor.pipelines.video import ConfigMismatch

    with pytest.raises(ConfigMismatch, match="meta_json: True -> False"):
        run_video(fast_config(inputs, output, embed=False, limit=1, meta_json=False), local())


# -- the command -------------------------------------------------------------------------
def test_the_command_writes_shards_without_metas(inputs: Path, tmp_path: Path) -> None:
    output = tmp_path / "out"
    args = [*fixed_command(inputs, output, "3"), "--no-embed", "--no-tags", "--no-live"]
    options = ["--no-meta-json", "--shards", "webdataset", "--shard-mb", "0.05"]
    result = runner.invoke(app, [*args, *options])
    assert result.exit_code == 0, result.output
    assert "WebDataset shards of 0.05 MiB" in result.output
    assert not (output / "metas").exists()
    kept = {c for r in records(output).values() for c in r["kept"]}
    assert set(shard_samples(output)) == kept
    assert json.loads((output / ".conveyor" / "config.json").read_text())["meta_json"] is False
    again = runner.invoke(app, [*args, *options])
    assert again.exit_code == 0 and "3 already complete" in again.output
    assert set(shard_samples(output)) == kept


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--shards", "zip"], "zip"),
        (["--shards", "webdataset", "--shard-mb", "0"], "error: --shard-mb must be a number of"),
        (["--shards", "webdataset", "--shard-mb", "-1"], "error: --shard-mb must be a number"),
        (["--shard-mb", "1"], "error: --shard-mb has no effect without --shards webdataset"),
        (["--shards", "webdataset"], "error: --shards needs a local output"),
    ],
)
def test_bad_table_and_shard_options_exit_2(
    extra: list[str], message: str, inputs: Path, tmp_path: Path
) -> None:
    output = "s3://bucket/out" if extra == ["--shards", "webdataset"] else str(tmp_path / "o")
    result = runner.invoke(app, ["video", str(inputs), output, *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output
    if message.startswith("error:"):
        assert len(result.output.strip().splitlines()) == 1  # one line
    assert not (tmp_path / "o").exists()


def test_a_shards_folder_with_a_tar_missing_its_index_is_refused_before_the_run(
    inputs: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    (output / "shards").mkdir(parents=True)
    (output / "shards" / "shard-000000.tar").write_bytes(b"")
    args = [*fixed_command(inputs, output, "3"), "--no-embed", "--no-tags", "--no-live"]
    result = runner.invoke(app, [*args, "--shards", "webdataset"])
    assert result.exit_code == 2, result.output
    assert "shard-000000.tar has no index" in result.output
    assert not (output / "videos").exists()  # refused before any work
    assert OutputLayout(output).read_record("a.mp4") is None


@pytest.mark.slow
def test_shards_filled_at_the_end_carry_no_dedup_mark(tmp_path: Path) -> None:
    """Videos complete before a run went into its shards after its dedup had marked their
    metas: their samples said ``duplicate_of``, unlike every other's (docs/video.md)."""
    import shutil

    source = make_inputs(tmp_path / "in")
    shutil.copy(source / "a.mp4", source / "copy.mp4")  # every clip of it a duplicate
    output = tmp_path / "out"
    run_video(fast_config(source, output), local())
    report = run_video(fast_config(source, output, shards="webdataset", dedup=True), local())
    assert report.summary["clips"]["duplicates"] > 0
    samples = shard_samples(output)
    assert samples and all(json.loads(s["json"])["duplicate_of"] is None for s in samples.values())
    marked = [m for m in table_metas(output).values() if m["duplicate_of"] is not None]
    assert len(marked) == report.summary["clips"]["duplicates"]
