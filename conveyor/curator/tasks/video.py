"""NeMo Curator's video data model (``nemo_curator.tasks.video``), for video stages ported by
changing their imports.

A Curator-style stage works on these: ``task.data`` is a ``Video`` whose ``clips`` are the
clips still in play and ``filtered_clips`` those a filter moved aside; a ``Clip`` carries
``buffer`` (the encoded MP4), ``extracted_frames``, the motion and aesthetic scores,
``cosmos_embed1_embedding``, caption ``windows`` and ``errors``. Conveyor's own video stages
(the probe, splitters, transcoder, filters, models, writer) work on ``conveyor.tasks.Video``;
where the two meet, the adapter converts (``conveyor.curator.video_model``), so one pipeline
can mix them: the names that match carry over both ways (see docs/curator.md), and what
either model has no place for rides along untouched.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from conveyor.curator.tasks import Task
from conveyor.tasks.base import wrong_data

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Clip", "ClipStats", "Video", "VideoMetadata", "VideoTask", "_Window"]


@dataclass
class _Window:
    """A stretch of a clip's frames ``[start_frame, end_frame)`` for captioning: its inputs,
    its captions per model, and an optional preview."""

    start_frame: int
    end_frame: int
    mp4_bytes: bytes | None = None
    qwen_llm_input: dict[str, Any] | None = None
    x1_input: Any | None = None
    #: model name -> caption
    caption: dict[str, str] = field(default_factory=dict)
    enhanced_caption: dict[str, str] = field(default_factory=dict)
    webp_bytes: bytes | None = None

    def get_major_size(self) -> int:
        """Bytes held by the window's large fields (for memory accounting)."""
        size = len(self.mp4_bytes or b"") + len(self.webp_bytes or b"")
        size += sys.getsizeof(self.qwen_llm_input) if self.qwen_llm_input else 0
        return size + sys.getsizeof(self.caption) + sys.getsizeof(self.enhanced_caption)


@dataclass
class Clip:
    """One clip of a source video, as NeMo Curator's stages read and fill it."""

    uuid: UUID
    source_video: str
    #: [start, end) in seconds of the source
    span: tuple[float, float]
    #: the encoded clip (MP4)
    buffer: bytes | None = None
    #: ``FrameExtractionSignature.to_str()`` -> N x H x W x 3 uint8 RGB frames
    extracted_frames: dict[str, np.ndarray] = field(default_factory=dict)
    decoded_motion_data: Any = None
    motion_score_global_mean: float | None = None
    motion_score_per_patch_min_256: float | None = None
    aesthetic_score: float | None = None
    cosmos_embed1_frames: np.ndarray | None = None
    cosmos_embed1_embedding: np.ndarray | None = None
    windows: list[_Window] = field(default_factory=list)
    egomotion: dict[str, bytes] = field(default_factory=dict)
    cosmos_embed1_text_match: tuple[str, float] | None = None
    errors: dict[str, str] = field(default_factory=dict)
    #: the Conveyor clip this one was made from (what Conveyor's stages know of it that this
    #: model has no field for), else ``None``; and the stage that moved it to
    #: ``filtered_clips`` (set by the adapter)
    _conveyor: Any = field(default=None, repr=False, compare=False)
    _filtered_by: str | None = field(default=None, repr=False, compare=False)

    @property
    def duration(self) -> float:
        return self.span[1] - self.span[0]

    def extract_metadata(self) -> dict[str, Any] | None:
        """The encoded clip's size, rate, frame count and codec, probed from ``buffer``
        (``None`` before it is encoded)."""
        if self.buffer is None:
            return None
        from conveyor.media.decode import probe_bytes

        meta = probe_bytes(self.buffer, verify=False)
        return {
            "width": meta.width,
            "height": meta.height,
            "framerate": meta.fps,
            "num_frames": meta.num_frames,
            "video_codec": meta.codec,
            "num_bytes": len(self.buffer),
        }

    def get_major_size(self) -> int:
        """Bytes held by the clip's large fields (for memory accounting)."""
        size = 16 + len(self.buffer or b"")
        size += sum(frames.nbytes for frames in self.extracted_frames.values())
        measure = getattr(self.decoded_motion_data, "get_major_size", None)
        size += measure() if callable(measure) else 0
        return size + sum(window.get_major_size() for window in self.windows)


