"""A video pipeline in NeMo Curator's style: a reader and a motion filter written against
NeMo Curator's video model (``task.data.clips``, ``clip.buffer``,
``video.filtered_clips``), between Conveyor's own probe, splitter, transcoder and writer,
used as they are. Where the two meet, the adapter converts one video model to the other.

``python examples/curator/video_pipeline.py WORKDIR`` writes two short sample videos under
``WORKDIR/input`` and 1 s clips (H.264, with motion scores) under ``WORKDIR/output``; the
clips of the slower half of each video are filtered.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conveyor.curator.backends.xenna import XennaExecutor
from conveyor.curator.pipeline import Pipeline
from conveyor.curator.stages.base import ProcessingStage
from conveyor.curator.stages.resources import Resources
from conveyor.curator.tasks import EmptyTask
from conveyor.curator.tasks.video import Video, VideoTask
from conveyor.stages.video import ClipTranscoder, ClipWriter, FixedStrideSplitter, VideoProbe

VIDEO_EXTENSIONS = (".mp4", ".mov", ".mkv", ".webm", ".avi")


class VideoListStage(ProcessingStage[EmptyTask, VideoTask]):
    """One ``VideoTask`` per video file under ``path``."""

    name = "video_list"
    resources = Resources(cpus=0.25)

    def __init__(self, path: str) -> None:
        self.path = path

    def num_workers(self) -> int:
        return 1

    def process(self, task: EmptyTask) -> list[VideoTask]:
        files = sorted(p for p in Path(self.path).rglob("*") if p.suffix in VIDEO_EXTENSIONS)
        return [VideoTask(dataset_name="videos", data=Video(input_video=p)) for p in files]


class MotionThresholdFilter(ProcessingStage[VideoTask, VideoTask]):
    """Moves clips whose mean motion is under ``threshold`` to ``filtered_clips``."""

    name = "motion_threshold"
    resources = Resources(cpus=0.25)

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def process(self, task: VideoTask) -> VideoTask:
        video = task.data
        passed = []
        for clip in video.clips:
            score = clip.motion_score_global_mean
            if clip.buffer is None or score is None or score < self.threshold:
                video.filtered_clips.append(clip)
                video.clip_stats.num_filtered_by_motion += 1
            else:
                passed.append(clip)
        video.clips = passed
        return task


def build(workdir: Path, threshold: float = 0.02) -> Pipeline:
    return Pipeline(
        "video-curation",
        "probe, 1 s clips, x264 with motion scores, still clips filtered",
        [
            VideoListStage(str(workdir / "input")),
            VideoProbe(),  # Conveyor's own stages, as they are
            FixedStrideSplitter(clip_len_s=1.0, min_clip_s=0.5),
            ClipTranscoder(preset="ultrafast", motion_patch=256),
            MotionThresholdFilter(threshold),
            ClipWriter(str(workdir / "output")),
        ],
    )


def write_inputs(folder: Path) -> Path:
    from conveyor.samples.video import Segment, write_video

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        write_video(
            folder / f"v{i}.mp4",
            [Segment("gradient", 1.0, seed=i), Segment("fast", 1.0, seed=i)],
            width=96,
            height=64,
            fps=12,
        )
    return folder


def main(workdir: Path, executor: Any = None, threshold: float = 0.02) -> list[Any]:
    write_inputs(workdir / "input")
    return build(workdir, threshold).run(executor or XennaExecutor())


if __name__ == "__main__":
    done = main(Path(sys.argv[1] if len(sys.argv) > 1 else "curator-video"))
    kept = sum(c.kept for t in done for c in t.data.clips)
    print(f"{len(done)} chunks, {kept} clips kept", file=sys.stderr)
