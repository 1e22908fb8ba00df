"""The video demo: generated videos in, the full CPU pipeline, and a check of what it found.

``generate_demo_videos`` writes a seeded set of synthetic videos (test patterns, moving shapes
and noise, in MP4, MKV, MOV, WebM and AVI; hard cuts, a crossfade, a static stretch) and one
truncated file, each with its ground truth. ``run_demo`` curates them with the default video
pipeline (TransNetV2 shots, H.264, motion and quality filters, embeddings, tags) and checks
the outputs against the truth: cuts found within a few frames, the crossfade found, the
static stretch filtered by motion, the broken file reported, every clip decodable H.264.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table

from conveyor.demos import check_places
from conveyor.samples.video import Segment, SyntheticVideo, write_bad_file, write_video

if TYPE_CHECKING:
    from conveyor.engine.events import Monitor
    from conveyor.pipelines.video import VideoRunReport

DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "conveyor-demo"
#: a boundary counts as found when the detector puts it this close (frames)
CUT_TOLERANCE_FRAMES = 3
BROKEN = "broken/cut_short.mp4"


@dataclass
class DemoInput:
    """One generated input: its ground truth, or the kind of damage done to it."""

    relative_path: str
    truth: SyntheticVideo | None = None
    damage: str | None = None


def check_workdir(workdir: str | Path) -> None:
    """``ValueError`` unless the demo may write ``workdir``: its ``input`` and ``output``
    folders are folders (or not there yet), and ``input`` holds nothing but an earlier
    demo's videos, since the demo replaces that folder whole."""
    root = Path(workdir)
    check_places(root)
    inputs = root / "input"
    if not inputs.is_dir():
        return
    ours = {relative for relative, _, _ in _specs(0)} | {BROKEN}
    others = sorted(
        str(path.relative_to(inputs))
        for path in inputs.rglob("*")
        if not path.is_dir() and str(path.relative_to(inputs)) not in ours
    )
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        raise ValueError(
            f"--workdir: {inputs} holds {', '.join(others[:3])}{more}, which the demo did not "
            "write, and the demo replaces that folder: give an empty or a demo's --workdir"
        )


def generate_demo_videos(directory: str | Path, seed: int = 0) -> list[DemoInput]:
    """Write the demo's inputs under ``directory`` (replacing earlier ones); about 70 s of
    video in five containers, plus one truncated file."""
    root = Path(directory)
    shutil.rmtree(root, ignore_errors=True)
    made = [
        DemoInput(relative, truth=write_video(root / relative, segments, **options))
        for relative, segments, options in _specs(seed)
    ]
    write_bad_file(root / BROKEN, "truncated", seed)
    made.append(DemoInput(BROKEN, damage="truncated"))
    return made


def _specs(seed: int) -> list[tuple[str, list[Segment], dict[str, Any]]]:
    """The demo's videos: where each goes, its segments, how it is written."""
    s = seed * 100
    return [
        (
            "studio/cuts.mp4",
            [
                Segment("pan", 5, s + 1),
                Segment("shapes", 4, s + 2),
                Segment("rings", 5, s + 3),
                Segment("checker", 4, s + 4),
                Segment("noise", 3, s + 5),
            ],
            {"width": 640, "height": 360, "fps": 24},
        ),
        (
            "studio/crossfade.mkv",
            [Segment("plasma", 5, s + 6), Segment("pan", 5, s + 7), Segment("shapes", 6, s + 8)],
            {"width": 480, "height": 270, "fps": 25, "crossfades": {1: 1.0}},
        ),
        (
            "archive/static.mov",
            [
                Segment("rings", 5, s + 9),
                Segment("bars", 6, s + 10, static=True),
                Segment("checker", 5, s + 11),
            ],
            {"width": 640, "height": 360, "fps": 30},
        ),
        (
            "archive/noise.webm",
            [Segment("noise", 4, s + 12), Segment("pan", 5, s + 13)],
            {"width": 426, "height": 240, "fps": 24},
        ),
        (
            "archive/old.avi",
            [Segment("shapes", 6, s + 14), Segment("rings", 4, s + 15)],
            {"width": 320, "height": 240, "fps": 15},
        ),
    ]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class VideoDemoReport:
    """What ``run_demo`` did and found (the CLI prints it)."""

    inputs: list[DemoInput]
    run: VideoRunReport
    checks: list[Check] = field(default_factory=list)
    generate_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks) and self.run.result.completed


