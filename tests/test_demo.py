"""The demo corpus is reproducible and each junk kind trips the rule meant for it; one tiny
end-to-end run on the local backend checks the whole chain and the live view's final table."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from rich.console import Console

from conveyor.demos.text import (
    KEEP_KINDS,
    MIX,
    _document,
    _good,
    build_pipeline,
    generate_sample_data,
    print_report,
    run_demo,
)
from conveyor.stages.text.filters import first_failure, gopher_rules

EXPECTED_RULE = {
    "good": None,
    "duplicate": None,
    "short": "word_count",
    "gibberish": "mean_word_length",
    "symbols": "symbol_to_word_ratio",
    "ellipsis": "ellipsis_lines",
    "repeated": "repeated_lines",
}


def test_every_kind_has_an_expected_rule() -> None:
    assert set(EXPECTED_RULE) == set(MIX)


@pytest.mark.parametrize("kind", sorted(EXPECTED_RULE))
def test_each_kind_is_caught_by_its_rule(kind: str) -> None:
    rng = random.Random(kind)
    pool = [_good(rng) for _ in range(3)]
    rules = gopher_rules()
    for _ in range(200):
        assert first_failure(rules, _document(kind, rng, pool)) == EXPECTED_RULE[kind]


def test_generation_is_reproducible_and_cleans_stale_files(tmp_path: Path) -> None:
    first = generate_sample_data(tmp_path / "a", files=3, docs_per_file=15, seed=7)
    again = generate_sample_data(tmp_path / "b", files=3, docs_per_file=15, seed=7)
    other = generate_sample_data(tmp_path / "c", files=3, docs_per_file=15, seed=8)
    contents = [p.read_bytes() for p in first.files]
    assert contents == [p.read_bytes() for p in again.files]
    assert contents != [p.read_bytes() for p in other.files]
    assert first.documents == 45
    assert sum(len(p.read_text().splitlines()) for p in first.files) == 45
    # a smaller rerun in the same place leaves no stale input behind, and files keep content
    (tmp_path / "a" / "notes.txt").write_text("mine")
    smaller = generate_sample_data(tmp_path / "a", files=2, docs_per_file=15, seed=7)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "docs-00000.jsonl",
        "docs-00001.jsonl",
        "notes.txt",
    ]
    assert [p.read_bytes() for p in smaller.files] == contents[:2]
    with pytest.raises(ValueError, match="files >= 1"):
        generate_sample_data(tmp_path, files=0)


def test_pipeline_shape(tmp_path: Path) -> None:
    specs = build_pipeline(tmp_path / "in", tmp_path / "out").build()
    assert [s.name for s in specs] == [
        "FilePartitioningStage",
        "JsonlReaderStage",
        "HeuristicFilter",
        "DocumentAnnotator",
        "ParquetWriter",
    ]


def test_tiny_run_end_to_end_with_the_live_view(tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), width=120)
    report = run_demo(tmp_path, files=3, docs_per_file=20, seed=1, console=console)
    assert report.result.ok, report.result.failures
    assert report.ok
    assert report.sample.documents == 60
    assert report.kept + report.filtered == 60
    assert report.kept == sum(n for k, n in report.sample.kinds.items() if k in KEEP_KINDS)
    assert len(report.written) == 2  # 3 files, 2 per partition
    assert all(p.exists() and p.parent == tmp_path / "output" for p in report.written)
    print_report(report, console)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "text-curation-demo  finished in" in out  # the live view's final table
    assert "HeuristicFilter" in out
    assert "0 junk kept, 0 good dropped ok" in out
