"""Finding the videos (a directory, a file or a list of paths) and probing each one.

``VideoReader`` is a composite: ``VideoListing`` (one worker) turns the run's seed task into
one ``VideoTask`` per video to do, skipping videos an earlier run into the same output
finished, and ``VideoProbe`` fills each one's metadata. A file that is empty, truncated, not a
video, has no video stream or cannot be decoded fails there, with the reason, and goes on to
the writer as a failed video; every other video goes on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.resources import Resources
from conveyor.stage import CompositeStage, ProcessingStage
from conveyor.stages.video.base import VideoStage
from conveyor.stages.video.decode import probe
from conveyor.stages.video.layout import OutputLayout
from conveyor.tasks.base import Task
from conveyor.tasks.video import Video, VideoTask

log = logging.getLogger(__name__)

VIDEO_EXTENSIONS: tuple[str, ...] = (".mp4", ".mov", ".mkv", ".webm", ".avi")

InputSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclass(frozen=True)
class VideoSource:
    """One input file: where it is, its path relative to the input root, and its stamp."""

    path: str
    relative_path: str
    size: int
    mtime: float


def input_root(inputs: InputSpec) -> Path:
    """The directory relative paths are taken from: the input directory, a file's parent,
    or the deepest directory common to every path of a list."""
    paths = _as_list(inputs)
    if not paths:
        raise ValueError("no input paths given")
    roots = [p if p.is_dir() else p.parent for p in paths]
    if len(roots) == 1:
        return roots[0]
    return Path(os.path.commonpath([str(r) for r in roots]))


def _as_list(inputs: InputSpec) -> list[Path]:
    if isinstance(inputs, (str, os.PathLike)):
        return [Path(inputs).expanduser().absolute()]
    return [Path(p).expanduser().absolute() for p in inputs]


def check_inputs(inputs: InputSpec) -> None:
    """Raise ``FileNotFoundError`` naming the first input path that does not exist."""
    for path in _as_list(inputs):
        if not path.exists():
            raise FileNotFoundError(f"input {str(path)!r} does not exist")


def list_videos(
    inputs: InputSpec,
    *,
    extensions: Sequence[str] = VIDEO_EXTENSIONS,
    exclude: Sequence[str | os.PathLike[str]] = (),
    limit: int | None = None,
) -> list[VideoSource]:
    """Every video under ``inputs``, sorted by relative path, at most ``limit`` of them.

    Directories are searched recursively for ``extensions`` (any case), skipping hidden
    files and directories and the ``exclude`` directories (the output, when it lies inside
    the input). A file named explicitly is taken whatever its extension: probing decides.
    """
    check_inputs(inputs)
    root = input_root(inputs)
    wanted = tuple(e.lower() for e in extensions)
    skip = {Path(e).expanduser().absolute() for e in exclude}
    found: dict[str, Path] = {}
    for path in _as_list(inputs):
        if path.is_dir():
            for folder, dirs, files in os.walk(path):
                here = Path(folder)
                dirs[:] = sorted(
                    d for d in dirs if not d.startswith(".") and (here / d) not in skip
                )
                for name in files:
                    if not name.startswith(".") and name.lower().endswith(wanted):
                        full = here / name
                        found.setdefault(str(full.relative_to(root)), full)
        else:
            found.setdefault(str(path.relative_to(root)), path)
    sources = []
    for relative in sorted(found):
        full = found[relative]
        try:
            stat = full.stat()
        except OSError:
            stat = None  # vanished or unreadable: probing says why
        sources.append(
            VideoSource(
                str(full), relative, stat.st_size if stat else 0, stat.st_mtime if stat else 0.0
            )
        )
        if limit is not None and len(sources) >= limit:
            break
    return sources


def pending_videos(
    sources: Sequence[VideoSource], output: str | os.PathLike[str] | None
) -> list[VideoSource]:
    """The sources an earlier run into ``output`` did not finish (all without an output)."""
    if output is None:
        return list(sources)
    layout = OutputLayout(output)
    return [s for s in sources if not layout.is_complete(s.relative_path, s.size, s.mtime)]


class VideoListing(ProcessingStage[Task[Any], VideoTask]):
    """The run's seed task -> one ``VideoTask`` per video still to do (a single worker).

    With ``output`` set it resumes: videos whose outputs are complete (from the same file:
    same size and modification time) are skipped, and what an unfinished one left behind
    is removed before it is done again, so every clip ends up written exactly once.
    """

    resources = Resources(cpus=0.25)
    num_workers = 1

    def __init__(
        self,
        inputs: InputSpec,
        output: str | os.PathLike[str] | None = None,
        *,
        extensions: Sequence[str] = VIDEO_EXTENSIONS,
        limit: int | None = None,
    ) -> None:
        check_inputs(inputs)
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.sources = inputs if isinstance(inputs, (str, os.PathLike)) else list(inputs)
        self.output = output
        self.extensions = tuple(extensions)
        self.limit = limit

    def excluded(self) -> list[Path]:
        return [Path(self.output).expanduser().absolute()] if self.output is not None else []

    def process(self, task: Task[Any]) -> list[VideoTask]:
        sources = list_videos(
            self.sources, extensions=self.extensions, exclude=self.excluded(), limit=self.limit
        )
        todo = pending_videos(sources, self.output)
        if self.output is not None:
            layout = OutputLayout(self.output)
            layout.sweep_tmp()
            for source in todo:
                layout.reset(source.relative_path)
        log.info("%d videos found, %d to do", len(sources), len(todo))
        return [
            VideoTask(
                data=Video(
                    path=s.path,
                    relative_path=s.relative_path,
                    source_size=s.size,
                    source_mtime=s.mtime,
                ),
                dataset_name=task.dataset_name if isinstance(task, Task) else "",
            )
            for s in todo
        ]


class VideoProbe(VideoStage):
    """Fills each video's metadata with PyAV; a bad file fails with the reason.

    ``verify`` also decodes a first frame and the last seconds, so a file that cannot be
    decoded or was cut short fails here, before any work is spent on it.
    """

    resources = Resources(cpus=0.25)

    def __init__(self, verify: bool = True) -> None:
        self.verify = verify

    def process_video(self, video: Video) -> None:
        video.metadata = probe(video.path, verify=self.verify)
        return None

    def on_input_error(self, video: Video, exc: BaseException) -> None:
        super().on_input_error(video, exc)
        video.last_chunk = True  # a video that fails here is one (empty) chunk


class VideoReader(CompositeStage[Task[Any], VideoTask]):
    """List the videos of ``inputs`` (resuming into ``output`` when given) and probe them."""

    def __init__(
        self,
        inputs: InputSpec,
        output: str | os.PathLike[str] | None = None,
        *,
        extensions: Sequence[str] = VIDEO_EXTENSIONS,
        limit: int | None = None,
        verify: bool = True,
    ) -> None:
        self.listing = VideoListing(inputs, output, extensions=extensions, limit=limit)
        self.probe = VideoProbe(verify=verify)

    def decompose(self) -> list[ProcessingStage[Any, Any]]:
        return [self.listing, self.probe]
