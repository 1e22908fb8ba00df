"""A video pipeline in NeMo Curator's style: Curator-style stages that wrap Conveyor's own
video stages, next to Conveyor's writer used as it is.

``python examples/curator/video_pipeline.py WORKDIR`` writes two short sample videos under
``WORKDIR/input`` and 1 s clips (H.264, with motion scores) under ``WORKDIR/output``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conveyor.curator.backends.xenna import XennaExecutor
from conveyor.curator.pipeline import Pipeline
from conveyor.curator.stages.base import ProcessingStage
from conveyor.curator.stages.resources import Resources
from conveyor.curator.tasks import EmptyTask, VideoTask
from conveyor.stages.video import ClipTranscoder, ClipWriter, FixedStrideSplitter, VideoProbe
from conveyor.stages.video.reader import list_videos
from conveyor.tasks.video import Video


class VideoListStage(ProcessingStage[EmptyTask, VideoTask]):
    """One ``VideoTask`` per video file under ``path``."""

    name = "video_list"
    resources = Resources(cpus=0.25)

    def __init__(self, path: str) -> None:
        self.path = path

    def num_workers(self) -> int:
        return 1

    def process(self, task: EmptyTask) -> list[VideoTask]:
        return [
            VideoTask(
                f"video-{i}",
                "videos",
                Video(
                    source.path,
                    source.relative_path,
                    source_size=source.size,
                    source_mtime=source.mtime,
                ),
            )
            for i, source in enumerate(list_videos(self.path))
        ]


class Wrapped(ProcessingStage[VideoTask, VideoTask]):
    """A Conveyor stage run from a Curator-style one: its ``setup`` gets Conveyor's worker
    description (``worker_metadata.allocation``)."""

    def __init__(self, name: str, inner: Any, cpus: float = 1.0) -> None:
        self.name = name
        self.inner = inner
        self.resources = Resources(cpus=cpus)

    def setup(self, worker_metadata: Any = None) -> None:
        self.inner.setup(worker_metadata.allocation)

    def teardown(self) -> None:
        self.inner.teardown()

    def process(self, task: VideoTask) -> Any:
        self.inner._threads = self._threads
        result = self.inner.process(task)
        return list(result) if result is not None and not isinstance(result, VideoTask) else result


def build(workdir: Path) -> Pipeline:
    return Pipeline(
        "video-curation",
        "probe, 1 s clips, x264 with motion scores",
        [
            VideoListStage(str(workdir / "input")),
            Wrapped("probe", VideoProbe(), cpus=0.25),
            Wrapped("split", FixedStrideSplitter(clip_len_s=1.0, min_clip_s=0.5), cpus=0.25),
            Wrapped("transcode", ClipTranscoder(preset="ultrafast", motion_patch=256)),
            ClipWriter(str(workdir / "output")),  # Conveyor's own stage, as it is
        ],
    )


def write_inputs(folder: Path) -> Path:
    from conveyor.samples.video import Segment, write_video

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        write_video(
            folder / f"v{i}.mp4",
            [Segment("shapes", 1.0, seed=i), Segment("pan", 1.0, seed=i)],
            width=96,
            height=64,
            fps=12,
        )
    return folder


def main(workdir: Path, executor: Any = None) -> list[VideoTask]:
    write_inputs(workdir / "input")
    return build(workdir).run(executor or XennaExecutor())


if __name__ == "__main__":
    done = main(Path(sys.argv[1] if len(sys.argv) > 1 else "curator-video"))
    clips = sum(len(t.data.clips) for t in done)
    print(f"{len(done)} chunks, {clips} clips", file=sys.stderr)
