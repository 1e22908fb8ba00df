"""JSONL parts rewritten to one field order at publishing: the driver alone against the
run's workers.

A text run writing JSONL whose records do not all have the same fields (or not in one
order) rewrites its parts at the end so that every record has every field in one order
(``writers.unify_jsonl``). The driver did it alone, at about 60 MB/s; past
``PARALLEL_REWRITE_BYTES`` the parts are shared among the run's workers. This script makes
the same parts twice (``--parts`` of ``--part-mb`` each, half of them with a field the
others lack), rewrites one copy in this process and the other on a local streaming
executor (its start included), checks that both give the same bytes, and prints the two
times and their ratio.

    python benchmarks/jsonl_unify.py --parts 8 --part-mb 32
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from conveyor.backends import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.stages.text.writers import unify_jsonl


def make_parts(folder: Path, parts: int, part_mb: float, seed: int = 1) -> list[Path]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    folder.mkdir(parents=True)
    paths = []
    for n in range(parts):
        path = folder / f"part-{n:05d}.jsonl"
        with open(path, "w") as out:
            size = 0
            while size < part_mb * (1 << 20):
                record = {"text": " ".join(rng.choices(words, k=60)), "id": size, "score": 0.5}
                if n % 2:
                    record["source"] = "crawl"  # a field the even parts lack
                line = json.dumps(record) + "\n"
                out.write(line)
                size += len(line)
        paths.append(path)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--part-mb", type=float, default=32.0)
    p.add_argument("--repeat", type=int, default=3, help="rounds, the two ways in turn")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="conveyor-jsonl-unify-"))
    try:
        base = make_parts(root / "base", args.parts, args.part_mb)
        total = sum(p.stat().st_size for p in base) / 1e6
        times: dict[str, list[float]] = {"driver alone": [], "workers": []}
        same = True
        for n in range(args.repeat):
            made = {}
            for way in times:
                shutil.copytree(root / "base", root / f"{way}-{n}")
                made[way] = sorted((root / f"{way}-{n}").glob("*.jsonl"))
            for way in sorted(times, key=lambda w: (w == "workers") == bool(n % 2)):
                executor = StreamingExecutor(LocalBackend()) if way == "workers" else None
                t0 = time.perf_counter()
                unify_jsonl(made[way], executor=executor)  # (the executor's start counts)
                times[way].append(time.perf_counter() - t0)
            pairs = zip(made["driver alone"], made["workers"], strict=True)
            same = same and all(a.read_bytes() == b.read_bytes() for a, b in pairs)
            for way in times:
                shutil.rmtree(root / f"{way}-{n}")
        print(
            f"{args.parts} parts, {total:,.0f} MB ({args.parts // 2} rewritten), "
            f"{os.cpu_count()} CPUs, {args.repeat} rounds; same bytes: {same}"
        )
        for way, found in times.items():
            median = statistics.median(found)
            print(f"{way:<14}{median:8.2f} s (median; {', '.join(f'{t:.2f}' for t in found)})")
        alone, shared = (statistics.median(t) for t in times.values())
        print(f"ratio (driver alone / workers): {alone / shared:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
