"""Finding the videos (a directory, a file or a list of paths, local or URLs) and probing each
one.

``VideoReader`` is a composite: ``VideoListing`` (one worker) turns the run's seed task into
one ``VideoTask`` per video to do, skipping videos an earlier run into the same output
finished (or, as ``run_video`` runs it, each source the driver lists as the run goes,
``VideoSources``), and ``VideoProbe`` fills each one's metadata. A file that is empty,
truncated, not a video, has no video stream or cannot be decoded fails there, with the
reason, and goes on to the writer as a failed video; every other video goes on.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from conveyor.media.decode import probe
from conveyor.media.layout import INTERNAL, GroupCount, OutputLayout, same_source
from conveyor.media.limits import MAX_VIDEO_PIXELS
from conveyor.resources import Resources
from conveyor.stage import CompositeStage, ProcessingStage
from conveyor.stages.video.base import VideoStage
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


@dataclass(frozen=True, slots=True)
class VideoSource:
    """One input file: where it is, its path relative to the input root, and its stamp.

    ``reset``: an earlier run may have left files of this video in the output (an outdated
    record, or staging), which the listing stage removes before the video is done again.
    """

    path: str
    relative_path: str
    size: int
    mtime: float
    reset: bool = True

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
    of them: ``iter_videos`` as a list."""
    return list(iter_videos(inputs, extensions=extensions, exclude=exclude, limit=limit))


def iter_videos(
    inputs: InputSpec,
    *,
    extensions: Sequence[str] = VIDEO_EXTENSIONS,
    exclude: Sequence[str | os.PathLike[str] | ObjectPath] = (),
    limit: int | None = None,
) -> Iterator[VideoSource]:
    """Every video under ``inputs`` (paths or URLs) in relative path order, found as it is
    consumed, at most ``limit`` of them; a missing input is a ``FileNotFoundError`` now.

    A folder is read one directory at a time, each sorted with a subfolder's name taken as
    ``name/``, which gives the order of the whole relative paths without listing them all
    first; a prefix on S3 streams page by page (``ObjectPath.iter_find``). Directories are
    searched recursively for ``extensions`` (any case), skipping hidden files and
    directories and the ``exclude`` directories (the output, when it lies inside the input).
    Linked folders are followed (datasets are often assembled from links to other disks),
    each real folder once, so a link back up the tree is no loop, and a subfolder holding a
    Conveyor output (its ``.conveyor`` folder) is skipped; a linked file is taken once
    per real file, and not at all where the file it names is listed itself (a link inside
    the input to a video of the input: its clips were made twice). A file named explicitly is
    taken whatever its extension: probing decides. A name that is not valid UTF-8 is read
    from where it is but known by its ``printable`` form (ids, records).
    """
    check_inputs(inputs)
    root = input_root(inputs)
    wanted = tuple(e.lower() for e in extensions)
    streams: list[Iterator[VideoSource]]
    if isinstance(root, ObjectPath):
        skip_prefixes = [f"{ObjectPath(str(e))}/" for e in exclude if is_url(e)]
        streams = [
            _object_videos(path, root, wanted, skip_prefixes)
            for path in _as_list(inputs)
            if isinstance(path, ObjectPath)
        ]
    else:
        local = [path for path in _as_list(inputs) if isinstance(path, Path)]
        walk = _Walk(
            wanted,
            skip={os.path.realpath(Path(e).expanduser()) for e in exclude if not is_url(e)},
            roots=[os.path.realpath(p) for p in local if p.is_dir()],
        )
        streams = [_local_videos(path, root, walk) for path in local]
    merged = streams[0] if len(streams) == 1 else _merged(streams)
    return itertools.islice(merged, limit)


def _merged(streams: list[Iterator[VideoSource]]) -> Iterator[VideoSource]:
    """Sorted streams as one, each relative path once (inputs may overlap)."""
    last = None
    for source in heapq.merge(*streams, key=lambda s: s.relative_path):
        if source.relative_path != last:
            last = source.relative_path
            yield source


#: the folder an output of Conveyor's keeps its state in: a folder of the input holding
#: one is an earlier run's output, not input (``_walk``)
OUTPUT_MARK = INTERNAL


