"""NeMo Curator's ``Resources``: its field order and its 1.x video fields, as Conveyor's.

Curator 1.x took ``Resources(cpus, gpu_memory_gb, gpus, nvdecs, nvencs, entire_gpu)``;
Conveyor's own order is ``(cpus, gpus, gpu_memory_gb, memory_gb)``. This class takes
Curator's (positionally too) and *is* a ``conveyor.Resources``, so the engine reads it as is.

How the video fields map: ``nvdecs``/``nvencs`` are Conveyor's own resources (video
decoder and encoder units of a GPU, placed so that no GPU's units are oversubscribed);
``entire_gpu=True`` reserves one whole GPU, with its decoder and encoder units, which is
what NeMo Curator meant by it. ``gpu_memory_gb`` becomes a GPU fraction where the worker is
placed (Curator turns it into a fraction on the driver, from GPU 0), so a cluster of
different GPUs is sized per node.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conveyor.resources import Resources as _Resources


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Resources(_Resources):
    """Per-worker request in NeMo Curator's terms (see the module docstring)."""

    entire_gpu: bool = False

    def __init__(
        self,
        cpus: float = 1.0,
        gpu_memory_gb: float = 0.0,
        gpus: float = 0.0,
        nvdecs: float = 0.0,
        nvencs: float = 0.0,
        entire_gpu: bool = False,
        memory_gb: float = 0.0,
    ) -> None:
        if not isinstance(entire_gpu, bool):
            raise TypeError(f"Resources.entire_gpu must be True or False, got {entire_gpu!r}")
        if entire_gpu:
            if gpu_memory_gb or (gpus and gpus != 1):
                raise ValueError(
                    "Resources: entire_gpu=True reserves one whole GPU; leave gpus and "
                    f"gpu_memory_gb unset (got gpus={gpus}, gpu_memory_gb={gpu_memory_gb})"
                )
            gpus = 1.0
        setattr_ = object.__setattr__
        for name, value in (
            ("cpus", cpus),
            ("gpus", gpus),
            ("gpu_memory_gb", gpu_memory_gb),
            ("memory_gb", memory_gb),
            ("nvdecs", nvdecs),
            ("nvencs", nvencs),
            ("entire_gpu", entire_gpu),
        ):
            setattr_(self, name, value)
        self.__post_init__()

    @property
    def requires_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_memory_gb > 0 or self.entire_gpu

    def native(self) -> _Resources:
        """The same request as a plain ``conveyor.Resources`` (what the engine schedules)."""
        return _Resources(
            self.cpus, self.gpus, self.gpu_memory_gb, self.memory_gb, self.nvdecs, self.nvencs
        )


def as_resources(value: Any, stage: str) -> _Resources:
    """A stage's ``resources`` as the engine's: Curator's class, ours, or the dict Curator's
    ``@processing_stage`` also takes; anything else is an error naming the stage."""
    if isinstance(value, Resources):
        return value.native()
    if isinstance(value, _Resources):
        return value
    if isinstance(value, dict):
        try:
            return Resources(**value).native()
        except TypeError as exc:
            raise ValueError(f"stage {stage!r}: resources {value!r}: {exc}") from None
    raise TypeError(
        f"stage {stage!r}: resources must be a Resources (or a dict of its fields), got {value!r}"
    )
