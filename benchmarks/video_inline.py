"""Conveyor's own video stages in one process, without the engine: the floor for ``ours``.

``conveyor video INPUT OUTPUT --splitter fixed --no-quality --no-embed --no-tags`` runs its
stages (list, probe, split, transcode, motion, write) as pools of worker processes. This
script runs the same stages, built by the same ``build_video_pipeline``, one after the other
in this one process, each task all the way to the writer before the next (depth first; the
writer takes them in its batches), each stage through the ``StageRunner`` its workers use (so
memory is tidied as there). It writes
what the command writes, except ``summary.json`` (here: seconds of video and clips kept) and
the event log.

What separates it from the plain script (``plain_video.py``) is the work of the stages
themselves: the probe's checks, the clip table, metas, records and intents the writer
writes. What separates ``ours`` from it is the engine: messages, queues and processes. A
contender of ``benchmarks/video.py --user --inline``; by hand::

    python benchmarks/video_inline.py INPUT OUTPUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from conveyor.backends.runtime import StageRunner
from conveyor.cluster import NodeInfo, WorkerInfo
from conveyor.pipelines.video import VideoConfig, build_video_pipeline
from conveyor.tasks import EmptyTask


def run_inline(config: VideoConfig) -> dict[str, Any]:
    """Run ``config``'s stages depth first in this process; seconds of video, clips kept."""
    specs = build_video_pipeline(config).build()
    node = NodeInfo("local", 1.0)
    runners = []
    for spec in specs:
        worker = WorkerInfo(f"{spec.name}-0", spec.name, "local")
        runner = StageRunner(spec.stage, spec.name, worker)
        if spec.has_node_setup:
            runner.setup_on_node(node)
        runner.setup()
        runners.append(runner)
    begun = time.perf_counter()
    last = len(runners) - 1
    # the writer takes batches (short videos share a clip table), as the engine gives it
    # when its input comes faster than it waits (``batch_wait_s``)
    batch = specs[last].batch_size
    held: tuple[list[Any], list[str]] = ([], [])
    try:
        pending: list[tuple[int, Any, str]] = [(0, EmptyTask(), "0")]
        while pending:
            index, task, label = pending.pop()
            if index == last:
                held[0].append(task)
                held[1].append(label)
                if len(held[0]) == batch:
                    runners[last].run(*held)
                    held = ([], [])
                continue
            outputs, labels, _ = runners[index].run([task], [label])
            made = zip(reversed(outputs), reversed(labels), strict=True)
            pending.extend((index + 1, out, lab) for out, lab in made)
        if held[0]:
            runners[last].run(*held)
    finally:
        for runner in runners:
            runner.teardown()
    records = [json.loads(p.read_text()) for p in (Path(config.output) / "videos").rglob("*.json")]
    return {
        "seconds_in": sum((r.get("metadata") or {}).get("duration_s", 0.0) for r in records),
        "clips": {"kept": sum(len(r["kept"]) for r in records)},
        "wall_s": time.perf_counter() - begun,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    args = p.parse_args(argv)
    config = VideoConfig(
        input=str(args.input),
        output=str(args.output),
        splitter="fixed",
        quality=False,
        embed=False,
        tags=False,
    )
    summary = run_inline(config)
    (args.output / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    kept, seconds = summary["clips"]["kept"], summary["seconds_in"]
    print(f"{seconds:.0f} s of video, {kept} clips kept, {summary['wall_s']:.1f} s")
    return summary


if __name__ == "__main__":
    main()
