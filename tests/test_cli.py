"""The ``conveyor`` command: help, version, and a real tiny demo run on the local backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import conveyor
from conveyor.cli import app

runner = CliRunner()


def test_help_lists_the_demo_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "demo" in result.output
    assert "--version" in result.output


def test_help_gives_each_command_one_line_at_80_columns() -> None:
    """Each command's whole docstring, wrapped where its source lines end, made the list
    ragged and 30 lines long; its own ``--help`` says the rest."""
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    box = result.output.split("Commands")[1].split("╰")[0]
    names = [line.split()[1] for line in box.splitlines()[1:]]
    assert names == ["demo", "text-demo", "video", "report", "text", "dedup", "image", "simulate"]


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"conveyor {conveyor.__version__}"


def test_demo_help_shows_its_options() -> None:
    result = runner.invoke(app, ["text-demo", "--help"])
    assert result.exit_code == 0
    for option in ("--workdir", "--files", "--docs-per-file", "--executor", "--no-live"):
        assert option in result.output


def test_bad_executor_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["text-demo", "--workdir", str(tmp_path), "--executor", "ray"])
    assert result.exit_code == 2
    assert not (tmp_path / "input").exists()


def test_demo_runs_a_tiny_dataset(tmp_path: Path) -> None:
    args = ["text-demo", "--workdir", str(tmp_path), "--files", "3", "--docs-per-file", "20"]
    result = runner.invoke(app, [*args, "--no-live"])
    assert result.exit_code == 0, result.output
    assert "60 documents in 3 files" in result.output
    assert "0 junk kept, 0 good dropped ok" in result.output
    assert "finished in" not in result.output  # --no-live: no live view, no final table
    assert len(list((tmp_path / "input").glob("docs-*.jsonl"))) == 3
    assert len(list((tmp_path / "output").glob("part-*.parquet"))) == 2


def test_a_demo_never_deletes_what_it_did_not_write(tmp_path: Path) -> None:
    """``conveyor demo --workdir DIR`` replaces DIR/input whole: a file of the user's there
    was deleted."""
    notes = tmp_path / "input" / "my-notes.txt"
    notes.parent.mkdir()
    notes.write_text("precious")
    result = runner.invoke(app, ["demo", "--workdir", str(tmp_path), "--no-live"])
    assert result.exit_code == 2
    assert "holds my-notes.txt, which the demo did not write" in result.output
    assert notes.read_text() == "precious"
    assert not (tmp_path / "output").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--workdir", "{file}"],
        ["demo", "--workdir", "{tmp}"],  # its output/ is a file
        ["text-demo", "--workdir", "{file}"],
        ["simulate", "docs_3stage_1gpu_each", "--no-chart", "--out", "{file}"],
        ["simulate", "docs_3stage_1gpu_each", "--no-chart", "--out", "{file}/sub"],
    ],
)
def test_a_file_where_a_folder_goes_exits_2_before_anything_is_written(
    tmp_path: Path, args: list[str]
) -> None:
    (tmp_path / "output").write_text("mine")
    given = [a.format(file=tmp_path / "output", tmp=tmp_path) for a in args]
    result = runner.invoke(app, given)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "is a file" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["output"]


def test_a_config_s_field_names_read_as_the_options_typed() -> None:
    """``min_clip_s (5.0) is longer than max_clip_s (1.0)`` named no option the user knew."""
    result = runner.invoke(app, ["video", ".", "out", "--min-clip", "5", "--max-clip", "1"])
    assert result.exit_code == 2
    assert result.output == "error: --min-clip (5.0) is longer than --max-clip (1.0)\n"
    # a problem's first word is its field (``--threshold must be ...`` in tests/test_cli_text.py)
    result = runner.invoke(app, ["video", ".", "out", "--embed-model", "/no/m"])
    assert result.exit_code == 2
    assert result.output == "error: --embed-model '/no/m' does not exist\n"
