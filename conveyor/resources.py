"""What one worker of a stage needs: CPUs, host memory, and GPUs as a count/fraction or as memory.

``gpu_memory_gb`` is deliberately *not* turned into a GPU fraction here: the right fraction
depends on the GPU of the node where the worker lands, which only placement knows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resources:
    """Per-worker resource request.

    - ``cpus``: cores reserved per worker; fractional values let several I/O-bound workers share
      a core.
    - ``gpus``: below 1 a fraction of one GPU (workers are packed onto a device); 1 or more must
      be a whole number of GPUs on one node.
    - ``gpu_memory_gb``: alternative to ``gpus``; becomes a fraction of the GPU where the worker
      is placed.
    - ``memory_gb``: host memory one worker needs at its peak (its model, buffers, activations).
      A floor: the engine measures what workers really take and counts the larger figure
      against the nodes' memory, so a stage declared too low still cannot exhaust a machine.
    - ``nvdecs``, ``nvencs``: video decoder and encoder units (NVDEC, NVENC) of one GPU the
      worker keeps busy, fractions allowed (two workers of ``nvdecs=0.5`` share a unit). The
      worker lands on a GPU with that many units free (the node's count per GPU: declared,
      or known from the GPU's model), so no GPU's units are oversubscribed; with
      ``gpus=0`` it gets the device without a share of its compute. A worker of whole GPUs
      holds their units whole.
    """

    cpus: float = 1.0
    gpus: float = 0.0
    gpu_memory_gb: float = 0.0
    memory_gb: float = 0.0
    nvdecs: float = 0.0
    nvencs: float = 0.0

    def __post_init__(self) -> None:
        for field in ("cpus", "gpus", "gpu_memory_gb", "memory_gb", "nvdecs", "nvencs"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"Resources.{field} must be a number, got {value!r}")
            if math.isnan(value) or math.isinf(value):
                raise ValueError(f"Resources.{field} must be finite, got {value!r}")
            if value < 0:
                raise ValueError(f"Resources.{field} must be >= 0, got {value!r}")
        if self.gpus > 0 and self.gpu_memory_gb > 0:
            raise ValueError(
                "Resources: set either gpus or gpu_memory_gb, not both "
                f"(got gpus={self.gpus}, gpu_memory_gb={self.gpu_memory_gb})"
            )
        if self.gpus > 1 and self.gpus != int(self.gpus):
            raise ValueError(
                f"Resources.gpus above 1 must be a whole number of GPUs, got {self.gpus}; "
                "use a fraction below 1 to share one GPU"
            )

    @property
    def requires_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_memory_gb > 0

    @property
    def video_engines(self) -> bool:
        """Whether the worker asks for NVDEC or NVENC units (and so for a GPU device)."""
        return self.nvdecs > 0 or self.nvencs > 0

    @property
    def whole_gpus(self) -> int:
        """Number of whole GPUs (0 for CPU-only or fractional workers)."""
        return int(self.gpus) if self.gpus >= 1 else 0

    def gpu_fraction(self, gpu_memory_gb_of_node: float | None) -> float:
        """GPU share of one device for a fractional worker, resolved against the node's GPU.

        Raises ``ValueError`` when memory is requested but the node's GPU memory is unknown or
        too small, naming both numbers.
        """
        if self.gpu_memory_gb <= 0:
            return self.gpus if self.gpus < 1 else 0.0
        if not gpu_memory_gb_of_node:
            raise ValueError(
                f"Resources.gpu_memory_gb={self.gpu_memory_gb} needs the GPU memory of the node, "
                "which is unknown (declare it: gpu_memory_gb=80 on LocalBackend, RayBackend or "
                "RayDataExecutor)"
            )
        if self.gpu_memory_gb > gpu_memory_gb_of_node:
            raise ValueError(
                f"Resources.gpu_memory_gb={self.gpu_memory_gb} exceeds one GPU of this node "
                f"({gpu_memory_gb_of_node} GB); ask for whole GPUs with Resources(gpus=N)"
            )
        return self.gpu_memory_gb / gpu_memory_gb_of_node

    def describe(self) -> str:
        parts = [f"cpus={self.cpus:g}"]
        if self.gpus:
            parts.append(f"gpus={self.gpus:g}")
        if self.gpu_memory_gb:
            parts.append(f"gpu_memory_gb={self.gpu_memory_gb:g}")
        if self.memory_gb:
            parts.append(f"memory_gb={self.memory_gb:g}")
        for name in ("nvdecs", "nvencs"):
            if getattr(self, name):
                parts.append(f"{name}={getattr(self, name):g}")
        return ", ".join(parts)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 2**30)
