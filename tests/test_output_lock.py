"""One run at a time per output: a second run, or a second command, stops at once naming the
first, and never touches what the first is writing (``--overwrite`` included); a holder
killed with ``kill -9`` blocks nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conveyor import OutputInUse
from conveyor.cli import app
from conveyor.output_lock import LOCK_NAME, lock_path, output_lock

ROOT = Path(__file__).resolve().parents[1]

HOLDER = textwrap.dedent(
    """
    import sys
    from conveyor.output_lock import output_lock
    with output_lock(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.read()
    """
)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """``tmp_path/out`` with a file in it, its lock held by another process until the test
    ends."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("made by the run in progress")
    (out / "clips").mkdir()  # what --overwrite clears
    (out / "clips" / "c.mp4").write_bytes(b"a clip of the run in progress")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out), "--holder-flag"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    try:
        yield out, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_holder_is_refused_naming_the_first(
    held: tuple[Path, subprocess.Popen[str]],
) -> None:
    out, proc = held
    with pytest.raises(OutputInUse) as caught, output_lock(out):
        pass
    message = str(caught.value)
    assert message.startswith(f"{out} is being written by another run (pid {proc.pid} on ")
    assert "--holder-flag" in message and message.endswith("or write to another output")


def test_the_lock_goes_with_its_holder_even_killed(
    held: tuple[Path, subprocess.Popen[str]],
) -> None:
    out, proc = held
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (out / LOCK_NAME).exists()  # left by the killed run: it blocks nothing
    with output_lock(out):
        assert f'"pid": {os.getpid()}' in (out / LOCK_NAME).read_text()
    assert not (out / LOCK_NAME).exists()
    assert (out / "precious.txt").exists()


def test_nested_holds_in_one_process_are_one_hold(tmp_path: Path) -> None:
    """The command holds the lock and the pipeline it runs takes it again."""
    out = tmp_path / "new" / "out"
    with output_lock(out):
        with output_lock(str(out)):
            assert (out / LOCK_NAME).exists()
        assert (out / LOCK_NAME).exists()  # the outer hold is still on
        (out / "clip.mp4").write_bytes(b"x")
    assert not (out / LOCK_NAME).exists() and (out / "clip.mp4").exists()


def test_a_run_that_wrote_nothing_leaves_no_empty_output(tmp_path: Path) -> None:
    with output_lock(tmp_path / "never-written"):
        pass
    assert not (tmp_path / "never-written").exists()


def test_nothing_to_lock_on_a_store_or_where_a_file_is(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    assert lock_path("s3://bucket/out") is None
    assert lock_path(tmp_path / "a-file") is None
    assert lock_path(tmp_path / "a-file" / "below") is None
    with output_lock("s3://bucket/out"):
        pass


def _parquet(path: Path) -> Path:
    vectors = np.eye(4, dtype=np.float32)
    pq.write_table(pa.table({"id": list("abcd"), "embedding": vectors.tolist()}), path)
    return path


@pytest.mark.parametrize("command", ["video", "image", "text", "dedup"])
def test_each_command_on_a_held_output_exits_1_and_touches_nothing(
    held: tuple[Path, subprocess.Popen[str]], tmp_path: Path, command: str
) -> None:
    out, proc = held
    source = tmp_path / "in"
    source.mkdir()
    args = {
        "video": ["video", str(source), str(out), "--overwrite"],
        "image": ["image", str(source), str(out), "--overwrite"],
        "text": ["text", str(source), str(out)],
        "dedup": ["dedup", str(_parquet(tmp_path / "e.parquet")), str(out)],
    }[command]
    (source / "a.mp4").write_bytes(b"not read")
    (source / "a.jpg").write_bytes(b"not read")
    (source / "a.jsonl").write_text('{"text": "not read"}\n')
    result = CliRunner().invoke(app, [*args, "--no-live"] if command != "dedup" else args)
    assert result.exit_code == 1, result.output
    assert f"error: {out} is being written by another run (pid {proc.pid}" in result.output
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, "clips", "precious.txt"]
    assert (out / "clips" / "c.mp4").exists()


def test_the_pipelines_entry_points_take_it_too(
    held: tuple[Path, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """A user's script calling ``run_video`` or ``semantic_dedup`` is held back the same."""
    from conveyor.dedup import semantic_dedup
    from conveyor.pipelines.image import ImageConfig, run_image
    from conveyor.pipelines.text import TextConfig, run_text
    from conveyor.pipelines.video import VideoConfig, run_video

    out, _ = held
    source = tmp_path / "in"
    source.mkdir()
    for run in (
        lambda: run_video(VideoConfig(str(source), str(out))),
        lambda: run_image(ImageConfig(str(source), str(out))),
        lambda: run_text(TextConfig(str(source), str(out))),
        lambda: semantic_dedup(_parquet(tmp_path / "e.parquet"), out),
    ):
        with pytest.raises(OutputInUse, match="is being written by another run"):
            run()
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, "clips", "precious.txt"]
