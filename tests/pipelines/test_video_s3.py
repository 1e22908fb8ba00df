"""The video pipeline with its input and its output in an S3 bucket (moto's server on
127.0.0.1): listing, probing and decoding from the bucket, every output written there through
a temporary object, a bad file named with its reason, and a second run (the command) that
skips what the first finished."""

from __future__ import annotations

import io
import json
from pathlib import Path

import av
import fsspec
import pytest
from typer.testing import CliRunner

from conveyor.backends import LocalBackend
from conveyor.cli import app
from conveyor.executors import StreamingExecutor
from conveyor.pipelines.video import VideoConfig, run_video
from conveyor.samples.video import Segment, write_bad_file, write_video
from conveyor.storage import ObjectPath

runner = CliRunner()
OPTIONS = ["--splitter", "fixed", "--clip-len", "2", "--no-quality", "--no-tags", "--dedup"]


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small good videos (one in a sub-folder) and a truncated one, on local disk."""
    root = tmp_path_factory.mktemp("s3-videos")
    write_video(root / "a.mp4", [Segment("pan", 2, 1), Segment("bars", 2, 2)], width=96, height=64)
    write_video(root / "sub" / "b.mkv", [Segment("rings", 3, 3)], width=96, height=64, fps=12)
    write_bad_file(root / "broken.mp4", "truncated")
    return root


@pytest.mark.slow  # 20-36 s on 2 cores, the longest of `make test`: it runs in test-all (CI)
def test_a_run_from_a_bucket_into_a_bucket_then_a_resumed_one(bucket: str, videos: Path) -> None:
    fs = fsspec.filesystem("s3")
    fs.put(f"{videos}/", f"{bucket[5:]}/in/", recursive=True)
    source, output = f"{bucket}/in", f"{bucket}/out"
    config = VideoConfig(
        source, output, splitter="fixed", clip_len_s=2.0, quality=False, tags=False, dedup=True
    )
    report = run_video(config, StreamingExecutor(LocalBackend(num_cpus=2)))

    summary = report.summary
    assert report.summary_path == ObjectPath(f"{output}/summary.json")
    assert summary["videos"]["in"] == 3 and summary["videos"]["ok"] == 2, summary["failures"]
    assert [(f["video"], "truncated" in f["reason"]) for f in summary["failures"]] == [
        ("broken.mp4", True)
    ]
    out = fs._strip_protocol(output)
    keys = {k[len(out) + 1 :] for k in fs.find(out)}
    clips = sorted(k for k in keys if k.startswith("clips/"))
    assert len(clips) == summary["clips"]["kept"] > 0
    assert {"summary.json", "dedup.json", "videos/a.mp4.json", "videos/sub/b.mkv.json"} <= keys
    assert not any(
        k.startswith(".conveyor/tmp/") or k.startswith(".conveyor/staging/") for k in keys
    )
    assert not any(k.rsplit("/", 1)[-1].startswith(".") for k in keys)  # no temporary left
    with av.open(io.BytesIO(fs.cat_file(f"{out}/{clips[0]}"))) as container:
        assert sum(1 for _ in container.decode(video=0)) > 0
    record = json.loads(fs.cat_file(f"{out}/videos/a.mp4.json"))
    assert record["path"] == f"{source}/a.mp4" and record["status"] == "ok"
    assert record["source"]["size_bytes"] == (videos / "a.mp4").stat().st_size
    meta = json.loads(fs.cat_file(f"{out}/metas/{record['kept'][0]}.json"))
    assert meta["clip_location"] == f"clips/{record['kept'][0]}.mp4" and meta["has_embedding"]
    with fs.open(f"{out}/{record['embeddings']}", "rb") as stream:
        import pyarrow.parquet as pq

        assert pq.read_table(stream).column("clip_id").to_pylist() == record["kept"]

    again = runner.invoke(app, ["video", source, output, *OPTIONS, "--no-live"])
    assert again.exit_code == 0, again.output
    assert "3 already complete" in again.output
    summary = json.loads(fs.cat_file(f"{out}/summary.json"))
    assert summary["videos"]["skipped_as_complete"] == 3
    assert summary["videos"]["done_this_run"] == 0


def test_the_command_names_what_is_wrong_with_a_url(s3_env: str) -> None:
    result = runner.invoke(app, ["video", "s3://no-such-bucket-y/in", "s3://x/out"])
    assert result.exit_code == 2
    assert "INPUT 's3://no-such-bucket-y/in'" in result.output and "bucket" in result.output
