"""Backends turn the controller's decisions into real workers (imported on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor._lazy import lazy_getattr

_EXPORTS = {
    "Backend": "conveyor.backends.base",
    "LocalBackend": "conveyor.backends.local",
}

__all__ = ["Backend", "LocalBackend"]

if TYPE_CHECKING:
    from conveyor.backends.base import Backend
    from conveyor.backends.local import LocalBackend


__getattr__ = lazy_getattr("conveyor.backends", _EXPORTS, globals())
