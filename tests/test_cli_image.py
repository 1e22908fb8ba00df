"""``conveyor image``: exit 0 with bad images listed, the run report, resuming; exit 2 with one
line for a bad INPUT, OUTPUT or option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.samples.image import write_folder

runner = CliRunner()
FAST = ["--no-live", "--no-embed", "--no-tags", "--no-nsfw", "--images-per-task", "4"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-images")
    write_folder(root, 6, sizes=[(120, 90), (90, 120)])
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff not quite a jpeg")
    return root


def test_a_run_lists_bad_images_exits_0_writes_its_report_and_resumes(
    folder: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    result = runner.invoke(app, ["image", str(folder), str(output), *FAST, "--limit", "6"])
    assert result.exit_code == 0, result.output
    assert "broken.jpg [ImageDecoder]: not an image" in result.output
    assert "1 failure(s)" in result.output and "report:" in result.output
    summary = json.loads((output / "summary.json").read_text())
    assert summary["images"]["in"] == 6 and summary["images"]["in_shards"] == 5
    assert (output / "events.jsonl").exists() and (output / "report.html").exists()
    assert "bad image" in (output / "report.html").read_text()
    again = runner.invoke(app, ["image", str(folder), str(output), *FAST, "--limit", "6"])
    assert again.exit_code == 0, again.output
    assert "2 part(s) complete before, skipped" in again.output


def test_a_run_where_every_image_failed_exits_1(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.jpg").write_text("not an image")
    result = runner.invoke(app, ["image", str(source), str(tmp_path / "out"), *FAST])
    assert result.exit_code == 1, result.output
    assert "a.jpg [ImageDecoder]: not an image" in result.output
    assert "every image failed" in result.output


def test_images_that_could_not_be_read_for_now_exit_1_saying_the_next_run_reads_them(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose images failed for a permission or I/O error is not done: a script must
    not take it for done. (The tests run as root, whom no permission stops: the run's
    summary is told so.)"""
    import conveyor.pipelines.image as image_pipeline

    real = image_pipeline.run_image

    def run_image(*args: object, **kwargs: object) -> object:
        report = real(*args, **kwargs)  # type: ignore[arg-type]
        report.summary["images"]["read_again"] = 2
        return report

    monkeypatch.setattr(image_pipeline, "run_image", run_image)
    result = runner.invoke(app, ["image", str(folder), str(tmp_path / "out"), *FAST])
    assert result.exit_code == 1, result.output
    assert "2 image(s) could not be read for now (a permission or I/O error, above): the " in (
        " ".join(result.output.split())
    )


