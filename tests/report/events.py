"""Hand-built event logs following the events.jsonl schema (docs/observability.md).

``three_stage_run`` is a run of ``read -> infer -> write`` where ``infer`` (a GPU model) is
the bottleneck: work queues up in front of it, it is busy all the time, and the autoscaler
moves workers to it (1 -> 3 -> 6) while ``write`` sits idle with an empty input queue
(starved) and is scaled down; two inputs fail with tracebacks and one ``infer`` worker dies.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

STAGES = ("read", "infer", "write")
FAILURE_MESSAGES = (
    "CUDA out of memory while decoding frame 17",
    "cannot write clip: disk quota exceeded",
)


def run_start(name: str = "clips", stages: tuple[str, ...] = STAGES, time: float = 1.7e9):
    return {
        "type": "run_start",
        "t": 0.0,
        "time": time,
        "pipeline": name,
        "description": "Decode videos, embed them on a GPU, write the clips.",
        "executor": "streaming",
        "backend": "LocalBackend",
        "settings": {"max_attempts": 3, "edge_max_tasks": 64, "cpus": 8},
        "stages": [
            {
                "name": stage,
                "cpus": 1.0,
                "gpus": 1.0 if stage == "infer" else 0.0,
                "gpu_memory_gb": 0.0,
                "batch_size": 4 if stage == "infer" else 1,
                "num_workers": None,
                "timeout_s": 30.0 if stage == "infer" else None,
            }
            for stage in stages
        ],
        "cluster": {
            "nodes": [{"node_id": "node-a", "cpus": 8.0, "gpus": 8.0}],
            "cpus": 8.0,
            "gpus": 8.0,
        },
        "host": {"hostname": "box", "platform": "Linux", "python": "3.11.9", "conveyor": "0.1.0"},
    }


def _infer_workers(t: float) -> int:
    return 1 if t < 10 else 3 if t < 40 else 6


def snapshot(t: float, stages: tuple[str, ...] = STAGES) -> dict[str, Any]:
    """The state at ``t``: ``infer`` completes 2 tasks/s per worker; ``read`` keeps its
    queue full; ``write`` gets what ``infer`` gives it and idles."""
    done_infer = 0.0
    step = 0.5
    tt = 0.0
    while tt < t:  # integrate infer's rate (workers change over time)
        done_infer += 2 * _infer_workers(tt) * min(step, t - tt)
        tt += step
    infer_in = int(done_infer)
    rows = []
    for i, stage in enumerate(stages):
        if stage == "read" or (i == 0 and stage != "infer"):
            row = dict(ready=2, target=2, queued=200, busy=0.35, tasks_in=infer_in + 40)
        elif stage == "infer":
            row = dict(
                ready=_infer_workers(t - 2) if t >= 2 else 1,  # ready 2 s after the decision
                target=_infer_workers(t),
                queued=max(5, 60 - int(t / 3)),
                busy=0.97 + 0.02 * math.sin(t),
                tasks_in=infer_in,
            )
        else:  # downstream of the bottleneck: little to do
            row = dict(
                ready=2 if t < 60 else 1,
                target=2 if t < 60 else 1,
                queued=0,
                busy=0.15,
                tasks_in=max(0, infer_in - 1),
            )
        rows.append(
            {
                "name": stage,
                "starting": 0,
                "queued_bytes": row["queued"] * 4096,
                "in_flight": row["ready"],
                "tasks_out": row["tasks_in"],
                "filtered": 0,
                "failed": 1 if (stage == "infer" and t > 30) else 0,
                "retried": 0,
                "task_time_s": 0.5,
                "done": False,
                **row,
            }
        )
    return {
        "type": "snapshot",
        "t": round(t, 4),
        "inputs": infer_in + 40,
        "outputs": max(0, infer_in - 1),
        "source_exhausted": t > 100,
        "cpus_reserved": 5.0,
        "gpus_reserved": float(_infer_workers(t)),
        "stages": rows,
    }


def decisions() -> list[dict[str, Any]]:
    return [
        {
            "type": "decision",
            "t": 0.0,
            "changes": [
                {"stage": s, "before": 0, "after": 2 if s != "infer" else 1, "reason": "first"}
                for s in STAGES
            ],
        },
        {
            "type": "decision",
            "t": 10.0,
            "changes": [
                {
                    "stage": "infer",
                    "before": 1,
                    "after": 3,
                    "reason": "bottleneck: 2.0 tasks/s per source vs 9.8 upstream",
                }
            ],
        },
        {
            "type": "decision",
            "t": 40.0,
            "changes": [
                {
                    "stage": "infer",
                    "before": 3,
                    "after": 6,
                    "reason": "bottleneck: 6.0 tasks/s vs 9.8 upstream",
                }
            ],
        },
        {
            "type": "decision",
            "t": 60.0,
            "changes": [
                {
                    "stage": "write",
                    "before": 2,
                    "after": 1,
                    "reason": "little work left: 0 queued for 2 workers",
                }
            ],
        },
    ]


def failures() -> list[dict[str, Any]]:
    return [
        {
            "type": "failure",
            "t": 31.5,
            "stage": "infer",
            "task": "video-0007.mp4",
            "error_type": "RuntimeError",
            "message": FAILURE_MESSAGES[0],
            "traceback": 'Traceback (most recent call last):\n  File "infer.py", line 3\n'
            "RuntimeError: CUDA out of memory",
            "attempts": 3,
        },
        {
            "type": "failure",
            "t": 75.25,
            "stage": "write",
            "task": "video-0042.mp4",
            "error_type": "OSError",
            "message": FAILURE_MESSAGES[1],
            "traceback": 'Traceback (most recent call last):\n  File "write.py", line 9\n'
            "OSError: [Errno 122] Disk quota exceeded",
            "attempts": 1,
        },
    ]


def workers() -> list[dict[str, Any]]:
    out = []
    for s in STAGES:
        out.append(_worker(0.0, "start", s, f"{s}-0"))
        out.append(_worker(1.5, "ready", s, f"{s}-0", setup_s=1.5))
    out.append(_worker(50.0, "died", "infer", "infer-3", reason="exit code -9 (killed: OOM)"))
    out.append(_worker(61.0, "stop", "write", "write-1", reason="scale down"))
    return out


def _worker(t, event, stage, worker, reason=None, setup_s=None) -> dict[str, Any]:
    return {
        "type": "worker",
        "t": t,
        "event": event,
        "stage": stage,
        "worker": worker,
        "node": "node-a",
        "reason": reason,
        "setup_s": setup_s,
    }


def run_end(wall_s: float = 120.0) -> dict[str, Any]:
    return {
        "type": "run_end",
        "t": wall_s,
        "completed": True,
        "wall_s": wall_s,
        "startup_s": 1.5,
        "first_output_s": 2.0,
        "counts": {"inputs": 1300, "outputs": 1298, "filtered": 0, "failed": 2, "skipped": 0},
        "stages": {
            s: {
                "tasks_in": 1300,
                "tasks_out": 1299,
                "filtered": 0,
                "failed": 1 if s != "read" else 0,
                "retried": 2,
                "worker_deaths": 1 if s == "infer" else 0,
                "timeouts": 0,
                "peak_workers": 6 if s == "infer" else 2,
                "worker_memory_bytes": 1536 << 20 if s == "infer" else 0,
                "busy_s": 500.0,
            }
            for s in STAGES
        },
    }


def three_stage_run(seconds: int = 120, end: bool = True) -> list[dict[str, Any]]:
    """The whole run's events in time order."""
    events: list[dict[str, Any]] = [run_start()]
    timed = decisions() + failures() + workers()
    timed += [snapshot(float(t)) for t in range(1, seconds + 1)]
    timed.sort(key=lambda e: e["t"])
    events += timed
    if end:
        events.append(run_end(float(seconds)))
    return events


