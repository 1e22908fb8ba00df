"""Exact and fuzzy dedup as a two-pass plan: keys spilled per batch, resolved one partition at
a time, duplicates dropped; quality measured on a corpus with planted near-duplicates.

Quality is measured over removed documents: the expected set is, for each planted group (an
original, its near-duplicates at Jaccard >= 0.8 and its reformatted exact copies), every member
but the one with the smallest id. Precision = |removed & expected| / |removed|, recall =
|removed & expected| / |expected|. Pairs planted at Jaccard 0.5-0.7 must keep both documents.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from conveyor import Pipeline
from conveyor.backends import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.stages.text._minhash import normalised_words, shingle_hashes
from conveyor.stages.text.dedup import (
    DUPLICATES_REMOVED,
    DedupKeys,
    DedupResult,
    DropDuplicates,
    FuzzyDedupConfig,
    content_hash,
    normalise,
    resolve_duplicates,
)
from conveyor.tasks import DocumentBatch

SHINGLE = 5
#: texts in id order, their ids, the ids to remove, the pairs at Jaccard 0.5-0.7
Corpus = tuple[list[str], np.ndarray, set[int], set[tuple[int, int]]]


# -- a planted corpus ------------------------------------------------------------------------
def _shingles(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def _jaccard(sa: set[tuple[str, ...]], b: list[str]) -> float:
    sb = _shingles(b)
    return len(sa & sb) / len(sa | sb)


def _mutate(
    rng: np.random.Generator, words: list[str], vocab: list[str], lo: float, hi: float
) -> list[str]:
    """A copy with word edits (replace, insert, delete) whose shingle Jaccard is in [lo, hi]."""
    original = _shingles(words)
    while True:
        target = rng.uniform(lo, hi)
        edited = list(words)
        similarity = 1.0
        while similarity > target:
            trial = list(edited)
            at = int(rng.integers(len(trial)))
            op = rng.integers(3)
            if op == 0:
                trial[at] = vocab[int(rng.integers(len(vocab)))]
            elif op == 1:
                trial.insert(at, vocab[int(rng.integers(len(vocab)))])
            else:
                del trial[at]
            value = _jaccard(original, trial)
            if value < lo:
                break
            edited, similarity = trial, value
        if lo <= similarity <= hi:
            return edited


def _render(rng: np.random.Generator, words: list[str]) -> str:
    """Words as prose: capitals, commas and full stops, odd whitespace (normalise undoes it)."""
    caps = rng.random(len(words)) < 0.05
    caps[0] = True
    marks = rng.random(len(words))
    out = [
        (w.capitalize() if c else w) + ("." if m < 0.06 else "," if m < 0.12 else "")
        for w, c, m in zip(words, caps.tolist(), marks.tolist(), strict=True)
    ]
    return ("  " if rng.random() < 0.5 else "\n").join(out)


def planted_corpus(
    seed: int, originals: int, near_groups: int, exact_groups: int, far_pairs: int
) -> Corpus:
    """Texts in a shuffled order with their ids, the ids dedup should remove, and the
    (Jaccard 0.5-0.7) pairs that must both stay."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = sorted(
        {"".join(rng.choice(letters, size=int(rng.integers(2, 9)))) for _ in range(6000)}
    )
    weights = 1.0 / (np.arange(len(vocab)) + 20.0)
    weights /= weights.sum()
    base = [
        [vocab[i] for i in rng.choice(len(vocab), size=int(rng.integers(100, 300)), p=weights)]
        for _ in range(originals)
    ]
    docs: list[list[str]] = list(base)
    groups: list[list[int]] = []
    order = rng.permutation(originals)
    near, exact = order[:near_groups], order[near_groups : near_groups + exact_groups]
    far = order[near_groups + exact_groups : near_groups + exact_groups + far_pairs]
    for i in near:
        members = [int(i)]
        for _ in range(int(rng.integers(1, 3))):
            members.append(len(docs))
            docs.append(_mutate(rng, base[i], vocab, 0.8, 0.97))
        groups.append(members)
    for i in exact:
        groups.append([int(i), len(docs)])
        docs.append(list(base[i]))
    far_index = []
    for i in far:
        far_index.append((int(i), len(docs)))
        docs.append(_mutate(rng, base[i], vocab, 0.5, 0.7))
    ids = rng.permutation(len(docs)).astype(np.int64)  # id = position in input order
    texts = [_render(rng, words) for words in docs]
    expected = set()
    for members in groups:
        member_ids = sorted(int(ids[m]) for m in members)
        expected.update(member_ids[1:])
    far_ids = {(int(ids[a]), int(ids[b])) for a, b in far_index}
    by_id = np.argsort(ids)
    return [texts[i] for i in by_id], ids[by_id], expected, far_ids


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return planted_corpus(7, originals=2500, near_groups=300, exact_groups=60, far_pairs=150)


