"""The Backend protocol: what any backend must do for the controller, and nothing more.

A backend starts and stops workers where it is told, moves handles, and reports events. It
makes no decisions: how many workers, where, and how much may queue are the policies' job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from conveyor.cluster import NodeInfo
from conveyor.engine.messages import BackendEvent, Handle, WorkerPlacement
from conveyor.engine.spec import StageSpec


@runtime_checkable
class Backend(Protocol):
    """Mechanism only. Implementations: ``LocalBackend`` (worker processes on this machine,
    ``backends/local.py``), ``RayBackend`` (actors on a Ray cluster, ``backends/ray.py``),
    ``SimulatedBackend`` (modelled workers on a virtual clock, ``backends/simulated.py``) and
    its subclass ``conveyor.sim.report.TrackingBackend`` (the same, also keeping what each
    node holds, per device, for the simulator's report). ``RayDataExecutor`` runs a pipeline
    as a Ray Data plan and needs none of them.

    A backend whose stored payloads can vanish while the inputs they came from are fine (a
    cluster's node leaves and takes its object store along) sets the class attribute
    ``payloads_can_be_lost = True`` and reports a read of such a payload as an error with
    ``ErrorInfo.lost``; the controller then keeps each source task until everything made
    from it is done, and makes a lost input again from its source. It must keep a source's
    handle readable for that long (``put`` handles are not consumed by reading them).

    A backend that knows no node will join its cluster any more (this machine; a simulated
    cluster whose joins are past) has a method ``nodes_may_join() -> bool`` saying so: a
    stage then left with work and no room for a worker ends the run with a ``BackendError``
    instead of waiting (a Ray cluster's autoscaler may add a node: it waits, and says so).
    """

    #: Bytes that queued payloads may use in all, split across edges by the backpressure policy.
    memory_budget_bytes: int

    def open(self) -> None:
        """Acquire what the run needs (stores, connections). Called once before anything else."""

    def nodes(self) -> list[NodeInfo]:
        """The cluster as it is now; called every autoscale cycle."""

    def now(self) -> float:
        """Monotonic seconds (a virtual clock on the simulator)."""

    def put(self, obj: Any, label: str) -> Handle:
        """Store a driver-side object (a source task) and return its handle."""

    def get(self, handle: Handle) -> Any:
        """Fetch a payload to the driver and release it (last-stage outputs only)."""

    def free(self, handles: Sequence[Handle]) -> None:
        """Release payloads that will never be read (inputs that finally failed)."""

    def start_worker(self, worker_id: str, stage: StageSpec, placement: WorkerPlacement) -> None:
        """Start a worker; ``WorkerReady`` or ``WorkerSetupFailed`` follows from ``poll``."""

    def stop_worker(self, worker_id: str) -> None:
        """Let the worker finish what it holds, tear down, and report ``WorkerStopped``."""

    def kill_worker(self, worker_id: str) -> None:
        """Kill a worker at once, whatever it is doing (a batch ran past its stage's
        ``timeout_s``); its death may still be reported, and is then ignored."""

    def submit(
        self,
        worker_id: str,
        batches: list[tuple[int, list[Handle]]],
        threads: int | None = None,
        allowance: int | None = None,
    ) -> None:
        """Hand batches ``(batch_id, handles)`` to a ready worker; ``threads``: how many CPU
        threads they may use (the stage's ``threads`` while they run), ``None`` for the
        stage's own CPUs.

        For a generator stage (``StageSpec.streams``) each output is reported as it is made
        (``BatchOutputs``), and each batch makes at most ``allowance`` outputs (``None``: no
        limit) before its generator is paused at its ``yield`` until ``resume`` allows more:
        backpressure reaches into a batch that is running."""

    def resume(self, worker_id: str, batch_id: int, outputs: int) -> None:
        """Let a running generator batch make ``outputs`` more outputs than it was allowed
        (a batch that ended meanwhile ignores it)."""

    def poll(self, timeout: float) -> list[BackendEvent]:
        """Events since the last call, waiting up to ``timeout`` seconds for the first."""

    def shutdown(self) -> None:
        """Stop every worker (teardown runs), release everything; safe to call twice."""
