"""``conveyor dedup``: planted duplicates through the command, and one clear line (exit 2)
for a bad input or option."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conveyor.cli import app

runner = CliRunner()


def run(*args: str) -> object:
    return runner.invoke(app, ["dedup", *args], env={"COLUMNS": "250"})


def write(path: Path, ids: list[str], vectors: np.ndarray, when: list[float]) -> None:
    flat = pa.array(vectors.astype(np.float32).reshape(-1))
    embedding = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
    pq.write_table(pa.table({"key": ids, "vec": embedding, "when": when}), path)


def test_planted_copies_through_the_command(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((40, 8))
    copies = base[:10] + 0.001 * rng.standard_normal((10, 8))
    (tmp_path / "a").mkdir()
    write(tmp_path / "a" / "x.parquet", [f"b{i}" for i in range(40)], base, [1.0] * 40)
    # the copies come later in input order but earlier by --order-by: they are kept
    write(tmp_path / "y.parquet", [f"c{i}" for i in range(10)], copies, [0.0] * 10)
    args = ["--id-column", "key", "--embedding-column", "vec", "--order-by", "when"]
    result = run(str(tmp_path / "a"), str(tmp_path / "y.parquet"), str(tmp_path / "out"), *args)
    assert result.exit_code == 0, result.output
    assert "50 items" in result.output and "10 duplicates at >= 0.95" in result.output
    marks = pq.read_table(tmp_path / "out" / "duplicates.parquet").to_pylist()
    assert {m["id"]: m["duplicate_of"] for m in marks} == {f"b{i}": f"c{i}" for i in range(10)}
    assert json.loads((tmp_path / "out" / "dedup.json").read_text())["order_by"] == ["when"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["only-one"], "give INPUT... and OUTPUT"),
        (["{in}", "{out}", "--threshold", "1.5"], "--threshold must be in (0, 1]"),
        (["{in}", "{out}", "--address", "127.0.0.1:1"], "--address needs --backend ray"),
        (
            ["{in}", "{out}", "--backend", "ray", "--address", "127.0.0.1:1", "--cpus", "1"],
            "--cpus declares a private cluster's CPUs",
        ),
        (
            ["{in}", "{out}", "--backend", "ray", "--address", "127.0.0.1:1"],
            "no Ray cluster answers at 127.0.0.1:1",
        ),
        (["{in}", "{out}", "--id-column", "nope"], "has no column 'nope'"),
        (["{tmp}/missing", "{out}"], "does not exist"),
        # an output that is a file (the input itself here) failed in a pass, naming nothing
        (["{in}", "{in}"], "in.parquet is a file, not a folder"),
    ],
)
def test_bad_input_or_option_exits_2_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    write(tmp_path / "in.parquet", ["a"], np.ones((1, 4)), [0.0])
    given = [
        a.format(**{"in": tmp_path / "in.parquet", "out": tmp_path / "out", "tmp": tmp_path})
        for a in args
    ]
    result = run(*given, "--embedding-column", "vec")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_a_failed_pass_exits_1_naming_the_file(tmp_path: Path) -> None:
    ragged = pa.table({"id": ["a", "b"], "embedding": [[1.0, 0.0], [1.0]]})
    pq.write_table(ragged, tmp_path / "ragged.parquet")
    result = run(str(tmp_path / "ragged.parquet"), str(tmp_path / "out"))
    assert result.exit_code == 1
    assert "ragged.parquet" in result.output and "embeddings of 2 and of 1" in result.output


def test_items_left_out_are_said_apart_by_why(tmp_path: Path) -> None:
    """A missing embedding and one holding NaN are both left out; the line says which is
    which, since a NaN usually means a broken model upstream."""
    nan = float("nan")
    vectors = [[1.0, 0.0], None, [nan, 1.0], [nan, nan], [1.0, 0.001], [0.0, 1.0]]
    pq.write_table(pa.table({"id": list("abcdef"), "embedding": vectors}), tmp_path / "x.parquet")
    result = run(str(tmp_path / "x.parquet"), str(tmp_path / "out"), "--threshold", "0.99")
    assert result.exit_code == 0, result.output
    assert (
        "3 items (1 without an embedding and 2 holding NaN or infinite values left out)"
        in result.output
    )
    assert "1 duplicates at >= 0.99" in result.output