def write_events(path: Path, events: list[dict[str, Any]], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + tail, encoding="utf-8")
    return path


def write_rotated(run_dir: Path, events: list[dict[str, Any]], parts: int = 3) -> None:
    """Split ``events`` like EventLog's rotation: events.jsonl newest, events.N.jsonl older,
    each part after the first starting with the run's run_start again."""
    start, rest = events[0], events[1:]
    size = math.ceil(len(rest) / parts)
    chunks = [rest[i * size : (i + 1) * size] for i in range(parts)]
    for index, chunk in enumerate(chunks):
        number = parts - 1 - index  # the first chunk is the oldest
        name = "events.jsonl" if number == 0 else f"events.{number}.jsonl"
        write_events(run_dir / name, [start, *chunk])


#: logs that are valid but unusual: a report must still come out, and open cleanly
ODD_LOGS = {
    "run_start only": [run_start()],
    "no snapshot": [run_start(), run_end()],
    "no run_start": [snapshot(1.0), snapshot(2.0), failures()[0]],
    "one snapshot": [run_start(), snapshot(1.0)],
    "same time": [run_start(), snapshot(1.0), snapshot(1.0), snapshot(1.0)],
    "odd values": [
        run_start(),
        {"type": "snapshot", "t": 1, "stages": [{"name": "read"}, "x"]},
        {"type": "snapshot", "t": 2, "stages": [{"name": "new", "busy": "high", "ready": None}]},
        {"type": "snapshot", "t": 0.5, "stages": []},  # out of order
        {"type": "decision", "t": 1, "changes": [{"stage": "zzz"}, 3]},
        {"type": "worker", "t": "soon", "event": "died"},
        {"type": "failure"},
        {"type": "run_end", "counts": None},
    ],
}


