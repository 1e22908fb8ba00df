"""Three unbalanced stages (25 / 100 / 50 ms per task) passing a 1 MiB payload along.

Runs the same stage objects on StreamingExecutor, BatchExecutor and a plain in-process loop,
on the local backend and, with Ray installed, on RayBackend and RayDataExecutor and in a Ray
actor pipeline written by hand and told the best allocation in advance (``ray hand``: what
Ray itself allows here, see ``_ray_hand``), one after the other, and prints wall time,
throughput against the ideal for the CPU budget, time to first output, start-up time and
peak memory (process tree RSS/PSS, shared memory).

    .venv/bin/python benchmarks/unbalanced3.py --mode sleep
    .venv/bin/python benchmarks/unbalanced3.py --mode cpu --tasks 200
    .venv/bin/python benchmarks/unbalanced3.py --engines local,ray --only streaming
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from typing import Any

from _common import (
    MIB,
    RESOURCE_HEADER,
    RESOURCE_NOTE,
    BatchExecutor,
    Finish,
    MakePayload,
    Measurement,
    PassThrough,
    RaySession,
    StreamingExecutor,
    add_engine_args,
    best_allocation,
    check,
    contenders,
    fmt,
    machine_line,
    measure_iter,
    parse_engines,
    resource_row,
    run_conveyor,
    run_loop,
    table,
    usable_cores,
)
from _ray_hand import run_hand_pipeline

TARGET_RATIO = {"sleep": 0.90, "cpu": 0.85}
TARGET_RAY_RATIO = {"sleep": 0.80}
TARGET_FIRST_OUTPUT_S = 1.0
CONTENDERS = ("streaming", "batch", "loop", "hand")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--mode",
        choices=["sleep", "cpu"],
        default="sleep",
        help="stage cost: time.sleep, or a busy loop burning thread CPU time",
    )
    p.add_argument("--tasks", type=int, default=200, help="number of tasks (default 200)")
    p.add_argument(
        "--costs-ms",
        default="25,100,50",
        help="per-task cost of the three stages in ms (default 25,100,50)",
    )
    p.add_argument(
        "--payload",
        choices=["numpy", "bytes"],
        default="numpy",
        help="payload type created by stage 1 (default numpy)",
    )
    p.add_argument("--payload-mib", type=float, default=1.0, help="payload size in MiB")
    p.add_argument(
        "--cpus-per-worker",
        type=float,
        default=None,
        help="Resources(cpus=...) of every stage (default 0.25 sleep, 0.5 cpu)",
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
        "--loop-tasks",
        type=int,
        default=50,
        help="tasks for the sequential loop (it is slow; 0 = same as --tasks)",
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
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 24 tasks (loop 6), small enough for tests"
    )
    add_engine_args(p)
    args = p.parse_args(argv)
    parse_engines(p, args)
    if args.quick:
        args.tasks = min(args.tasks, 24)
        args.loop_tasks = 6
    if args.cpus_per_worker is None:
        args.cpus_per_worker = 0.25 if args.mode == "sleep" else 0.5
    args.costs = [float(c) / 1000 for c in args.costs_ms.split(",")]
    if len(args.costs) != 3:
        p.error("--costs-ms needs three values")
    args.only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(args.only) - set(CONTENDERS)
    if unknown:
        p.error(f"--only: unknown contender(s) {', '.join(sorted(unknown))}")
    if args.loop_tasks <= 0:
        args.loop_tasks = args.tasks
    return args


def build_stages(args: argparse.Namespace) -> list[Any]:
    c1, c2, c3 = args.costs
    common = {"cpus": args.cpus_per_worker, "mode": args.mode}
    return [
        MakePayload(
            "make_25ms",
            cost_s=c1,
            nbytes=int(args.payload_mib * MIB),
            payload=args.payload,
            **common,
        ),
        PassThrough("pass_100ms", cost_s=c2, **common),
        Finish("finish_50ms", cost_s=c3, **common),
    ]


def slots(args: argparse.Namespace) -> int:
    """Workers of ``cpus_per_worker`` that fit the CPU budget."""
    return math.floor(args.num_cpus / args.cpus_per_worker + 1e-9)


def ideal(args: argparse.Namespace) -> tuple[float, str]:
    rate, alloc = best_allocation(args.costs, slots(args))
    text = (
        f"ideal: best integer allocation of {slots(args)} worker slots "
        f"(floor({args.num_cpus:g} / {args.cpus_per_worker:g})) to stages costing "
        f"{'/'.join(f'{c * 1000:g}' for c in args.costs)} ms: "
        f"{'/'.join(map(str, alloc))} -> max min(n_i / cost_i) = {rate:.2f} tasks/s"
    )
    if args.mode == "cpu":
        cores = usable_cores(args.num_cpus)
        core_rate = cores / sum(args.costs)
        text += (
            f"; cpu mode also capped by cores / total CPU per task = {cores:g} / "
            f"{sum(args.costs):.3f} s = {core_rate:.2f} tasks/s"
        )
        rate = min(rate, core_rate)
    return rate, text + f"  => ideal {rate:.2f} tasks/s"


def main(argv: list[str] | None = None) -> list[Measurement]:
    args = parse_args(argv)
    ideal_tps, ideal_text = ideal(args)
    budget = None if args.memory_budget_mb is None else int(args.memory_budget_mb * MIB)
    print(
        f"unbalanced3: mode={args.mode}, {args.tasks} tasks, payload {args.payload_mib:g} MiB "
        f"{args.payload}, cpus/worker={args.cpus_per_worker:g}"
    )
    print(machine_line(args.num_cpus))
    results: list[Measurement] = []
    with RaySession(args.num_cpus, args.ray_address) as ray_session:
        for label, engine, name in contenders(args):
            print(f"  running {label} ...", flush=True)
            stages = build_stages(args)
            if name == "loop":
                m = run_loop("loop", stages, range(args.loop_tasks), args.loop_tasks)
            elif name == "hand":
                ray_session.ensure()
                ray_session.settle()
                alloc = best_allocation(args.costs, slots(args))[1]
                m = measure_iter(
                    label,
                    args.tasks,
                    functools.partial(run_hand_pipeline, stages, alloc, list(range(args.tasks))),
                )
                m.workers = {s.name: n for s, n in zip(stages, alloc, strict=True)}
            else:
                cls = BatchExecutor if name == "batch" else StreamingExecutor
                m = run_conveyor(
                    label,
                    stages,
                    cls,
                    range(args.tasks),
                    args.tasks,
                    num_cpus=args.num_cpus,
                    memory_budget_bytes=budget,
                    trace=args.trace,
                    engine=engine,
                    ray_session=ray_session,
                )
            results.append(m)

    cores = usable_cores(args.num_cpus)
    header = [
        "contender",
        "tasks",
        "wall s",
        "tasks/s",
        "ideal/s",
        "ratio",
        "steady/s",
        "steady ratio",
        "first out s",
        "startup s",
        "shutdown s",
        "workers (peak)",
    ]
    rows = []
    for m in results:
        rows.append(
            [
                m.label,
                m.tasks,
                fmt(m.wall_s),
                fmt(m.tps),
                fmt(ideal_tps),
                fmt(m.tps / ideal_tps),
                fmt(m.steady_tps),
                fmt(None if m.steady_tps is None else m.steady_tps / ideal_tps),
                fmt(m.first_output_s, ".3f"),
                fmt(m.startup_s, ".3f"),
                fmt(m.shutdown_s, ".3f"),
                "/".join(str(v) for v in m.workers.values()) or "1 (in-process)",
            ]
        )
    print()
    print(table(f"unbalanced3 ({args.mode} mode): throughput", header, rows))
    print()
    print(
        table(
            f"unbalanced3 ({args.mode} mode): resources",
            RESOURCE_HEADER,
            [resource_row(m, cores) for m in results],
        )
    )
    print(ideal_text)
    print(
        "wall = driver side, from Pipeline.stream() to the end of the run (shutdown s = after "
        "the last output);\ntasks/s = outputs / wall; ratio = tasks/s / ideal; "
        "steady = (outputs - 1) / (last output - first output);\n"
        "first out = RunResult.first_output_s (loop: first task through all stages);\n"
        f"{RESOURCE_NOTE}"
    )

    trows: list[list[str]] = []
    streaming = next((m for m in results if m.label == "streaming"), None)
    if streaming is not None:
        ratio = streaming.tps / ideal_tps
        target = TARGET_RATIO[args.mode]
        first = streaming.first_output_s
        trows += [
            ["streaming tasks/s / ideal", fmt(ratio), f">= {target:.2f}", check(ratio >= target)],
            [
                "streaming first output s",
                fmt(first, ".3f"),
                f"< {TARGET_FIRST_OUTPUT_S:g}",
                check(None if first is None else first < TARGET_FIRST_OUTPUT_S),
            ],
        ]
        for m in results:
            if m is not streaming:
                trows.append(
                    [
                        f"streaming / {m.label} tasks/s",
                        fmt(streaming.tps / m.tps if m.tps else None),
                        "-",
                        "-",
                    ]
                )
    on_ray = next((m for m in results if m.label == "ray streaming"), None)
    if on_ray is not None:
        ratio = on_ray.tps / ideal_tps
        target = TARGET_RAY_RATIO.get(args.mode)
        trows.append(
            [
                "ray streaming tasks/s / ideal",
                fmt(ratio),
                "-" if target is None else f">= {target:.2f}",
                check(None if target is None else ratio >= target),
            ]
        )
        hand = next((m for m in results if m.label == "ray hand"), None)
        if hand is not None:
            # what the engine costs apart from what Ray costs: the hand-written pipeline
            # knows the allocation in advance, the engine has to find it
            trows.append(
                [
                    "ray hand tasks/s / ideal (Ray's ceiling here)",
                    fmt(hand.tps / ideal_tps),
                    "-",
                    "-",
                ]
            )
            trows.append(
                [
                    "ray streaming / ray hand tasks/s",
                    fmt(on_ray.tps / hand.tps if hand.tps else None),
                    "-",
                    "-",
                ]
            )
        data = next((m for m in results if m.label == "ray-data"), None)
        if data is not None:
            trows += [
                [
                    "ray streaming / ray-data tasks/s",
                    fmt(on_ray.tps / data.tps if data.tps else None),
                    "> 1",
                    check(on_ray.tps > data.tps),
                ],
                [
                    "ray streaming / ray-data first output s",
                    fmt(
                        on_ray.first_output_s / data.first_output_s
                        if on_ray.first_output_s and data.first_output_s
                        else None
                    ),
                    "< 1",
                    check(
                        None
                        if not (on_ray.first_output_s and data.first_output_s)
                        else on_ray.first_output_s < data.first_output_s
                    ),
                ],
            ]
    if trows:
        print()
        print(table("targets", ["metric", "measured", "target", "status"], trows))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
