"""A text curation run whose driver is killed with ``kill -9`` at random moments and resumed
with its journal writes every output exactly once, as an uninterrupted run does."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from conveyor.demos.text import generate_sample_data

DRIVER = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path

    from conveyor import Pipeline, processing_stage
    from conveyor.backends import LocalBackend
    from conveyor.demos.text import FIELDS
    from conveyor.executors import StreamingExecutor
    from conveyor.stages.text import (
        DocumentAnnotator, HeuristicFilter, JsonlReaderStage, ParquetWriter,
    )
    from conveyor.tasks import FileGroupTask

    @processing_stage(name="Pace")
    def pace(batch):
        time.sleep(0.1)  # the rest of a run outlasts a kill's delay on any machine
        return batch

    source, output = Path(sys.argv[1]), Path(sys.argv[2])
    tasks = [FileGroupTask(data=[str(p)]) for p in sorted(source.glob("docs-*.jsonl"))]
    pipeline = Pipeline("resume", [
        JsonlReaderStage(fields=FIELDS),
        HeuristicFilter(drop_empty=False),
        pace.with_(num_workers=1),
        DocumentAnnotator(),
        ParquetWriter(output / "parquet"),
    ])
    result = pipeline.run(
        StreamingExecutor(LocalBackend(num_cpus=2)), tasks, journal=output / "journal"
    )
    print("skipped", result.counts["skipped"], "inputs", result.counts["inputs"], flush=True)
    assert result.completed and result.ok, result.failures
    """
)


def journaled(output: Path) -> int:
    try:
        return max(0, len((output / "journal").read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def drive(source: Path, output: Path, kill_at: tuple[int, float] | None = None) -> str:
    """Run the driver; with ``kill_at = (records, delay)``, SIGKILL it ``delay`` seconds
    after its journal holds ``records`` records (a moment mid-run however loaded the
    machine is), and wait for its process tree to go."""
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(source), str(output)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    if kill_at is None:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        return out
    records, delay = kill_at
    kill_when(proc, lambda: journaled(output) >= records, delay)
    return ""


def kill_when(proc: subprocess.Popen[str], ready: Callable[[], bool], delay: float) -> None:
    """SIGKILL ``proc`` ``delay`` seconds after ``ready()`` holds, and wait for its process
    tree to go."""
    deadline = time.monotonic() + 180
    while not ready():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(delay)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(children, timeout=20)
    for p in alive:  # the orphan tests say they go; here they must not skew the next run
        p.kill()


def rows(output: Path) -> list[tuple[str, str]]:
    found = []
    for path in (output / "parquet").glob("*.parquet"):
        table = pq.read_table(path, columns=["id", "content_hash"])
        ids, hashes = table.column("id").to_pylist(), table.column("content_hash").to_pylist()
        found.extend(zip(ids, hashes, strict=True))
    return sorted(found)


@pytest.mark.slow
def test_killed_at_random_moments_and_resumed_every_output_is_written_once(
    tmp_path: Path,
) -> None:
    source = tmp_path / "in"
    generate_sample_data(source, files=24, docs_per_file=300, seed=3)
    reference = tmp_path / "reference"
    assert "skipped 0 inputs 24" in drive(source, reference)
    expected = rows(reference)
    assert len(expected) == len(set(expected)) > 0

    resumed = tmp_path / "resumed"
    rng = random.Random(int(os.environ.get("CONVEYOR_TEST_SEED", "9")))
    for records in sorted(rng.sample(range(1, 16), 3)):
        drive(source, resumed, kill_at=(records, rng.uniform(0.0, 0.2)))
    last = drive(source, resumed)
    skipped = int(last.split()[1])
    assert 0 < skipped < 24, last  # the kills landed mid-run, and their work was kept
    assert rows(resumed) == expected  # every document once: none lost, none twice
    visible = {p.name for p in (resumed / "parquet").iterdir() if not p.name.startswith(".")}
    assert visible == {p.name for p in (reference / "parquet").iterdir()}
    lines = (resumed / "journal").read_text().splitlines()
    assert len(lines) == 1 + 24  # a header, then one record per finished source
