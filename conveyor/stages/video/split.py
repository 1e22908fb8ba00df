"""Splitting a video into clips: at a fixed stride, or along the shots a detector found.

The rules are pure functions of frame numbers, tested on their own: ``fixed_stride_spans``
for fixed stride, and ``SceneClipper`` for shots (scenes shorter than ``min_len_s`` dropped,
``crop_s`` trimmed at each end, less where that would leave a scene of ``min_len_s`` or more
no clip, scenes longer than ``max_len_s`` cut at a stride or truncated;
no clip spans a transition). ``SceneClipper`` works incrementally: as detection moves along a
video it hands out every clip that later frames cannot change, so clips of a long video (or
of a long shot) go downstream while the rest is still being detected.

Clips travel in chunks of a few consecutive clips (``chunk_sizes``): 1, then 2, then 4, up to
``clips_per_chunk``, so the first clips of each video reach the writer fast and later chunks
decode their stretch of the source once for several clips.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from conveyor.media.dissolves import VarianceDissolves
from conveyor.media.layout import resumed_clips
from conveyor.media.transitions import GradualRuns, merge_transitions
from conveyor.resources import Resources
from conveyor.stages.video.base import VideoStage, check_numbers
from conveyor.tasks.video import Clip, Video, VideoTask, clip_id

MaxLenMode = Literal["stride", "truncate"]


# -- rules ------------------------------------------------------------------------------
def _frame_at(seconds: float, fps: float) -> int:
    """The frame boundary nearest ``seconds`` (halves up). A time reached two ways (a clip's
    end, the next one's start) can differ in its last bit, which with ``round`` put the
    boundary on two frames (a frame in no clip, or in two) where a length is not a whole
    number of frames; the tolerance is far under a frame."""
    return math.floor(seconds * fps + 0.5 + 1e-9)


def fixed_stride_spans(
    num_frames: int, fps: float, clip_len_s: float, stride_s: float, min_clip_s: float
) -> list[tuple[int, int]]:
    """Frame spans ``[start, end)`` every ``stride_s`` seconds, ``clip_len_s`` long; the last
    one ends with the video and is dropped when shorter than ``min_clip_s``."""
    check_numbers(clip_len_s=clip_len_s, stride_s=stride_s, min_clip_s=min_clip_s)
    if clip_len_s <= 0 or stride_s <= 0 or min_clip_s < 0:
        raise ValueError("clip_len_s and stride_s must be > 0 and min_clip_s >= 0")
    spans = []
    k = 0
    while True:
        start = _frame_at(k * stride_s, fps)
        if start >= num_frames:
            break
        end = min(_frame_at(k * stride_s + clip_len_s, fps), num_frames)
        if end - start >= max(1, round(min_clip_s * fps)):
            spans.append((start, end))
        if end >= num_frames:
            break
        k += 1
    return spans


@dataclass(frozen=True)
class SplitRules:
    """How shots become clips (seconds)."""

    min_len_s: float = 2.0
    max_len_s: float = 10.0
    max_len_mode: MaxLenMode = "stride"
    crop_s: float = 0.5

    def __post_init__(self) -> None:
        if self.min_len_s < 0 or self.crop_s < 0:
            raise ValueError("min_len_s and crop_s must be >= 0")
        if self.max_len_s <= 0 or self.max_len_s < self.min_len_s:
            raise ValueError(
                f"max_len_s must be > 0 and >= min_len_s, got {self.max_len_s} (min "
                f"{self.min_len_s})"
            )
        if self.max_len_mode not in ("stride", "truncate"):
            raise ValueError(
                f"max_len_mode must be 'stride' or 'truncate', got {self.max_len_mode!r}"
            )

    @property
    def first_clip_certain_s(self) -> float:
        """How far into a shot detection must reach before its first clip cannot change:
        the longest clip plus a crop at each end (``SceneClipper.advance``)."""
        return self.max_len_s + 2 * self.crop_s


class SceneClipper:
    """Clip spans of one video's scenes, handed out as soon as they are certain.

    Feed it the transitions in order (``transition``) and how far detection has got
    (``advance``); ``finish`` closes the last scene at the video's end. A transition
    ``(first, last)`` (inclusive frames; ``(c, c - 1)`` for a hard cut before frame ``c``)
    ends the open scene before ``first``; the next scene starts after ``last``.
    """

    def __init__(self, rules: SplitRules, fps: float) -> None:
        self.rules = rules
        self.crop = round(rules.crop_s * fps)
        self.min_len = max(1, round(rules.min_len_s * fps))
        self.max_len = max(1, round(rules.max_len_s * fps))
        self.scene_start = 0
        self.pieces = 0  # pieces of the open scene handed out

    def _usable_start(self) -> int:
        return self.scene_start + self.crop

    def advance(self, frontier: int) -> list[tuple[int, int]]:
        """Spans of the open scene that end before ``frontier - crop``: whatever comes after
        ``frontier`` (a transition or not), they stay as they are."""
        start = self._usable_start()
        limit = frontier - self.crop
        out = []
        if self.rules.max_len_mode == "truncate":
            if self.pieces == 0 and start + self.max_len <= limit:
                out.append((start, start + self.max_len))
                self.pieces = 1
            return out
        while start + (self.pieces + 1) * self.max_len <= limit:
            begin = start + self.pieces * self.max_len
            out.append((begin, begin + self.max_len))
            self.pieces += 1
        return out

    def _close(self, end: int) -> list[tuple[int, int]]:
        """The open scene ends at ``end`` (exclusive): its remaining spans."""
        start = self._usable_start()
        stop = end - self.crop
        if self.pieces == 0 and stop - start < self.min_len <= end - self.scene_start:
            # a shot shorter than a clip and both crops is cropped less rather than lost
            spare = (end - self.scene_start - self.min_len) // 2
            start, stop = self.scene_start + spare, end - spare
        out: list[tuple[int, int]] = []
        if self.rules.max_len_mode == "truncate":
            if self.pieces == 0 and stop - start >= self.min_len:
                out.append((start, min(stop, start + self.max_len)))
            return out
        begin = start + self.pieces * self.max_len
        while begin < stop:
            finish = min(begin + self.max_len, stop)
            if finish - begin >= self.min_len:
                out.append((begin, finish))
            begin = finish
        return out

    def transition(self, first: int, last: int) -> list[tuple[int, int]]:
        out = self._close(first)
        self.scene_start = last + 1
        self.pieces = 0
        return out

    def finish(self, end: int) -> list[tuple[int, int]]:
        out = self._close(end)
        self.scene_start = end
        self.pieces = 0
        return out


def scene_spans(
    transitions: list[tuple[int, int]], num_frames: int, rules: SplitRules, fps: float
) -> list[tuple[int, int]]:
    """All clip spans of a video at once (what the incremental clipper adds up to)."""
    clipper = SceneClipper(rules, fps)
    spans: list[tuple[int, int]] = []
    for first, last in transitions:
        spans += clipper.transition(first, last)
    return spans + clipper.finish(num_frames)


def chunk_sizes(clips_per_chunk: int, start: int = 0) -> Iterator[int]:
    """Sizes of consecutive chunks from chunk ``start`` on: 1, 2, 4, ... up to the cap."""
    if isinstance(clips_per_chunk, bool) or not isinstance(clips_per_chunk, int):
        raise ValueError(f"clips_per_chunk must be a whole number, got {clips_per_chunk!r}")
    if clips_per_chunk < 1:
        raise ValueError(f"clips_per_chunk must be >= 1, got {clips_per_chunk}")
    index = start
    while True:
        yield min(clips_per_chunk, 2 ** min(index, 30))
        index += 1


def make_clips(video: Video, spans: list[tuple[int, int]]) -> list[Clip]:
    """``Clip``s of ``video`` for frame spans (ids from the relative path and the span)."""
    assert video.metadata is not None
    fps = video.metadata.fps
    return [
        Clip(
            clip_id=clip_id(video.relative_path, start, end),
            source_video=video.relative_path,
            span=(start / fps, end / fps),
            frame_span=(start, end),
        )
        for start, end in spans
    ]


def chunk_clips(
    video: Video, clips: list[Clip], clips_per_chunk: int, first_index: int = 0, last: bool = True
) -> list[Video]:
    """``clips`` as consecutive chunks numbered from ``first_index``; with ``last`` the final
    chunk is marked last (an empty one is made when there are no clips, so the writer still
    hears of the video). Clips an interrupted run of the video finished (``Video.resume``)
    are marked ``restored``: they keep their places, and no stage works on them again."""
    if video.resume is not None:
        finished = resumed_clips(video.resume)
        for clip in clips:
            clip.restored = clip.clip_id in finished
    chunks = []
    sizes = chunk_sizes(clips_per_chunk, first_index)
    position = 0
    index = first_index
    while position < len(clips):
        size = next(sizes)
        part = clips[position : position + size]
        position += size
        chunks.append(video.chunk(part, index, last and position >= len(clips)))
        index += 1
    if last and not chunks:
        chunks.append(video.chunk([], index, True))
    return chunks


# -- stages -----------------------------------------------------------------------------
class FixedStrideSplitter(VideoStage):
    """Clips every ``stride_s`` seconds, ``clip_len_s`` long (``min_clip_s`` the shortest
    kept), fanned out in chunks."""

    resources = Resources(cpus=0.25)

    def __init__(
        self,
        clip_len_s: float = 10.0,
        stride_s: float | None = None,
        min_clip_s: float = 2.0,
        clips_per_chunk: int = 2,
    ) -> None:
        self.clip_len_s = clip_len_s
        self.stride_s = clip_len_s if stride_s is None else stride_s
        self.min_clip_s = min_clip_s
        self.clips_per_chunk = clips_per_chunk
        fixed_stride_spans(1, 1.0, self.clip_len_s, self.stride_s, self.min_clip_s)  # validate
        next(chunk_sizes(clips_per_chunk))

    def process_video(self, video: Video) -> list[Video]:
        meta = video.metadata
        assert meta is not None, "FixedStrideSplitter needs probed videos (VideoReader first)"
        spans = fixed_stride_spans(
            meta.num_frames, meta.fps, self.clip_len_s, self.stride_s, self.min_clip_s
        )
        return chunk_clips(video, make_clips(video, spans), self.clips_per_chunk)


@dataclass
class _Progress:
    """What the shot splitter knows of one video while its windows arrive."""

    clipper: SceneClipper
    count: int
    windows: dict[int, Video]
    next_window: int = 0
    next_chunk: int = 0
    end: int = 0
    errors: dict[str, str] | None = None
    #: transitions not yet reported with a chunk
    transitions: list[tuple[int, int]] = field(default_factory=list)
    #: what decoded the windows' frames, and why not NVDEC, not yet reported with a chunk
    decoders: set[str] = field(default_factory=set)
    fallback: str | None = None
    #: runs of gradual evidence (dissolves or content), and transitions found but not yet
    #: given to the clipper because an open run before them may still become one
    gradual: GradualRuns | None = None
    pending: list[tuple[int, int]] = field(default_factory=list)
    #: dissolves found in the sag of the frames' variance (where the detector measures it)
    dissolves: VarianceDissolves | None = None

    def settle(self, frontier: int, done: bool = False) -> list[tuple[int, int]]:
        """Clip spans certain once detection has reached ``frontier``: transitions before it
        (and before any open gradual run or possible dissolve) go to the clipper in order."""
        assert self.gradual is not None and self.dissolves is not None
        if done:
            self.pending += self.gradual.finish() + self.dissolves.finish()
        holds = [h for h in (self.gradual.holding, self.dissolves.holding) if h is not None]
        limit = frontier if not holds or done else min(frontier, *holds)
        merged = merge_transitions(self.pending)  # sorted: those ready come first
        ready = [t for t in merged if t[0] < limit]
        self.pending = merged[len(ready) :]
        spans: list[tuple[int, int]] = []
        for first, last in ready:
            spans += self.clipper.transition(first, last)
        self.transitions += ready
        if done:
            return spans + self.clipper.finish(frontier)
        return spans + self.clipper.advance(limit)


class ShotSplitter(VideoStage):
    """Windows with detected transitions -> chunks of clips, in order, as soon as certain.

    Windows of a video may arrive in any order and interleaved with other videos'; the stage
    keeps, per video, the windows it cannot use yet (transitions only: frames were dropped by
    the detector) and emits clips for the longest run of consecutive windows it has. It runs
    as one worker, since it holds that state. A window that failed fails the video: no more
    clips are made for it, and its last chunk carries the error.
    """

    resources = Resources(cpus=0.25)
    num_workers = 1

    def __init__(self, rules: SplitRules | None = None, clips_per_chunk: int = 2) -> None:
        self.rules = rules or SplitRules()
        self.clips_per_chunk = clips_per_chunk
        next(chunk_sizes(clips_per_chunk))
        self._videos: dict[str, _Progress] = {}

    def setup(self, worker: object) -> None:
        self._videos = {}

    def process(self, task: VideoTask) -> list[VideoTask]:
        video = task.data
        window = video.window
        if window is None:  # failed before windows were made
            if not video.failed:
                raise ValueError(
                    f"stage {self.name!r}: video {video.relative_path!r} has no detection "
                    "window; put a shot detector before it"
                )
            return self._emit(task, [video.chunk([], 0, True)])
        key = video.relative_path
        progress = self._videos.get(key)
        if progress is None:
            assert video.metadata is not None
            fps = video.metadata.fps
            progress = _Progress(SceneClipper(self.rules, fps), window.count, {})
            progress.gradual = GradualRuns(fps)
            progress.dissolves = VarianceDissolves(fps)
            self._videos[key] = progress
        progress.windows[window.index] = video
        return self._emit(task, self._drain(key, progress))

    def _drain(self, key: str, progress: _Progress) -> list[Video]:
        clips: list[Clip] = []
        template: Video | None = None
        while progress.next_window in progress.windows:
            part = progress.windows.pop(progress.next_window)
            progress.next_window += 1
            template = part
            window = part.window
            assert window is not None
            progress.end = max(progress.end, window.end)
            if part.decoder is not None:
                progress.decoders.add(part.decoder)
            progress.fallback = progress.fallback or part.decoder_fallback
            if part.failed or progress.errors is not None:
                progress.errors = {**(progress.errors or {}), **part.errors}
                continue
            if window.transitions is None:
                raise ValueError(
                    f"window {window.index} of {key!r} reached {self.name!r} without detected "
                    "transitions; put a shot detector before it"
                )
            assert progress.gradual is not None and progress.dissolves is not None
            progress.pending += window.transitions
            progress.pending += progress.gradual.feed(window.start, window.gradual, window.end)
            progress.pending += progress.dissolves.feed(window.start, window.variance, window.end)
            clips += make_clips(part, progress.settle(window.end))
        if template is None:
            return []
        done = progress.next_window >= progress.count
        if done:
            del self._videos[key]
            if progress.errors is None:
                clips += make_clips(template, progress.settle(progress.end, done=True))
        base = template.chunk([], 0, False)
        base.errors = dict(progress.errors or {})
        if progress.errors is not None:
            clips = []  # clips sent before the failure stay; no more are made
        chunks = chunk_clips(base, clips, self.clips_per_chunk, progress.next_chunk, last=done)
        progress.next_chunk += len(chunks)
        if chunks:
            chunks[0].transitions = progress.transitions
            chunks[0].shot_decoders = sorted(progress.decoders)
            chunks[0].shot_decoder_fallback = progress.fallback
            progress.transitions, progress.decoders, progress.fallback = [], set(), None
        return chunks

    def _emit(self, task: VideoTask, videos: list[Video]) -> list[VideoTask]:
        return [
            VideoTask(data=v, dataset_name=task.dataset_name, metadata=dict(task.metadata))
            for v in videos
        ]


def windows(num_frames: int, window: int, first_end: int = 0) -> list[tuple[int, int]]:
    """``[start, end)`` frame ranges of ``window`` frames covering a video.

    With ``first_end`` (in a longer video), the frames before it are split evenly into as
    many windows as fit best, so that one ends exactly there: where a video's first clip
    becomes certain, which is then not kept waiting for a window reaching past it.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1 frame, got {window}")
    spans: list[tuple[int, int]] = []
    start = 0
    if 0 < first_end < num_frames:
        count = max(1, round(first_end / window))
        edges = [round(first_end * k / count) for k in range(count + 1)]
        spans = list(itertools.pairwise(edges))
        start = first_end
    count = max(1, math.ceil((num_frames - start) / window))
    spans += [(start + i * window, min(start + (i + 1) * window, num_frames)) for i in range(count)]
    return spans