@dataclass
class _Walk:
    """What the walks of one listing share: the extensions wanted, the folders to leave out,
    the real input folders, and the real folders and linked files taken so far."""

    wanted: tuple[str, ...]
    skip: set[str]
    roots: list[str]
    seen: set[str] = field(default_factory=set)
    linked: set[str] = field(default_factory=set)

    def takes_link(self, path: str) -> bool:
        """Whether the linked file ``path`` is listed: not where its real file is a video of
        an input folder (listed itself), else once per real file. A link to nothing (or a
        loop of links) is listed, for its failure to say so: it vanished without a word."""
        if not os.path.exists(path):
            return True
        real = os.path.realpath(path)
        for root in self.roots:
            inside = os.path.relpath(real, root)
            parts = inside.split(os.sep)
            if (
                not inside.startswith("..")
                and not any(p.startswith(".") for p in parts)
                and real.lower().endswith(self.wanted)
                and not any(real.startswith(s + os.sep) for s in self.skip)
            ):
                return False
        if real in self.linked:
            return False
        self.linked.add(real)
        return True


def _local_videos(path: Path, root: Path, walk: _Walk) -> Iterator[VideoSource]:
    relative = printable(str(path.relative_to(root)))
    if not path.is_dir():
        yield _local_source(str(path), relative)
        return
    yield from _walk(str(path), "" if relative == "." else f"{relative}/", walk)


def _walk(folder: str, prefix: str, walk: _Walk) -> Iterator[VideoSource]:
    """The videos under ``folder`` in relative path order; a subfolder's entries are listed
    only when the walk reaches it."""
    real = os.path.realpath(folder)
    if real in walk.seen or real in walk.skip:
        return
    walk.seen.add(real)
    wanted = walk.wanted
    names = []  # a subfolder's name ends with "/", so sorting puts it where its files go
    links: set[str] = set()  # decided in walk order, so the same link wins in every run
    output = False  # the folder holds a Conveyor output (its ``.conveyor`` folder)
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    output = output or name == OUTPUT_MARK
                    continue
                try:
                    is_dir = entry.is_dir()  # through links
                except OSError:
                    is_dir = False
                if is_dir:
                    names.append(name + "/")
                elif name.lower().endswith(wanted):
                    names.append(name)
                    if entry.is_symlink():
                        links.add(name)
    except OSError as exc:  # skipped, as os.walk does, but said: it vanished without a word
        log.warning("%s is skipped: it cannot be read (%s)", folder, exc.strerror or exc)
        return
    if output and real not in walk.roots:
        # an earlier run's output inside the input: its clips (or images) were curated
        # again as input by the next run into another output
        log.warning("%s is skipped: it holds a Conveyor output (%s/)", folder, OUTPUT_MARK)
        return
    if output:
        names = _beside_output(folder, names)
    names.sort(key=printable)
    for name in names:
        if name.endswith("/"):
            yield from _walk(os.path.join(folder, name[:-1]), prefix + printable(name), walk)
        elif name not in links or walk.takes_link(os.path.join(folder, name)):
            yield _local_source(os.path.join(folder, name), prefix + printable(name))


def _beside_output(folder: str, names: list[str]) -> list[str]:
    """An input folder that is an output holding the run's own sources too (``conveyor
    video a.mp4 .``) is read without the folders its run wrote: its clips were the videos'
    second copy. An output alone is read whole: its clips curated again, as asked."""
    from conveyor.pipelines.owner import output_kind, owned_names

    owned = set(owned_names(output_kind(folder) or "video"))
    own = [name for name in names if name.rstrip("/") in owned]
    if not own or len(own) == len(names):
        return names
    own.sort()
    clips = "clips/" if "clips/" in own else own[0]
    log.warning(
        "%s is read without the folders of the Conveyor output written there (%s): give "
        "%s as INPUT to curate what it holds",
        folder,
        ", ".join(own),
        os.path.join(folder, clips),
    )
    return [name for name in names if name not in own]


def _local_source(path: str, relative: str) -> VideoSource:
    try:
        stat = os.stat(path)
    except OSError:
        return VideoSource(path, relative, 0, 0.0)  # vanished or unreadable: probing says why
    return VideoSource(path, relative, stat.st_size, stat.st_mtime)


def _object_videos(
    path: ObjectPath, root: ObjectPath, wanted: tuple[str, ...], skip_prefixes: list[str]
) -> Iterator[VideoSource]:
    """The videos under one input URL, with each object's size and modification time from
    the listing itself (no request per video)."""
    base = len(str(root)) + 1
    listed = False
    for entry in path.iter_find():
        listed = True
        full = str(entry.path)
        parts = entry.relative.split("/")
        if any(p.startswith(".") for p in parts) or not parts[-1].lower().endswith(wanted):
            continue
        if any(full.startswith(prefix) for prefix in skip_prefixes):
            continue
        yield VideoSource(full, full[base:], entry.size, entry.mtime)
    if not listed:  # a file (a prefix with nothing under it was refused by check_inputs)
        info = path.info()
        yield VideoSource(str(path), str(path)[base:], info["size"], mtime(info))


