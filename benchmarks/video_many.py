"""Many small videos: does the driver's bookkeeping stay flat as the video count grows?

At each ``--sizes`` count (2,000 and 20,000 by default) of generated 2 s videos at 160x90 in
nested folders (``video_user.make_small_videos``: copies of a few distinct ones, cached), the
command a user runs, ``conveyor video IN OUT --splitter fixed --no-quality --no-embed
--no-tags --no-live`` (``benchmarks/video.py --user``'s small case), runs three times:

- ``full``: into a fresh output, every video;
- ``partial``: into another fresh output with ``--limit`` at 95% of the videos;
- ``resume``: the same command without ``--limit`` on that output, which resumes: the wall
  time of this rerun is the resume time with 95% done.

**How the driver is measured.** Each run is a subprocess of this script (``--driver``), which
runs the ``conveyor`` command in-process (``conveyor.cli.app``, what the installed command
runs) and writes its own resource usage when the command ends: CPU seconds (user + system,
``RUSAGE_SELF``) and peak RSS (``ru_maxrss``) of the driver process alone. The workers are
not in them: the local backend's root process is a child started with ``subprocess``, and
the hosts and workers are its descendants, so ``RUSAGE_SELF`` never counts them, and exactly
(not sampled: nothing is missed at the end). The same figures are also taken at the entry and
exit of ``run_video`` (listing, resume checks, the engine's loop, the summary), which leaves
out the start-up every run pays once (imports, the backend's start): the per-video figure that
says whether the bookkeeping grows with the count; and around ``build_summary`` (its CPU, and
the peak RSS before it), to tell the run's bookkeeping from the summary's. The whole tree's
CPU (``RUSAGE_CHILDREN`` around the subprocess) is printed beside, for scale.

Also per size: the first clip on disk (polled from the start: does the first video start
before a long listing ends?), the journal's size (``OUT/.conveyor/journal``), and the summary
time: from the newest video record (a video is done when its record is written) to
``summary.json`` being written, both file modification times.

The ratios (largest size over smallest) of the driver's CPU per video and of its peak RSS are
the figures of issue 29 (target: at most 1.1). ``--quick``: 200 and 2,000 videos. Prints;
asserts nothing::

    python benchmarks/video_many.py --sizes 2000,20000 --json figures.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from _common import fmt, machine_line, mb, table
from video_user import FIXED_OPTIONS, POLL_S, _children_cpu_s, _has_clip, make_small_videos

SECONDS, WIDTH, HEIGHT, FPS = 2.0, 160, 90, 30
#: share of the videos done before the resumed run
DONE_BEFORE_RESUME = 0.95
TARGET_RATIO = 1.1


# -- the driver, in its own process -------------------------------------------------------
def _self_usage() -> dict[str, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss": float(psutil.Process().memory_info().rss),
        "peak_rss": usage.ru_maxrss * 1024.0,  # so far (KiB on Linux)
        "t": time.time(),
    }


def driver_main(stats: Path, command: list[str]) -> int:
    """Run ``conveyor COMMAND`` in this process; write this process's own usage to ``stats``."""
    import conveyor.pipelines.video as video_pipeline
    from conveyor.cli import app

    marks: dict[str, Any] = {}

    def marked(module: Any, name: str, mark: str) -> None:
        """``module.name`` noting this process's usage when called and when it returns
        (the CLI imports ``run_video`` when it runs, and ``run_video`` finds ``build_summary``
        among its module's names)."""
        function = getattr(module, name)

        def measured(*args: Any, **kwargs: Any) -> Any:
            marks[f"{mark}_in"] = _self_usage()
            try:
                return function(*args, **kwargs)
            finally:
                marks[f"{mark}_out"] = _self_usage()

        setattr(module, name, measured)

    marked(video_pipeline, "run_video", "run")
    marked(video_pipeline, "build_summary", "summary")
    code: int | str | None = 0
    try:
        app(args=command, prog_name="conveyor")
    except SystemExit as exc:
        code = exc.code
    usage = resource.getrusage(resource.RUSAGE_SELF)
    figures = {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss": usage.ru_maxrss * 1024,  # KiB on Linux
        "exit": code if isinstance(code, int) else 1,
        **marks,
    }
    stats.write_text(json.dumps(figures))
    return figures["exit"]


