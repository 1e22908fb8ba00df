"""Video curation stages: read, split (fixed stride or shots), transcode, filter, extract
frames, embed, annotate, write. Each is an ordinary ``ProcessingStage`` over ``VideoTask``s;
``conveyor.pipelines.video`` puts them together. Names are imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr

_EXPORTS = {
    "AdaptiveDetector": "conveyor.stages.video.cut_detectors",
    "AestheticFilter": "conveyor.stages.video.aesthetic",
    "Captioner": "conveyor.stages.video.caption",
    "ClipEmbedder": "conveyor.stages.video.embed",
    "ClipFrameExtractor": "conveyor.stages.video.frames",
    "ClipStage": "conveyor.stages.video.base",
    "ClipTranscoder": "conveyor.stages.video.transcode",
    "ClipWriter": "conveyor.stages.video.writer",
    "ContentDetector": "conveyor.stages.video.cut_detectors",
    "FixedStrideSplitter": "conveyor.stages.video.split",
    "FrameConsumer": "conveyor.stages.video.base",
    "HistogramDetector": "conveyor.stages.video.cut_detectors",
    "HybridDetector": "conveyor.stages.video.cut_detectors",
    "ImageNetTagger": "conveyor.stages.video.tags",
    "InputError": "conveyor.media.errors",
    "MotionFilter": "conveyor.stages.video.motion",
    "NSFWFilter": "conveyor.stages.video.nsfw",
    "QualityFilter": "conveyor.stages.video.quality",
    "TextEmbedder": "conveyor.stages.video.text_embed",
    "OverlayTextFilter": "conveyor.stages.video.overlay_text",
    "MarkDuplicates": "conveyor.stages.video.dedup",
    "ShardWriter": "conveyor.stages.video.shards",
    "ShotFrameDecoder": "conveyor.stages.video.shots",
    "ShotSplitter": "conveyor.stages.video.split",
    "ShotWindows": "conveyor.stages.video.shots",
    "SplitRules": "conveyor.stages.video.split",
    "TransNetV2Detector": "conveyor.stages.video.shots",
    "VideoListing": "conveyor.stages.video.reader",
    "VideoProbe": "conveyor.stages.video.reader",
    "VideoReader": "conveyor.stages.video.reader",
    "VideoStage": "conveyor.stages.video.base",
    "VideoTypeClassifier": "conveyor.stages.video.video_type",
}

__all__ = [
    "AdaptiveDetector",
    "AestheticFilter",
    "Captioner",
    "ClipEmbedder",
    "ClipFrameExtractor",
    "ClipStage",
    "ClipTranscoder",
    "ClipWriter",
    "ContentDetector",
    "FixedStrideSplitter",
    "FrameConsumer",
    "HistogramDetector",
    "HybridDetector",
    "ImageNetTagger",
    "InputError",
    "MarkDuplicates",
    "MotionFilter",
    "NSFWFilter",
    "OverlayTextFilter",
    "QualityFilter",
    "ShardWriter",
    "ShotFrameDecoder",
    "ShotSplitter",
    "ShotWindows",
    "SplitRules",
    "TextEmbedder",
    "TransNetV2Detector",
    "VideoListing",
    "VideoProbe",
    "VideoReader",
    "VideoStage",
    "VideoTypeClassifier",
]

if TYPE_CHECKING:
    from conveyor.media.errors import InputError
    from conveyor.stages.video.aesthetic import AestheticFilter
    from conveyor.stages.video.base import ClipStage, FrameConsumer, VideoStage
    from conveyor.stages.video.caption import Captioner
    from conveyor.stages.video.cut_detectors import (
        AdaptiveDetector,
        ContentDetector,
        HistogramDetector,
        HybridDetector,
    )
    from conveyor.stages.video.dedup import MarkDuplicates
    from conveyor.stages.video.embed import ClipEmbedder
    from conveyor.stages.video.frames import ClipFrameExtractor
    from conveyor.stages.video.motion import MotionFilter
    from conveyor.stages.video.nsfw import NSFWFilter
    from conveyor.stages.video.overlay_text import OverlayTextFilter
    from conveyor.stages.video.quality import QualityFilter
    from conveyor.stages.video.reader import VideoListing, VideoProbe, VideoReader
    from conveyor.stages.video.shards import ShardWriter
    from conveyor.stages.video.shots import ShotFrameDecoder, ShotWindows, TransNetV2Detector
    from conveyor.stages.video.split import FixedStrideSplitter, ShotSplitter, SplitRules
    from conveyor.stages.video.tags import ImageNetTagger
    from conveyor.stages.video.text_embed import TextEmbedder
    from conveyor.stages.video.transcode import ClipTranscoder
    from conveyor.stages.video.video_type import VideoTypeClassifier
    from conveyor.stages.video.writer import ClipWriter

__getattr__ = lazy_getattr("conveyor.stages.video", _EXPORTS, globals())