def _batches(texts: list[str], ids: np.ndarray, size: int) -> list[DocumentBatch]:
    return [
        DocumentBatch(
            data=pa.table({"text": texts[s : s + size], "_conveyor_doc_id": ids[s : s + size]})
        )
        for s in range(0, len(texts), size)
    ]


def _pass1(stage: DedupKeys, batches: list[DocumentBatch]) -> None:
    for batch in batches:
        assert stage.process(batch) is batch


def _removed(result: DedupResult) -> np.ndarray:
    return np.load(result.removed_path)


# -- normalisation and exact mode ------------------------------------------------------------
def test_normalise_and_content_hash() -> None:
    assert normalise("  Hello,\tWORLD!! ﬁne_tuned\u3000end.Start ") == (
        "hello world fine tuned end start"
    )
    assert content_hash("Hello,  WORLD.\n") == content_hash(" hello,\tworld.")
    assert content_hash("hello world") != content_hash("hello worlds")
    assert content_hash("\uff28ello wor\u200bld") == content_hash("hello world")  # NFKC, ZWSP
    # punctuation and symbols are content for exact dedup (each pair was one document)
    for one, other in (("if a < b:", "if a > b:"), ("2 + 3", "2 - 3"), ("$5", "\u20ac5")):
        assert content_hash(one) != content_hash(other)
    assert content_hash("Hello, world.") != content_hash("hello world")
    value = content_hash("anything")
    assert isinstance(value, int) and -(1 << 63) <= value < 1 << 63
    pa.array([value], type=pa.int64())  # fits an Arrow int64


def test_combining_marks_are_parts_of_words_not_punctuation() -> None:
    """Vowel signs were taken for punctuation: "the boy plays" and "the girl plays" in Hindi
    were exact duplicates, as were Thai words differing in a tone mark."""
    boy, girl = "लड़का स्कूल में खेलता है।", "लड़की स्कूल में खेलती है।"
    assert normalise(boy) == "लड़का स्कूल में खेलता है"
    assert content_hash(boy) != content_hash(girl)
    assert content_hash("ไม่ ใช่") != content_hash("ไม ใช")
    assert normalise("e\u0301t\u00e9") == "\u00e9t\u00e9"  # NFKC composes the accent


def test_texts_of_no_words_are_duplicates_only_of_the_same_text() -> None:
    """Every emoji-only or punctuation-only text was a duplicate of every other one."""
    assert content_hash("😀😀😀🎉🎉") != content_hash("🎉 🎉")
    assert content_hash("🎉  🎉") == content_hash("🎉 🎉")
    assert content_hash("!!!") != content_hash("") != content_hash("🎉")
    assert content_hash("") == content_hash("  \n")


def test_scripts_without_spaces_are_shingled_by_character() -> None:
    """A page of Chinese split at spaces was a few clause-long words: a copy with one
    character changed shared none of its shingles, and no near duplicate was found."""
    assert normalised_words("委员会审查了预算, and approved 新項目。") == [
        *"委员会审查了预算",
        "and",
        "approved",
        *"新項目",
    ]
    text = "".join(chr(0x4E00 + i * 37 % 20000) for i in range(400)).replace("\u4e00", "")
    text = "\uff0c".join(text[i : i + 40] for i in range(0, len(text), 40))  # clauses, no spaces
    changed = text[:200] + "些" + text[201:]
    first, second = (set(shingle_hashes([t], SHINGLE)[0].tolist()) for t in (text, changed))
    assert len(first & second) / len(first | second) > 0.95
    # an invisible character inside a word leaves it one word
    assert normalised_words("commit\u200btee soft\u00adhyphen") == ["committee", "softhyphen"]


