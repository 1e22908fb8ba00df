"""The video data model: a ``Video`` (one source file, or one chunk of its clips) and its
``Clip``s, carried between stages by a ``VideoTask``.

A video travels in pieces. Before splitting, one task is one source file (probed metadata,
errors). Shot detection cuts it into frame windows (``FrameWindow``: low-resolution frames
and, once detected, the transitions in them), and splitting emits *chunks*: tasks that each
hold a few consecutive clips of one video, numbered ``chunk_index`` with ``last_chunk`` set on
the final one. The transcoder, which cuts a chunk's clips from one decode of the source,
sends each clip on as soon as it is encoded: one *part* of its chunk (``part`` of ``parts``),
so the writer knows a video is complete once it has every part of every chunk. Every later
stage works on the clips of what it is given, so clips flow downstream independently of the
rest of their video.

Errors are data: a video that cannot be read carries ``errors`` and no clips, and travels on to
the writer, which records it; a clip that fails a stage carries ``errors`` and is not kept.
Large buffers are ``bytes`` (encoded clips) and NumPy arrays (frames, embeddings), which the
engine stores once and maps without a copy.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from conveyor.tasks.base import Task, wrong_data

if TYPE_CHECKING:  # the driver lists and resumes videos without loading NumPy (0.2 s)
    import numpy as np

#: namespace of clip and video ids (UUIDv5): the same source and span give the same id always
ID_NAMESPACE = uuid.UUID("6f1c3b0e-8d7a-5c1e-9a4b-2e0c0f7d5a11")

#: the value of ``Clip.filtered_by`` for a clip that failed a stage (it is never kept)
ERROR_FILTER = "error"


def video_id(relative_path: str) -> str:
    """Stable id of a source video from its path relative to the input root."""
    return str(uuid.uuid5(ID_NAMESPACE, f"video:{relative_path}"))


def clip_id(relative_path: str, start_frame: int, end_frame: int) -> str:
    """Stable id of a clip: a UUIDv5 of its source's relative path and its frame span."""
    return str(uuid.uuid5(ID_NAMESPACE, f"clip:{relative_path}#{start_frame}-{end_frame}"))


@dataclass(frozen=True)
class VideoMetadata:
    """What probing the source told us (``None`` where the container does not say)."""

    duration_s: float
    fps: float
    num_frames: int
    width: int
    height: int
    codec: str
    pixel_format: str | None = None
    bit_rate: int | None = None
    audio_codec: str | None = None
    container: str | None = None
    size_bytes: int = 0
    #: time (s) of the first frame in the stream's clock; spans are relative to it
    start_time_s: float = 0.0
    #: clockwise rotation the player applies (phone videos), in degrees
    rotation: int = 0
    #: the shape of a pixel, width:height (DVD and broadcast video are stored anamorphic)
    sample_aspect: tuple[int, int] = (1, 1)
    #: stored as fields (broadcast, camcorders, DVDs): clips are deinterlaced when cut
    interlaced: bool = False

    @property
    def sideways(self) -> bool:
        """A player turns it a quarter (a phone held upright): shown height is stored width."""
        return self.rotation % 180 == 90

    def shown_size(self, width: int, height: int) -> tuple[int, int]:
        """``width`` x ``height`` pixels of this video as a player shows them: widened by
        the pixels' shape, turned by the rotation."""
        num, den = self.sample_aspect
        wide = round(width * num / den) if num > 0 and den > 0 else width
        return (height, wide) if self.sideways else (wide, height)

    def as_dict(self) -> dict[str, Any]:
        return {
            "duration_s": round(self.duration_s, 6),
            "fps": round(self.fps, 6),
            "num_frames": self.num_frames,
            "width": self.width,
            "height": self.height,
            "codec": self.codec,
            "pixel_format": self.pixel_format,
            "bit_rate": self.bit_rate,
            "audio_codec": self.audio_codec,
            "container": self.container,
            "size_bytes": self.size_bytes,
            "start_time_s": round(self.start_time_s, 6),
            "rotation": self.rotation,
            "sample_aspect": f"{self.sample_aspect[0]}:{self.sample_aspect[1]}",
            "interlaced": self.interlaced,
        }


@dataclass(frozen=True)
class MotionScores:
    """A clip's motion from its codec's vectors, in fractions of the frame width per frame:
    the frames' mean and the stillest ``patch`` x ``patch`` square's (``frames``: how many
    frames had vectors; none says nothing about motion). ``source`` says whose vectors:
    ``"source"`` (the source video's, read while the clip was cut) or ``"clip"`` (the encoded
    clip's)."""

    patch: int
    global_mean: float
    patch_min: float
    frames: int
    source: str = "clip"