def test_metrics_are_served_on_the_loopback_address_with_the_batch_executor(
    folder: Path, tmp_path: Path
) -> None:
    pytest.importorskip("prometheus_client")
    options = [*FAST, "--metrics-port", "0", "--no-report", "--limit", "2", "--executor", "batch"]
    result = runner.invoke(app, ["image", str(folder), str(tmp_path / "out"), *options])
    assert result.exit_code == 0, result.output
    assert "metrics: http://127.0.0.1:" in result.output and "batch executor" in result.output
    assert not (tmp_path / "out" / "events.jsonl").exists()


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["{tmp}/missing", "{tmp}/out"], "error: INPUT '{tmp}/missing' does not exist"),
        (["{tmp}/*.png", "{tmp}/out"], "matches no file"),
        (["{tmp}/empty", "{tmp}/out"], "error: no images in {tmp}/empty"),
        (["{folder}", "s3://bucket/out"], "is a URL"),
        (["{folder}", "{folder}/img-000000.jpg"], "is a file, not a folder"),
        (["{folder}", "{tmp}/out", "--dedup", "semantic", "--no-embed"], "compares embeddings"),
        (["{folder}", "{tmp}/out", "--dedup", "fuzzy"], "Invalid value for '--dedup'"),
        (["{folder}", "{tmp}/out", "--address", "127.0.0.1:1"], "--address needs --backend ray"),
        (
            [
                "{folder}",
                "{tmp}/out",
                "--backend",
                "ray",
                "--address",
                "127.0.0.1:1",
                "--cpus",
                "1",
            ],
            "--cpus declares a private cluster's CPUs",
        ),
        (
            ["{folder}", "{tmp}/out", "--backend", "ray", "--address", "127.0.0.1:1"],
            "no Ray cluster answers at 127.0.0.1:1",
        ),
        (["{folder}", "{tmp}/out", "--aesthetic-model", "{tmp}/nope.pt"], "aesthetic model path"),
        # a folder without its head, a file that is no model: they were exit 1, OUTPUT made
        (["{folder}", "{tmp}/out", "--aesthetic-model", "{tmp}/empty"], "has no aesthetic_head"),
        (["{folder}", "{tmp}/out", "--aesthetic-model", "{tmp}/notes.pt"], "is neither a model"),
        # not finite, or empty (it meant the current folder)
        (["{folder}", "{tmp}/out", "--cpus", "inf"], "--cpus must be a finite number, got inf"),
        (["{folder}", "{tmp}/out", "--memory-gb", "inf"], "--memory-gb must be a finite number"),
        (["", "{tmp}/out"], "error: INPUT is empty"),
        (["{folder}", ""], "error: OUTPUT is empty"),
        (["{folder}", "{tmp}/out", "--aesthetic-model", ""], "error: --aesthetic-model is empty"),
        # an option that would have no effect with the others (it was silently ignored)
        (
            ["{folder}", "{tmp}/out", "--dedup", "exact", "--phash-distance", "30"],
            "error: --phash-distance has no effect without --dedup phash",
        ),
        (["{folder}", "{tmp}/out", "--semantic-threshold", "0.9"], "without --dedup semantic"),
        (["{folder}", "{tmp}/out", "--clip-score-threshold", "0.3"], "without --clip-score-model"),
        (["{folder}", "{tmp}/out", "--clip-score-model", "{tmp}/notes.pt"], "is a file: give a"),
        (
            ["{folder}", "{tmp}/out", "--dedup-keep", "largest"],
            "error: --dedup-keep has no effect without --dedup phash or semantic (copies of the "
            "same bytes are as large and score the same)",
        ),
        (
            ["{folder}", "{tmp}/out", "--dedup", "phash", "--dedup-keep", "aesthetic"],
            "error: --dedup-keep aesthetic reads the aesthetic score: give --aesthetic-model",
        ),
        (["{folder}", "{tmp}/out", "--no-quality", "--min-size", "9"], "without --quality"),
        (["{folder}", "{tmp}/out", "--no-nsfw", "--nsfw-threshold", "0.1"], "without --nsfw"),
    ],
)
def test_a_bad_input_or_option_exits_2_with_one_line(
    arguments: list[str], message: str, folder: Path, tmp_path: Path
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.pt").write_text("hi")
    values = {"tmp": str(tmp_path), "folder": str(folder)}
    argv = ["image", *(a.format(**values) for a in arguments), "--no-live"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    if message.startswith("Invalid value"):
        assert message in result.output
    else:
        assert message.format(**values) in one_error_line(result.output)
    assert not (tmp_path / "out").exists()


def test_other_options_on_an_existing_output_exit_2_and_overwrite_starts_afresh(
    folder: Path, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    first = runner.invoke(app, ["image", str(folder), str(output), *FAST, "--limit", "2"])
    assert first.exit_code == 0, first.output
    other = [*FAST, "--limit", "2", "--min-size", "100"]
    refused = runner.invoke(app, ["image", str(folder), str(output), *other])
    assert refused.exit_code == 2
    assert "(--min-size: 64 -> 100)" in one_error_line(refused.output)
    fresh = runner.invoke(app, ["image", str(folder), str(output), *other, "--overwrite"])
    assert fresh.exit_code == 0, fresh.output
    summary = json.loads((output / "summary.json").read_text())
    assert summary["options"]["min_size"] == 100
    assert summary["images"]["filtered"] == {"too_small": 1}  # broken.jpg, then a 120 x 90


def test_an_output_whose_name_is_not_utf8_is_written(folder: Path, tmp_path: Path) -> None:
    """pyarrow refuses a str path that is not UTF-8: the run finished, then exited 1 on
    reading its own tables back for dedup, writing neither shards nor summary."""
    import os

    output = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    result = runner.invoke(app, ["image", str(folder), str(output), *FAST, "--limit", "6"])
    assert result.exit_code == 0, result.output
    summary = json.loads((output / "summary.json").read_text())
    assert summary["images"]["in"] == 6 and list((output / "shards").glob("*.tar"))
