"""Per-task overhead: 20,000 zero-cost int tasks through three ``x + 1`` stages.

Reports end-to-end tasks per second of StreamingExecutor, StreamingExecutor keeping a journal
(``journal=``: one record per finished task), StreamingExecutor watched by an ``EventLog`` and
a ``PrometheusMonitor`` scraped twice a second, BatchExecutor and a plain loop over the same
stage objects, on the local backend and, with Ray installed, on RayBackend and
RayDataExecutor, measured one after the other in this process.

    .venv/bin/python benchmarks/tiny3.py
    .venv/bin/python benchmarks/tiny3.py --batch-size 16
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import (
    RESOURCE_HEADER,
    RESOURCE_NOTE,
    BatchExecutor,
    Increment,
    Measurement,
    RaySession,
    StreamingExecutor,
    add_engine_args,
    check,
    contenders,
    fmt,
    machine_line,
    parse_engines,
    resource_row,
    run_conveyor,
    run_loop,
    table,
    usable_cores,
)

TARGET_TPS = 5000.0
CONTENDERS = ("streaming", "journal", "watched", "batch", "loop")
SCRAPE_EVERY_S = 0.5


@contextlib.contextmanager
def watchers(folder: Path) -> Iterator[list[Any]]:
    """An event log in ``folder`` and Prometheus metrics scraped by a thread, as a user
    watching the run would have them."""
    from conveyor.monitor import EventLog, PrometheusMonitor

    stop = threading.Event()
    with PrometheusMonitor(port=0) as metrics:

        def scrape() -> None:
            while not stop.wait(SCRAPE_EVERY_S):
                with urllib.request.urlopen(metrics.url, timeout=5) as response:
                    response.read()

        thread = threading.Thread(target=scrape, daemon=True)
        thread.start()
        try:
            yield [EventLog(folder), metrics]
        finally:
            stop.set()
            thread.join()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20_000, help="number of tasks (default 20000)")
    p.add_argument("--batch-size", type=int, default=1, help="batch_size of every stage")
    p.add_argument(
        "--cpus-per-worker",
        type=float,
        default=0.5,
        help="Resources(cpus=...) of every stage (default 0.5)",
    )
    p.add_argument(
        "--num-cpus", type=float, default=2.0, help="LocalBackend(num_cpus=...) budget (default 2)"
    )
    p.add_argument(
        "--only",
        default=",".join(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)}",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="print the controller's snapshot (workers, queues) every tick",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 500 tasks")
    add_engine_args(p)
    args = p.parse_args(argv)
    parse_engines(p, args)
    if args.quick:
        args.tasks = min(args.tasks, 500)
    args.only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(args.only) - set(CONTENDERS)
    if unknown:
        p.error(f"--only: unknown contender(s) {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> list[Measurement]:
    args = parse_args(argv)
    print(
        f"tiny3: {args.tasks} int tasks, 3 stages of x + 1, batch_size={args.batch_size}, "
        f"cpus/worker={args.cpus_per_worker:g}"
    )
    print(machine_line(args.num_cpus))
    results: list[Measurement] = []
    expected = sum(range(args.tasks)) + 3 * args.tasks
    with (
        tempfile.TemporaryDirectory(prefix="conveyor-tiny3-") as scratch,
        RaySession(args.num_cpus, args.ray_address) as ray_session,
    ):
        for label, engine, name in contenders(args):
            print(f"  running {label} ...", flush=True)
            stages = [
                Increment(f"inc{i}", cpus=args.cpus_per_worker, batch_size=args.batch_size)
                for i in (1, 2, 3)
            ]
            total = 0

            def add(out: int) -> None:
                nonlocal total
                total += out

            if name == "loop":
                m = run_loop("loop", stages, range(args.tasks), args.tasks)
                total = expected  # the loop is the reference
            else:
                cls = BatchExecutor if name == "batch" else StreamingExecutor
                journal = Path(scratch, f"{label}.journal") if name == "journal" else None
                folder = Path(scratch, label.replace(" ", "-"))
                with (
                    watchers(folder) if name == "watched" else contextlib.nullcontext([])
                ) as monitors:
                    m = run_conveyor(
                        label,
                        stages,
                        cls,
                        range(args.tasks),
                        args.tasks,
                        num_cpus=args.num_cpus,
                        on_output=add,
                        trace=args.trace,
                        engine=engine,
                        ray_session=ray_session,
                        journal=journal,
                        monitors=monitors,
                    )
                if name == "watched":
                    log = folder / "events.jsonl"
                    lines = len(log.read_text().splitlines())
                    print(f"  {label}: {lines} event log lines, {log.stat().st_size} B")
                if journal is not None:
                    records = len(journal.read_text().splitlines()) - 1  # after its header
                    print(f"  {label}: {records} journal records, {journal.stat().st_size} B")
            if total != expected:
                print(f"  !! {label}: outputs sum to {total}, expected {expected}")
            results.append(m)

    streaming = next((m for m in results if m.label == "streaming"), None)
    header = [
        "contender",
        "tasks",
        "wall s",
        "tasks/s",
        "vs streaming",
        "steady/s",
        "first out s",
        "startup s",
        "shutdown s",
        "workers (peak)",
    ]
    rows = []
    for m in results:
        rel = m.tps / streaming.tps if streaming is not None and streaming.tps else None
        rows.append(
            [
                m.label,
                m.tasks,
                fmt(m.wall_s, ".3f"),
                fmt(m.tps, ".0f"),
                fmt(rel),
                fmt(m.steady_tps, ".0f"),
                fmt(m.first_output_s, ".3f"),
                fmt(m.startup_s, ".3f"),
                fmt(m.shutdown_s, ".3f"),
                "/".join(str(v) for v in m.workers.values()) or "1 (in-process)",
            ]
        )
    print()
    print(table("tiny3 (zero-cost tasks): throughput", header, rows))
    print()
    cores = usable_cores(args.num_cpus)
    print(table("tiny3: resources", RESOURCE_HEADER, [resource_row(m, cores) for m in results]))
    print(
        "wall = driver side, from Pipeline.stream() to the end of the run, start-up and "
        "shutdown included (shutdown s = after the last output);\ntasks/s = outputs / wall; "
        "vs streaming = tasks/s / streaming tasks/s; "
        "steady = (outputs - 1) / (last output - first output)\n" + RESOURCE_NOTE
    )
    if streaming is not None:
        trows = [
            [
                "streaming tasks/s",
                fmt(streaming.tps, ".0f"),
                f">= {TARGET_TPS:.0f}",
                check(streaming.tps >= TARGET_TPS),
            ]
        ]
        journaled = next((m for m in results if m.label == "journal"), None)
        if journaled is not None and streaming.tps:
            ratio = journaled.tps / streaming.tps
            trows.append(
                ["journal / streaming tasks/s", fmt(ratio), ">= 0.95 (noise)", check(ratio >= 0.95)]
            )
        watched = next((m for m in results if m.label == "watched"), None)
        if watched is not None and streaming.tps:
            ratio = watched.tps / streaming.tps
            trows.append(
                ["watched / streaming tasks/s", fmt(ratio), ">= 0.95 (noise)", check(ratio >= 0.95)]
            )
        print()
        print(table("targets", ["metric", "measured", "target", "status"], trows))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