@dataclass
class Clip:
    """One clip: a span of its source, and everything the stages learned about it."""

    clip_id: str
    #: path of the source relative to the input root
    source_video: str
    #: [start, end) in seconds from the source's first frame
    span: tuple[float, float]
    #: [start, end) frame indices of the source (at its nominal frame rate)
    frame_span: tuple[int, int]
    #: the encoded clip (H.264 in MP4), set by the transcoder
    encoded: bytes | None = None
    width: int = 0
    height: int = 0
    fps: float = 0.0
    num_frames: int = 0
    codec: str | None = None
    #: name -> score, from every filter that looked at the clip (also in score-only mode)
    scores: dict[str, float] = field(default_factory=dict)
    #: the filter that rejected the clip, ``"error"`` if a stage failed on it, else ``None``
    filtered_by: str | None = None
    embedding: np.ndarray | None = None
    text_embedding: np.ndarray | None = None
    #: (label, score) pairs, best first
    tags: list[tuple[str, float]] = field(default_factory=list)
    #: model name -> caption
    captions: dict[str, str] = field(default_factory=dict)
    #: zero-shot video type (``VideoTypeClassifier``): ``{"label": best label, "scores":
    #: {label: probability}}``, else ``None``
    video_type: dict[str, Any] | None = None
    #: frames decoded once for the models downstream: sampling rate (fps) -> N x H x W x 3
    #: uint8 RGB; dropped by the last stage that needs them
    frames: dict[float, np.ndarray] = field(default_factory=dict, repr=False)
    #: ImageNet class probabilities averaged over the frames, left by the embedder when it
    #: runs the packaged EfficientNet-Lite0 (whose classifier head is one matrix product past
    #: the features it pools) for the tagger; dropped with the frames
    class_probabilities: np.ndarray | None = field(default=None, repr=False)
    #: the codec's motion vectors summed up by a pass that decodes every frame anyway (the
    #: transcoder's over the source, or a frame extractor's over the clip), for the motion
    #: filter (which otherwise decodes the clip itself)
    motion: MotionScores | None = field(default=None, repr=False)
    #: stage name -> reason, for failures of this clip
    errors: dict[str, str] = field(default_factory=dict)
    #: id of the kept clip this one nearly duplicates (semantic dedup), else ``None``
    duplicate_of: str | None = None
    #: finished by an earlier, interrupted run of its video (``Video.resume``): no stage
    #: works on it again, and the writer adopts what that run staged for it
    restored: bool = False
    #: fields of NeMo Curator's ``Clip`` this model has no place for, set by a Curator-style
    #: stage (``conveyor.curator.tasks.video``): carried through Conveyor's stages so that
    #: the next Curator-style stage sees them again
    carried: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def duration_s(self) -> float:
        return self.span[1] - self.span[0]

    @property
    def made(self) -> bool:
        """Encoded by the transcoder (its bytes may since have been written and dropped)."""
        return self.encoded is not None or self.num_frames > 0

    @property
    def kept(self) -> bool:
        """Made, not filtered and not failed: what goes to ``clips/``."""
        return self.made and self.filtered_by is None and not self.errors

    @property
    def active(self) -> bool:
        """Still worth work downstream: not filtered, not failed, not restored."""
        return self.filtered_by is None and not self.errors and not self.restored

    def fail(self, stage: str, reason: str) -> None:
        """Record a failure of this clip at ``stage``; the clip is not kept."""
        self.errors[stage] = reason
        self.filtered_by = ERROR_FILTER
        self.drop_frames()

    def reject(self, filter_name: str) -> None:
        """Mark the clip filtered by ``filter_name`` (the first filter to reject it wins)."""
        if self.filtered_by is None:
            self.filtered_by = filter_name
        self.drop_frames()

    def drop_frames(self) -> None:
        """Free what was decoded or computed for the models downstream."""
        self.frames.clear()
        self.class_probabilities = None


@dataclass
class FrameWindow:
    """A stretch of a video for shot detection: frames ``[start, end)`` are the ones this
    window decides about; ``frames`` also holds ``context`` frames on each side (edge frames
    repeated at the video's ends), since a detector needs to see across its borders."""

    index: int
    count: int
    start: int
    end: int
    context: int = 0
    #: (end - start + 2 * context) x H x W x 3 uint8 RGB, dropped by the detector
    frames: np.ndarray | None = field(default=None, repr=False)
    #: transitions found in [start, end): (first, last) frame pairs, inclusive; a hard cut
    #: between frames c - 1 and c is (c, c - 1), a transition of zero frames
    transitions: list[tuple[int, int]] | None = None
    #: the detector's per-frame transition score for [start, end) (for inspection)
    scores: np.ndarray | None = field(default=None, repr=False)
    #: per frame of [start, end), how strongly it looks part of a gradual transition
    #: (``transitions.gradual_codes``); the splitter decides over the whole video which runs
    #: of them are transitions. None: the detector marks hard cuts only
    gradual: np.ndarray | None = field(default=None, repr=False)
    #: per frame of [start, end), the picture's variance (``dissolves.frame_variance``): the
    #: splitter finds dissolves in how it sags over the whole video. None: not measured
    variance: np.ndarray | None = field(default=None, repr=False)


