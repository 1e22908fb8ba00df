"""NeMo Curator's ``RayClient``: the Ray cluster its tutorials start before a pipeline runs.

``RayClient().start()`` starts a Ray cluster on this machine for this process (Conveyor's
private cluster: loopback addresses, its own temporary folder, the dashboard on 127.0.0.1
where ``ray[default]`` is installed), unless ``RAY_ADDRESS`` names one already, which it
joins. ``RayDataExecutor`` and ``RayActorPoolExecutor`` then run on it; ``XennaExecutor``
runs on this machine without Ray either way (``XennaExecutor(backend=RayBackend())`` puts it
on Ray). ``stop()`` (or leaving its ``with`` block, or the interpreter's exit) stops a
cluster it started and leaves one it joined.

Ray picks its own ports for a cluster started in a process, so the port settings NeMo
Curator's client takes, its stdout capture file and object spilling are warned about, not
taken; ``num_cpus``, ``num_gpus``, ``include_dashboard``, ``ray_dashboard_host``,
``ray_dashboard_port`` and ``ray_temp_dir`` are.
"""

from __future__ import annotations

import atexit
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

#: settings of NeMo Curator's client with no effect here, and their defaults
_NOT_TAKEN = {
    "ray_port": 6379,
    "ray_client_server_port": 10001,
    "ray_metrics_port": 8080,
    "enable_object_spilling": False,
    "ray_stdouterr_capture_file": None,
}


@dataclass
class RayClient:
    """A Ray cluster for the pipelines of this process (see the module docstring)."""

    ray_port: int = 6379
    ray_dashboard_port: int = 8265
    ray_client_server_port: int = 10001
    ray_temp_dir: str | None = None
    include_dashboard: bool = True
    ray_metrics_port: int = 8080
    ray_dashboard_host: str = "127.0.0.1"
    num_gpus: int | None = None
    num_cpus: int | None = None
    enable_object_spilling: bool = False
    ray_stdouterr_capture_file: str | None = None
    connection: Any = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        for spec in fields(self):
            if spec.name in _NOT_TAKEN and getattr(self, spec.name) != _NOT_TAKEN[spec.name]:
                warnings.warn(
                    f"RayClient: {spec.name}={getattr(self, spec.name)!r} has no effect here "
                    "(Ray picks the ports of a cluster started in this process, and its "
                    "output goes to its own logs)",
                    UserWarning,
                    stacklevel=3,
                )

    def start(self) -> None:
        """Start (or join, with ``RAY_ADDRESS``) the cluster; a second call does nothing."""
        if self.connection is not None:
            return
        from conveyor.backends.ray import RayConnection, dashboard_available

        init: dict[str, Any] = {}
        if self.ray_temp_dir is not None:
            init["_temp_dir"] = self.ray_temp_dir
        if not self.include_dashboard or not dashboard_available():
            init["include_dashboard"] = False
        else:
            init["dashboard_host"] = self.ray_dashboard_host
            init["dashboard_port"] = self.ray_dashboard_port
        connection = RayConnection()  # joins RAY_ADDRESS's cluster, with its resources
        if connection.target() is None:  # a cluster of our own: its settings apply
            connection = RayConnection(
                num_cpus=self.num_cpus, num_gpus=self.num_gpus, init_kwargs=init
            )
        connection.connect()
        self.connection = connection
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the cluster this client started (a joined one goes on); safe twice."""
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.disconnect()
            atexit.unregister(self.stop)

    def __enter__(self) -> RayClient:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
