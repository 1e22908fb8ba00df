"""Backends turn the controller's decisions into real workers (imported on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr

_EXPORTS = {
    "Backend": "conveyor.backends.base",
    "LocalBackend": "conveyor.backends.local",
    "RayBackend": "conveyor.backends.ray",
    "SimulatedBackend": "conveyor.backends.simulated",
}

__all__ = ["Backend", "LocalBackend", "RayBackend", "SimulatedBackend"]

if TYPE_CHECKING:
    from conveyor.backends.base import Backend
    from conveyor.backends.local import LocalBackend
    from conveyor.backends.ray import RayBackend
    from conveyor.backends.simulated import SimulatedBackend


if not TYPE_CHECKING:  # a type checker sees the names imported above, and no others
    __getattr__ = lazy_getattr("conveyor.backends", _EXPORTS, globals())
