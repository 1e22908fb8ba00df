"""The media code the stages run, none of it a stage: decoding video with PyAV (``decode``),
what counts as bad input (``errors``), the video output's layout and clip table (``layout``,
``table``), shot transitions (``transitions``), loading image models and the MiniLM sentence
encoder (``models``, ``minilm``) and filling tar shards (``tar_shards``). Names are imported
on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr

_EXPORTS = {
    "InputError": "conveyor.media.errors",
    "OutputLayout": "conveyor.media.layout",
    "SentenceEncoder": "conveyor.media.minilm",
    "TarShardBook": "conveyor.media.tar_shards",
    "probe": "conveyor.media.decode",
}

__all__ = ["InputError", "OutputLayout", "SentenceEncoder", "TarShardBook", "probe"]

if TYPE_CHECKING:
    from conveyor.media.decode import probe
    from conveyor.media.errors import InputError
    from conveyor.media.layout import OutputLayout
    from conveyor.media.minilm import SentenceEncoder
    from conveyor.media.tar_shards import TarShardBook

__getattr__ = lazy_getattr("conveyor.media", _EXPORTS, globals())
