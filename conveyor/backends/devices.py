"""What this machine offers: CPUs and GPUs (NVML when available, else device files).

``CUDA_VISIBLE_DEVICES``, when set, restricts and orders the GPUs the way CUDA would.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInventory:
    physical_ids: tuple[str, ...]
    memory_gb: float | None
    #: the first GPU's model as NVML names it ("NVIDIA H100 80GB HBM3"), if known
    name: str | None = None

    @property
    def video_engines(self) -> tuple[int | None, int | None]:
        """NVDEC and NVENC units of one GPU of this model (``None``: not known)."""
        return video_engines(self.name)


#: NVDEC and NVENC units per GPU of the models we know (NVIDIA's video codec support
#: matrix); matched on the model name's words, the longest match first
VIDEO_ENGINES: dict[str, tuple[int, int]] = {
    "H200": (7, 0),
    "H100": (7, 0),
    "H800": (7, 0),
    "GH200": (7, 0),
    "A100": (5, 0),
    "A800": (5, 0),
    "A30": (4, 0),
    "L40S": (3, 3),
    "L40": (3, 3),
    "L4": (4, 2),
    "A40": (2, 1),
    "A10": (2, 1),
    "A10G": (2, 1),
    "A2": (2, 1),
    "T4": (2, 1),
    "V100": (1, 3),
    "RTX 6000 Ada": (3, 3),
}


def video_engines(name: str | None) -> tuple[int | None, int | None]:
    """NVDEC and NVENC units per GPU for a GPU model name (``None``: an unknown model)."""
    if not name:
        return None, None
    words = name.upper().replace("-", " ").split()
    for model in sorted(VIDEO_ENGINES, key=len, reverse=True):
        parts = model.upper().split()
        if any(words[i : i + len(parts)] == parts for i in range(len(words))):
            return VIDEO_ENGINES[model]
    return None, None


def detect_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _nvml() -> tuple[list[str], float | None, str | None] | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: no GPUs
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        mem = name = None
        if count:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
            raw = pynvml.nvmlDeviceGetName(handle)
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
        return [str(i) for i in range(count)], mem, name
    finally:
        pynvml.nvmlShutdown()


def detect_gpus() -> GpuInventory:
    found = _nvml()
    if found is None:
        ids = sorted(
            (p.removeprefix("/dev/nvidia") for p in glob.glob("/dev/nvidia[0-9]*")), key=int
        )
        found = (ids, None, None)
    ids, mem, name = found
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        ids = [v for v in wanted if v in ids]
    return GpuInventory(tuple(ids), mem, name)
