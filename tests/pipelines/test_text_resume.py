"""An interrupted text run is taken up where it stopped: the next run with the same input
and options reads only the read tasks the first did not finish, and its output and counts
are exactly those of a run never interrupted; anything changed starts over."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.pipelines import text_resume
from conveyor.pipelines.text import TextConfig, run_text
from conveyor.pipelines.text_resume import PassLog, read_log

PROSE = (
    "the of and to in is was for that with as on by at from his her their they this which "
    "be are were have has had not but or all one two new more first people time year day"
)
WORDS = PROSE.split(" ")


def corpus(folder: Path, files: int = 4, lines: int = 400) -> Path:
    """JSONL of prose with planted duplicates: near copies of earlier lines, a few short
    lines for the word-count rule."""
    rng = random.Random(7)
    folder.mkdir()
    made: list[str] = []
    for f in range(files):
        with open(folder / f"f{f}.jsonl", "w") as out:
            for i in range(lines):
                if made and i % 5 == 0:
                    text = rng.choice(made)  # an exact copy
                elif i % 37 == 0:
                    text = "too short"
                else:
                    text = " ".join(rng.choice(WORDS) for _ in range(60))
                    made.append(text)
                out.write(json.dumps({"text": text, "n": f * lines + i}) + "\n")
    return folder


class Stop:
    """Interrupts a run (as Ctrl-C does) at an output of the pass named."""

    def __init__(self, when: str, after: int) -> None:
        self.when, self.after, self.seen, self.stage = when, after, 0, ""

    def on_pass(self, label: str) -> None:
        self.stage = label

    def on_output(self, _: Any) -> None:
        if self.stage == self.when:
            self.seen += 1
            if self.seen > self.after:
                raise KeyboardInterrupt


def config(source: Path, out: Path, **options: Any) -> TextConfig:
    return TextConfig(str(source), str(out), langid=False, chunk_bytes=40_000, **options)


def rows(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((out / "documents").glob("part-*")):
        with open(path, "rb") as stream:  # (pyarrow takes no path that is not UTF-8)
            found += pq.read_table(stream).to_pylist()
    return found


def counts(summary: dict[str, Any]) -> dict[str, Any]:
    dedup = {k: v for k, v in summary["dedup"].items() if k != "resolve_s"}
    keys = ("documents", "filtered_by_rule", "languages", "files", "output_files", "failures")
    return {"dedup": dedup, **{k: summary[k] for k in keys}}


def read_tasks(report: Any, number: int) -> int:
    return report.results[number].stats["TextReader"].tasks_in


@pytest.mark.parametrize("dedup", ["exact", "none"])
def test_an_interrupted_run_resumed_matches_a_run_never_interrupted(
    tmp_path: Path, dedup: str
) -> None:
    source = corpus(tmp_path / "in")
    whole = run_text(config(source, tmp_path / "whole", dedup=dedup))
    assert whole.completed and whole.summary["documents"]["kept"] > 0
    assert whole.summary["resumed_tasks"] == {}
    total = read_tasks(whole, 0)
    assert total >= 8
    out = tmp_path / "out"
    stops = [("pass 1", 3)] + ([("pass 2", 1)] if dedup != "none" else [])
    notes: list[str] = []
    for when, after in stops:
        stop = Stop(when, after)
        with pytest.raises(KeyboardInterrupt):
            run_text(
                config(source, out, dedup=dedup),
                on_output=stop.on_output,
                on_pass=stop.on_pass,
                on_note=notes.append,
            )
        assert not (out / "documents").exists()  # nothing published
    report = run_text(config(source, out, dedup=dedup), on_note=notes.append)
    assert report.completed
    assert rows(out) == rows(tmp_path / "whole")
    assert counts(report.summary) == counts(whole.summary)
    # the first interruption came after 4 outputs of pass 1: at least 4 tasks were done
    # (each makes one batch here), and the runs after it did not read them again
    resumed = report.summary["resumed_tasks"]
    assert resumed["pass_1"] >= 4
    assert read_tasks(report, 0) == total - resumed["pass_1"]
    assert any(note.startswith("resuming: ") for note in notes), notes
    if dedup != "none":
        assert resumed["pass_2"] >= 2
        assert read_tasks(report, 1) == read_tasks(whole, 1) - resumed["pass_2"]
    assert not (out / ".conveyor").exists()  # the state goes with the finished run
    again = run_text(config(source, out, dedup=dedup))  # a finished run is done anew
    assert again.summary["resumed_tasks"] == {} and rows(out) == rows(tmp_path / "whole")


def test_a_changed_option_or_input_starts_over(tmp_path: Path) -> None:
    source = corpus(tmp_path / "in", files=2)
    out = tmp_path / "out"
    notes: list[str] = []
    stop = Stop("pass 1", 2)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="none"), on_output=stop.on_output, on_pass=stop.on_pass)
    report = run_text(config(source, out, dedup="none", min_words=20), on_note=notes.append)
    assert notes == ["starting over: rules changed since the interrupted run"]
    assert report.summary["resumed_tasks"] == {} and report.completed
    stop = Stop("pass 1", 2)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="none"), on_output=stop.on_output, on_pass=stop.on_pass)
    changed = "starting over: the input (its files, their sizes or modification times) changed"
    with open(source / "f1.jsonl", "a") as f:
        f.write(json.dumps({"text": " ".join(WORDS)}) + "\n")
    notes.clear()
    report = run_text(config(source, out, dedup="none"), on_note=notes.append)
    assert notes == [f"{changed} since the interrupted run"]
    assert report.summary["documents"]["in"] == 801 and report.summary["resumed_tasks"] == {}
    # a file rewritten to the same size was resumed with its old documents
    stop = Stop("pass 1", 2)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="none"), on_output=stop.on_output, on_pass=stop.on_pass)
    first = source / "f0.jsonl"
    before = first.stat()
    first.write_text(first.read_text().replace("river", "RIVER").replace("the", "THE"))
    assert first.stat().st_size == before.st_size
    os.utime(first, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    notes.clear()
    report = run_text(config(source, out, dedup="none"), on_note=notes.append)
    assert notes == [f"{changed} since the interrupted run"]
    assert any("THE" in row["text"] for row in rows(out))


@pytest.mark.slow  # (seven runs, 18 s: make test-all, as CI, runs it)
def test_a_run_stopped_while_it_starts_over_or_resets_pass_2_leaves_no_state_naming_lost_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old logs outlived the files they named: stopped while it cleared them (starting
    over with other options), a run left them for the next run with the old options to
    resume from, and it published without those documents under a complete summary."""
    from conveyor.pipelines import text

    source = corpus(tmp_path / "in", files=2)
    whole = run_text(config(source, tmp_path / "whole", dedup="exact"))
    out = tmp_path / "out"
    stop = Stop("pass 1", 3)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="exact"), on_output=stop.on_output, on_pass=stop.on_pass)
    clear = text.TextLayout.clear_work

    def stopped(self: Any, **kwargs: Any) -> None:
        clear(self, **kwargs)
        raise KeyboardInterrupt  # as a Ctrl-C once the files are gone

    monkeypatch.setattr(text.TextLayout, "clear_work", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="exact", min_words=20))
    monkeypatch.setattr(text.TextLayout, "clear_work", clear)
    report = run_text(config(source, out, dedup="exact"))
    assert report.summary["resumed_tasks"] == {} and rows(out) == rows(tmp_path / "whole")
    assert counts(report.summary) == counts(whole.summary)

    # pass 2's state made anew (its staged files changed): stopped before its log was
    stop = Stop("pass 2", 0)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="exact"), on_output=stop.on_output, on_pass=stop.on_pass)
    state = out / ".conveyor" / "resume" / "pass-2.json"
    state.write_text(state.read_text().replace('"staging": [[', '"staging": [["gone", 1], ['))
    real = text_resume.PassLog.__init__

    def stopped_log(self: Any, path: Path, *args: Any) -> None:
        if path.name == "pass-2.jsonl":
            raise KeyboardInterrupt
        real(self, path, *args)

    monkeypatch.setattr(text_resume.PassLog, "__init__", stopped_log)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="exact"))
    monkeypatch.setattr(text_resume.PassLog, "__init__", real)
    report = run_text(config(source, out, dedup="exact"))
    assert "pass_2" not in report.summary["resumed_tasks"]
    assert rows(out) == rows(tmp_path / "whole")


