"""Semantic dedup at scale: ``conveyor.dedup.semantic_dedup`` against one process holding
everything, on synthetic clustered embeddings with planted near-duplicates.

Cases, each run in a fresh child process whose whole process tree (the driver and every
worker it starts) is sampled for CPU and peak memory:

* **growth**: ``--sizes`` (default 1M and 5M items of ``--dim`` 1,280 float32) through ours
  on the local backend, next to the one-process baseline (every embedding in memory, faiss
  k-means with the same number of clusters, then faiss's exact range search within each
  cluster at the threshold) where its memory fits (under half of the machine's). The table
  shows wall and peak memory against N: ours should stay flat in memory, the baseline grows
  with N.
* **quality**: ``--quality`` items (default 200,000) through ours with several numbers of
  clusters (``--clusters``), against the keep rule over *all* pairs (exact, blockwise):
  precision (every mark is a real pair above the threshold: 1.0 by construction, checked)
  and recall.
* **ray** (``--ray``): the smallest size on a 2-node loopback Ray cluster (started inside
  the child, so its processes count in the tree; its start-up is reported apart).

The data: ``N / 1,000`` topics (Gaussian centres); each item a topic's centre plus noise
(cosine about 0.5 within a topic); one item in ten has one to three near-copies with cosine
spread over 0.92-0.999 around the 0.95 threshold. Written once to ``--data`` (files of
100,000 rows, row groups of 10,000) and reused while the recipe is the same.

    .venv/bin/python benchmarks/semdedup.py                        # 1M, 5M, quality 200k
    .venv/bin/python benchmarks/semdedup.py --sizes 1000000 --ray  # 1M, and on Ray
    .venv/bin/python benchmarks/semdedup.py --quick                # a few seconds
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from _common import machine_line, table

ROWS_PER_FILE = 100_000
ROW_GROUP = 10_000
THRESHOLD = 0.95
HERE = Path(__file__).resolve().parent


# -- data ------------------------------------------------------------------------------------------
def recipe(n: int, dim: int, seed: int) -> dict[str, Any]:
    return {"n": n, "dim": dim, "seed": seed, "version": 1}


def make_data(folder: Path, n: int, dim: int, seed: int = 0) -> Path:
    """``n`` items (base items and their near-copies, interleaved as they are made) under
    ``folder``; cached by recipe."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    stamp = folder / "recipe.json"
    if stamp.exists() and json.loads(stamp.read_text()) == recipe(n, dim, seed):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((max(1, n // 1000), dim), dtype=np.float32)
    made = 0
    for index in range(-(-n // ROWS_PER_FILE)):
        rows = min(ROWS_PER_FILE, n - made)
        base_rows = int(rows / 1.2)
        base = topics[rng.integers(0, len(topics), base_rows)]
        base += rng.standard_normal((base_rows, dim), dtype=np.float32)
        copies = []
        while base_rows + sum(len(c) for c in copies) < rows:
            left = rows - base_rows - sum(len(c) for c in copies)
            src = base[rng.integers(0, base_rows, min(left, 1 + left // 3))]
            # cosine 1 / sqrt(1 + eps^2): eps in [0.045, 0.43] spans 0.999 .. 0.92
            eps = rng.uniform(0.045, 0.43, (len(src), 1)).astype(np.float32)
            noise = rng.standard_normal(src.shape, dtype=np.float32)
            noise *= eps * np.linalg.norm(src, axis=1, keepdims=True) / np.sqrt(dim)
            copies.append(src + noise)
        vectors = np.concatenate([base, *copies])[:rows]
        vectors = vectors[rng.permutation(rows)]
        ids = pa.array(np.arange(made, made + rows, dtype=np.int64))
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
        pq.write_table(
            pa.table({"id": ids, "embedding": embedding}),
            folder / f"part-{index:05d}.parquet",
            row_group_size=ROW_GROUP,
            compression="none",
        )
        made += rows
    stamp.write_text(json.dumps(recipe(n, dim, seed)))
    return folder


def read_all(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, unit rows) of every file, filled into one preallocated array (no second copy)."""
    import pyarrow.parquet as pq

    from conveyor.dedup.similarity import normalise

    paths = sorted(folder.glob("*.parquet"))
    metas = [pq.read_metadata(p) for p in paths]
    n = sum(m.num_rows for m in metas)
    ids = np.empty(n, np.int64)
    vectors: np.ndarray | None = None
    at = 0
    for path in paths:
        t = pq.read_table(path)
        flat = t.column("embedding").combine_chunks().values.to_numpy()
        rows = flat.reshape(t.num_rows, -1)
        if vectors is None:
            vectors = np.empty((n, rows.shape[1]), np.float32)
        vectors[at : at + t.num_rows] = normalise(rows)
        ids[at : at + t.num_rows] = t.column("id").to_numpy()
        at += t.num_rows
        del t, flat, rows
    assert vectors is not None
    return ids, vectors


# -- the children --------------------------------------------------------------------------------
def child_ours(args: argparse.Namespace) -> dict[str, Any]:
    from conveyor.dedup import semantic_dedup

    executor = None
    started = time.perf_counter()
    stack = contextlib.ExitStack()
    ray_start = None
    if args.ray:
        import _ray_cluster

        _ray_cluster.prepare()
        address = stack.enter_context(_ray_cluster.two_node_cluster(cpus_per_node=1))
        from conveyor.backends.ray import RayBackend
        from conveyor.executors.streaming import StreamingExecutor

        executor = StreamingExecutor(RayBackend(address))
        ray_start = time.perf_counter() - started
    with stack:
        t0 = time.perf_counter()
        result = semantic_dedup(
            args.input, args.out, threshold=THRESHOLD, n_clusters=args.clusters, executor=executor
        )
        wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "ray_start_s": ray_start,
        "duplicates": result.duplicates,
        "clusters": result.clusters,
        "passes": result.passes,
    }


def child_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """Every embedding in this process: faiss k-means (same k, same sample size), then within
    each cluster faiss's exact range search at the threshold (BLAS, as ours), and the same
    keep rule (an item with an earlier item in range is a duplicate)."""
    import faiss

    t0 = time.perf_counter()
    _, x = read_all(Path(args.input))
    n, dim = x.shape
    k = args.clusters
    sample = x[np.random.default_rng(0).choice(n, min(n, max(64 * k, 20_000)), replace=False)]
    kmeans = faiss.Kmeans(dim, k, niter=20, seed=0, spherical=True)
    kmeans.train(sample)
    _, nearest = kmeans.index.search(x, 1)
    duplicates = 0
    for cluster in range(k):
        members = np.flatnonzero(nearest[:, 0] == cluster)
        if len(members) < 2:
            continue
        index = faiss.IndexFlatIP(dim)
        index.add(x[members])
        lims, _, found = index.range_search(x[members], THRESHOLD)
        query = np.repeat(np.arange(len(members)), np.diff(lims).astype(np.int64))
        duplicates += len(np.unique(query[found < query]))
    return {"wall_s": time.perf_counter() - t0, "duplicates": duplicates, "clusters": k}


def child_exact(args: argparse.Namespace) -> dict[str, Any]:
    from conveyor.dedup.similarity import best_earlier_within

    t0 = time.perf_counter()
    ids, x = read_all(Path(args.input))
    found, _, _ = best_earlier_within(x, np.arange(len(x)), THRESHOLD)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    np.save(Path(args.out) / "exact.npy", np.sort(ids[found]))
    return {"wall_s": time.perf_counter() - t0, "duplicates": len(found)}


class Watch:
    """CPU seconds and peak summed RSS of a child process and its descendants."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        self.cpu: dict[int, float] = {}
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            rss = 0
            with contextlib.suppress(psutil.Error):
                for p in [self.proc, *self.proc.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error), p.oneshot():
                        t = p.cpu_times()
                        self.cpu[p.pid] = t.user + t.system + t.children_user + t.children_system
                        rss += p.memory_info().rss
            self.peak = max(self.peak, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_child(kind: str, data: Path, out: Path, clusters: int, ray: bool = False) -> dict:
    command = [sys.executable, __file__, "--child", kind, "--input", str(data), "--out", str(out)]
    command += ["--clusters", str(clusters)] + (["--ray"] if ray else [])
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=HERE)
    watch = Watch(psutil.Process(proc.pid))
    stdout, _ = proc.communicate()
    watch.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{kind} on {data} failed (exit {proc.returncode})")
    figures = json.loads(stdout.strip().splitlines()[-1])
    figures["cpu_s"] = sum(watch.cpu.values())
    figures["peak_rss_mb"] = watch.peak / 2**20
    return figures


# -- the cases ------------------------------------------------------------------------------------
def growth(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rows = []
    ram = psutil.virtual_memory().total
    for n in args.sizes:
        data = make_data(args.data / f"n{n}-d{args.dim}", n, args.dim)
        clusters = max(1, n // 10_000)
        ours = run_child("ours", data, work / f"ours-{n}", clusters)
        print(f"  {n:,}: ours {ours['wall_s']:.1f} s, {ours['peak_rss_mb']:.0f} MB", flush=True)
        need = n * args.dim * 4 * 1.5  # the embeddings, a file read, the largest cluster
        if need < ram / 2:
            base = run_child("baseline", data, work / f"base-{n}", clusters)
        else:
            base = {"skipped": f"needs ~{need / 2**30:.0f} GB, over half of {ram / 2**30:.0f} GB"}
        rows.append({"n": n, "clusters": clusters, "ours": ours, "baseline": base})
        if "wall_s" in base:
            print(f"  {n:,}: one process {base['wall_s']:.1f} s, {base['peak_rss_mb']:.0f} MB")
    return rows


def quality(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    n = args.quality
    data = make_data(args.data / f"n{n}-d{args.dim}", n, args.dim, seed=1)
    exact = run_child("exact", data, work / "exact", 1)
    truth = np.load(work / "exact" / "exact.npy")
    runs = []
    import pyarrow.parquet as pq

    for k in args.clusters:
        figures = run_child("ours", data, work / f"quality-{k}", k)
        ours = np.sort(pq.read_table(work / f"quality-{k}" / "duplicates.parquet")["id"].to_numpy())
        hit = np.intersect1d(ours, truth)
        figures.update(
            recall=len(hit) / max(1, len(truth)), precision=len(hit) / max(1, len(ours)), k=k
        )
        runs.append(figures)
    return {"n": n, "exact": exact, "runs": runs}


def report(figures: dict[str, Any]) -> None:
    print(f"\n{figures['machine']}")
    rows = []
    for r in figures.get("growth", []):
        o, b = r["ours"], r["baseline"]
        rows.append(
            [
                f"{r['n']:,}",
                r["clusters"],
                f"{o['wall_s']:.1f}",
                f"{o['cpu_s']:.0f}",
                f"{o['peak_rss_mb']:,.0f}",
                f"{b['wall_s']:.1f}" if "wall_s" in b else "-",
                f"{b['peak_rss_mb']:,.0f}" if "wall_s" in b else b["skipped"],
                f"{o['duplicates']:,}" + (f" / {b['duplicates']:,}" if "wall_s" in b else ""),
            ]
        )
    if rows:
        header = ["items", "k", "ours s", "ours CPU-s", "ours peak MB", "one process s"]
        header += ["one process peak MB", "duplicates (ours / one process)"]
        print(table(f"growth ({figures['dim']}-d float32, threshold {THRESHOLD})", header, rows))
    q = figures.get("quality")
    if q:
        rows = [
            [r["k"], f"{r['recall']:.4f}", f"{r['precision']:.4f}", f"{r['wall_s']:.1f}"]
            for r in q["runs"]
        ]
        title = (
            f"quality on {q['n']:,} items: {q['exact']['duplicates']:,} duplicates by all "
            f"pairs ({q['exact']['wall_s']:.0f} s)"
        )
        print(table(title, ["k", "recall", "precision", "ours s"], rows))
    for r in figures.get("ray", []):
        print(
            f"ray, 2-node loopback: {r['n']:,} items in {r['wall_s']:.1f} s (cluster start "
            f"{r['ray_start_s']:.1f} s), peak {r['peak_rss_mb']:,.0f} MB with the cluster"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1000000,5000000", help="items per growth run")
    p.add_argument("--dim", type=int, default=1280)
    p.add_argument(
        "--quality", type=int, default=200_000, help="items of the quality case (0: none)"
    )
    p.add_argument("--clusters", default="10,40,160", help="k of the quality runs")
    p.add_argument("--ray", action="store_true", help="the smallest size on Ray as well")
    p.add_argument("--quick", action="store_true", help="tiny sizes, to try it out")
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "cvy-semdedup")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", choices=["ours", "baseline", "exact"], help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.clusters = int(args.clusters)
        run = {"ours": child_ours, "baseline": child_baseline, "exact": child_exact}[args.child]
        print(json.dumps(run(args)))
        return {}
    if args.quick:
        args.sizes, args.dim, args.quality, args.clusters = "20000,60000", 64, 5000, "4,16"
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.clusters = [int(k) for k in args.clusters.split(",") if k]
    figures: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": machine_line(os.cpu_count() or 1),
        "dim": args.dim,
        "threshold": THRESHOLD,
    }
    with tempfile.TemporaryDirectory(prefix="cvy-semdedup-") as tmp:
        work = Path(tmp)
        figures["growth"] = growth(args, work)
        if args.quality:
            figures["quality"] = quality(args, work)
        if args.ray and args.sizes:
            n = min(args.sizes)
            data = make_data(args.data / f"n{n}-d{args.dim}", n, args.dim)
            ray = run_child("ours", data, work / "ray", max(1, n // 10_000), ray=True)
            figures["ray"] = [{"n": n, **ray}]
    report(figures)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
        print(f"figures: {args.json}")
    return figures


if __name__ == "__main__":
    main()
