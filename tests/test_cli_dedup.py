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
KEY = ("--id-column", "key")


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
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "dedup.json",
        "duplicates.parquet",
    ]  # no empty .conveyor/ left where the work was


def test_a_dash_keeps_the_largest_through_the_command(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((20, 8))
    copies = base[:5] + 0.001 * rng.standard_normal((5, 8))
    vectors = np.concatenate([base, copies])
    ids = [f"b{i}" for i in range(20)] + [f"c{i}" for i in range(5)]
    write(tmp_path / "x.parquet", ids, vectors, [0.0] * 20 + [1.0] * 5)
    # the value's dash is not read as an option (--order-by=-when is plain click)
    order = ["--order-by", "-when"]
    out = tmp_path / "out"
    result = run(str(tmp_path / "x.parquet"), str(out), *KEY, "--embedding-column", "vec", *order)
    assert result.exit_code == 0, result.output
    marks = pq.read_table(out / "duplicates.parquet").to_pylist()
    assert {m["id"]: m["duplicate_of"] for m in marks} == {f"b{i}": f"c{i}" for i in range(5)}


def test_columns_named_like_internal_ones_through_the_command(tmp_path: Path) -> None:
    """--order-by cluster and --id-column pos failed after three passes with Arrow's
    "Multiple matches for FieldRef" and a schema dump."""
    v = [1.0, 0.0, 0.0, 0.0]
    embedding = pa.array([v, v, [0.0, 1.0, 0.0, 0.0], v], pa.list_(pa.float32()))
    table = pa.table({"pos": [10, 11, 12, 13], "embedding": embedding, "cluster": [9, 3, 1, 0]})
    pq.write_table(table, tmp_path / "in.parquet")
    args = ["--id-column", "pos", "--order-by", "cluster"]
    result = run(str(tmp_path / "in.parquet"), str(tmp_path / "out"), *args)
    assert result.exit_code == 0, result.output
    marks = pq.read_table(tmp_path / "out" / "duplicates.parquet").to_pylist()
    assert {m["id"]: m["duplicate_of"] for m in marks} == {10: 13, 11: 13}


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
        (
            ["{in}", "{out}", "--id-column", "nope"],
            "has no column 'nope' (it has key, vec, when); name yours with --id-column, "
            "--embedding-column, --order-by",
        ),
        # the checks before any pass (with --id-column key: the files' id column)
        (["{in}", "{out}", "--id-column", "vec"], "column 'vec' is both the embedding and the id"),
        (["{in}", "{out}", *KEY, "--order-by", "vec"], "'vec' is both the embedding and the keep"),
        (["{in}", "{out}", "--id-column", "when"], "column 'when' is double; ids must be integers"),
        (["{tmp}/structs.parquet", "{out}", *KEY], "column 'key' is struct<a: int64>; ids must"),
        (
            ["{tmp}/lists.parquet", "{out}", *KEY, "--order-by", "tags"],
            "column 'tags' is list<element: int64>; the keep order needs a number, string",
        ),
        (["{tmp}/nulls.parquet", "{out}", *KEY], "nulls.parquet': column 'key' is null on row 1"),
        (
            ["{in}", "{tmp}/eight.parquet", "{out}", *KEY],
            "eight.parquet': column 'vec' holds embeddings of 8 numbers, '",
        ),
        (["{tmp}/missing", "{out}"], "does not exist"),
        # an output that is a file (the input itself here) failed in a pass, naming nothing
        (["{in}", "{in}"], "in.parquet is a file, not a folder"),
    ],
)
def test_bad_input_or_option_exits_2_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    write(tmp_path / "in.parquet", ["a"], np.ones((1, 4)), [0.0])
    write(tmp_path / "eight.parquet", ["b"], np.ones((1, 8)), [0.0])
    write(tmp_path / "nulls.parquet", ["a", None], np.ones((2, 4)), [0.0, 1.0])
    table = pq.read_table(tmp_path / "in.parquet")
    structs = table.set_column(0, "key", pa.array([{"a": 1}]))
    pq.write_table(structs, tmp_path / "structs.parquet")
    lists = table.append_column("tags", pa.array([[1]]))
    pq.write_table(lists, tmp_path / "lists.parquet")
    given = [
        a.format(**{"in": tmp_path / "in.parquet", "out": tmp_path / "out", "tmp": tmp_path})
        for a in args
    ]
    result = run(*given, "--embedding-column", "vec")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()  # before any pass


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (no folder can be made there)")
def test_an_output_that_cannot_be_made_exits_2_with_one_line(tmp_path: Path) -> None:
    write(tmp_path / "in.parquet", ["a"], np.ones((1, 4)), [0.0])
    result = run(str(tmp_path / "in.parquet"), "/proc/conveyor-out", "--embedding-column", "vec")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: cannot create the output /proc/conveyor-out: No such file or directory"
    )


