"""Wall time to simulate one hour of pipeline time on 2,000 GPUs (target: < 60 s).

Runs the shipped ``hour_2000gpu`` scenario (250 nodes x 8 GPUs x 64 CPUs; a task is a shard
of 50 videos, so each stage's batches take 12-180 s) with the streaming executor on the
simulated backend, stopping at virtual second 3,600. Placement diagnostics are off: this times
the controller, the policies and the simulator, not the report's extra bookkeeping.

    .venv/bin/python benchmarks/sim_hour.py
    .venv/bin/python benchmarks/sim_hour.py --profile        # cProfile top entries
    .venv/bin/python benchmarks/sim_hour.py --virtual-s 600  # a shorter run
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats

from conveyor.sim import format_report, resolve_scenario, simulate

TARGET_S = 60.0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--virtual-s", type=float, default=3600.0, help="simulated seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="print cProfile's top entries")
    p.add_argument("--quiet", action="store_true", help="only the summary line")
    args = p.parse_args(argv)
    scenario = resolve_scenario("hour_2000gpu")
    scenario = dataclasses.replace(scenario, stop_at_s=args.virtual_s)
    if args.virtual_s <= scenario.report.warmup_s:
        scenario = dataclasses.replace(
            scenario, report=dataclasses.replace(scenario.report, warmup_s=0.0)
        )
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    sim = simulate(scenario, seed=args.seed, diagnose=False)
    if profiler:
        profiler.disable()
    report = sim.report
    if not args.quiet:
        print(format_report(report))
        print()
    batches = sum(
        sum(sim.backend.usage.done[s.name].values()) / s.batch_size for s in scenario.stages
    )
    verdict = "ok" if report.wall_s < TARGET_S * args.virtual_s / 3600 else "MISSED"
    print(
        f"simulated {report.virtual_s:,.0f} s on {report.gpus:,} GPUs in {report.wall_s:.1f} s "
        f"wall ({report.cpu_s:.1f} s CPU): {batches:,.0f} batches, "
        f"{report.worker_starts:,} worker starts, {report.target_changes:,} target changes, "
        f"{1e6 * report.wall_s / max(batches, 1):.0f} us wall per batch · "
        f"target < {TARGET_S * args.virtual_s / 3600:g} s: {verdict}"
    )
    if profiler:
        print()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
