"""Conveyor next to its peers on the same workloads: Cosmos-Xenna and a hand-written Ray Data.

Workloads (the stage objects of ``unbalanced3`` and ``tiny3``, unchanged):

- ``unbalanced3``: stages of 25 / 100 / 50 ms (sleep) passing a 1 MiB NumPy payload,
  0.25 CPU per worker, 2 CPUs: ideal 40 tasks/s (best split of 8 worker slots);
- ``tiny3``: zero-cost ``x + 1`` three times, 0.5 CPU per worker (per-task overhead).

Engines, one after the other in this process: Conveyor's StreamingExecutor on the local
backend and on the Ray backend; Cosmos-Xenna's streaming and batch modes; a Ray Data pipeline
written by hand as a user would (``map_batches`` per stage, the same resources); Conveyor's
RayDataExecutor. Every Ray engine runs on a fresh private Ray cluster (its start-up is
printed apart), so none inherits what the previous one left behind. Peers are installed only
by ``make bench-peers``; a peer that is not installed is reported as such.

For each engine: throughput (outputs / wall time, start-up included) and its ratio to the
ideal, start-up (Conveyor: every initial worker ready; peers, which do not report it: the
first stage's first call begins), time to first output (Conveyor and Ray Data: first output
at the driver; Xenna returns outputs only at the end, so: when the last stage made its first
output), and peak memory of the whole process tree (RSS and PSS; the Ray cluster is in it).

    make bench-peers
    .venv/bin/python benchmarks/peers.py --workloads unbalanced3 --tasks 200
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import (
    MIB,
    Finish,
    Increment,
    MakePayload,
    Measurement,
    PassThrough,
    RaySession,
    StreamingExecutor,
    best_allocation,
    check,
    fmt,
    machine_line,
    mb,
    measure_iter,
    run_conveyor,
    table,
)

WORKLOADS = ("unbalanced3", "tiny3")
ENGINES = (
    "conveyor-local",
    "conveyor-ray",
    "xenna-streaming",
    "xenna-batch",
    "ray-data-hand",
    "conveyor-ray-data",
)
NUM_CPUS = 2.0


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def stages_for(workload: str) -> list[Any]:
    if workload == "unbalanced3":
        return [
            MakePayload("make_25ms", cost_s=0.025, nbytes=MIB),
            PassThrough("pass_100ms", cost_s=0.100),
            Finish("finish_50ms", cost_s=0.050),
        ]
    return [Increment(f"inc{i}", cpus=0.5) for i in (1, 2, 3)]


def ideal(workload: str) -> float | None:
    if workload != "unbalanced3":
        return None
    return best_allocation([0.025, 0.100, 0.050], math.floor(NUM_CPUS / 0.25))[0]


# -- peers ----------------------------------------------------------------------------------
def run_xenna(label: str, workload: str, n: int, batch: bool) -> Measurement:
    from cosmos_xenna.pipelines import v1 as xenna

    class XStage(xenna.Stage):
        def __init__(self, stage: Any, first: bool) -> None:
            self.stage = stage
            self.first = first

        @property
        def stage_batch_size(self) -> int:
            return int(self.stage.batch_size)

        @property
        def required_resources(self) -> Any:
            return xenna.Resources(cpus=float(self.stage.resources.cpus), gpus=0.0)

        def process_data(self, in_data: list[Any]) -> list[Any]:
            begun = time.time()
            values = in_data if self.first else [i[0] for i in in_data]
            started = [begun] * len(in_data) if self.first else [i[2] for i in in_data]
            outs = self.stage.process_batch(values)
            now = time.time()
            return [(o, now, s) for o, s in zip(outs, started, strict=True)]

    stages = stages_for(workload)
    spec = xenna.PipelineSpec(
        list(range(n)),
        [XStage(s, i == 0) for i, s in enumerate(stages)],
        xenna.PipelineConfig(
            execution_mode=xenna.ExecutionMode.BATCH if batch else xenna.ExecutionMode.STREAMING,
            return_last_stage_outputs=True,
            logging_interval_s=3600,
            # the default (180 s) never rescales a run this short; give it its chance
            mode_specific=xenna.StreamingSpecificSpec(autoscale_interval_s=2.0),
            # its default 0.95 leaves floor(0.95 x 2) = 1 of this machine's 2 CPUs
            cpu_allocation_percentage=1.0,
        ),
    )
    return measure_iter(label, n, lambda: xenna.run_pipeline(spec) or [], stamped=True)


def run_ray_data_hand(label: str, workload: str, n: int) -> Measurement:
    """Ray Data as a user writes it: one ``map_batches`` per stage, rows of Python objects."""
    import ray.data

    stages = stages_for(workload)

    import cloudpickle

    paths = list(sys.path)

    def make_fn(stage: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
        # the stage travels as bytes and is loaded once the worker can import its module
        blob = cloudpickle.dumps(stage)
        loaded: list[Any] = []

        def fn(batch: dict[str, Any]) -> dict[str, Any]:
            if not loaded:
                import sys as worker_sys

                worker_sys.path[:0] = [p for p in paths if p not in worker_sys.path]
                loaded.append(cloudpickle.loads(blob))
            outs = loaded[0].process_batch(list(batch["item"]))
            column = [None] * len(outs)
            for i, o in enumerate(outs):
                column[i] = o
            return {"item": column}

        return fn

    ds = ray.data.range(n, override_num_blocks=min(n, 1000)).map(lambda r: {"item": r["id"]})
    for stage in stages:
        ds = ds.map_batches(
            make_fn(stage),
            batch_size=stage.batch_size,
            batch_format="numpy",
            num_cpus=stage.resources.cpus,
        )

    def iterate() -> Any:
        for row in ds.iter_rows():
            yield row["item"]

    return measure_iter(label, n, iterate, stamped=False)


# -- main -------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="unbalanced3,tiny3")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"subset of {','.join(ENGINES)}")
    p.add_argument("--tasks", type=int, default=None, help="tasks (default 200 / 2000)")
    p.add_argument("--ray-address", default=None, help="join a running Ray cluster instead")
    p.add_argument("--quick", action="store_true", help="smoke run: 16 / 100 tasks")
    args = p.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for name, given, known in (
        ("workload", args.workloads, WORKLOADS),
        ("engine", args.engines, ENGINES),
    ):
        unknown = set(given) - set(known)
        if unknown:
            p.error(f"unknown {name}(s): {', '.join(sorted(unknown))}")
    if any(e != "conveyor-local" for e in args.engines) and not have("ray"):
        p.error("the Ray engines need Ray: pip install 'conveyor[ray]'")
    return args


def tasks_for(args: argparse.Namespace, workload: str) -> int:
    if args.tasks is not None:
        return args.tasks
    if args.quick:
        return 16 if workload == "unbalanced3" else 100
    return 200 if workload == "unbalanced3" else 2000


def main(argv: list[str] | None = None) -> dict[str, list[Measurement]]:
    args = parse_args(argv)
    print(machine_line(NUM_CPUS))
    missing = {
        "xenna-streaming": "cosmos_xenna",
        "xenna-batch": "cosmos_xenna",
    }
    everything: dict[str, list[Measurement]] = {}
    # what Cosmos-Xenna sets when it starts a cluster itself: its state queries need them
    os.environ.setdefault("RAY_MAX_LIMIT_FROM_API_SERVER", "40000")
    os.environ.setdefault("RAY_MAX_LIMIT_FROM_DATA_SOURCE", "40000")
    with RaySession(NUM_CPUS, args.ray_address, dashboard=True) as session:
        for workload in args.workloads:
            n = tasks_for(args, workload)
            print(f"\n{workload}: {n} tasks")
            results: list[Measurement] = []
            for engine in args.engines:
                module = missing.get(engine)
                if module is not None and not have(module):
                    print(f"  {engine}: not installed (make bench-peers)")
                    continue
                print(f"  running {engine} ...", flush=True)
                if engine == "conveyor-local":
                    # the previous workload's cluster would be in this engine's process tree
                    session.close()
                    m = run_conveyor(
                        engine,
                        stages_for(workload),
                        StreamingExecutor,
                        range(n),
                        n,
                        num_cpus=NUM_CPUS,
                    )
                elif engine in ("conveyor-ray", "conveyor-ray-data"):
                    session.restart()
                    m = run_conveyor(
                        engine,
                        stages_for(workload),
                        StreamingExecutor,
                        range(n),
                        n,
                        num_cpus=NUM_CPUS,
                        engine="ray" if engine == "conveyor-ray" else "ray-data",
                        ray_session=session,
                    )
                else:
                    session.restart()
                    try:
                        if engine.startswith("xenna"):
                            m = run_xenna(engine, workload, n, batch=engine == "xenna-batch")
                        else:
                            m = run_ray_data_hand(engine, workload, n)
                    except Exception as exc:  # noqa: BLE001 - a peer's failure is a result
                        print(f"  !! {engine} failed: {type(exc).__name__}: {exc}")
                        continue
                if m.outputs != n:
                    print(f"  !! {engine}: {m.outputs} outputs of {n}")
                results.append(m)
            everything[workload] = results
            report(workload, results, ideal(workload))
    return everything


def report(workload: str, results: list[Measurement], ideal_tps: float | None) -> None:
    header = [
        "engine",
        "tasks",
        "wall s",
        "tasks/s",
        "ratio to ideal",
        "start-up s",
        "first output s",
        "peak RSS MB",
        "peak PSS MB",
        "cpu s",
    ]
    rows = []
    for m in results:
        rows.append(
            [
                m.label,
                m.tasks,
                fmt(m.wall_s),
                fmt(m.tps, ".1f"),
                fmt(m.tps / ideal_tps if ideal_tps else None),
                fmt(m.startup_s),
                fmt(m.first_output_s),
                mb(m.peak_rss),
                mb(m.peak_pss),
                fmt(m.driver_cpu_s + m.workers_cpu_s, ".1f"),
            ]
        )
    title = f"{workload}: engines side by side"
    if ideal_tps:
        title += f" (ideal {ideal_tps:.1f} tasks/s)"
    print()
    print(table(title, header, rows))
    ours = next((m for m in results if m.label == "conveyor-ray"), None)
    peers = [m for m in results if not m.label.startswith("conveyor")]
    if ours is not None and peers:
        trows = []
        for m in peers:
            trows.append(
                [
                    f"conveyor-ray vs {m.label}: tasks/s",
                    f"{fmt(ours.tps, '.1f')} vs {fmt(m.tps, '.1f')}",
                    "ahead",
                    check(ours.tps > m.tps),
                ]
            )
            if ours.first_output_s is not None and m.first_output_s is not None:
                trows.append(
                    [
                        f"conveyor-ray vs {m.label}: first output s",
                        f"{fmt(ours.first_output_s)} vs {fmt(m.first_output_s)}",
                        "ahead",
                        check(ours.first_output_s < m.first_output_s),
                    ]
                )
        print()
        print(table(f"{workload}: targets", ["metric", "measured", "target", "status"], trows))
    print(
        "wall = from the call to the last output, start-up included (the Ray cluster was "
        "running already); peak RSS/PSS = the process tree, Ray cluster included;\n"
        "cpu = user+sys seconds of the driver and its descendants during the run"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
