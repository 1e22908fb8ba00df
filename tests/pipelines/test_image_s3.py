"""``conveyor image`` reading from an S3 bucket (moto's server on 127.0.0.1): image files, an
img2dataset tar shard read by byte ranges, a Parquet of image bytes, and a glob of URLs."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.samples.image import encode, render_image, write_folder, write_shards

runner = CliRunner()
FAST = ["--no-live", "--no-embed", "--no-tags", "--no-nsfw", "--no-report"]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3-images")
    write_folder(root / "files", 3, sizes=[(100, 80)])
    (root / "files" / "broken.jpg").write_bytes(b"not an image")
    write_shards(root / "shards", 4, 4, seed=20, sizes=[(100, 80)])
    table = pa.table({"image": [encode(render_image(30 + i, 100, 80)) for i in range(2)]})
    (root / "table").mkdir()
    pq.write_table(table, root / "table" / "rows.parquet")
    return root


def test_a_bucket_of_files_shards_and_a_table(bucket: str, images: Path, tmp_path: Path) -> None:
    fsspec.filesystem("s3").put(f"{images}/", f"{bucket[5:]}/in/", recursive=True)
    output = tmp_path / "out"
    result = runner.invoke(app, ["image", f"{bucket}/in", str(output), *FAST])
    assert result.exit_code == 0, result.output
    summary = json.loads((output / "summary.json").read_text())
    assert summary["images"]["in"] == 3 + 1 + 4 + 2 and summary["images"]["in_shards"] == 9
    assert [f["key"] for f in summary["failures"]] == ["files/broken.jpg"]
    rows = pq.read_table(output / "metadata").to_pylist()
    captions = {r["key"]: r["caption"] for r in rows}
    assert captions["shards/00000.tar/000000002"] == "an abstract pattern 2"
    assert "table/rows.parquet#1" in captions


def test_a_glob_of_urls(bucket: str, images: Path, tmp_path: Path) -> None:
    fsspec.filesystem("s3").put(f"{images}/", f"{bucket[5:]}/in/", recursive=True)
    output = tmp_path / "out"
    result = runner.invoke(app, ["image", f"{bucket}/in/files/img-*.jpg", str(output), *FAST])
    assert result.exit_code == 0, result.output
    assert json.loads((output / "summary.json").read_text())["images"]["in"] == 3
    missing = runner.invoke(app, ["image", f"{bucket}/in/*.png", str(output), *FAST])
    assert missing.exit_code == 2 and "matches no file" in missing.output
