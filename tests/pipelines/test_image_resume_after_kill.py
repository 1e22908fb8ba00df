"""``conveyor image`` killed with ``kill -9`` at random moments and run again writes every
image exactly once: the metadata and the shards are those of a run that went through."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from conveyor.samples.image import write_folder, write_shards
from tests.pipelines.test_resume_after_kill import kill_when

OPTIONS = [
    "--no-live", "--no-nsfw", "--no-tags", "--images-per-task", "2", "--shard-mb", "0.02",
    "--dedup", "phash", "--no-report",
]  # fmt: skip


def records(output: Path) -> int:
    return len(list((output / ".conveyor" / "parts").glob("part-*.json")))


def run(source: Path, output: Path, kill_at: tuple[int, float] | None = None) -> str:
    """The command; with ``kill_at = (records, delay)``, SIGKILL it ``delay`` seconds after
    that many parts are complete (a moment mid-run however loaded the machine)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "image", str(source), str(output), *OPTIONS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    if kill_at is None:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (out + err)[-3000:]
        return out
    count, delay = kill_at
    kill_when(proc, lambda: records(output) >= count, delay)
    return ""


def rows(output: Path) -> dict[str, dict[str, Any]]:
    table = ds.dataset(output / "metadata", format="parquet").to_table()
    found = table.to_pylist()
    assert len(found) == len({r["key"] for r in found})
    return {r["key"]: r for r in found}


def shard_ids(output: Path) -> list[str]:
    ids = []
    for tar in sorted((output / "shards").glob("*.tar")):
        with tarfile.open(tar) as shard:
            ids += [m.name.split(".")[0] for m in shard if m.name.endswith(".json")]
    return ids


@pytest.mark.slow
def test_killed_at_random_moments_and_resumed_every_image_is_written_once(
    tmp_path: Path,
) -> None:
    source = tmp_path / "in"
    write_folder(source, 16, sizes=[(96, 72), (72, 96)])
    write_shards(source / "shards", 12, 5, seed=50, sizes=[(96, 72)])
    (source / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    reference = tmp_path / "reference"
    run(source, reference)
    expected, expected_ids = rows(reference), shard_ids(reference)
    assert len(expected) == 29 and len(expected_ids) == len(set(expected_ids)) == 28

    resumed = tmp_path / "resumed"
    rng = random.Random(int(os.environ.get("CONVEYOR_TEST_SEED", "5")))
    # at most 9 of the 16 parts done before a kill is asked for: the parts left take longer
    # than the kill does to land even on a loaded machine (with up to 13 done and 0.3 s, a
    # run at a load of 10 on 2 cores finished every part before its kill)
    for count in sorted(rng.sample(range(1, 10), 2)):
        run(source, resumed, kill_at=(count, rng.uniform(0.0, 0.15)))
    assert not (resumed / "summary.json").exists()  # every kill landed mid-run
    last = run(source, resumed)
    summary = json.loads((resumed / "summary.json").read_text())
    assert 0 < summary["parts"]["skipped_as_complete"] < summary["parts"]["in"], last
    assert summary["images"]["in"] == 29 and summary["images"]["in_shards"] == 28
    assert shard_ids(resumed) == expected_ids  # every kept image once, in input order
    for key, row in rows(resumed).items():
        assert row == expected[key], key
    assert not list((resumed / ".conveyor" / "staging").glob("*.tar"))