@dataclass
class Video:
    """A source video, or one chunk of its clips."""

    path: str
    relative_path: str
    metadata: VideoMetadata | None = None
    clips: list[Clip] = field(default_factory=list)
    #: stage name -> reason, for failures of the whole video (it yields no clips)
    errors: dict[str, str] = field(default_factory=dict)
    #: position of this chunk among the video's chunks; ``last_chunk`` marks the final one
    chunk_index: int = 0
    last_chunk: bool = False
    #: this task is part ``part`` of ``parts`` of its chunk (the transcoder sends each clip on
    #: as it is encoded: ``part_of``); a whole chunk is part 0 of 1
    part: int = 0
    parts: int = 1
    #: set while shot detection works on a window of this video
    window: FrameWindow | None = None
    #: shot transitions found since the previous chunk, as inclusive frame pairs (a hard cut
    #: before frame ``c`` is ``(c, c - 1)``): the writer gathers them into the video's record
    transitions: list[tuple[int, int]] = field(default_factory=list)
    #: packets of the source the decoder refused while this chunk's clips were cut: frames
    #: missing from them (the writer adds them up in the video's record)
    damaged_packets: int = 0
    #: what decoded this part's clips: ``"nvdec"`` or ``"cpu"`` (``None``: no decode), and
    #: where NVDEC was asked for and could not take the video, why (the writer records both)
    decoder: str | None = None
    decoder_fallback: str | None = None
    #: what decoded the shot detector's frames of this video's windows since the chunk
    #: before (``"nvdec"``, ``"cpu"``), and where NVDEC was asked for and could not take
    #: them, why (the writer records both)
    shot_decoders: list[str] = field(default_factory=list)
    shot_decoder_fallback: str | None = None
    #: size and modification time of the source when listed: a changed file is redone
    source_size: int = 0
    source_mtime: float = 0.0
    #: an earlier run of this video was interrupted after finishing some of its clips: the
    #: staged list of them (``OutputLayout.resume_video``), which the splitter marks
    #: ``Clip.restored``, and this attempt's ``generation`` (its staged files are named by
    #: it, apart from the earlier attempts' it adopts); ``None`` and 0: a fresh start
    resume: str | None = None
    generation: int = 0
    #: the video's record (``videos/<path>.json``), set by the writer on the task whose
    #: writing completed the video: what comes after the writer (the shard writer, the
    #: run's summary) learns of a finished video from it, without reading the record back
    record: dict[str, Any] | None = field(default=None, repr=False)
    #: fields of NeMo Curator's ``Video`` this model has no place for (as ``Clip.carried``)
    carried: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def video_id(self) -> str:
        return video_id(self.relative_path)

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    @property
    def whole(self) -> bool:
        """This task holds the whole video: its only chunk, in one part."""
        return self.chunk_index == 0 and self.last_chunk and self.parts == 1

    def fail(self, stage: str, reason: str) -> None:
        """Record a failure of the whole video: it yields no (more) clips."""
        self.errors[stage] = reason
        self.clips = []
        if self.window is not None:  # its place among the windows still counts
            self.window.frames = None

    def chunk(self, clips: list[Clip], index: int, last: bool) -> Video:
        """A copy of this video holding ``clips`` as chunk ``index``."""
        return replace(
            self,
            clips=clips,
            chunk_index=index,
            last_chunk=last,
            part=0,
            parts=1,
            window=None,
            transitions=[],
            decoder=None,
            decoder_fallback=None,
            shot_decoders=[],
            shot_decoder_fallback=None,
        )

    def part_of(self, index: int, count: int, clips: list[Clip]) -> Video:
        """A copy of this chunk holding ``clips`` as its part ``index`` of ``count``.

        What the chunk says once for all its clips (its transitions, errors, damaged
        packets and shot decoders so far) rides on part 0 only, so that the writer records
        it once whatever order the parts arrive in.
        """
        first = index == 0
        return replace(
            self,
            clips=clips,
            part=index,
            parts=count,
            transitions=list(self.transitions) if first else [],
            errors=dict(self.errors) if first else {},
            damaged_packets=self.damaged_packets if first else 0,
            shot_decoders=list(self.shot_decoders) if first else [],
            shot_decoder_fallback=self.shot_decoder_fallback if first else None,
        )


@dataclass
class VideoTask(Task[Video]):
    """The task every video stage takes and returns; ``data`` is the ``Video``."""

    data: Video = None  # type: ignore[assignment]

    def check_data(self, data: Any) -> None:
        if data is not None and not isinstance(data, Video):
            raise wrong_data(self, "a conveyor.tasks.Video", data)

    @property
    def video(self) -> Video:
        return self.data

    @property
    def num_items(self) -> int:
        return len(self.data.clips) if self.data is not None else 0

    def short_repr(self) -> str:
        video = self.data
        if video is None:
            return f"VideoTask(id={self.task_id or '?'})"
        where = f", window={video.window.index}" if video.window is not None else ""
        if video.parts > 1:
            where += f", part={video.part}/{video.parts}"
        return (
            f"VideoTask(id={self.task_id or '?'}, video={video.relative_path!r}, "
            f"chunk={video.chunk_index}{where}, clips={len(video.clips)})"
        )
