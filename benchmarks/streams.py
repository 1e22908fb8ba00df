"""A generator stage against the same stage returning a list, side by side in one run.

A split stage makes ``--outputs`` outputs per input, ``--gap-ms`` of work each (a clip
encoded, a window decoded), then a consumer takes ``--consumer-ms`` over each. The same work
is written twice: ``process`` yields each output as it is made (``generator``), or returns
them all at the end (``list``). Printed per contender: time to the first output at the end
of the pipeline, wall time, peak bytes in shared memory, and the ratios. Then the cost of
forwarding one output at a time: ``--many`` zero-cost outputs of one input through a
zero-cost consumer, generator against list (outputs per second). Local backend; prints,
asserts nothing.

    .venv/bin/python benchmarks/streams.py
    .venv/bin/python benchmarks/streams.py --inputs 4 --outputs 20 --gap-ms 100
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
from _common import fmt, machine_line, mb, table

from conveyor import Pipeline, ProcessingStage, Resources
from conveyor.backends import LocalBackend
from conveyor.executors import StreamingExecutor
from conveyor.result import RunResult


def work(seconds: float) -> None:
    """Busy CPU for ``seconds`` (a sleep would leave the cores to the other stages)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SplitList(ProcessingStage[int, bytes]):
    """Makes every output, then returns them together."""

    name = "split"
    resources = Resources(cpus=1)

    def __init__(self, outputs: int, gap_s: float, size: int) -> None:
        self.count, self.gap_s, self.size = outputs, gap_s, size

    def process(self, task: int) -> list[bytes]:
        made = []
        for _ in range(self.count):
            work(self.gap_s)
            made.append(bytes(self.size))
        return made


class SplitYield(SplitList):
    """The same work, each output yielded as it is made."""

    def process(self, task: int) -> Iterator[bytes]:  # type: ignore[override]
        for _ in range(self.count):
            work(self.gap_s)
            yield bytes(self.size)


class Consume(ProcessingStage[bytes, int]):
    name = "consume"
    resources = Resources(cpus=1)

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s

    def process(self, blob: bytes) -> int:
        work(self.cost_s)
        return len(blob)


class SharedBytes:
    """Peak bytes the run held in shared memory, sampled at every tick."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend, self.peak = backend, 0

    def on_start(self, pipeline: str, stages: list[str]) -> None:
        pass

    def on_tick(self, snapshot: Any) -> None:
        self.peak = max(self.peak, self.backend.shared_bytes())

    def on_end(self, result: RunResult) -> None:
        pass


def run(split: SplitList, consumer: Consume, inputs: int, cpus: float) -> tuple[RunResult, int]:
    backend = LocalBackend(num_cpus=cpus)
    shared = SharedBytes(backend)
    executor = StreamingExecutor(backend, monitors=[shared])
    result = Pipeline("streams", [split, consumer]).run(executor, range(inputs))
    return result, shared.peak


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=4)
    p.add_argument("--outputs", type=int, default=10, help="outputs per input")
    p.add_argument("--gap-ms", type=float, default=200.0, help="work per output")
    p.add_argument("--consumer-ms", type=float, default=20.0, help="work per output downstream")
    p.add_argument("--size", type=int, default=1 << 20, help="bytes per output")
    p.add_argument("--many", type=int, default=10_000, help="outputs of the overhead case")
    p.add_argument("--cpus", type=float, default=None)
    args = p.parse_args(argv)
    # imported under another name (the smoke test): its stages travel by value all the same
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cpus = args.cpus or float(LocalBackend().num_cpus)
    print(machine_line(cpus))
    figures: dict[str, Any] = {}
    rows = []
    for label, cls in (("list", SplitList), ("generator", SplitYield)):
        split = cls(args.outputs, args.gap_ms / 1000, args.size)
        result, peak = run(split, Consume(args.consumer_ms / 1000), args.inputs, cpus)
        figures[label] = {
            "first_output_s": result.first_output_s,
            "wall_s": result.wall_s,
            "peak_shared_bytes": peak,
        }
        rows.append([label, fmt(result.first_output_s), fmt(result.wall_s), mb(peak)])
    print(
        table(
            f"{args.inputs} inputs x {args.outputs} outputs, {args.gap_ms:g} ms each, "
            f"{args.consumer_ms:g} ms downstream",
            ["contender", "first output s", "wall s", "peak shared"],
            rows,
        )
    )
    gen, lst = figures["generator"], figures["list"]
    print(
        f"generator / list: first output {gen['first_output_s'] / lst['first_output_s']:.2f}x, "
        f"wall {gen['wall_s'] / lst['wall_s']:.2f}x"
    )
    rates = {}
    for label, cls in (("list", SplitList), ("generator", SplitYield)):
        result, _ = run(cls(args.many, 0.0, 8), Consume(0.0), 1, cpus)
        rates[label] = args.many / result.wall_s
    figures["outputs_per_s"] = rates
    print(
        f"forwarding {args.many:,} zero-cost outputs of one input: list {rates['list']:,.0f}/s, "
        f"generator {rates['generator']:,.0f}/s ({rates['generator'] / rates['list']:.2f}x)"
    )
    return figures


if __name__ == "__main__":
    main()