def test_shingles_and_signatures_made_in_runs_are_those_of_one_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 16 MB batch held every word as a Python string at once (380 MB above the batch,
    kept by the worker's allocator): runs of text give the same keys."""
    import conveyor.stages.text._minhash as mh

    rng = np.random.default_rng(11)
    vocabulary = [f"w{i}" for i in range(300)]
    texts = [
        " ".join(rng.choice(vocabulary, size=int(n))) for n in rng.integers(0, 40, size=300)
    ] + ["", "!!!", "one two", "委员会审查了预算"]
    whole = mh.shingle_hashes(texts, 5)
    whole_sig = mh.signatures(*whole, 24, 7)
    monkeypatch.setattr(mh, "_SHINGLE_CHARS", 97)
    monkeypatch.setattr(mh, "_SIGNATURE_DOCS", 13)
    flat, offsets = mh.shingle_hashes(texts, 5)
    assert np.array_equal(flat, whole[0]) and np.array_equal(offsets, whole[1])
    assert np.array_equal(mh.signatures(flat, offsets, 24, 7), whole_sig)
    assert mh.signatures(np.zeros(0, np.uint64), np.zeros(1, np.int64), 24, 7).shape == (0, 24)


def test_the_ascii_shortcut_of_normalise_matches_its_definition() -> None:
    rng = np.random.default_rng(3)
    for _ in range(2000):
        text = "".join(map(chr, rng.integers(0, 128, size=int(rng.integers(0, 30)))))
        spec = re.sub(r"[^\w\s]|_", " ", unicodedata.normalize("NFKC", text).lower())
        assert normalise(text) == " ".join(spec.split()), repr(text)


def test_exact_removes_copies_across_batches_keeping_the_first(tmp_path: Path) -> None:
    texts = [
        "The cat sat on the mat.",  # 0 kept
        "Something else entirely",  # 1 kept
        "the CAT sat  on the mat.",  # 2 copy of 0
        "",  # 3 kept: the first empty text
        "SOMETHING else\tentirely ",  # 4 copy of 1
        "   ",  # 5 copy of 3 (empty after normalisation)
        "the cat sat on the mat.",  # 6 copy of 0
        "a different text",  # 7 kept
    ]
    ids = np.arange(100, 108, dtype=np.int64)
    stage = DedupKeys(tmp_path / "spill", "exact", partitions=3)
    _pass1(stage, _batches(texts, ids, 3))  # every copy is in another batch than its first
    result = resolve_duplicates(tmp_path / "spill", "exact")
    assert _removed(result).tolist() == [102, 104, 105, 106]
    assert (result.documents, result.components, result.removed) == (8, 3, 4)
    assert result.candidate_pairs == result.duplicate_pairs == 4
    assert result.removed_path == tmp_path / "spill" / "removed.npy"
    assert _removed(result).dtype == np.int64


def test_resolve_of_an_empty_spill_dir(tmp_path: Path) -> None:
    (tmp_path / "spill").mkdir()
    result = resolve_duplicates(tmp_path / "spill", "fuzzy", out_path=tmp_path / "r.npy")
    assert (result.documents, result.removed) == (0, 0)
    assert _removed(result).tolist() == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_duplicates(tmp_path / "nowhere", "exact")


# -- fuzzy quality -----------------------------------------------------------------------------
def _quality(removed: np.ndarray, expected: set[int]) -> tuple[float, float]:
    found = set(removed.tolist())
    hits = len(found & expected)
    return hits / max(len(found), 1), hits / len(expected)


def test_fuzzy_defaults_find_planted_near_duplicates(corpus: Corpus, tmp_path: Path) -> None:
    texts, ids, expected, far = corpus
    stage = DedupKeys(tmp_path / "spill", "fuzzy", partitions=8)
    _pass1(stage, _batches(texts, ids, 500))
    result = resolve_duplicates(tmp_path / "spill", "fuzzy")
    removed = _removed(result)
    precision, recall = _quality(removed, expected)
    assert precision >= 0.99 and recall >= 0.95, (precision, recall, result)
    kept = set(ids.tolist()) - set(removed.tolist())
    assert all(a in kept and b in kept for a, b in far)  # Jaccard 0.5-0.7: both stay
    assert result.documents == len(texts)
    assert result.removed == len(removed)
    assert result.candidate_pairs >= result.duplicate_pairs >= result.removed
    assert np.all(np.diff(removed) > 0)


def test_without_the_check_pairs_at_half_similarity_are_merged(
    corpus: Corpus, tmp_path: Path
) -> None:
    """The banding alone does not separate 0.5-0.7 from 0.8: that is what the check is for."""
    texts, ids, expected, far = corpus
    config = FuzzyDedupConfig(jaccard_check=False)
    _pass1(DedupKeys(tmp_path / "s", "fuzzy", config, partitions=4), _batches(texts, ids, 800))
    result = resolve_duplicates(tmp_path / "s", "fuzzy")
    assert result.candidate_pairs == result.duplicate_pairs
    spilled = list((tmp_path / "s" / "docs").rglob("*.arrow"))
    assert spilled and all(ipc.open_file(p).schema.names == ["doc"] for p in spilled)
    removed = set(_removed(result).tolist())
    merged = sum(1 for a, b in far if a in removed or b in removed)
    assert merged > len(far) // 10
    assert len(removed & expected) / len(expected) >= 0.95
    with pytest.raises(ValueError, match="spilled no shingle sets"):
        resolve_duplicates(tmp_path / "s", "fuzzy", FuzzyDedupConfig(jaccard_check=True))


# -- determinism and bounded memory -----------------------------------------------------------
def test_same_result_whatever_the_split_partitions_or_retries(
    corpus: Corpus, tmp_path: Path
) -> None:
    texts, ids, _, _ = corpus
    texts, ids = texts[:1500], ids[:1500]
    results = []
    for run, (size, partitions) in enumerate([(500, 8), (137, 3), (1500, 1)]):
        spill = tmp_path / f"run{run}"
        stage = DedupKeys(spill, "fuzzy", partitions=partitions)
        batches = _batches(texts, ids, size)
        _pass1(stage, batches)
        if run == 1:  # retries: the same batches again, also through a fresh worker's copy
            _pass1(stage, batches[:4])
            _pass1(DedupKeys(spill, "fuzzy", partitions=partitions), batches[-2:])
            files = [p.relative_to(spill) for p in spill.rglob("*.arrow")]
            assert len(files) == len(set(files)) and not list(spill.rglob("*.tmp"))
        results.append(resolve_duplicates(spill, "fuzzy"))
    first = _removed(results[0])
    assert len(first) > 0
    for result in results[1:]:
        assert np.array_equal(_removed(result), first)
        assert (result.candidate_pairs, result.duplicate_pairs, result.components) == (
            results[0].candidate_pairs,
            results[0].duplicate_pairs,
            results[0].components,
        )


def test_a_batch_spilled_twice_under_another_split_adds_nothing(
    corpus: Corpus, tmp_path: Path
) -> None:
    texts, ids, _, _ = corpus
    texts, ids = texts[:600], ids[:600]
    for mode in ("exact", "fuzzy"):
        once, twice = tmp_path / f"{mode}1", tmp_path / f"{mode}2"
        _pass1(DedupKeys(once, mode, partitions=2), _batches(texts, ids, 200))
        _pass1(DedupKeys(twice, mode, partitions=2), _batches(texts, ids, 200))
        _pass1(DedupKeys(twice, mode, partitions=2), _batches(texts, ids, 150))  # overlapping
        a, b = resolve_duplicates(once, mode), resolve_duplicates(twice, mode)
        assert np.array_equal(_removed(a), _removed(b)) and a.documents == b.documents == 600


def test_resolve_holds_one_partition_at_a_time(corpus: Corpus, tmp_path: Path) -> None:
    texts, ids, _, _ = corpus
    config = FuzzyDedupConfig()
    partitions = 16
    _pass1(DedupKeys(tmp_path / "s", "fuzzy", partitions=partitions), _batches(texts, ids, 1000))
    result = resolve_duplicates(tmp_path / "s", "fuzzy")
    total = result.documents * config.bands
    assert total / partitions * 0.8 < result.peak_partition_rows < total / partitions * 1.25
    assert not (tmp_path / "s" / "_resolve").exists()  # its scratch space is gone
    exact = tmp_path / "e"
    _pass1(DedupKeys(exact, "exact", partitions=4), _batches(texts, ids, 1000))
    rows = resolve_duplicates(exact, "exact").peak_partition_rows
    assert len(texts) / 4 * 0.8 < rows < len(texts) / 4 * 1.25


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"bands": 16, "rows": 8},
            r"num_perm must equal bands \* rows, got 120 != 16 \* 8 = 128 .*num_perm=128",
        ),
        ({"threshold": 0.0}, "threshold must be in"),
        ({"threshold": 1.5}, "threshold must be in"),
        ({"shingle_size": 0}, "shingle_size must be >= 1"),
        ({"num_perm": 0, "bands": 0, "rows": 6}, "num_perm must be >= 1"),
        ({"rows": 2.5}, "rows must be an int"),
        ({"seed": -1}, "seed must be in"),
        (
            {"bands": 10**6, "rows": 10**6},
            r"bands \* rows\) must be <= 1024, got 1,000,000,000,000",
        ),
        ({"num_perm": 2048, "bands": 1024, "rows": 2}, r"must be <= 1024, got 2,048"),
        ({"jaccard_check": "yes"}, "jaccard_check must be a bool"),
    ],
)
def test_bad_config_is_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FuzzyDedupConfig(**kwargs)


