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


def detect_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _nvml() -> tuple[list[str], float | None] | None:
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
        mem = None
        if count:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        return [str(i) for i in range(count)], mem
    finally:
        pynvml.nvmlShutdown()


def detect_gpus() -> GpuInventory:
    found = _nvml()
    if found is None:
        ids = sorted(
            (p.removeprefix("/dev/nvidia") for p in glob.glob("/dev/nvidia[0-9]*")), key=int
        )
        found = (ids, None)
    ids, mem = found
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        ids = [v for v in wanted if v in ids]
    return GpuInventory(tuple(ids), mem)
