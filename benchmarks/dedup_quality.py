"""Exact and fuzzy dedup on a planted corpus: precision, recall, speed and memory per setting.

Generates English-like documents (Zipf-distributed pseudo-words, 100-300 words, prose-style
capitals, commas and line breaks), then plants: near-duplicate groups (an original and one or
two copies edited word by word to a shingle Jaccard in [0.8, 0.97]), reformatted exact copies
(equal after ``normalise``), and "far" pairs edited to a Jaccard in [0.5, 0.7] that must both
be kept. Ids are a random permutation, so which member comes first is random.

Runs pass 1 (``DedupKeys.process_batch``, ``batch_size`` batches at a time as the engine
would) and ``resolve_duplicates`` (in a fresh interpreter, to measure its memory alone), no
engine, for exact mode and for several (bands, rows) choices, and prints per setting:

* precision and recall over removed documents: the expected set is every member of a planted
  group but its smallest id; precision = |removed & expected| / |removed|, recall =
  |removed & expected| / |expected|; recall is also split by the copy's Jaccard to its original
* far pairs merged: planted 0.5-0.7 pairs that lost a document (should be 0)
* candidate and verified pairs, the largest key partition, spill bytes per document
* pass-1 and resolve throughput (documents per second, one core) and the peak RSS of resolve,
  run in a fresh interpreter: "base+growth" MB, base being the interpreter with its imports

    .venv/bin/python benchmarks/dedup_quality.py                  # 50,000 documents
    .venv/bin/python benchmarks/dedup_quality.py --docs 5000      # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from _common import machine_line, table

from conveyor.stages.text.dedup import DedupKeys, DedupResult, FuzzyDedupConfig
from conveyor.tasks import DocumentBatch

SHINGLE = 5
BINS = ((0.80, 0.85), (0.85, 0.90), (0.90, 1.01))


# -- corpus ------------------------------------------------------------------------------------
def _shingles(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def _jaccard(a: set[tuple[str, ...]], words: list[str]) -> float:
    b = _shingles(words)
    return len(a & b) / len(a | b)


def _mutate(
    rng: np.random.Generator, words: list[str], vocab: list[str], lo: float, hi: float
) -> tuple[list[str], float]:
    """A copy with word edits (replace, insert, delete) to a shingle Jaccard in [lo, hi]."""
    original = _shingles(words)
    while True:
        target = rng.uniform(lo, hi)
        edited, similarity = list(words), 1.0
        while similarity > target:
            trial = list(edited)
            at = int(rng.integers(len(trial)))
            op = int(rng.integers(3))
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
            return edited, similarity


def _render(rng: np.random.Generator, words: list[str]) -> str:
    """Prose: some capitals, commas and full stops, spaces or line breaks between words."""
    n = len(words)
    caps = rng.random(n) < 0.05
    caps[0] = True
    marks = rng.random(n)
    tokens = [
        (w.capitalize() if c else w) + ("." if m < 0.06 else "," if m < 0.12 else "")
        for w, c, m in zip(words, caps.tolist(), marks.tolist(), strict=True)
    ]
    return ("  " if rng.random() < 0.5 else "\n").join(tokens)


@dataclass
class Corpus:
    texts: list[str]  # in id order
    ids: np.ndarray
    expected: set[int]  # ids to remove: every group member but the smallest id
    exact_expected: set[int]  # the same for the exact copies alone
    far: list[tuple[int, int]]
    copy_similarity: dict[int, float]  # near-duplicate copy id -> its Jaccard to its original


def planted_corpus(seed: int, docs: int) -> Corpus:
    """``docs`` documents: ~9% near-duplicate copies, ~1% exact copies, ~3% far copies."""
    rng = np.random.default_rng(seed)
    near_groups, exact_groups, far_pairs = docs * 6 // 100, docs // 100, docs * 3 // 100
    originals = docs - near_groups * 3 // 2 - exact_groups - far_pairs
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = sorted(
        {"".join(rng.choice(letters, size=int(rng.integers(2, 10)))) for _ in range(20000)}
    )
    weights = 1.0 / (np.arange(len(vocab)) + 20.0)
    weights /= weights.sum()
    lengths = rng.integers(100, 301, size=originals)
    drawn = rng.choice(len(vocab), size=int(lengths.sum()), p=weights)
    cuts = np.cumsum(lengths)[:-1]
    base = [[vocab[i] for i in chunk] for chunk in np.split(drawn, cuts)]
    words: list[list[str]] = list(base)
    order = rng.permutation(originals)
    groups: list[list[int]] = []
    similarity: dict[int, float] = {}
    near_originals = order[:near_groups]
    for n, i in enumerate(near_originals):
        members = [int(i)]
        for _ in range(1 + (n % 2)):  # one or two copies: 1.5 per group
            edited, value = _mutate(rng, base[i], vocab, 0.8, 0.97)
            similarity[len(words)] = value
            members.append(len(words))
            words.append(edited)
        groups.append(members)
    for i in order[near_groups : near_groups + exact_groups]:
        words.append(list(base[i]))
    far_index = []
    for i in order[near_groups + exact_groups : near_groups + exact_groups + far_pairs]:
        far_index.append((int(i), len(words)))
        words.append(_mutate(rng, base[i], vocab, 0.5, 0.7)[0])
    # copies that came out identical by chance (two one-word edits alike) are exact copies too
    same: dict[tuple[str, ...], list[int]] = {}
    for index, doc in enumerate(words):
        same.setdefault(tuple(doc), []).append(index)
    exact = [members for members in same.values() if len(members) > 1]
    ids = rng.permutation(len(words)).astype(np.int64)
    texts = [_render(rng, w) for w in words]

    def to_remove(sets: list[list[int]]) -> set[int]:
        out: set[int] = set()
        for members in sets:
            out.update(sorted(int(ids[m]) for m in members)[1:])
        return out

    by_id = np.argsort(ids)
    return Corpus(
        texts=[texts[i] for i in by_id],
        ids=ids[by_id],
        expected=to_remove(groups + exact),
        exact_expected=to_remove(exact),
        far=[(int(ids[a]), int(ids[b])) for a, b in far_index],
        copy_similarity={int(ids[k]): v for k, v in similarity.items()},
    )


# -- measuring ---------------------------------------------------------------------------------
_RESOLVE = """
import json, sys, time
from dataclasses import asdict
from conveyor.stages.text.dedup import FuzzyDedupConfig, resolve_duplicates