def run_demo(
    workdir: str | Path = DEFAULT_WORKDIR,
    *,
    seed: int = 0,
    executor: str = "streaming",
    live: bool = True,
    cpus: float | None = None,
    console: Console | None = None,
    monitors: Sequence[Monitor] = (),
) -> VideoDemoReport:
    """Generate the inputs under ``workdir/input``, curate them into ``workdir/output`` (made
    afresh), and check the result. ``monitors`` watch the run beside the live view."""
    from conveyor.backends.local import LocalBackend
    from conveyor.executors import BatchExecutor, StreamingExecutor
    from conveyor.monitor import LiveView
    from conveyor.pipelines.video import VideoConfig, clear_output, run_video

    console = console or Console()
    root = Path(workdir)
    check_workdir(root)
    input_dir, output_dir = root / "input", root / "output"
    started = time.perf_counter()
    inputs = generate_demo_videos(input_dir, seed)
    generate_s = time.perf_counter() - started
    clear_output(output_dir)
    config = VideoConfig(str(input_dir), str(output_dir))
    backend = LocalBackend(num_cpus=cpus)
    view = LiveView(console=console, live=None if live else False)
    kind = {"streaming": StreamingExecutor, "batch": BatchExecutor}.get(executor)
    if kind is None:
        raise ValueError(f"executor must be 'streaming' or 'batch', got {executor!r}")
    seconds = sum(i.truth.duration_s for i in inputs if i.truth is not None)
    console.print(
        f"[bold]Conveyor video demo[/]: {len(inputs)} generated videos ({seconds:.0f} s, one "
        f"broken) in {generate_s:.1f} s -> {executor} executor, local backend, "
        f"{backend.num_cpus:g} CPUs"
    )
    try:
        run = run_video(config, kind(backend, monitors=[view, *monitors]))
    finally:
        view.close()
    report = VideoDemoReport(inputs, run, generate_s=generate_s)
    report.checks = check_outputs(output_dir, inputs)
    return report


# -- checks -----------------------------------------------------------------------------
def check_outputs(output: Path, inputs: list[DemoInput]) -> list[Check]:
    """Every check of the demo against the generator's ground truth."""
    from conveyor.media.layout import OutputLayout

    layout = OutputLayout(output)
    records = {i.relative_path: layout.read_record(i.relative_path) for i in inputs}
    checks = [
        _check_cuts(inputs, records),
        _check_fades(inputs, records),
        _check_static(inputs, records, layout),
        _check_broken(inputs, records),
        _check_kept(inputs, records),
        _check_clips(layout),
    ]
    return checks


def _boundaries(record: dict[str, Any] | None) -> list[float]:
    return list(record.get("boundaries_s", [])) if record else []


def _check_cuts(inputs: list[DemoInput], records: dict[str, Any]) -> Check:
    found = missed = spurious = 0
    misses = []
    for item in inputs:
        truth = item.truth
        if truth is None:
            continue
        detected = _boundaries(records[item.relative_path])
        tolerance = CUT_TOLERANCE_FRAMES / truth.fps
        for cut in truth.cuts_s:
            if any(abs(b - cut) <= tolerance for b in detected):
                found += 1
            else:
                missed += 1
                misses.append(f"{item.relative_path}@{cut:g}s")
        expected = [*truth.cuts_s, *((a + b) / 2 for a, b in truth.fades_s)]
        spurious += sum(
            1 for b in detected if not any(abs(b - e) <= tolerance + 1.0 for e in expected)
        )
    detail = f"{found} of {found + missed} hard cuts found within {CUT_TOLERANCE_FRAMES} frames"
    if misses:
        detail += f" (missed: {', '.join(misses)})"
    detail += f"; {spurious} spurious"
    return Check("cuts", missed == 0 and spurious == 0, detail)