def test_a_run_stopped_while_its_parts_are_made_one_schema_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state was forgotten before the parts were rewritten to one schema (JSONL on the
    run's workers, which may take minutes): a stop then cost the whole run."""
    from conveyor.stages.text import writers

    source = corpus(tmp_path / "in", files=2)
    out = tmp_path / "out"
    unify = writers.unify_shards

    def stopped(*args: Any, **kwargs: Any) -> None:
        unify(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(writers, "unify_shards", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="none", format="jsonl"))
    monkeypatch.setattr(writers, "unify_shards", unify)
    report = run_text(config(source, out, dedup="none", format="jsonl"))
    assert report.completed and report.summary["resumed_tasks"]["pass_1"] > 0
    assert read_tasks(report, 0) == 0  # nothing read again


def test_parts_that_cannot_be_made_one_schema_leave_no_state_to_resume_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged part failed the rewrite, and every resume after it alike."""
    from conveyor.stages.text import writers

    def damaged(*_: Any, **__: Any) -> None:
        raise ValueError("a part cut short")

    monkeypatch.setattr(writers, "unify_shards", damaged)
    source = corpus(tmp_path / "in", files=1, lines=100)
    with pytest.raises(ValueError, match="cut short"):
        run_text(config(source, tmp_path / "out", dedup="none"))
    assert not (tmp_path / "out" / ".conveyor" / "resume").exists()


def test_the_copies_of_a_finished_run_go_before_its_summary_says_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill right after the summary was written left the staged rows (a second copy of
    the output) and the dedup keys under a summary that called the output complete."""
    from conveyor.pipelines import text

    source = corpus(tmp_path / "in", files=1, lines=200)
    out = tmp_path / "out"
    build = text.build_summary
    left: list[list[str]] = []

    def look(*args: Any, **kwargs: Any) -> dict[str, Any]:
        left.append(sorted(p.name for p in (out / ".conveyor").iterdir()))
        return build(*args, **kwargs)

    monkeypatch.setattr(text, "build_summary", look)
    assert run_text(config(source, out, dedup="exact")).completed
    assert left == [["ready"]]  # (it says the output is a text run's until the summary is in)
    assert not (out / ".conveyor").exists()


def test_the_command_says_how_to_resume_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = corpus(tmp_path / "in", files=2)
    out = tmp_path / "out"
    args = ["text", str(source), str(out), "--no-live", "--no-langid", "--chunk-mb", "0.04"]
    add = PassLog.add
    calls: list[int] = []

    def stop_at_the_third(self: PassLog, metadata: dict[str, Any]) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        add(self, metadata)

    monkeypatch.setattr(PassLog, "add", stop_at_the_third)
    runner = CliRunner()
    result = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 130, result.output
    assert "run the same command again to resume" in result.output
    monkeypatch.setattr(PassLog, "add", add)
    result = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "resuming: 2 read task(s) an earlier run finished are not read again" in result.output
    assert "(resumed: 2 task(s) of pass 1 done by an earlier run)" in result.output


def _line(shard: str, **more: Any) -> str:
    return json.dumps({"shard": shard, "written": {"rows": 1}, **more})


def test_a_task_is_finished_only_when_its_every_batch_is_logged(tmp_path: Path) -> None:
    log = tmp_path / "pass-1.jsonl"
    log.write_text(
        "\n".join(
            [
                _line("00000000-000000", batches=1),  # finished
                _line("00000001-000001", batches=2),  # its batch 0 is missing
                _line("00000002-000000"),
                _line("00000002-000001", batches=2),  # finished, out of order
                "not json",
                json.dumps({"other": 1}),
                _line("00000003-000000", batches=1)[:-5],  # torn by a crash
            ]
        )
    )
    finished = read_log(log)
    assert finished.tasks == {0, 2}
    assert [o["shard"] for o in finished.outputs] == [
        "00000000-000000",
        "00000002-000000",
        "00000002-000001",
    ]
    assert read_log(tmp_path / "none.jsonl").tasks == frozenset()
    # a pass's log keeps the finished outputs and drops the rest, which run again
    PassLog(log, finished).close()
    assert read_log(log) == finished
    assert len(log.read_text().splitlines()) == 3


def logged(out: Path, name: str) -> int:
    try:
        return len((out / ".conveyor" / "resume" / name).read_bytes().splitlines())
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_killed_mid_pass_and_resumed_the_output_is_a_whole_runs(tmp_path: Path) -> None:
    """``kill -9`` of the command (its workers go with it) in pass 1, then in pass 2 of the
    run that resumed it: the third run's documents and counts are a whole run's."""
    import subprocess
    import sys

    from tests.pipelines.test_resume_after_kill import kill_when

    source = corpus(tmp_path / "in", files=6, lines=600)
    options = ["--no-live", "--no-report", "--no-langid", "--dedup", "fuzzy", "--chunk-mb", "0.04"]

    def command(out: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "conveyor", "text", str(source), str(out), *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parents[2],
        )

    whole = tmp_path / "whole"
    proc = command(whole)
    assert proc.wait(timeout=300) == 0, proc.communicate()
    out = tmp_path / "out"
    kill_when(command(out), lambda: logged(out, "pass-1.jsonl") >= 10, 0.1)
    assert not (out / "documents").exists() and not (out / "summary.json").exists()
    kill_when(command(out), lambda: logged(out, "pass-2.jsonl") >= 1, 0.0)
    proc = command(out)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, (stdout + stderr)[-3000:]
    assert "resuming: " in stdout
    assert rows(out) == rows(whole)
    done = json.loads((out / "summary.json").read_text())
    assert counts(done) == counts(json.loads((whole / "summary.json").read_text()))
    assert done["resumed_tasks"]["pass_1"] >= 10 and done["resumed_tasks"]["pass_2"] >= 1


@pytest.mark.slow
def test_an_output_in_a_bucket_is_written_and_keeps_no_resume_state(
    bucket: str, tmp_path: Path
) -> None:
    """Both passes into a bucket (pass 2 read the staged rows from it: its partitioner
    was handed the bucket's path object and refused it); an interrupted run starts over."""
    import fsspec

    source = corpus(tmp_path / "in", files=2, lines=200)
    whole = run_text(config(source, tmp_path / "whole", dedup="fuzzy"))
    out = f"{bucket}/out"
    stop = Stop("pass 1", 1)
    with pytest.raises(KeyboardInterrupt):
        run_text(config(source, out, dedup="fuzzy"), on_output=stop.on_output, on_pass=stop.on_pass)
    report = run_text(config(source, out, dedup="fuzzy"))
    assert report.completed and report.summary["resumed_tasks"] == {}
    assert counts(report.summary) == counts(whole.summary)
    fs = fsspec.filesystem("s3")
    found = sorted(fs.find(f"{out[5:]}/documents"))
    assert ["documents/" + p.rsplit("/", 1)[-1] for p in found] == whole.summary["output_files"]
    got = [r for p in found for r in pq.read_table(fs.open(p)).to_pylist()]
    assert got == rows(tmp_path / "whole")
    assert not fs.find(f"{out[5:]}/.conveyor")


@pytest.mark.parametrize("dedup", ["exact", pytest.param("semantic", marks=pytest.mark.slow)])
def test_an_output_whose_name_is_not_utf8_is_written(tmp_path: Path, dedup: str) -> None:
    """pyarrow refuses a str path that is not UTF-8: the dedup keys and embeddings could
    not be spilled there, and every task failed, every run."""
    if dedup == "semantic":
        pytest.importorskip("torch")
    source = corpus(tmp_path / "in", files=1, lines=60)
    out = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    report = run_text(config(source, out, dedup=dedup))
    assert report.completed and not report.failures
    assert report.summary["dedup"]["removed"] > 0 and rows(out)


def test_a_staged_part_pass_2_cannot_read_is_no_silent_loss(tmp_path: Path) -> None:
    """Pass 2 counted no file error: a part it could not read lost its documents from an
    output called complete. The run is not published, says which part, and tries it again."""
    source = corpus(tmp_path / "in")
    out = tmp_path / "out"

    def damage(label: str) -> None:
        if label == "pass 2":
            part = sorted((out / ".conveyor").rglob("staging/*.parquet"))[0]
            part.write_bytes(part.read_bytes()[:100])

    report = run_text(config(source, out, dedup="exact"), on_pass=damage)
    assert not report.completed and not report.summary["completed"]
    (failure,) = report.summary["failures"]
    assert (
        failure["stage"] == "TextReader (pass 2)" and "could not be read back" in failure["reason"]
    )
    assert not (out / "documents").exists()
    state = out / ".conveyor" / "resume" / "pass-2.jsonl"
    assert failure["task"] not in (state.read_text() if state.exists() else "")
