"""Technical quality: images too small, of an extreme aspect ratio, or blank.

Each image gets ``aspect_ratio`` (longer side over shorter) and ``contrast`` (the standard
deviation of its working copy's grey levels, 0-255) as scores, and is filtered by the first
rule it breaks: ``too_small`` (shorter side under ``min_size`` pixels), ``aspect_ratio``
(over ``max_aspect``), ``blank`` (contrast under ``min_contrast``: one flat colour, a
placeholder). ``score_only`` records the scores and filters nothing.
"""

from __future__ import annotations

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.image.base import ImageStage
from conveyor.tasks.image import ImageRecord

#: luma weights of ITU-R BT.601, as Pillow's ``convert("L")`` uses them
LUMA = np.asarray([0.299, 0.587, 0.114], np.float32)


class ImageQualityFilter(ImageStage):
    """Score each image's aspect ratio and contrast; filter small, extreme and blank ones."""

    resources = Resources(cpus=0.25)

    def __init__(
        self,
        min_size: int = 64,
        max_aspect: float = 4.0,
        min_contrast: float = 2.0,
        *,
        score_only: bool = False,
    ) -> None:
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise ValueError(f"min_size must be an int >= 0, got {min_size!r}")
        if not max_aspect >= 1:
            raise ValueError(f"max_aspect must be >= 1, got {max_aspect}")
        if not 0 <= min_contrast <= 255:
            raise ValueError(f"min_contrast must be in [0, 255], got {min_contrast}")
        self.min_size = min_size
        self.max_aspect = max_aspect
        self.min_contrast = min_contrast
        self.score_only = score_only

    def process_image(self, image: ImageRecord) -> None:
        if image.pixels is None:
            return
        short, long = sorted((image.width, image.height))
        aspect = long / short
        contrast = float((image.pixels.astype(np.float32) @ LUMA).std())
        image.scores["aspect_ratio"] = round(aspect, 4)
        image.scores["contrast"] = round(contrast, 4)
        if self.score_only:
            return
        if short < self.min_size:
            image.reject("too_small")
        elif aspect > self.max_aspect:
            image.reject("aspect_ratio")
        elif contrast < self.min_contrast:
            image.reject("blank")
