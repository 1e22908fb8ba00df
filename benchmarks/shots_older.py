"""Dissolves on the older shot benchmark's set (issue 27's "24 of 28"), with and without the
variance sag, side by side in one run.

The set is the one the 2026-11-26 record measured (docs/measurements/2026-11-26-shot-
dissolves.md): the video benchmark's timelines (``video._segments``: shots of 3-12 s of six
patterns, a 1 s dissolve now and then; 8 of 60 s) and six harder dissolve videos (0.5, 1, 2
and 3 s between different patterns, 1 and 2 s between two scenes of one pattern), 320x180 at
30 fps. Each video goes through the pipeline's own detection stages, in this process: its
windows (``VideoConfig.detection_window_s``, 25 frames of context), the decode
PySceneDetect's detectors take (256 wide, OpenCV's resize) and ``--detector`` (``hybrid``
by default, what ``auto`` is on a CPU); the transitions are each window's, the gradual runs
(``GradualRuns``) and, for ``with sag``, the dissolves of the variance's sag
(``VarianceDissolves``), as the splitter takes them. ``without sag`` is the same detection
with the sag's dissolves left out: the detector's work is done once and scored both ways.

Scored as that record scored it: a hard cut is found by a transition within 3 frames, a
dissolve by one overlapping it; spurious: transitions more than 3 frames from any true one;
clips into a transition: clips of the default rules (``scene_spans``: 2-10 s, 0.5 s cropped
at each end) that span a hard cut or share more than one frame with a dissolve.

    .venv/bin/python benchmarks/shots_older.py           # 8 timelines of 60 s + 6 dissolves
    .venv/bin/python benchmarks/shots_older.py --quick   # 1 timeline of 20 s + 2 dissolves
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine_line, table
from shots import Score  # its counters; the scoring here is the older record's
from video import _segments

from conveyor.cluster import WorkerInfo
from conveyor.media.decode import probe
from conveyor.media.dissolves import VarianceDissolves
from conveyor.media.transitions import GradualRuns, merge_transitions
from conveyor.pipelines.video import VideoConfig
from conveyor.samples.video import Segment, SyntheticVideo, write_video
from conveyor.stages.video.cut_detectors import SCENEDETECT_WIDTH, detector_for
from conveyor.stages.video.shots import TRANSNET_CONTEXT, ShotFrameDecoder, ShotWindows
from conveyor.stages.video.split import SplitRules, scene_spans
from conveyor.tasks.video import Video, VideoTask

#: a hard cut counts as found with a transition this many frames away at most
TOLERANCE = 3
#: the harder dissolves: (patterns, seconds)
DISSOLVES = [
    (("rings", "bars", "checker"), 0.5),
    (("pan", "shapes", "plasma"), 1.0),
    (("rings", "bars", "checker"), 2.0),
    (("pan", "shapes", "plasma"), 3.0),
    (("shapes", "shapes", "shapes"), 1.0),
    (("plasma", "plasma", "plasma"), 2.0),
]
CONTENDERS = ("without sag", "with sag")


def make_inputs(
    folder: Path, videos: int, seconds: float, dissolves: int, shot_s: float = 7.0
) -> list[SyntheticVideo]:
    size = {"width": 320, "height": 180, "fps": 30}
    made = []
    for i in range(videos):
        segments, fades = _segments(i, seconds)
        made.append(write_video(folder / f"video-{i:03d}.mp4", segments, crossfades=fades, **size))
    for i, (kinds, fade) in enumerate(DISSOLVES[:dissolves]):
        length = max(shot_s, fade + 1)
        segments = [Segment(kind, length, 100 * i + j) for j, kind in enumerate(kinds)]
        fades = {j: fade for j in range(len(kinds) - 1)}
        path = folder / f"dissolve-{i}-{kinds[0]}-{fade:g}s.mp4"
        made.append(write_video(path, segments, crossfades=fades, **size))
    return made


def detect(truth: SyntheticVideo, detector: Any) -> dict[str, list[tuple[int, int]]]:
    """The transitions the splitter takes from the pipeline's stages, without and with the
    dissolves of the variance's sag."""
    video = Video(str(truth.path), truth.path.name, probe(str(truth.path)))
    decoder = ShotFrameDecoder(size=None, width=SCENEDETECT_WIDTH, scaler="opencv")
    windows = ShotWindows(VideoConfig.detection_window_s, TRANSNET_CONTEXT)
    gradual, sags = GradualRuns(truth.fps), VarianceDissolves(truth.fps)
    found: list[tuple[int, int]] = []
    sagged: list[tuple[int, int]] = []
    for window in windows.process_video(video):
        task = VideoTask(data=window)
        decoder.process(task)
        detector.process(task)
        frame_window = task.data.window
        assert frame_window is not None
        found += frame_window.transitions or []
        found += gradual.feed(frame_window.start, frame_window.gradual, frame_window.end)
        sagged += sags.feed(frame_window.start, frame_window.variance, frame_window.end)
    found += gradual.finish()
    sagged += sags.finish()
    return {
        "without sag": merge_transitions(found),
        "with sag": merge_transitions(found + sagged),
    }