def test_a_failed_pass_exits_1_with_its_reason(tmp_path: Path) -> None:
    write(tmp_path / "in.parquet", ["a", "a"], np.ones((2, 4)), [0.0, 1.0])
    given = [str(tmp_path / "in.parquet"), str(tmp_path / "out"), "--id-column", "key"]
    result = run(*given, "--embedding-column", "vec")
    assert result.exit_code == 1, result.output
    assert "id 'a' is on two rows that are near-duplicates" in result.output


def test_lengths_that_differ_inside_a_file_exit_2_naming_the_file_and_row(
    tmp_path: Path,
) -> None:
    """Found by the first pass (the plan reads one embedding per file): a bad input all the
    same, not a failed pass (exit 1)."""
    ragged = pa.table({"id": ["a", "b"], "embedding": [[1.0, 0.0], [1.0]]})
    pq.write_table(ragged, tmp_path / "ragged.parquet")
    result = run(str(tmp_path / "ragged.parquet"), str(tmp_path / "out"))
    assert result.exit_code == 2
    # (under the first pass's table: the view shows each pass)
    assert " ".join(result.output.split()).endswith(
        f"error: {tmp_path / 'ragged.parquet'}: column 'embedding' holds embeddings of 2 and "
        "of 1 numbers (row 1); they must all have one length"
    )


def test_each_pass_is_shown_and_no_live_is_taken(tmp_path: Path) -> None:
    """A compare pass over millions takes minutes: the command said nothing until the end
    (and refused --no-live, which the other commands take)."""
    vectors = [[1.0, 0.0], [1.0, 0.0001], [0.0, 1.0]]
    pq.write_table(pa.table({"id": list("abc"), "embedding": vectors}), tmp_path / "x.parquet")
    result = run(str(tmp_path / "x.parquet"), str(tmp_path / "out"), "--no-live")
    assert result.exit_code == 0, result.output
    for name in ("semdedup-sample", "semdedup-compare", "semdedup-write"):
        assert f"{name}  finished in" in result.output
    assert "1 duplicates at >= 0.95" in result.output


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


def test_another_command_s_output_is_refused(tmp_path: Path) -> None:
    """Written into a video output, its duplicates.parquet and dedup.json replaced the
    video run's own (--dedup), which the clips' tables and summary no longer matched."""
    write(tmp_path / "in.parquet", ["a", "b"], np.eye(2, 4), [0.0, 1.0])
    out = tmp_path / "out"
    (out / ".conveyor").mkdir(parents=True)
    (out / ".conveyor" / "config.json").write_text('{"command": "video"}')
    result = run(
        str(tmp_path / "in.parquet"), str(out), "--id-column", "key", "--embedding-column", "vec"
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"error: OUTPUT {out} holds a video run's output: write the dedup to another OUTPUT "
        "(conveyor video --dedup dedups its own)"
    )
    assert sorted(p.name for p in out.iterdir()) == [".conveyor"]


def test_home_is_expanded_in_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``~/out`` (quoted, or from a script) was made as a folder named ``~`` in the current
    one, and ``~/emb`` was not found, where every other command expands it."""
    home, work = tmp_path / "home", tmp_path / "work"
    (home / "emb").mkdir(parents=True)
    work.mkdir()
    vectors = np.random.default_rng(1).standard_normal((6, 8))
    write(home / "emb" / "x.parquet", [f"k{i}" for i in range(6)], vectors, [0.0] * 6)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    result = run("~/emb", "~/out", "--id-column", "key", "--embedding-column", "vec")
    assert result.exit_code == 0, result.output
    assert (home / "out" / "dedup.json").exists() and list(work.iterdir()) == []
