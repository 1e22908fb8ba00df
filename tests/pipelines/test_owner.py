"""Whose output a folder is (``conveyor.pipelines.owner``): a command never writes into,
resumes or ``--overwrite``s another command's output, nor a folder another output owns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.pipelines.owner import check_owner, nesting_problem, output_kind

runner = CliRunner()


def write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("files", "kind"),
    [
        ({".conveyor/config.json": {"command": "image", "splitter": "x"}}, "image"),
        ({".conveyor/config.json": {"splitter": "shots"}}, "video"),  # before "command"
        ({".conveyor/config.json": {"min_size": 64}}, "image"),
        ({"summary.json": {"command": "text"}}, "text"),
        ({"summary.json": {"videos": {}}}, "video"),
        ({"summary.json": {"images": {}}}, "image"),
        ({"summary.json": {"documents": {}}}, "text"),
        ({".conveyor/staging/x": {}}, "text"),  # a text run under way
        ({"summary.json": {"mine": 1}}, None),
        ({"duplicates.parquet": {}, "dedup.json": {}}, None),  # a dedup's is no command's
        ({}, None),
    ],
)
def test_the_kind_of_an_output(tmp_path: Path, files: dict[str, object], kind: str) -> None:
    for name, data in files.items():
        write(tmp_path / name, data)
    assert output_kind(tmp_path) == kind
    assert output_kind(tmp_path / "missing") is None


def test_another_command_s_output_and_a_user_s_summary_are_refused(tmp_path: Path) -> None:
    write(tmp_path / "v" / "summary.json", {"command": "video"})
    check_owner(tmp_path / "v", "video")
    with pytest.raises(ValueError, match="holds a video run's output: write the text run to"):
        check_owner(tmp_path / "v", "text")
    write(tmp_path / "u" / "summary.json", {"mine": 1})
    with pytest.raises(ValueError, match=r"holds a summary\.json no Conveyor run wrote"):
        check_owner(tmp_path / "u", "image")
    check_owner(tmp_path / "nothing", "image")
    # a dedup's: an image run replaced its dedup.json and duplicates.parquet with its own
    write(tmp_path / "d" / "dedup.json", {"items": 4})
    with pytest.raises(ValueError, match="holds a conveyor dedup output"):
        check_owner(tmp_path / "d", "image")


def test_an_output_inside_a_folder_another_output_owns(tmp_path: Path) -> None:
    write(tmp_path / "out" / ".conveyor" / "config.json", {"command": "video"})
    assert "lies in" in str(nesting_problem(tmp_path / "out" / "clips" / "x"))
    assert "a video run's output owns" in str(nesting_problem(tmp_path / "out" / "embeddings"))
    assert nesting_problem(tmp_path / "out" / "mine" / "x") is None  # not a name it owns
    assert nesting_problem(tmp_path / "out") is None
    write(tmp_path / "t" / "summary.json", {"command": "text"})
    assert "a text run's output owns" in str(nesting_problem(tmp_path / "t" / "documents" / "x"))


def test_commands_refuse_each_other_s_outputs_before_writing(tmp_path: Path) -> None:
    """A text run into a video output replaced its summary, event log and report and swept
    its staging; ``conveyor image --overwrite`` deleted a video run's tables."""
    out = tmp_path / "out"
    write(out / ".conveyor" / "config.json", {"command": "video"})
    write(out / "summary.json", {"command": "video", "videos": {}})
    (out / "metadata").mkdir()
    (out / "metadata" / "t.parquet").write_text("the video run's")
    (out / ".conveyor" / "staging").mkdir()
    (tmp_path / "a.jsonl").write_text('{"text": "a document of a few words"}\n')
    (tmp_path / "img").mkdir()
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    for args in (
        ["text", str(tmp_path / "a.jsonl"), str(out)],
        ["image", str(tmp_path / "img"), str(out)],
        ["image", str(tmp_path / "img"), str(out), "--overwrite"],
    ):
        result = runner.invoke(app, [*args, "--no-live"])
        assert result.exit_code == 2, result.output
        assert "holds a video run's output" in result.output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_overwrite_leaves_folders_no_run_wrote(tmp_path: Path) -> None:
    """``--overwrite`` deleted a user's ``videos/`` and ``metadata/`` by their names."""
    out = tmp_path / "out"
    (out / "videos").mkdir(parents=True)
    (out / "videos" / "holiday.mp4").write_text("the user's")
    (tmp_path / "in").mkdir()
    result = runner.invoke(app, ["video", str(tmp_path / "in"), str(out), "--overwrite"])
    assert result.exit_code == 2, result.output
    assert "holds videos, which no video run wrote there" in result.output
    assert (out / "videos" / "holiday.mp4").read_text() == "the user's"


def test_a_text_run_keeps_a_user_s_part_files_beside_another_summary(tmp_path: Path) -> None:
    """A video output's summary made a text run take the user's part files for its own."""
    out = tmp_path / "out"
    write(out / "summary.json", {"command": "video"})
    (out / "part-00000.jsonl").write_text('{"user": 1}\n')
    (tmp_path / "a.jsonl").write_text('{"text": "a document of a few words"}\n')
    result = runner.invoke(app, ["text", str(tmp_path / "a.jsonl"), str(out), "--no-live"])
    assert result.exit_code == 2
    assert (out / "part-00000.jsonl").read_text() == '{"user": 1}\n'
