"""Is memory bounded by the queue budget, not by the dataset? 10,000 vs 100,000 tasks of 1 MiB.

Stage 1 makes a 1 MiB payload from an int, two stages pass it through, a slow last stage
(5 ms sleep) returns its length. Inputs are fed as a lazy generator. Prints peak RSS and PSS
of the whole process tree and the peak of shared memory for both sizes, and their ratios.

The smaller run is 10,000 tasks: a run of 1,000 ends in about 3 s, before the autoscaler has
grown the pools, and its ratio then counts the extra workers of the longer run, not payloads
held (docs/measurements/2026-11-30-headline-recheck.md).

    .venv/bin/python benchmarks/memory.py
    .venv/bin/python benchmarks/memory.py --with-batch   # BatchExecutor too (materializes all)
    .venv/bin/python benchmarks/memory.py --engines local,ray   # RayBackend side by side
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from _common import (
    MIB,
    BatchExecutor,
    Finish,
    MakePayload,
    Measurement,
    PassThrough,
    RaySession,
    StreamingExecutor,
    add_engine_args,
    check,
    fmt,
    machine_line,
    mb,
    parse_engines,
    run_conveyor,
    table,
)

from conveyor.backends import LocalBackend
from conveyor.engine.policies.backpressure import edge_budget

TARGET_GROWTH = 1.15
TARGET_PEAK_MB = 500.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes",
        default=None,
        help="comma-separated task counts, smallest first (default 10000,100000)",
    )
    p.add_argument("--payload", choices=["numpy", "bytes"], default="numpy")
    p.add_argument("--payload-mib", type=float, default=1.0, help="payload size in MiB")
    p.add_argument("--last-ms", type=float, default=5.0, help="sleep of the last stage (ms)")
    p.add_argument(
        "--cpus-per-worker",
        type=float,
        default=0.25,
        help="Resources(cpus=...) of every stage (default 0.25)",
    )
    p.add_argument(
        "--num-cpus", type=float, default=2.0, help="LocalBackend(num_cpus=...) budget (default 2)"
    )
    p.add_argument(
        "--memory-budget-mb",
        type=float,
        default=None,
        help="LocalBackend(memory_budget_bytes=...) in MiB (default: engine default)",
    )
    p.add_argument(
        "--with-batch",
        action="store_true",
        help="also run BatchExecutor (materializes every intermediate: "
        "size x payload of shared memory per stage)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="print the controller's snapshot (workers, queues) every tick",
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 40 vs 120 tasks (unless --sizes)"
    )
    add_engine_args(p)
    args = p.parse_args(argv)
    parse_engines(p, args)
    if args.sizes is None:
        args.sizes = "40,120" if args.quick else "10000,100000"
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if len(args.sizes) < 2:
        p.error("--sizes needs at least two counts")
    return args


def build_stages(args: argparse.Namespace) -> list[Any]:
    cpus = args.cpus_per_worker
    return [
        MakePayload("make", cpus=cpus, nbytes=int(args.payload_mib * MIB), payload=args.payload),
        PassThrough("pass1", cpus=cpus),
        PassThrough("pass2", cpus=cpus),
        Finish("finish_slow", cpus=cpus, cost_s=args.last_ms / 1000, mode="sleep"),
    ]


def main(argv: list[str] | None = None) -> list[Measurement]:
    args = parse_args(argv)
    budget = None if args.memory_budget_mb is None else int(args.memory_budget_mb * MIB)
    effective = LocalBackend(num_cpus=args.num_cpus, memory_budget_bytes=budget)
    edge = edge_budget(effective.memory_budget_bytes, 4, 1024)
    print(
        f"memory: {'/'.join(map(str, args.sizes))} tasks of {args.payload_mib:g} MiB "
        f"{args.payload}, last stage {args.last_ms:g} ms, cpus/worker={args.cpus_per_worker:g}"
    )
    print(machine_line(args.num_cpus))
    print(
        f"engine queue budget: memory_budget_bytes={mb(effective.memory_budget_bytes)} MB "
        f"-> per edge {mb(edge.max_bytes)} MB / {edge.max_tasks} tasks (executor defaults)"
    )
    if args.with_batch:
        print(
            "  note: BatchExecutor materializes every intermediate result: expect shared "
            "memory to grow with the dataset"
        )
    contenders: list[tuple[str, type[Any] | None, str]] = []
    for engine in args.engines:
        prefix = "" if engine == "local" else "ray "
        if engine == "ray-data":
            contenders.append(("ray-data", None, engine))
            continue
        contenders.append((f"{prefix}streaming", StreamingExecutor, engine))
        if args.with_batch:
            contenders.append((f"{prefix}batch", BatchExecutor, engine))
    results: list[Measurement] = []
    with RaySession(args.num_cpus, args.ray_address) as ray_session:
        for name, cls, engine in contenders:
            for size in args.sizes:
                print(f"  running {name} with {size} tasks ...", flush=True)
                tasks = (i for i in range(size))  # lazy: never a list (Ray Data lists it)
                m = run_conveyor(
                    f"{name} {size}",
                    build_stages(args),
                    cls,
                    tasks,
                    size,
                    num_cpus=args.num_cpus,
                    memory_budget_bytes=budget,
                    trace=args.trace,
                    engine=engine,
                    ray_session=ray_session,
                )
                if m.outputs != size:
                    print(f"  !! {name} {size}: {m.outputs} outputs")
                results.append(m)

    header = [
        "run",
        "tasks",
        "wall s",
        "tasks/s",
        "peak RSS MB",
        "peak PSS MB",
        "shm peak MB",
        "queue hwm MB per edge",
        "driver cpu s",
        "workers cpu s",
        "procs",
        "workers (peak)",
    ]
    rows = [
        [
            m.label,
            m.tasks,
            fmt(m.wall_s),
            fmt(m.tps, ".0f"),
            mb(m.peak_rss),
            mb(m.peak_pss),
            mb(m.peak_shm),
            "/".join(f"{v:.0f}" for v in m.queue_hwm_mb.values()),
            fmt(m.driver_cpu_s),
            fmt(m.workers_cpu_s),
            m.peak_procs,
            "/".join(str(v) for v in m.workers.values()),
        ]
        for m in results
    ]
    print()
    print(table("memory (peaks over the run)", header, rows))
    print(
        "peak RSS/PSS = sum over driver + all descendants (RSS sampled every 20 ms, PSS every "
        "100 ms; RSS counts pages shared by forked workers once per process, PSS splits them);\n"
        "shm peak = bytes in this run's /dev/shm/conveyor-<pid>-* dirs (all payloads: queued, "
        "in flight at workers, awaiting deletion);\nqueue hwm = the controller's high-water mark "
        "of queued payload bytes in front of each stage (RunResult.stats[...].queue_hwm_bytes); "
        "cpu = user+sys seconds"
    )

    trows = []
    small, large = args.sizes[0], args.sizes[-1]
    for name, _, _ in contenders:
        a = next(m for m in results if m.label == f"{name} {small}")
        b = next(m for m in results if m.label == f"{name} {large}")
        for what, x, y in (
            ("RSS", a.peak_rss, b.peak_rss),
            ("PSS", a.peak_pss, b.peak_pss),
            ("shm", a.peak_shm, b.peak_shm),
        ):
            ratio = y / x if x else None
            trows.append(
                [
                    f"{name} peak {what} {large}/{small}",
                    fmt(ratio),
                    f"<= {TARGET_GROWTH:.2f}",
                    check(None if ratio is None else ratio <= TARGET_GROWTH),
                ]
            )
        # on Ray the tree holds the cluster itself (about 0.8 GB idle, ~0.1 GB per actor):
        # only its growth with the dataset says something about the engine
        on_ray = name.startswith("ray")
        for what, value in (("RSS", b.peak_rss), ("PSS", b.peak_pss), ("shm", b.peak_shm)):
            trows.append(
                [
                    f"{name} peak {what} at {large} (MB)",
                    mb(value),
                    "-" if on_ray else f"< {TARGET_PEAK_MB:g}",
                    "-" if on_ray else check(value / MIB < TARGET_PEAK_MB),
                ]
            )
    print()
    print(table("targets", ["metric", "measured", "target", "status"], trows))
    print(
        f"shm is bounded by the engine's queue budget, not by the dataset: up to "
        f"{mb(effective.memory_budget_bytes)} MB queued over all edges (per edge "
        f"{mb(edge.max_bytes)} MB) plus payloads in flight at workers. A small run may end "
        f"before its queues reach that bound, so a shm ratio above target with\nthe large "
        f"run's edges at their cap is the budget being reached, not a leak; compare runs with "
        f"--memory-budget-mb (e.g. 256) to see the bound."
    )
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
