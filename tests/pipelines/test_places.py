"""Where a run's sources may lie: never the output folder, never where the run writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.pipelines.image import ImageConfig
from conveyor.pipelines.places import source_problems
from conveyor.pipelines.text_config import TextConfig
from conveyor.pipelines.video import VideoConfig, clear_output, owned

runner = CliRunner()


def test_a_source_in_a_folder_the_run_writes_is_named(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "clips").mkdir(parents=True)
    found = source_problems([str(out / "clips" / "a.mp4")], str(out), ["clips"])
    assert found == [
        f"INPUT {out / 'clips' / 'a.mp4'} lies in {out / 'clips'}, which the run writes over: "
        "move it out of OUTPUT, or write to another OUTPUT"
    ]
    # the event log the commands keep in OUTPUT is the run's too
    assert source_problems([str(out / "events.jsonl")], str(out), [])


@pytest.mark.parametrize(
    ("source", "fine"),
    [
        ("out", False),  # the output folder itself
        ("out/", False),
        ("link", False),  # a link to it
        ("out/raw", True),  # a folder of its own inside OUTPUT
        ("out/raw/clips", True),  # named like the run's folder, but not that folder
        (".", True),  # the output lies inside the input: the listing leaves it out
        ("out/clips/*.mp4", False),  # a glob: the folder before its first wildcard
        ("out/part-00007.parquet", False),  # a name the run owns by pattern
        ("out/part-7.parquet", True),
        ("s3://bucket/out/clips", True),  # a URL is not a local place
    ],
)
def test_where_a_source_may_lie(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, fine: bool
) -> None:
    (tmp_path / "out" / "clips").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "out")
    monkeypatch.chdir(tmp_path)
    found = source_problems([source], "out", ["clips"], lambda name: name.startswith("part-0"))
    assert (found == []) is fine, found


def test_an_output_url_holds_no_local_source(tmp_path: Path) -> None:
    assert source_problems([str(tmp_path)], "s3://bucket/out", ["clips"]) == []


def test_every_pipeline_refuses_a_source_where_it_writes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"lies in .*out/videos, which the run writes"):
        VideoConfig(str(out / "videos"), str(out))
    with pytest.raises(ValueError, match="OUTPUT is the INPUT folder"):
        VideoConfig(str(out), str(out))
    (tmp_path / "a.mp4").write_bytes(b"")
    with pytest.raises(ValueError, match=r"OUTPUT is the INPUT file .*a.mp4.: give a folder"):
        VideoConfig(str(tmp_path / "a.mp4"), str(tmp_path / "a.mp4"))
    with pytest.raises(ValueError, match=r"lies in .*out/shards, which the run writes"):
        ImageConfig(str(out / "shards"), str(out))
    with pytest.raises(ValueError, match=r"lies in .*out/part-00000.jsonl, which the run"):
        TextConfig(str(out / "part-00000.jsonl"), str(out))
    with pytest.raises(ValueError, match=r"lies in .*out/.conveyor, which the run writes"):
        TextConfig(str(out / ".conveyor" / "x.jsonl"), str(out))
    with pytest.raises(ValueError, match=r"lies in .*out/documents, which the run writes"):
        TextConfig(str(out / "documents" / "part-00000.parquet"), str(out))
    VideoConfig(str(out / "raw"), str(out))  # a folder of the user's inside OUTPUT


def test_what_overwrite_removes_is_what_the_sources_are_kept_from(tmp_path: Path) -> None:
    folders, files = owned(tmp_path)
    for folder in folders:
        (folder / "x").parent.mkdir(parents=True)
        (folder / "x").write_text("x")
    for file in files:
        file.write_text("x")
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.mp4").write_text("x")
    with pytest.raises(ValueError, match=r"no (video|Conveyor) run wrote"):
        clear_output(tmp_path)  # folders of those names that no run wrote are the user's
    (tmp_path / ".conveyor" / "config.json").write_text('{"command": "video"}')
    clear_output(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_overwrite_never_deletes_the_sources_it_was_given(tmp_path: Path) -> None:
    """``conveyor video OUT/clips OUT --overwrite`` emptied OUT/clips, the sources with it,
    then said they did not exist."""
    out = tmp_path / "out"
    (out / "clips").mkdir(parents=True)
    (out / "clips" / "a.mp4").write_bytes(b"not really a video")
    result = runner.invoke(app, ["video", str(out / "clips"), str(out), "--overwrite"])
    assert result.exit_code == 2, result.output
    assert "which the run writes over" in " ".join(result.output.split())
    assert (out / "clips" / "a.mp4").read_bytes() == b"not really a video"
    shards = out / "shards"
    shards.mkdir()
    (shards / "images-00000.tar").write_bytes(b"tar")
    result = runner.invoke(app, ["image", str(shards), str(out), "--overwrite"])
    assert result.exit_code == 2, result.output
    assert (shards / "images-00000.tar").read_bytes() == b"tar"


def test_video_refuses_the_input_folder_as_output_saying_so(tmp_path: Path) -> None:
    (tmp_path / "a.mp4").write_bytes(b"x")
    result = runner.invoke(app, ["video", str(tmp_path), str(tmp_path)])
    assert result.exit_code == 2
    assert "OUTPUT is the INPUT folder" in result.output  # not "no videos in ..."