def pending_videos(
    sources: Sequence[VideoSource], output: str | os.PathLike[str] | ObjectPath | None
) -> list[VideoSource]:
    """The sources an earlier run into ``output`` did not finish (all without an output);
    the shared tables' rows of videos whose records were deleted are dropped."""
    if output is None:
        return list(sources)
    # checked as a run's listing is: a kept clip deleted by hand was counted as there
    return list(VideoSources((), output, batch=max(1, len(sources)), listed=sources))


#: sources listed before their records are read together (on a store: concurrently); the
#: first video waits for this many to be listed, which on a disk takes a millisecond
RESUME_BATCH = 64


class VideoSources:
    """The videos of ``inputs`` still to do in ``output``, listed as the run consumes them.

    Iterating lists the inputs (``iter_videos``) and checks each batch of ``RESUME_BATCH``
    sources against the output's records, yielding only those an earlier run did not
    finish, each marked whether it needs ``reset``. So a run starts on its first videos
    while a folder or bucket of millions is still being listed, and holds only what the
    engine has admitted and the batch being checked. ``found``, ``complete`` and ``pending``
    count as it goes; ``on_complete(source, record)`` is told of each video complete before
    the run, with the record just read (a summary folds it in instead of reading it again),
    and ``on_pending(source)`` of each video still to do, as it is handed on. Sources
    ``listed`` already (``pending_videos``) are checked instead of listing ``inputs``.
    """

    def __init__(
        self,
        inputs: InputSpec,
        output: str | os.PathLike[str] | ObjectPath | None,
        *,
        extensions: Sequence[str] = VIDEO_EXTENSIONS,
        limit: int | None = None,
        batch: int = RESUME_BATCH,
        on_complete: Callable[[VideoSource, dict[str, Any]], None] | None = None,
        on_pending: Callable[[VideoSource], None] | None = None,
        listed: Sequence[VideoSource] | None = None,
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        exclude = [] if output is None else [output]
        self._listing = (
            iter(listed)
            if listed is not None
            else iter_videos(inputs, extensions=extensions, exclude=exclude, limit=limit)
        )
        self.output = output
        self.batch = max(1, batch)
        self.on_complete = on_complete
        self.on_pending = on_pending
        self.found = self.complete = self.pending = 0
        self.exhausted = False
        self._peeked: list[VideoSource] = []
        self._staged: set[str] | None = None
        self._stream: Iterator[VideoSource] | None = None
        self._groups = GroupCount()

    def empty(self) -> bool:
        """Whether the inputs hold no video at all (lists up to the first one)."""
        if not self._peeked and not self.exhausted and self._stream is None:
            first = next(self._listing, None)
            if first is None:
                self.exhausted = True
            else:
                self._peeked.append(first)
        return not self._peeked and self.exhausted

    def __iter__(self) -> Iterator[VideoSource]:
        if self._stream is not None:
            raise RuntimeError("VideoSources is iterated once (it lists as it goes)")
        self._stream = self._batches(itertools.chain(self._peeked, self._listing))
        self._peeked = []
        return self._stream

    def drain(self) -> None:
        """List, check and count what the run did not take (a run stopped early), so that
        the counts cover every video."""
        for _ in self._stream if self._stream is not None else self:
            pass

    def _batches(self, listing: Iterator[VideoSource]) -> Iterator[VideoSource]:
        while batch := list(itertools.islice(listing, self.batch)):
            yield from self._check(batch)
        self.exhausted = True
        if self.output is not None:
            _drop_stale_rows(OutputLayout(self.output), self._groups)

    def _check(self, batch: list[VideoSource]) -> Iterator[VideoSource]:
        """The sources of ``batch`` an earlier run did not finish, in order."""
        self.found += len(batch)
        layout: OutputLayout | None = None
        if self.output is None:
            records: dict[str, dict[str, Any] | None] = {}
        else:
            layout = OutputLayout(self.output)
            records = layout.read_records([s.relative_path for s in batch])
            if self._staged is None:
                self._staged = _staged_videos(layout)
        for source in batch:
            record = records.get(source.relative_path)
            vid = video_id(source.relative_path)
            staged = bool(self._staged) and vid in self._staged
            if (
                record is not None
                and same_source(record, source.size, source.mtime)
                # (a kept clip deleted by hand: the video is done again)
                and not (layout is not None and layout.kept_clips_missing(record))
            ):
                if staged and layout is not None:
                    # a stop between its record and the removal of its staging left that
                    layout.remove_tree(layout.staging_dir(vid))
                self.complete += 1
                self._groups.add(record)
                if self.on_complete is not None:
                    self.on_complete(source, record)
                continue
            reset = self.output is not None and (record is not None or staged)
            self._groups.recordless |= record is None and not staged
            if reset != source.reset:
                source = replace(source, reset=reset)
            self.pending += 1
            if self.on_pending is not None:
                self.on_pending(source)
            yield source


def _drop_stale_rows(layout: OutputLayout, groups: GroupCount) -> None:
    """Drop from the shared tables the rows of videos whose records no longer name them
    (``GroupCount``): a video whose record was deleted by hand is done again, and its old
    rows stayed beside its new ones, the same clip twice in ``metadata/``."""
    for name in groups.stale():
        dropped = layout.drop_from_group(name)
        if dropped:
            log.info("%s: %d row(s) of videos done again dropped", name, dropped)


def _staged_videos(layout: OutputLayout) -> set[str]:
    """Ids of the videos an earlier run had begun writing (their staging): one listing,
    taken before this run writes any, and as small as that run's work in flight."""
    staging = layout.staging
    if isinstance(staging, ObjectPath):
        return {e.relative.split("/", 1)[0] for e in staging.find()}
    try:
        return {entry.name for entry in os.scandir(staging)}
    except OSError:
        return set()


class VideoListing(ProcessingStage[Task[Any] | VideoSource, VideoTask]):
    """The run's seed task -> one ``VideoTask`` per video still to do (a single worker).

    With ``output`` set it resumes: videos whose outputs are complete (from the same file:
    same size and modification time) are skipped, and what an unfinished one left behind
    is removed before it is done again, so every clip ends up written exactly once. Given
    ``VideoSource`` tasks instead (``run_video`` lists in the driver, ``VideoSources``), it
    makes one ``VideoTask`` of each, cleaning up first after an earlier attempt where the
    source says one may have left files (``VideoSource.reset``).
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
            resume = None
            if self.output is not None and task.reset:
                resume = OutputLayout(self.output).resume_video(
                    task.relative_path, task.size, task.mtime
                )
            return [_video_task(task, "", resume)]
        sources = list_videos(
            self.sources, extensions=self.extensions, exclude=self.excluded(), limit=self.limit
        )
        todo = pending_videos(sources, self.output)
        resumes: dict[str, tuple[int, str] | None] = {}
        if self.output is not None:
            layout = OutputLayout(self.output)
            layout.sweep_tmp()
            # on a store a request per video adds up: reset only the videos something was
            # written for (one listing of the records and the staging says which)
            started = layout.started_videos() if is_url(self.output) else None
            for source in todo:
                if started is None or video_id(source.relative_path) in started:
                    resumes[source.relative_path] = layout.resume_video(
                        source.relative_path, source.size, source.mtime
                    )
        log.info("%d videos found, %d to do", len(sources), len(todo))
        dataset = task.dataset_name if isinstance(task, Task) else ""
        return [_video_task(s, dataset, resumes.get(s.relative_path)) for s in todo]


def _video_task(
    source: VideoSource, dataset: str, resume: tuple[int, str] | None = None
) -> VideoTask:
    """``source``'s task; ``resume``: the generation of this attempt and the clips an
    interrupted one finished (``OutputLayout.resume_video``)."""
    generation, finished = resume if resume is not None else (0, None)
    video = Video(
        path=source.path,
        relative_path=source.relative_path,
        source_size=source.size,
        source_mtime=source.mtime,
        resume=finished,
        generation=generation,
    )
    return VideoTask(data=video, dataset_name=dataset)


class VideoProbe(VideoStage):
    """Fills each video's metadata with PyAV; a bad file fails with the reason.

    ``verify`` also decodes a first frame and the last seconds, so a file that cannot be
    decoded or was cut short fails here, before any work is spent on it. A video whose
    frames have more than ``max_pixels`` pixels fails (``None``: any size is taken).
    """

    resources = Resources(cpus=0.25)

    def __init__(self, verify: bool = True, max_pixels: int | None = MAX_VIDEO_PIXELS) -> None:
        if max_pixels is not None and (isinstance(max_pixels, bool) or max_pixels < 1):
            raise ValueError(f"max_pixels must be a whole number >= 1 or None, got {max_pixels!r}")
        self.verify = verify
        self.max_pixels = max_pixels

    def process_video(self, video: Video) -> None:
        video.metadata = probe(video.path, verify=self.verify, max_pixels=self.max_pixels)
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
        max_pixels: int | None = MAX_VIDEO_PIXELS,
    ) -> None:
        self.listing = VideoListing(inputs, output, extensions=extensions, limit=limit)
        self.probe = VideoProbe(verify=verify, max_pixels=max_pixels)

    def decompose(self) -> list[ProcessingStage[Any, Any]]:
        return [self.listing, self.probe]
