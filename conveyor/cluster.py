"""What a stage's hooks are told about where they run: the node and the worker."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One machine of the cluster as the backend sees it."""

    node_id: str
    cpus: float
    gpus: int = 0
    gpu_memory_gb: float | None = None
    address: str = "127.0.0.1"
    #: host memory the engine's workers may take on this node, in bytes (``None``: unknown,
    #: no limit); the autoscaler and placement count each worker's measured peak against it
    memory_bytes: int | None = None
    #: video decoder and encoder units (NVDEC, NVENC) of each of its GPUs (``None``: unknown,
    #: not a limit); ``Resources(nvdecs=, nvencs=)`` are placed against them
    nvdecs_per_gpu: float | None = None
    nvencs_per_gpu: float | None = None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker of a stage: passed to ``setup_on_node`` and ``setup``."""

    worker_id: str
    stage: str
    node_id: str
    gpu_ids: tuple[int, ...] = field(default_factory=tuple)
    gpu_fraction: float = 0.0
