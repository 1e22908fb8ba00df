"""Lazy re-exports for package ``__init__`` files: names are imported on first use.

Worker processes import only the few modules they need, so keeping package imports lazy is
what lets them start fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_getattr(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``exports[name]`` and caches the value."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