def test_bad_stage_arguments_and_columns(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode must be 'exact' or 'fuzzy'"):
        DedupKeys(tmp_path, "approximate")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partitions must be an int >= 1"):
        DedupKeys(tmp_path, "exact", partitions=0)
    stage = DedupKeys(tmp_path / "s", "fuzzy", text_column="body", id_column="doc_id")
    assert stage.inputs() == ([], ["body", "doc_id"])
    with pytest.raises(ValueError, match="no id column 'doc_id'"):
        stage.process(DocumentBatch(data=pa.table({"body": ["x"]})))
    with pytest.raises(ValueError, match="no text column 'body'"):
        stage.process(DocumentBatch(data=pa.table({"text": ["x"], "doc_id": [1]})))
    with pytest.raises(ValueError, match="id column 'doc_id' holds string"):
        stage.process(DocumentBatch(data=pa.table({"body": ["x"], "doc_id": ["1"]})))
    with pytest.raises(ValueError, match="repeated values in id column 'doc_id'"):
        stage.process(DocumentBatch(data=pa.table({"body": ["x", "y"], "doc_id": [1, 1]})))
    drop = DropDuplicates(tmp_path / "missing.npy", id_column="doc_id")
    with pytest.raises(FileNotFoundError, match=r"missing\.npy"):
        drop.process(DocumentBatch(data=pa.table({"doc_id": [1]})))
    np.save(tmp_path / "r.npy", np.array([1], dtype=np.int64))
    with pytest.raises(ValueError, match="no id column 'doc_id'"):
        DropDuplicates(tmp_path / "r.npy", id_column="doc_id").process(
            DocumentBatch(data=pa.table({"_conveyor_doc_id": [1]}))
        )


def test_spill_dir_of_other_settings_is_refused(tmp_path: Path) -> None:
    batch = DocumentBatch(data=pa.table({"text": ["some words here"], "_conveyor_doc_id": [1]}))
    DedupKeys(tmp_path, "fuzzy", partitions=4).process(batch)
    with pytest.raises(ValueError, match="already holds keys made with"):
        DedupKeys(tmp_path, "fuzzy", partitions=8).process(batch)
    with pytest.raises(ValueError, match="holds 'fuzzy' keys"):
        resolve_duplicates(tmp_path, "exact")
    with pytest.raises(ValueError, match=r"rows \(5 != 6\)"):
        resolve_duplicates(tmp_path, "fuzzy", FuzzyDedupConfig(num_perm=100, bands=20, rows=5))


def test_drop_duplicates_filters_rows_and_whole_batches(tmp_path: Path) -> None:
    np.save(tmp_path / "r.npy", np.array([2, 5, 6], dtype=np.int64))
    stage = DropDuplicates(tmp_path / "r.npy")
    out = stage.process(
        DocumentBatch(data=pa.table({"_conveyor_doc_id": [1, 2, 3, 5], "text": list("abcd")}))
    )
    assert out is not None and out.data.column("text").to_pylist() == ["a", "c"]
    assert out.metadata[DUPLICATES_REMOVED] == 2
    assert stage.process(DocumentBatch(data=pa.table({"_conveyor_doc_id": [5, 6]}))) is None
    kept = stage.process(DocumentBatch(data=pa.table({"_conveyor_doc_id": [7]})))
    assert kept is not None and kept.metadata[DUPLICATES_REMOVED] == 0


# -- through the engine ----------------------------------------------------------------------
def test_two_passes_through_the_engine(corpus: Corpus, tmp_path: Path) -> None:
    texts, ids, expected, _ = corpus
    texts, ids = texts[:1200], ids[:1200]
    spill = tmp_path / "spill"
    batches = _batches(texts, ids, 200)
    first = Pipeline("dedup-keys", [DedupKeys(spill, "fuzzy", partitions=4)]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), batches
    )
    assert first.ok, first.failures
    assert sum(task.num_items for task in first.outputs) == len(texts)
    result = resolve_duplicates(spill, "fuzzy")
    in_process = tmp_path / "in-process"
    _pass1(DedupKeys(in_process, "fuzzy", partitions=4), batches)
    assert np.array_equal(_removed(result), _removed(resolve_duplicates(in_process, "fuzzy")))
    removed = set(_removed(result).tolist())
    assert removed and len(removed - expected) <= len(removed) // 100  # planted ones only
    second = Pipeline("dedup-drop", [DropDuplicates(result.removed_path)]).run(
        StreamingExecutor(LocalBackend(num_cpus=2)), _batches(texts, ids, 200)
    )
    assert second.ok, second.failures
    survivors = sorted(
        i for task in second.outputs for i in task.data.column("_conveyor_doc_id").to_pylist()
    )
    assert survivors == sorted(set(ids.tolist()) - removed)
    assert sum(task.metadata[DUPLICATES_REMOVED] for task in second.outputs) == len(removed)