@dataclass
class ClipStats:
    """Counts a writer adds up over a video's chunks."""

    num_filtered_by_motion: int = 0
    num_filtered_by_aesthetic: int = 0
    num_passed: int = 0
    num_transcoded: int = 0
    num_with_embeddings: int = 0
    num_with_caption: int = 0
    num_with_webp: int = 0
    total_clip_duration: float = 0.0
    max_clip_duration: float = 0.0

    def combine(self, other: ClipStats) -> None:
        """Add ``other``'s counts to these (the longest clip is the longer of the two)."""
        for name in (
            "num_filtered_by_motion",
            "num_filtered_by_aesthetic",
            "num_passed",
            "num_transcoded",
            "num_with_embeddings",
            "num_with_caption",
            "num_with_webp",
            "total_clip_duration",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_clip_duration = max(self.max_clip_duration, other.max_clip_duration)


@dataclass
class VideoMetadata:
    """What probing the source said (``None``: not probed, or the container does not say)."""

    size: int | None = None
    height: int | None = None
    width: int | None = None
    framerate: float | None = None
    num_frames: int | None = None
    duration: float | None = None
    video_codec: str | None = None
    pixel_format: str | None = None
    audio_codec: str | None = None
    bit_rate_k: int | None = None


#: the fields ``Video.has_metadata`` needs
_NEEDED = ("height", "width", "duration", "framerate", "num_frames", "video_codec")


@dataclass
class Video:
    """A source video, or one chunk of its clips, as NeMo Curator's stages read and fill it.

    ``input_video`` is a ``Path`` for a local file and the URL itself (a ``str``) for an
    object store's. A video that came from Conveyor's stages has no ``source_bytes`` (they
    read the file where they need it): read ``input_video``, or call ``populate_metadata``,
    which reads it when there are no bytes.
    """

    input_video: Path | str
    source_bytes: bytes | None = None
    metadata: VideoMetadata = field(default_factory=VideoMetadata)
    #: frames decoded for a shot detector
    frame_array: np.ndarray | None = None
    clips: list[Clip] = field(default_factory=list)
    filtered_clips: list[Clip] = field(default_factory=list)
    num_total_clips: int = 0
    num_clip_chunks: int = 0
    clip_chunk_index: int = 0
    clip_stats: ClipStats = field(default_factory=ClipStats)
    errors: dict[str, str] = field(default_factory=dict)
    #: the Conveyor video this one was made from, else ``None`` (as ``Clip._conveyor``),
    #: and what the Curator side does not show of it (``conveyor.curator.video_model``)
    _conveyor: Any = field(default=None, repr=False, compare=False)
    _held: Any = field(default=None, repr=False, compare=False)

    @property
    def input_path(self) -> str:
        video = self.input_video
        return video.as_posix() if isinstance(video, Path) else str(video)

    def populate_metadata(self) -> None:
        """Fill ``metadata`` by probing ``source_bytes`` (or the file, where there are no
        bytes); ``conveyor.media.InputError`` says why a video cannot be read."""
        from conveyor.media.decode import probe, probe_bytes

        if self.source_bytes is not None:
            meta = probe_bytes(self.source_bytes, verify=False)
            size = len(self.source_bytes)
        else:
            meta = probe(self.input_path, verify=False, max_pixels=None)
            size = meta.size_bytes
        self.metadata = curator_metadata(meta, size)

    def has_metadata(self) -> bool:
        return all(getattr(self.metadata, name) for name in _NEEDED)

    def is_10_bit_color(self) -> bool | None:
        pixels = self.metadata.pixel_format
        if pixels is None:
            return None
        return "10le" in pixels or "10be" in pixels

    @property
    def fraction(self) -> float:
        """The share of the video's clips this chunk holds (1 before chunking)."""
        if not self.num_total_clips:
            return 1.0
        return (len(self.clips) + len(self.filtered_clips)) / self.num_total_clips

    @property
    def weight(self) -> float:
        """How much work this task is, in units of five minutes of video (0 unprobed)."""
        if self.metadata.size is None:
            return 0.0
        if self.metadata.duration is None:
            raise ValueError(f"video {self.input_path}: metadata.duration is not known")
        return self.metadata.duration / 300 * self.fraction

    def get_major_size(self) -> int:
        """Bytes held by the video's large fields (for memory accounting)."""
        size = len(self.source_bytes or b"")
        size += self.frame_array.nbytes if self.frame_array is not None else 0
        return size + sum(clip.get_major_size() for clip in self.clips)


def curator_metadata(meta: Any, size: int | None) -> VideoMetadata:
    """NeMo Curator's metadata from Conveyor's ``conveyor.tasks.VideoMetadata``."""
    return VideoMetadata(
        size=size or None,
        height=meta.height,
        width=meta.width,
        framerate=meta.fps,
        num_frames=meta.num_frames,
        duration=meta.duration_s,
        video_codec=meta.codec,
        pixel_format=meta.pixel_format,
        audio_codec=meta.audio_codec,
        bit_rate_k=meta.bit_rate // 1000 if meta.bit_rate else None,
    )


class VideoTask(Task[Video]):
    """One video, or one chunk of its clips: ``VideoTask(dataset_name="videos",
    data=Video(input_video=Path(...)))``."""

    data: Video = None  # type: ignore[assignment]

    def check_data(self, data: Any) -> None:
        if data is None or isinstance(data, Video):
            return
        raise wrong_data(self, "a conveyor.curator.tasks.video.Video (NeMo Curator's)", data)

    def validate(self) -> bool:
        """Whether the video's local file exists (a URL is not checked)."""
        video = self.data
        if isinstance(video.input_video, Path) and not os.path.exists(video.input_video):
            print(f"Video {video.input_video} does not exist")
            return False
        return True

    @property
    def num_items(self) -> int:
        return 1
