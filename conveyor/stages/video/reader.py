"""Finding the videos (a directory, a file or a list of paths, local or URLs) and probing each
one.

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
from conveyor.stages.video.layout import OutputLayout, same_source
from conveyor.storage import ObjectPath, is_url, location, mtime, printable
from conveyor.tasks.base import Task
from conveyor.tasks.video import Video, VideoTask, video_id

log = logging.getLogger(__name__)

#: what a folder run takes (any case): the common containers, and what cameras, phones, TV
#: recordings, DVDs and older web video leave (AVCHD's .mts/.m2ts, DV, .m4v, .ts, .mpg and a
#: DVD's .vob, .flv/.f4v, .wmv/.asf, .3gp/.3g2, .mxf, Ogg's .ogv); probing decides whether a
#: file really is a video
VIDEO_EXTENSIONS: tuple[str, ...] = (
    ".mp4",
    ".mov",
    ".mkv",
    ".webm",
    ".avi",
    ".m4v",
    ".mts",
    ".m2ts",
    ".ts",
    ".mpg",
    ".mpeg",
    ".flv",
    ".wmv",
    ".3gp",
    ".mxf",
    ".vob",
    ".ogv",
    ".dv",
    ".f4v",
    ".asf",
    ".3g2",
)

#: a file or directory, or a list of them: local paths or URLs (``s3://bucket/videos``)
InputSpec = str | os.PathLike[str] | ObjectPath | Sequence[str | os.PathLike[str] | ObjectPath]


@dataclass(frozen=True)
class VideoSource:
    """One input file: where it is, its path relative to the input root, and its stamp."""

    path: str
    relative_path: str
    size: int
    mtime: float

    @property
    def key(self) -> tuple[str, int, str]:
        """What a journal knows it by: a changed file (size, time) is another source."""
        return (self.relative_path, self.size, repr(self.mtime))


def input_root(inputs: InputSpec) -> Path | ObjectPath:
    """The directory relative paths are taken from: the input directory, a file's parent,
    or the deepest directory common to every path of a list."""
    paths = _as_list(inputs)
    if not paths:
        raise ValueError("no input paths given")
    roots = [p if p.is_dir() else p.parent for p in paths]
    if len(roots) == 1:
        return roots[0]
    if isinstance(roots[0], ObjectPath):
        return _common_url([str(r) for r in roots])
    return Path(os.path.commonpath([str(r) for r in roots]))


def _common_url(urls: list[str]) -> ObjectPath:
    """The deepest prefix common to URLs of one store."""
    schemes = {u.split("://", 1)[0] for u in urls}
    rests = [u.split("://", 1)[1] for u in urls]
    common = os.path.commonpath(rests) if len(schemes) == 1 else ""
    if not common:
        raise ValueError(f"input URLs share no bucket or store: {', '.join(urls)}")
    return ObjectPath(f"{schemes.pop()}://{common}")


def _as_list(inputs: InputSpec) -> list[Path] | list[ObjectPath]:
    items = [inputs] if isinstance(inputs, (str, os.PathLike, ObjectPath)) else list(inputs)
    urls = [is_url(p) for p in items]
    if any(urls):
        if not all(urls):
            raise ValueError("inputs mix local paths and URLs: give one kind")
        return [ObjectPath(str(p)) for p in items]
    local = [location(p) for p in items]
    return [p.expanduser().absolute() for p in local if isinstance(p, Path)]


def check_inputs(inputs: InputSpec) -> None:
    """Raise ``FileNotFoundError`` naming the first input path that does not exist."""
    for path in _as_list(inputs):
        if isinstance(path, ObjectPath):
            try:
                path.info()
            except FileNotFoundError as exc:  # names the URL, or its missing bucket
                raise FileNotFoundError(f"input {exc}") from None
        elif not path.exists():
            raise FileNotFoundError(f"input {str(path)!r} does not exist")


def list_videos(
    inputs: InputSpec,
    *,
    extensions: Sequence[str] = VIDEO_EXTENSIONS,
    exclude: Sequence[str | os.PathLike[str] | ObjectPath] = (),
    limit: int | None = None,
) -> list[VideoSource]:
    """Every video under ``inputs`` (paths or URLs), sorted by relative path, at most ``limit``
    of them.

    Directories are searched recursively for ``extensions`` (any case), skipping hidden
    files and directories and the ``exclude`` directories (the output, when it lies inside
    the input). Linked folders are followed (datasets are often assembled from links to
    other disks), each real folder once, so a link back up the tree is no loop. A file named
    explicitly is taken whatever its extension: probing decides. A name that is not valid
    UTF-8 is read from where it is but known by its ``printable`` form (ids, records).
    """
    check_inputs(inputs)
    root = input_root(inputs)
    if isinstance(root, ObjectPath):
        return _list_objects(inputs, root, extensions, exclude, limit)
    wanted = tuple(e.lower() for e in extensions)
    skip = {os.path.realpath(Path(e).expanduser()) for e in exclude if not is_url(e)}
    found: dict[str, Path] = {}
    seen: set[str] = set()
    for path in _as_list(inputs):
        assert isinstance(path, Path)
        if path.is_dir():
            for folder, dirs, files in os.walk(path, followlinks=True):
                here = Path(folder)
                real = os.path.realpath(folder)
                if real in seen or real in skip:
                    dirs[:] = []
                    continue
                seen.add(real)
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in files:
                    if not name.startswith(".") and name.lower().endswith(wanted):
                        full = here / name
                        found.setdefault(printable(str(full.relative_to(root))), full)
        else:
            found.setdefault(printable(str(path.relative_to(root))), path)
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


def _list_objects(
    inputs: InputSpec,
    root: ObjectPath,
    extensions: Sequence[str],
    exclude: Sequence[str | os.PathLike[str] | ObjectPath],
    limit: int | None,
) -> list[VideoSource]:
    """``list_videos`` under URLs: one listing per input prefix, with each object's size and
    modification time from the listing itself (no request per video)."""
    wanted = tuple(e.lower() for e in extensions)
    skip = [f"{ObjectPath(str(e))}/" for e in exclude if is_url(e)]
    found: dict[str, VideoSource] = {}
    for path in _as_list(inputs):
        assert isinstance(path, ObjectPath)
        entries = path.find()
        if not entries:  # a file (a prefix with nothing under it was refused by check_inputs)
            info = path.info()
            relative = str(path)[len(str(root)) + 1 :]
            found.setdefault(relative, VideoSource(str(path), relative, info["size"], mtime(info)))
            continue
        for entry in entries:
            full = str(entry.path)
            parts = entry.relative.split("/")
            if any(p.startswith(".") for p in parts) or not parts[-1].lower().endswith(wanted):
                continue
            if any(full.startswith(prefix) for prefix in skip):
                continue
            relative = full[len(str(root)) + 1 :]
            found.setdefault(relative, VideoSource(full, relative, entry.size, entry.mtime))
    sources = [found[relative] for relative in sorted(found)]
    return sources[:limit] if limit is not None else sources


def pending_videos(
    sources: Sequence[VideoSource], output: str | os.PathLike[str] | ObjectPath | None
) -> list[VideoSource]:
    """The sources an earlier run into ``output`` did not finish (all without an output)."""
    if output is None:
        return list(sources)
    records = OutputLayout(output).read_records([s.relative_path for s in sources])
    return [s for s in sources if not same_source(records[s.relative_path], s.size, s.mtime)]


class VideoListing(ProcessingStage[Task[Any] | VideoSource, VideoTask]):
    """The run's seed task -> one ``VideoTask`` per video still to do (a single worker).

    With ``output`` set it resumes: videos whose outputs are complete (from the same file:
    same size and modification time) are skipped, and what an unfinished one left behind
    is removed before it is done again, so every clip ends up written exactly once. Given
    ``VideoSource`` tasks instead (a run with a journal lists in the driver), it makes one
    ``VideoTask`` of each, cleaning up after an earlier attempt the same way.
    """

    resources = Resources(cpus=0.25)
    num_workers = 1

    def __init__(
        self,
        inputs: InputSpec,
        output: str | os.PathLike[str] | ObjectPath | None = None,
        *,
        extensions: Sequence[str] = VIDEO_EXTENSIONS,
        limit: int | None = None,
    ) -> None:
        check_inputs(inputs)
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.sources = (
            inputs if isinstance(inputs, (str, os.PathLike, ObjectPath)) else list(inputs)
        )
        self.output = output
        self.extensions = tuple(extensions)
        self.limit = limit

    def excluded(self) -> list[Path | ObjectPath]:
        if self.output is None:
            return []
        output = location(self.output)
        return [output.expanduser().absolute() if isinstance(output, Path) else output]

    def process(self, task: Task[Any] | VideoSource) -> list[VideoTask]:
        if isinstance(task, VideoSource):
            if self.output is not None:
                OutputLayout(self.output).reset(task.relative_path)
            return [_video_task(task, "")]
        sources = list_videos(
            self.sources, extensions=self.extensions, exclude=self.excluded(), limit=self.limit
        )
        todo = pending_videos(sources, self.output)
        if self.output is not None:
            layout = OutputLayout(self.output)
            layout.sweep_tmp()
            # on a store a request per video adds up: reset only the videos something was
            # written for (one listing of the records and the staging says which)
            started = layout.started_videos() if is_url(self.output) else None
            for source in todo:
                if started is None or video_id(source.relative_path) in started:
                    layout.reset(source.relative_path)
        log.info("%d videos found, %d to do", len(sources), len(todo))
        dataset = task.dataset_name if isinstance(task, Task) else ""
        return [_video_task(s, dataset) for s in todo]


def _video_task(source: VideoSource, dataset: str) -> VideoTask:
    video = Video(
        path=source.path,
        relative_path=source.relative_path,
        source_size=source.size,
        source_mtime=source.mtime,
    )
    return VideoTask(data=video, dataset_name=dataset)


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
        output: str | os.PathLike[str] | ObjectPath | None = None,
        *,
        extensions: Sequence[str] = VIDEO_EXTENSIONS,
        limit: int | None = None,
        verify: bool = True,
    ) -> None:
        self.listing = VideoListing(inputs, output, extensions=extensions, limit=limit)
        self.probe = VideoProbe(verify=verify)

    def decompose(self) -> list[ProcessingStage[Any, Any]]:
        return [self.listing, self.probe]