# -- one run -------------------------------------------------------------------------------
def command(source: Path, output: Path, limit: int | None = None) -> list[str]:
    extra = ["--limit", str(limit)] if limit is not None else []
    return ["video", str(source), str(output), *FIXED_OPTIONS, "--no-live", *extra]


def measure(args: list[str], output: Path, log: Path) -> dict[str, Any]:
    """Run the driver on ``conveyor ARGS``: its own figures, the tree's CPU, wall time and
    the first clip in ``output/clips`` (polled from the start)."""
    stats = log.with_suffix(".stats.json")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", str(stats), "--", *args]
    clips = output / "clips"
    with open(log, "w") as sink:
        cpu_before = _children_cpu_s()
        begun = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
        first = None
        while first is None and proc.poll() is None:
            if _has_clip(clips):
                first = time.perf_counter() - begun
            else:
                time.sleep(POLL_S)
        proc.wait()
        wall = time.perf_counter() - begun
        tree_cpu = _children_cpu_s() - cpu_before
    if first is None and _has_clip(clips):
        first = wall
    driver = json.loads(stats.read_text()) if stats.exists() else {}
    run_in, run_out = driver.get("run_in"), driver.get("run_out")
    summary_in, summary_out = driver.get("summary_in"), driver.get("summary_out")
    summary = _read_json(output / "summary.json")
    return {
        "exit": proc.returncode,
        "wall_s": wall,
        "first_clip_s": first,
        "tree_cpu_s": tree_cpu,
        "driver_cpu_s": driver.get("cpu_s"),
        "driver_peak_rss": driver.get("peak_rss"),
        "run_cpu_s": run_out["cpu_s"] - run_in["cpu_s"] if run_in and run_out else None,
        "rss_at_run": run_in["rss"] if run_in else None,
        # the summary: its CPU, and the driver's peak before it began
        "summary_cpu_s": (
            summary_out["cpu_s"] - summary_in["cpu_s"] if summary_in and summary_out else None
        ),
        "peak_rss_before_summary": summary_in["peak_rss"] if summary_in else None,
        "videos": (summary or {}).get("videos", {}),
        "log": str(log),
    }


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def newest_mtime(folder: Path) -> float | None:
    """The latest modification time of a file under ``folder`` (records are written last)."""
    newest = None
    stack = [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.name.endswith(".json"):
                mtime = entry.stat(follow_symlinks=False).st_mtime
                newest = mtime if newest is None else max(newest, mtime)
    return newest


def size_figures(count: int, cache: Path, root: Path, resume: bool = True) -> dict[str, Any]:
    """The three runs at ``count`` videos (the full one alone without ``resume``) and what
    they measured."""
    source = make_small_videos(cache, count, SECONDS, WIDTH, HEIGHT, FPS)
    found: dict[str, Any] = {"videos": count}
    full = root / f"n{count}-full"
    print(f"  [{count:,} videos] full run ...", flush=True)
    run = measure(command(source, full), full, root / f"n{count}-full.log")
    journal = full / ".conveyor" / "journal"
    last_record = newest_mtime(full / "videos")
    summary = full / "summary.json"
    run["journal_bytes"] = journal.stat().st_size if journal.exists() else None
    run["summary_s"] = (
        summary.stat().st_mtime - last_record if summary.exists() and last_record else None
    )
    found["full"] = run
    shutil.rmtree(full, ignore_errors=True)
    if not resume:
        found["partial"] = found["resume"] = None
        return found

    done = max(1, min(count - 1, round(count * DONE_BEFORE_RESUME)))
    partial = root / f"n{count}-resume"
    print(f"  [{count:,} videos] partial run of {done:,}, then the resumed run ...", flush=True)
    found["partial"] = measure(
        command(source, partial, limit=done), partial, root / f"n{count}-partial.log"
    )
    found["resume"] = measure(command(source, partial), partial, root / f"n{count}-resume.log")
    shutil.rmtree(partial, ignore_errors=True)
    return found


# -- reporting -----------------------------------------------------------------------------
def per_video(value: float | None, count: int, scale: float = 1.0) -> float | None:
    return None if value is None else value * scale / count


def derived(size: dict[str, Any]) -> dict[str, Any]:
    """The per-video figures of one size."""
    n, full, resume = size["videos"], size["full"], size["resume"]
    return {
        "driver_cpu_ms_per_video": per_video(full["driver_cpu_s"], n, 1000),
        "run_cpu_ms_per_video": per_video(full["run_cpu_s"], n, 1000),
        "tree_cpu_ms_per_video": per_video(full["tree_cpu_s"], n, 1000),
        "driver_peak_rss": full["driver_peak_rss"],
        "peak_rss_before_summary": full.get("peak_rss_before_summary"),
        "rss_growth_per_video": (
            per_video(full["driver_peak_rss"] - full["rss_at_run"], n)
            if full["driver_peak_rss"] is not None and full["rss_at_run"] is not None
            else None
        ),
        "journal_bytes_per_video": per_video(full["journal_bytes"], n),
        "videos_per_s": n / full["wall_s"] if full["wall_s"] else None,
        "resume_s": resume["wall_s"] if resume else None,
        "resume_driver_cpu_s": resume["driver_cpu_s"] if resume else None,
    }


#: the printed rows: label, where the figure is, format
ROWS: list[tuple[str, str, str]] = [
    ("exit codes (full, partial, resume)", "exits", ""),
    ("videos ok in the summary", "ok", ",d"),
    ("wall s (full run)", "full.wall_s", ".1f"),
    ("videos per s", "d.videos_per_s", ".1f"),
    ("first clip on disk s", "full.first_clip_s", ".2f"),
    ("driver CPU s (whole process)", "full.driver_cpu_s", ".2f"),
    ("driver CPU ms per video", "d.driver_cpu_ms_per_video", ".3f"),
    ("  of it in run_video, ms per video", "d.run_cpu_ms_per_video", ".3f"),
    ("tree CPU ms per video (all processes)", "d.tree_cpu_ms_per_video", ".1f"),
    ("driver peak RSS MB", "d.driver_peak_rss", "mb"),
    ("  RSS at run_video's start MB", "full.rss_at_run", "mb"),
    ("  growth during the run, bytes per video", "d.rss_growth_per_video", ",.0f"),
    ("  peak before the summary MB", "full.peak_rss_before_summary", "mb"),
    ("journal bytes", "full.journal_bytes", ",d"),
    ("journal bytes per video", "d.journal_bytes_per_video", ".1f"),
    ("summary s (last record -> summary.json)", "full.summary_s", ".2f"),
    ("  of it building the summary, driver CPU s", "full.summary_cpu_s", ".2f"),
    ("resume s (rerun with 95% done)", "d.resume_s", ".2f"),
    ("  resumed run: driver CPU s", "d.resume_driver_cpu_s", ".2f"),
]
#: the ratios judged against the target: figure, its key in ``derived``
RATIOS = [
    ("driver CPU per video", "driver_cpu_ms_per_video"),
    ("driver CPU per video in run_video", "run_cpu_ms_per_video"),
    ("driver peak RSS", "driver_peak_rss"),
    ("driver peak RSS before the summary", "peak_rss_before_summary"),
]
#: peaks whose growth per added video is printed (what a million videos would add)
PEAKS = [
    ("driver peak RSS", "driver_peak_rss"),
    ("driver peak RSS before the summary", "peak_rss_before_summary"),
]


def cell(size: dict[str, Any], where: str, spec: str) -> str:
    if where == "exits":
        return "/".join(
            str((size[k] or {}).get("exit", "-")) for k in ("full", "partial", "resume")
        )
    if where == "ok":
        value: Any = size["full"]["videos"].get("ok")
    else:
        part, key = where.split(".", 1)
        value = (size["derived"] if part == "d" else size[part]).get(key)
    if spec == "mb":
        return mb(value)
    if value is not None and spec.endswith("d"):
        value = int(value)
    return fmt(value, spec) if spec else str(value)


def report(sizes: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    for size in sizes:
        size["derived"] = derived(size)
    header = ["figure", *(f"{s['videos']:,} videos" for s in sizes)]
    print(
        table(
            f"[video_many] conveyor video --splitter fixed (no models), {cores} cores, "
            "each size in its own runs",
            header,
            [[label, *(cell(s, where, spec) for s in sizes)] for label, where, spec in ROWS],
        )
    )
    small, large = sizes[0], sizes[-1]
    ratios = {}
    rows = []
    for label, key in RATIOS:
        a, b = small["derived"][key], large["derived"][key]
        ratio = b / a if a and b is not None else None
        ratios[key] = ratio
        met = None if ratio is None else ratio <= TARGET_RATIO
        rows.append(
            [
                label,
                fmt(ratio, ".3f"),
                f"<= {TARGET_RATIO:g}",
                "-" if met is None else ("met" if met else "not met"),
            ]
        )
    added = large["videos"] - small["videos"]
    for label, key in PEAKS:
        a, b = small["derived"][key], large["derived"][key]
        per = (b - a) / added if a is not None and b is not None and added else None
        ratios[f"{key}_bytes_per_added_video"] = per
        rows.append([f"{label}: bytes per added video", fmt(per, ",.0f"), "", ""])
    print(
        table(
            f"[video_many] {large['videos']:,} videos over {small['videos']:,}",
            ["figure", "ratio", "target", ""],
            rows,
        )
    )
    return ratios


def _commit() -> str | None:
    """The commit of the code measured (the checkout this script is in)."""
    try:
        found = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return found.stdout.strip()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--driver"]:
        raise SystemExit(driver_main(Path(argv[1]), argv[3:] if argv[2:3] == ["--"] else argv[2:]))
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", default=None, help="video counts, e.g. 2000,20000 (the default)")
    p.add_argument("--quick", action="store_true", help="200 and 2,000 videos")
    p.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "conveyor-bench-videos"
    )
    p.add_argument("--outputs", type=Path, default=None, help="runs' logs here (kept)")
    p.add_argument(
        "--no-resume", action="store_true", help="the full runs only (no partial and resumed)"
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    p.add_argument("--from-json", type=Path, default=None, help="print a saved run's tables")
    args = p.parse_args(argv)
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        saved["ratios"] = report(saved["sizes"], saved["cores"] or 1)
        return saved
    spec = args.sizes or ("200,2000" if args.quick else "2000,20000")
    try:
        counts = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        p.error(f"--sizes: comma-separated counts, got {spec!r}")
    if len(counts) < 2 or counts[0] < 1:
        p.error("--sizes: at least two counts of one or more videos")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(machine_line(float(cores or 1)))
    keep = args.outputs is not None
    root = args.outputs or Path(tempfile.mkdtemp(prefix="conveyor-bench-many-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        sizes = [size_figures(n, args.cache, root, not args.no_resume) for n in counts]
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    ratios = report(sizes, cores or 1)
    figures = {
        "command": ["conveyor", *command(Path("IN"), Path("OUT"))],
        "cores": cores,
        "done_before_resume": DONE_BEFORE_RESUME,
        "sizes": sizes,
        "ratios": ratios,
        "target_ratio": TARGET_RATIO,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": _commit(),
    }
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return figures


if __name__ == "__main__":
    main()