def _check_fades(inputs: list[DemoInput], records: dict[str, Any]) -> Check:
    total = hit = 0
    for item in inputs:
        if item.truth is None:
            continue
        detected = _boundaries(records[item.relative_path])
        for start, end in item.truth.fades_s:
            total += 1
            if any(start - 0.5 <= b <= end + 0.5 for b in detected):
                hit += 1
    return Check("crossfade", hit == total, f"{hit} of {total} crossfades found as a transition")


def _check_static(inputs: list[DemoInput], records: dict[str, Any], layout: Any) -> Check:
    import json

    inside = filtered = kept_inside = 0
    for item in inputs:
        if item.truth is None or not item.truth.static_s:
            continue
        record = records[item.relative_path]
        if record is None:
            return Check("static", False, f"{item.relative_path} has no record")
        for clip in record["clips"]:
            meta = json.loads(layout.meta_path(clip).read_text())
            start, end = meta["span"]
            for lo, hi in item.truth.static_s:
                overlap = max(0.0, min(end, hi) - max(start, lo))
                if overlap > 0.5 * (end - start):  # mostly still
                    inside += 1
                    if meta["filtered_by"] == "motion":
                        filtered += 1
                    if meta["filtered_by"] is None:
                        kept_inside += 1
    ok = inside > 0 and filtered == inside and kept_inside == 0
    return Check(
        "static", ok, f"{filtered} of {inside} clips of the static stretch filtered by motion"
    )


def _check_broken(inputs: list[DemoInput], records: dict[str, Any]) -> Check:
    reasons = []
    for item in inputs:
        if item.damage is None:
            continue
        record = records[item.relative_path]
        if record is None or record["status"] != "failed" or not record["errors"]:
            return Check("broken file", False, f"{item.relative_path} was not reported as failed")
        reasons.append(f"{item.relative_path}: {next(iter(record['errors'].values()))}")
    return Check("broken file", True, "; ".join(reasons))


def _check_kept(inputs: list[DemoInput], records: dict[str, Any]) -> Check:
    bad = [
        i.relative_path
        for i in inputs
        if i.truth is not None
        and (records[i.relative_path] is None or not records[i.relative_path]["kept"])
    ]
    good = sum(1 for i in inputs if i.truth is not None)
    return Check(
        "videos",
        not bad,
        f"{good - len(bad)} of {good} good videos finished with kept clips"
        + (f" (not: {', '.join(bad)})" if bad else ""),
    )


def _check_clips(layout: Any) -> Check:
    import json

    import av

    paths = sorted(layout.clips.glob("*.mp4"))
    problems = []
    for path in paths:
        meta = json.loads(layout.meta_path(path.stem).read_text())
        try:
            with av.open(io.BytesIO(path.read_bytes())) as container:
                stream = container.streams.video[0]
                frames = sum(1 for _ in container.decode(stream))
                codec, pix_fmt = stream.codec_context.name, stream.codec_context.pix_fmt
        except av.FFmpegError as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        if codec != "h264" or pix_fmt != "yuv420p" or frames != meta["num_frames"]:
            problems.append(f"{path.name}: {codec}/{pix_fmt}, {frames} of {meta['num_frames']}")
    ok = bool(paths) and not problems
    return Check(
        "clips",
        ok,
        f"{len(paths) - len(problems)} of {len(paths)} written clips decode as H.264 yuv420p "
        "with every frame" + (f" ({'; '.join(problems[:3])})" if problems else ""),
    )


def print_report(report: VideoDemoReport, console: Console | None = None) -> None:
    """The run's summary, then the checks against the ground truth."""
    from conveyor.pipelines.video_summary import print_summary

    console = console or Console()
    print_summary(report.run.summary, console)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="checks against the generator")
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("detail")
    for check in report.checks:
        table.add_row(check.name, "[green]ok[/]" if check.ok else "[red]WRONG[/]", check.detail)
    console.print(table)
    console.print(f"outputs: {report.run.summary_path.parent}")
