"""Backends turn the controller's decisions into real workers (imported on first use)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Backend": "conveyor.backends.base",
    "LocalBackend": "conveyor.backends.local",
}

__all__ = ["Backend", "LocalBackend"]

if TYPE_CHECKING:
    from conveyor.backends.base import Backend
    from conveyor.backends.local import LocalBackend


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor.backends' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
