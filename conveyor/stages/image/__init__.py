"""Image curation stages: read a part of the input, decode and normalise, score (quality,
NSFW, aesthetics), embed and tag, write; deduplication and shard packing after the stream.
Heavy imports (Pillow, torch, onnxruntime) happen when a stage is used."""

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr

_EXPORTS = {
    "ImageAestheticFilter": "conveyor.stages.image.models",
    "ImageDecoder": "conveyor.stages.image.decode",
    "ImageEmbedder": "conveyor.stages.image.models",
    "ImageLayout": "conveyor.stages.image.layout",
    "ImageNSFWFilter": "conveyor.stages.image.models",
    "ImageQualityFilter": "conveyor.stages.image.quality",
    "ImageReader": "conveyor.stages.image.read",
    "ImageSources": "conveyor.stages.image.sources",
    "ImageStage": "conveyor.stages.image.base",
    "ImageTagger": "conveyor.stages.image.models",
    "ImageWriter": "conveyor.stages.image.writer",
    "deduplicate": "conveyor.stages.image.dedup",
    "pack_shards": "conveyor.stages.image.shards",
}

__all__ = [
    "ImageAestheticFilter",
    "ImageDecoder",
    "ImageEmbedder",
    "ImageLayout",
    "ImageNSFWFilter",
    "ImageQualityFilter",
    "ImageReader",
    "ImageSources",
    "ImageStage",
    "ImageTagger",
    "ImageWriter",
    "deduplicate",
    "pack_shards",
]

if TYPE_CHECKING:
    from conveyor.stages.image.base import ImageStage
    from conveyor.stages.image.decode import ImageDecoder
    from conveyor.stages.image.dedup import deduplicate
    from conveyor.stages.image.layout import ImageLayout
    from conveyor.stages.image.models import (
        ImageAestheticFilter,
        ImageEmbedder,
        ImageNSFWFilter,
        ImageTagger,
    )
    from conveyor.stages.image.quality import ImageQualityFilter
    from conveyor.stages.image.read import ImageReader
    from conveyor.stages.image.shards import pack_shards
    from conveyor.stages.image.sources import ImageSources
    from conveyor.stages.image.writer import ImageWriter

__getattr__ = lazy_getattr("conveyor.stages.image", _EXPORTS, globals())
