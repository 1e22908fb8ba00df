"""Gopher-style rules one by one, and HeuristicFilter on whole batches."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest

from conveyor.stages.text import (
    REJECTED_BY,
    AlphaWords,
    BulletLines,
    DuplicateNGramChars,
    EllipsisLines,
    HeuristicFilter,
    MeanWordLength,
    RepeatedLineChars,
    RepeatedLines,
    RepeatedParagraphChars,
    RepeatedParagraphs,
    Rule,
    StopWords,
    SymbolToWordRatio,
    TextStats,
    TopNGramChars,
    WordCount,
    gopher_rules,
)
from conveyor.tasks import DocumentBatch


def _words(n: int, word: str = "word") -> str:
    return " ".join([word] * n)


def _keep(rule: Rule, text: str) -> bool:
    return rule.keep(TextStats.of(text))


def test_text_stats_split_words_and_non_empty_lines() -> None:
    stats = TextStats.of("  one two \n\n three\n   \n")
    assert stats.words == ["one", "two", "three"]
    assert stats.lines == ["one two", "three"]


@pytest.mark.parametrize(("n", "kept"), [(2, False), (3, True), (5, True), (6, False)])
def test_word_count_bounds_are_inclusive(n: int, kept: bool) -> None:
    assert _keep(WordCount(min_words=3, max_words=5), _words(n)) is kept


@pytest.mark.parametrize(
    ("word", "kept"), [("ab", False), ("abc", True), ("abcdefghij", True), ("abcdefghijk", False)]
)
def test_mean_word_length(word: str, kept: bool) -> None:
    assert _keep(MeanWordLength(), _words(10, word)) is kept


def test_mean_word_length_mixes_lengths_and_ignores_empty_text() -> None:
    assert _keep(MeanWordLength(min_length=3, max_length=3), "ab abcd")  # mean 3
    assert _keep(MeanWordLength(), "   ")


def test_symbol_to_word_ratio_counts_hashes_and_ellipses() -> None:
    rule = SymbolToWordRatio(max_ratio=0.1)
    assert _keep(rule, _words(19) + " #tag")  # 1 / 20 words
    assert _keep(rule, _words(9) + " #tag")  # 1 / 10: the bound is inclusive
    assert not _keep(rule, _words(8) + " #a #b")  # 2 / 10
    assert not _keep(rule, _words(8) + " wait... what\u2026")  # 2 ellipses / 10 words
    # hashes and ellipses are held to the ratio apart, as Gopher does: 1 of each per 10
    # words passes (it was rejected as 2 symbols)
    assert _keep(rule, _words(8) + " #tag wait...")
    assert not _keep(rule, _words(7) + " #a #b wait...")
    assert _keep(SymbolToWordRatio(max_ratio=0.5, symbols=("$",)), "$ $ a b")
    assert not _keep(SymbolToWordRatio(max_ratio=0.4, symbols=("$",)), "$ $ a b")
    assert _keep(SymbolToWordRatio(max_ratio=0.3, symbols=("$", "%")), "$ $ % % a b c d")
    assert not _keep(SymbolToWordRatio(max_ratio=0.3, symbols=(("$", "%"),)), "$ $ % % a b c d")


def test_ellipsis_lines_fraction() -> None:
    rule = EllipsisLines(max_fraction=0.5)
    assert _keep(rule, "read more...\nfull line\n")
    assert not _keep(rule, "read more...\nand more\u2026\nfull line")
    assert _keep(rule, "")


def test_repeated_lines_fraction() -> None:
    rule = RepeatedLines(max_fraction=0.3)
    assert _keep(rule, "a\nb\nc\na")  # 1 repeat / 4 lines
    assert not _keep(rule, "a\nb\na\na")  # 2/4
    assert _keep(rule, "only one line")
    assert not _keep(RepeatedLines(max_fraction=0.0), "x\n  x  ")  # compared stripped


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: WordCount(min_words=10, max_words=5), "min_words <= max_words"),
        (lambda: MeanWordLength(min_length=-1), "min_length <= max_length"),
        (lambda: SymbolToWordRatio(max_ratio=-0.1), "max_ratio must be >= 0"),
        (lambda: SymbolToWordRatio(symbols=()), "symbols must be non-empty"),
        (lambda: SymbolToWordRatio(symbols=("#", ())), "symbols must be non-empty"),
        (lambda: SymbolToWordRatio(symbols=(("...", ""),)), "symbols must be non-empty"),
        (lambda: EllipsisLines(max_fraction=1.5), r"max_fraction must be in \[0, 1\]"),
        (lambda: RepeatedLines(max_fraction=-0.5), r"max_fraction must be in \[0, 1\]"),
    ],
)
def test_rule_settings_are_validated(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


# -- the Gopher rules the default set leaves out ----------------------------------------------
def test_bulleted_lines_and_words_without_a_letter() -> None:
    items = [f"{mark} item {i} of the list" for i, mark in enumerate("-*\u2022\u25cf" * 3)]
    assert not _keep(BulletLines(), "\n".join(items))
    assert _keep(BulletLines(), "\n".join([*items[:9], "a line", "another line"]))  # 9/11
    assert _keep(BulletLines(), "")
    assert not _keep(AlphaWords(), " ".join(["20231115"] * 80))
    assert not _keep(AlphaWords(), "\n".join(["----"] * 80))
    assert _keep(AlphaWords(), _words(8, "word") + " 12 34")  # 8/10 words have a letter
    assert not _keep(AlphaWords(), _words(7, "word") + " 12 34 56")
    assert _keep(AlphaWords(), "年度预算 é 中")  # letters of any script


def test_stop_words_are_english_function_words() -> None:
    assert not _keep(StopWords(), _words(80, "budget"))  # keyword spam
    assert _keep(StopWords(), "The budget of the city.")  # "The" and "of": 2, any case
    assert not _keep(StopWords(min_count=3), "The budget of a city.")
    assert not _keep(StopWords(), "Der Haushalt der Stadt wurde genehmigt.")


def test_repeated_paragraphs_and_the_characters_in_repeats() -> None:
    para = _words(40, "alpha")
    twice = f"{para}\n\n{para}\n \n{para}\n\nshort one\n\nshort two"  # 2 of 5 repeat
    assert not _keep(RepeatedParagraphs(max_fraction=0.3), twice)
    assert _keep(RepeatedParagraphs(max_fraction=0.4), twice)
    assert not _keep(RepeatedParagraphChars(), twice)  # most characters are repeats
    assert _keep(RepeatedParagraphChars(), f"{para}\n\nother text here")
    long_line = _words(30, "gamma")
    lines = "\n".join([long_line, long_line, *(f"line {i}" for i in range(10))])
    assert _keep(RepeatedLines(), lines)  # 1 of 12 lines repeats
    assert not _keep(RepeatedLineChars(), lines)  # but it is 2/3 of the characters


def test_repeated_n_grams() -> None:
    assert not _keep(TopNGramChars(2, 0.2), " ".join(["buy now cheap"] * 40))
    rng = random.Random(0)
    vocabulary = [f"w{i}x" for i in range(500)]
    prose = " ".join(rng.choice(vocabulary) for _ in range(300))
    for n in range(2, 5):
        assert _keep(TopNGramChars(n, 0.2), prose)
    for n in range(5, 11):
        assert _keep(DuplicateNGramChars(n, 0.1), prose)
    copied = prose + " " + " ".join(prose.split()[:60])  # 60 of 360 words again
    assert not _keep(DuplicateNGramChars(5, 0.15), copied)  # 120 words inside repeats
    assert _keep(DuplicateNGramChars(5, 0.35), copied)
    assert _keep(TopNGramChars(2), "one two")  # no n-gram occurs twice
    assert TopNGramChars(3).name == "top_3gram_chars"
    assert DuplicateNGramChars(7).name == "duplicate_7gram_chars"
    with pytest.raises(ValueError, match="n must be >= 1"):
        DuplicateNGramChars(0)


def test_the_full_gopher_set_has_the_paper_s_thresholds_and_unique_names() -> None:
    full = gopher_rules(full=True)
    names = [rule.name for rule in full]
    assert names[:5] == [rule.name for rule in gopher_rules()] and len(set(names)) == len(names)
    thresholds = {r.name: r.max_fraction for r in full if hasattr(r, "n")}
    assert thresholds == {
        "top_2gram_chars": 0.2, "top_3gram_chars": 0.18, "top_4gram_chars": 0.16,
        "duplicate_5gram_chars": 0.15, "duplicate_6gram_chars": 0.14,
        "duplicate_7gram_chars": 0.13, "duplicate_8gram_chars": 0.12,
        "duplicate_9gram_chars": 0.11, "duplicate_10gram_chars": 0.1,
    }  # fmt: skip
    assert "stop_words" not in names  # English only: asked for apart
    HeuristicFilter(full)  # names unique, every rule a Rule


def _batch(texts: list[str | None], **columns: list[object]) -> DocumentBatch:
    data = {"text": pa.array(texts, type=pa.string()), **columns}
    return DocumentBatch(data=pa.table(data), task_id="7", metadata={"source_files": ["f.jsonl"]})


GOOD = _words(60, "river")
SHORT = "too short"
HASHY = _words(60, "#tag")
REPEATED = "\n".join([_words(10, "same")] * 10)


def test_filter_keeps_good_rows_and_counts_the_first_failing_rule() -> None:
    task = _batch([GOOD, SHORT, HASHY, GOOD, REPEATED, None], id=[1, 2, 3, 4, 5, 6])
    out = HeuristicFilter().process(task)
    assert out is not None
    assert out.data.column("id").to_pylist() == [1, 4]
    # a null text counts as empty; HASHY also has a mean word length of 4, so only the
    # symbol rule rejects it; REPEATED is long enough and fails on its repeated lines
    assert out.metadata[REJECTED_BY] == {
        "word_count": 2,
        "mean_word_length": 0,
        "symbol_to_word_ratio": 1,
        "ellipsis_lines": 0,
        "repeated_lines": 1,
    }
    assert out.metadata["source_files"] == ["f.jsonl"]


def test_counts_add_up_across_filter_stages() -> None:
    first = HeuristicFilter(rules=[WordCount(min_words=3)])
    second = HeuristicFilter(rules=[WordCount(min_words=50), RepeatedLines()])
    mid = first.process(_batch([GOOD, SHORT, "a b c d"]))
    assert mid is not None
    out = second.process(mid)
    assert out is not None
    assert out.num_items == 1
    assert out.metadata[REJECTED_BY] == {"word_count": 2, "repeated_lines": 0}


def test_all_rejected_batch_is_dropped_unless_asked_to_keep_it() -> None:
    task = _batch([SHORT, SHORT])
    assert HeuristicFilter().process(task) is None
    out = HeuristicFilter(drop_empty=False).process(task)
    assert out is not None
    assert out.num_items == 0
    assert out.metadata[REJECTED_BY]["word_count"] == 2


def test_pandas_batches_are_accepted() -> None:
    task = DocumentBatch(data=pd.DataFrame({"text": [GOOD, SHORT], "n": [1, 2]}))
    out = HeuristicFilter().process(task)
    assert out is not None
    assert out.to_pandas()["n"].tolist() == [1]


def test_custom_text_field_and_declared_columns() -> None:
    stage = HeuristicFilter(text_field="body")
    assert stage.inputs() == ([], ["body"])
    assert stage.outputs() is None  # pass-through: see the comment in HeuristicFilter
    out = stage.process(DocumentBatch(data=pa.table({"body": [GOOD]})))
    assert out is not None
    assert out.num_items == 1


def test_missing_text_column_names_task_files_and_columns() -> None:
    task = DocumentBatch(
        data=pa.table({"body": ["x"], "id": [1]}), task_id="3.1", metadata={"source_files": ["a"]}
    )
    with pytest.raises(ValueError, match=r"task 3\.1 \(from a\) has no column 'text'") as info:
        HeuristicFilter().process(task)
    assert "columns: body, id" in str(info.value)


def test_non_string_text_column_is_rejected() -> None:
    with pytest.raises(ValueError, match="column 'text' holds int64, expected strings"):
        HeuristicFilter().process(DocumentBatch(data=pa.table({"text": [1, 2]})))


def test_bad_rule_lists() -> None:
    with pytest.raises(ValueError, match="rules must not be empty"):
        HeuristicFilter(rules=[])
    with pytest.raises(TypeError, match="is not a conveyor Rule"):
        HeuristicFilter(rules=["word_count"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="rule names must be unique"):
        HeuristicFilter(rules=[WordCount(), WordCount(min_words=1)])


def test_default_rules_and_resources() -> None:
    assert [r.name for r in gopher_rules()] == [
        "word_count",
        "mean_word_length",
        "symbol_to_word_ratio",
        "ellipsis_lines",
        "repeated_lines",
    ]
    assert HeuristicFilter().resources.cpus == 1.0


#: a paragraph of prose in each of three scripts written without spaces between words
UNSPACED = {
    "zh": "自然语言处理是计算机科学领域与人工智能领域中的一个重要方向。它研究能实现人与计算机"
    "之间用自然语言进行有效通信的各种理论和方法。",
    "ja": "自然言語処理は、人間が日常的に使っている自然言語をコンピュータに処理させる一連の"
    "技術であり、人工知能と言語学の一分野である。",
    "th": "การประมวลผลภาษาธรรมชาติเป็นสาขาหนึ่งของปัญญาประดิษฐ์และภาษาศาสตร์ที่มุ่งเน้น"
    "การทำให้คอมพิวเตอร์เข้าใจภาษามนุษย์",
}


@pytest.mark.parametrize("language", sorted(UNSPACED))
def test_prose_in_scripts_without_spaces_passes_the_word_rules(language: str) -> None:
    """Split at spaces, a page of Chinese was a few words of hundreds of characters: every
    Chinese, Japanese and Thai document was filtered, whatever --languages said."""
    text = UNSPACED[language]
    stats = TextStats.of(text)
    assert stats.unspaced and len(stats.words) >= 50  # a character is a word there
    assert all(rule.keep(stats) for rule in gopher_rules())
    assert not WordCount().keep(TextStats.of(text[:20]))  # a fragment is still one
    mixed = TextStats.of("Python 3.12 " + text)
    assert mixed.words[:2] == ["Python", "3.12"] and mixed.unspaced
    assert not TextStats.of(_words(60) + " 東京").unspaced
