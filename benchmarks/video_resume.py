"""What a long video stopped part way costs to finish: the same command again, against a run
never stopped, side by side in one run.

Generates one long video, runs ``conveyor video`` on it to the end (the reference), then
runs it again into another output, ``kill -9``s the process group once ``--stop-at`` of the
reference's clips are staged, and runs the same command to the end. Prints the wall time of
each run, the clips the resumed run adopted, and whether its record equals the reference's.
Before clip-level resume, the second run redid the whole video.

    python benchmarks/video_resume.py --minutes 2 --splitter fixed
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine_line, table

from conveyor.samples.video import Segment, write_video

KINDS = ("pan", "rings", "checker", "noise", "plasma")


def command(source: Path, output: Path, args: argparse.Namespace) -> list[str]:
    cut = ["--splitter", "fixed", "--clip-len", "4"] if args.splitter == "fixed" else []
    return [
        sys.executable, "-m", "conveyor", "video", str(source), str(output), *cut,
        "--no-live", "--cpus", str(args.cpus),
    ]  # fmt: skip


def record(output: Path) -> dict[str, Any]:
    found = json.loads((output / "videos" / "long.mp4.json").read_text())
    for key in ("finished_at", "resumed_clips", "resumed_seconds", "num_chunks"):
        found.pop(key, None)
    return found


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def stopped_run(cmd: list[str], output: Path, parts: int) -> tuple[float, int]:
    """Run ``cmd`` until ``parts`` clips are staged, then kill it: (seconds, parts staged)."""
    start = time.perf_counter()
    said = output.with_name(output.name + ".log")
    with open(said, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    staging = output / ".conveyor" / "staging"
    staged = 0
    try:
        while staged < parts:
            if proc.poll() is not None:
                tail = said.read_text(errors="replace")[-2000:]
                raise SystemExit(
                    f"the run ended before it was stopped (exit {proc.returncode}):\n{tail}"
                )
            staged = len(list(staging.glob("*/chunk-*.json")))
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(1.0)  # its workers notice and go
    return time.perf_counter() - start, staged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=2.0, help="length of the generated video")
    p.add_argument("--splitter", choices=("fixed", "shots"), default="fixed")
    p.add_argument("--stop-at", type=float, default=0.7, help="share of clips staged at the kill")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    p.add_argument("--width", type=int, default=640)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="conveyor-video-resume-"))
    try:
        seconds = args.minutes * 60
        scene = 12.0
        segments = [
            Segment(KINDS[i % len(KINDS)], scene, i) for i in range(max(1, round(seconds / scene)))
        ]
        height = round(args.width * 9 / 16 / 2) * 2
        write_video(work / "in" / "long.mp4", segments, width=args.width, height=height, fps=30)
        reference, resumed = work / "reference", work / "resumed"
        whole = timed(command(work / "in", reference, args))
        clips = len(record(reference)["clips"])
        want = max(1, round(clips * args.stop_at))
        before, staged = stopped_run(command(work / "in", resumed, args), resumed, want)
        after = timed(command(work / "in", resumed, args))
        found = json.loads((resumed / "videos" / "long.mp4.json").read_text())
        same = record(resumed) == record(reference)
        print(machine_line(args.cpus))
        print(
            table(
                f"one {args.minutes:g}-minute {args.width}x{height} video, {args.splitter}, "
                f"{clips} clips; stopped with {staged} staged",
                ["run", "wall s", "clips adopted", "record as the reference's"],
                [
                    ["never stopped", f"{whole:.1f}", "-", "-"],
                    ["stopped (kill -9)", f"{before:.1f}", "-", "-"],
                    ["resumed", f"{after:.1f}", str(found["resumed_clips"]), str(same)],
                ],
            )
        )
        print(f"resumed / never stopped: {after / whole:.2f}x the wall time")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
