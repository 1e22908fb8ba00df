"""The frame-sampling names of ``nemo_curator.utils.decoder_utils`` that stages use as keys
of ``Clip.extracted_frames``.

Conveyor's frame extractor (``conveyor.stages.video.ClipFrameExtractor``) samples whole-clip
sequences; a Curator-style stage finds them under
``FrameExtractionSignature(FrameExtractionPolicy.sequence, fps).to_str()``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FrameExtractionPolicy(enum.Enum):
    """Which frames of a clip: one of three, or a sequence at a rate."""

    first = 0
    middle = 1
    last = 2
    sequence = 3


class FramePurpose(enum.Enum):
    """What frames are for; the value is the sampling rate (fps) NeMo Curator uses."""

    AESTHETICS = 1
    EMBEDDINGS = 2


@dataclass
class FrameExtractionSignature:
    """A policy and a rate: ``to_str()`` is the frames' key in ``Clip.extracted_frames``."""

    extraction_policy: FrameExtractionPolicy
    target_fps: float

    def to_str(self) -> str:
        return f"{self.extraction_policy!s}-{int(self.target_fps * 1000)}"