def high_water_kb():  # VmHWM belongs to this exec's memory (ru_maxrss counts the fork's)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

spill, mode, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
config = FuzzyDedupConfig(**config) if config else None
base = high_water_kb()
start = time.perf_counter()
result = resolve_duplicates(spill, mode, config)
seconds = time.perf_counter() - start
peak = high_water_kb()
out = {k: str(v) if k == "removed_path" else v for k, v in asdict(result).items()}
print(json.dumps({"result": out, "seconds": seconds, "base_kb": base, "peak_kb": peak}))
"""


def resolve_in_child(spill: Path, mode: str, config: FuzzyDedupConfig | None) -> dict[str, Any]:
    """``resolve_duplicates`` in a fresh interpreter, so its peak RSS is its own."""
    argument = json.dumps(dataclasses.asdict(config) if config else None)
    done = subprocess.run(
        [sys.executable, "-c", _RESOLVE, str(spill), mode, argument],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(
    label: str,
    corpus: Corpus,
    spill: Path,
    mode: str,
    config: FuzzyDedupConfig | None,
    args: argparse.Namespace,
    partitions: int,
) -> list[str]:
    batches = [
        DocumentBatch(
            data=pa.table(
                {
                    "text": corpus.texts[s : s + args.batch],
                    "_conveyor_doc_id": corpus.ids[s : s + args.batch],
                }
            )
        )
        for s in range(0, len(corpus.texts), args.batch)
    ]
    stage = DedupKeys(spill, mode, config, partitions=partitions)  # type: ignore[arg-type]

    start = time.perf_counter()
    for first in range(0, len(batches), stage.batch_size):  # as the engine hands them over
        stage.process_batch(batches[first : first + stage.batch_size])
    pass1_s = time.perf_counter() - start
    spill_bytes = sum(p.stat().st_size for p in spill.rglob("*") if p.is_file())
    child = resolve_in_child(spill, mode, config)
    result = DedupResult(**child["result"])
    resolve_s = child["seconds"]
    resolve_mb = (child["peak_kb"] - child["base_kb"]) / 1024
    removed = set(np.load(result.removed_path).tolist())
    expected = corpus.expected if mode == "fuzzy" else corpus.exact_expected
    hits = len(removed & expected)
    precision = hits / len(removed) if removed else 1.0
    recall = hits / len(expected)
    by_bin = []
    for lo, hi in BINS:
        members = [d for d, v in corpus.copy_similarity.items() if lo <= v < hi and d in expected]
        by_bin.append(sum(d in removed for d in members) / max(len(members), 1))
    far_merged = sum(1 for a, b in corpus.far if a in removed or b in removed)
    n = len(corpus.texts)
    row = [
        label,
        f"{precision:.4f}",
        f"{recall:.4f}",
        *(f"{value:.3f}" if mode == "fuzzy" else "-" for value in by_bin),
        f"{far_merged}/{len(corpus.far)}",
        f"{result.candidate_pairs:,}",
        f"{result.duplicate_pairs:,}",
        f"{result.peak_partition_rows:,}",
        f"{spill_bytes / n:.0f}",
        f"{n / pass1_s:,.0f}",
        f"{n / resolve_s:,.0f}",
        f"{child['base_kb'] / 1024:.0f}+{resolve_mb:.0f}",
    ]
    print(f"  {label}: pass 1 {pass1_s:.1f} s, resolve {resolve_s:.2f} s, {result}", flush=True)
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=50_000, help="documents (default 50,000)")
    p.add_argument("--batch", type=int, default=1000, help="documents per batch (default 1000)")
    p.add_argument("--partitions", type=int, default=16, help="spill partitions (default 16)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--shapes",
        default="20x6,16x8,20x5,32x4",
        help="bands x rows to compare, the first being the default (default 20x6,16x8,20x5,32x4)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(machine_line(1))
    print(f"date: {datetime.date.today()}")
    start = time.perf_counter()
    corpus = planted_corpus(args.seed, args.docs)
    print(
        f"corpus: {len(corpus.texts):,} documents, {len(corpus.expected):,} to remove "
        f"({len(corpus.exact_expected):,} exact copies), {len(corpus.far):,} far pairs, "
        f"{sum(map(len, corpus.texts)) / len(corpus.texts):,.0f} characters per document, "
        f"made in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    default = FuzzyDedupConfig()
    parts = args.partitions
    settings: list[tuple[str, str, FuzzyDedupConfig | None, int]] = [
        ("exact", "exact", None, parts)
    ]
    for shape in args.shapes.split(","):
        bands, rows = (int(x) for x in shape.split("x"))
        config = FuzzyDedupConfig(num_perm=bands * rows, bands=bands, rows=rows)
        s8 = config.candidate_probability(0.8)
        s5 = config.candidate_probability(0.5)
        name = f"{bands}x{rows}" + (" (default)" if config == default else "")
        settings.append((f"{name} P(.8)={s8:.3f} P(.5)={s5:.2f}", "fuzzy", config, parts))
    settings.append(
        ("20x6 no Jaccard check", "fuzzy", FuzzyDedupConfig(jaccard_check=False), parts)
    )
    settings.append(("20x6 in 1 partition (memory)", "fuzzy", default, 1))
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="dedup-bench-") as tmp:
        for n, (label, mode, config, partitions) in enumerate(settings):
            spill = Path(tmp) / str(n)
            rows_out.append(measure(label, corpus, spill, mode, config, args, partitions))
    header = [
        "setting",
        "precision",
        "recall",
        *(f"rec J{lo:.2f}+" for lo, _ in BINS),
        "far merged",
        "candidates",
        "verified",
        "peak part rows",
        "spill B/doc",
        "pass1 doc/s",
        "resolve doc/s",
        "resolve RSS MB",
    ]
    print()
    print(
        table(
            f"dedup on {len(corpus.texts):,} documents, {args.partitions} partitions unless "
            f"said, batches of "
            f"{args.batch}, one core (exact: precision/recall over the exact copies alone)",
            header,
            rows_out,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