def score(truth: SyntheticVideo, found: list[tuple[int, int]], into: Score) -> None:
    fps = truth.fps
    cuts = [round(c * fps) for c in truth.cuts_s]  # a cut before frame c
    fades = [(round(a * fps), round(b * fps) - 1) for a, b in truth.fades_s]  # mixed frames
    near = [(c - 1, c) for c in cuts] + fades
    for c in cuts:
        into.cuts += 1
        if any(first - TOLERANCE <= c <= last + 1 + TOLERANCE for first, last in found):
            into.cuts_found += 1
        else:
            into.missed.append(f"{truth.path.name}: cut at {c / fps:.2f} s")
    for a, b in fades:
        into.dissolves += 1
        if any(first <= b and last >= a for first, last in found):
            into.dissolves_found += 1
        else:
            into.missed.append(f"{truth.path.name}: dissolve {a / fps:.2f}-{(b + 1) / fps:.2f} s")
    into.spurious += sum(
        1
        for first, last in found
        if not any(first - TOLERANCE <= b and last + TOLERANCE >= a for a, b in near)
    )
    for start, end in scene_spans(found, truth.num_frames, SplitRules(), fps):
        into.clips += 1
        spans_cut = any(start < c < end for c in cuts)
        overlap = max((min(end, b + 1) - max(start, a) for a, b in fades), default=0)
        into.clips_crossing += spans_cut or overlap > 1


def main(argv: list[str] | None = None) -> dict[str, Score]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--videos", type=int, default=8, help="benchmark timelines (default 8)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of each (default 60)")
    p.add_argument("--dissolves", type=int, default=len(DISSOLVES), help="hard-dissolve videos")
    p.add_argument("--detector", default="hybrid", help="hybrid (default) or transnetv2")
    p.add_argument("--quick", action="store_true", help="1 timeline of 20 s, 2 dissolve videos")
    args = p.parse_args(argv)
    if args.quick:
        args.videos, args.seconds, args.dissolves = 1, 20.0, 2
    print(machine_line(os.cpu_count() or 1))
    detector = detector_for(args.detector)
    detector.setup(WorkerInfo("bench", type(detector).__name__, "local"))
    scores = {name: Score() for name in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="cvy-shots-older-") as tmp:
        truths = make_inputs(Path(tmp), args.videos, args.seconds, args.dissolves)
        began = time.process_time()
        for truth in truths:
            for name, found in detect(truth, detector).items():
                score(truth, found, scores[name])
        spent = time.process_time() - began
    rows = [
        [
            name,
            f"{s.cuts_found}/{s.cuts}",
            f"{s.dissolves_found}/{s.dissolves}",
            s.spurious,
            f"{s.clips_crossing}/{s.clips}",
        ]
        for name, s in scores.items()
    ]
    title = (
        f"{len(truths)} videos, --detector {args.detector}, detection in this process "
        f"{spent:.1f} CPU-s (both rows from one detection)"
    )
    print(table(title, ["contender", "hard cuts", "dissolves", "spurious", "clips into"], rows))
    for name, s in scores.items():
        for miss in s.missed:
            print(f"  {name}: missed {miss}")
    return scores


if __name__ == "__main__":
    main()