# -- the machine's use (host_cpu_s, run_cpu_s, host_gpu_s: counters since the start) -------
SHARED = ("decode", "encode", "write")


def with_host(
    events: list[dict[str, Any]],
    cores: float,
    busy: float,
    run: float | None = None,
    gpus: float = 0,
    gpu_busy: float | None = None,
) -> list[dict[str, Any]]:
    """``events`` as EventLog writes them where it measures the host: ``cores`` CPUs
    watched, ``busy`` of them busy all along (``run`` by the run itself), and ``gpus`` GPUs
    ``gpu_busy`` busy."""
    out = []
    for event in events:
        event = dict(event)
        if event["type"] == "run_start":
            event["host"] = {**event["host"], "cpus": cores, "gpus": gpus}
        elif event["type"] in ("snapshot", "run_end"):
            t = float(event["t"])
            event["host_cpu_s"] = round(busy * t, 3)
            event["run_cpu_s"] = round((busy if run is None else run) * t, 3)
            if gpu_busy is not None:
                event["host_gpu_s"] = round(gpu_busy * t, 3)
        out.append(event)
    return out


def shared_cores_run(
    seconds: int = 60, busy: tuple[float, ...] = (0.7, 0.6, 0.5), computing: float = 0.8
) -> list[dict[str, Any]]:
    """``decode -> encode -> write`` on a 2-CPU machine, CPUs shared by time: each stage's
    workers busy ``busy`` of the time (and computing ``computing`` of that), a few tasks
    queued, 7.18 CPUs held between them; no host measures (see ``with_host``)."""
    start = run_start("shared", SHARED)
    start["cluster"] = {"nodes": [{"node_id": "node-a", "cpus": 2.0, "gpus": 0.0}],
                        "cpus": 2.0, "gpus": 0.0}  # fmt: skip
    for stage in start["stages"]:
        stage["gpus"] = 0.0
    events: list[dict[str, Any]] = [start]
    for t in range(1, seconds + 1):
        rows = [
            {"name": name, "ready": 2, "starting": 0, "target": 2, "queued": 2,
             "queued_bytes": 8192, "in_flight": 2, "tasks_in": 4 * t, "tasks_out": 4 * t,
             "filtered": 0, "failed": 0, "retried": 0, "busy": busy[i], "task_time_s": 0.4,
             "done": False}
            for i, name in enumerate(SHARED)
        ]  # fmt: skip
        snapshot = {"type": "snapshot", "t": float(t), "inputs": 4 * t + 2, "outputs": 4 * t,
                    "source_exhausted": False, "cpus_reserved": 7.18, "gpus_reserved": 0.0,
                    "stages": rows}  # fmt: skip
        events.append(snapshot)
    end = run_end(float(seconds))
    end["stages"] = {
        name: {"tasks_in": 4 * seconds, "busy_s": 2 * busy[i] * seconds,
               "cpu_s": 2 * busy[i] * seconds * computing}
        for i, name in enumerate(SHARED)
    }  # fmt: skip
    events.append(end)
    return events
