"""Shot detection on generated video with known transitions: TransNetV2's single-frame head
alone against both heads (the default), side by side on the same frames.

The videos are the video benchmark's timelines (shots of 3-12 s of six patterns, a 1 s
dissolve now and then) plus a set of harder dissolves: 0.5, 1, 2 and 3 s between different
patterns and 1 and 2 s between two scenes of the same pattern. Every video goes through the
pipeline's own stages (5 s windows, frames at 48 x 27, the detector) and the clips come from
``scene_spans`` with the default rules (2-10 s, 0.5 s cropped at each end). Per contender:

* transitions found: a hard cut with a transition within 3 frames, a dissolve with one
  overlapping it
* spurious: transitions more than 3 frames from any true one
* clips into a transition: clips that span a hard cut or share more than one frame with a
  dissolve (the figure that matters: such a clip mixes two shots)
* seconds spent in the detector (both run the same network; the second head is free)

    .venv/bin/python benchmarks/shots.py              # 8 videos of 60 s + 6 dissolve videos
    .venv/bin/python benchmarks/shots.py --quick      # 2 of 20 s + 2 dissolve videos
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import machine_line, table
from video import _segments

from conveyor.cluster import WorkerInfo
from conveyor.pipelines.video import VideoConfig
from conveyor.samples.video import Segment, SyntheticVideo, write_video
from conveyor.stages.video.decode import probe
from conveyor.stages.video.shots import (
    TRANSNET_CONTEXT,
    ShotFrameDecoder,
    ShotWindows,
    TransNetV2Detector,
)
from conveyor.stages.video.split import SplitRules, scene_spans
from conveyor.tasks.video import Video, VideoTask

#: a hard cut counts as found with a transition this many frames away at most
TOLERANCE = 3
#: dissolves harder than the benchmark's: (patterns, seconds)
DISSOLVES = [
    (("rings", "bars", "checker"), 0.5),
    (("pan", "shapes", "plasma"), 1.0),
    (("rings", "bars", "checker"), 2.0),
    (("pan", "shapes", "plasma"), 3.0),
    (("shapes", "shapes", "shapes"), 1.0),
    (("plasma", "plasma", "plasma"), 2.0),
]


@dataclass
class Score:
    cuts: int = 0
    cuts_found: int = 0
    dissolves: int = 0
    dissolves_found: int = 0
    spurious: int = 0
    clips: int = 0
    clips_into: int = 0
    detector_s: float = 0.0
    misses: list[str] = field(default_factory=list)


def make_inputs(
    folder: Path, videos: int, seconds: float, dissolves: int, shot_s: float
) -> list[SyntheticVideo]:
    size = {"width": 320, "height": 180, "fps": 30}  # detection sees 48 x 27 whatever the size
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


def detect(truth: SyntheticVideo, detector: TransNetV2Detector) -> tuple[list[Any], float]:
    """The transitions the pipeline's stages find in ``truth``, and the detector's seconds."""
    video = Video(str(truth.path), truth.path.name, probe(str(truth.path)))
    decoder, spent, found = ShotFrameDecoder(), 0.0, []
    windows = ShotWindows(VideoConfig.detection_window_s, TRANSNET_CONTEXT)
    for window in windows.process_video(video):
        task = VideoTask(data=window)
        decoder.process(task)
        begun = time.perf_counter()
        detector.process_batch([task])
        spent += time.perf_counter() - begun
        assert window.window is not None
        found += window.window.transitions or []
    return found, spent


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
            into.misses.append(f"{truth.path.name}: cut at {c / fps:.2f} s")
    for a, b in fades:
        into.dissolves += 1
        if any(first <= b and last >= a for first, last in found):
            into.dissolves_found += 1
        else:
            into.misses.append(f"{truth.path.name}: dissolve {a / fps:.2f}-{(b + 1) / fps:.2f} s")
    into.spurious += sum(
        1
        for first, last in found
        if not any(first - TOLERANCE <= b and last + TOLERANCE >= a for a, b in near)
    )
    for start, end in scene_spans(found, truth.num_frames, SplitRules(), fps):
        into.clips += 1
        spans_cut = any(start < c < end for c in cuts)
        overlap = max((min(end, b + 1) - max(start, a) for a, b in fades), default=0)
        into.clips_into += spans_cut or overlap > 1


def main(argv: list[str] | None = None) -> dict[str, Score]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--videos", type=int, default=8, help="benchmark timelines (default 8)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of each (default 60)")
    p.add_argument("--dissolves", type=int, default=len(DISSOLVES), help="hard-dissolve videos")
    p.add_argument("--shot-s", type=float, default=7.0, help="shots of those (default 7)")
    p.add_argument("--quick", action="store_true", help="2 videos of 20 s, 2 dissolve videos")
    args = p.parse_args(argv)
    if args.quick:
        args.videos, args.seconds, args.dissolves = 2, 20.0, 2
    print(machine_line(1))
    contenders = {
        "single-frame head": TransNetV2Detector(gradual_threshold=None),
        "both heads (default)": TransNetV2Detector(),
    }
    for detector in contenders.values():
        detector.setup(WorkerInfo("bench", "TransNetV2Detector", "local"))
    scores = {name: Score() for name in contenders}
    with tempfile.TemporaryDirectory(prefix="cvy-shots-") as tmp:
        inputs = make_inputs(Path(tmp), args.videos, args.seconds, args.dissolves, args.shot_s)
        for truth in inputs:
            for name, detector in contenders.items():
                found, spent = detect(truth, detector)
                scores[name].detector_s += spent
                score(truth, found, scores[name])
    rows = [
        [
            name,
            f"{s.cuts_found} of {s.cuts}",
            f"{s.dissolves_found} of {s.dissolves}",
            str(s.spurious),
            f"{s.clips_into} of {s.clips}",
            f"{s.detector_s:.1f}",
        ]
        for name, s in scores.items()
    ]
    print(
        table(
            f"shot detection on {len(inputs)} generated videos (TransNetV2, 5 s windows)",
            ["detector", "hard cuts found", "dissolves found", "spurious", "clips into a "
             "transition", "detector s"],
            rows,
        )
    )  # fmt: skip
    base, ours = scores.values()
    if base.clips_into:
        ratio = ours.clips_into / base.clips_into
        print(f"clips into a transition, both heads / single head: {ratio:.2f}")
    for name, s in scores.items():
        if s.misses:
            print(f"{name} missed ({len(s.misses)}): " + "; ".join(s.misses))
    return scores


if __name__ == "__main__":
    main()
