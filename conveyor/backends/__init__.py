"""Backends turn the controller's decisions into real workers."""

from conveyor.backends.base import Backend
from conveyor.backends.local import LocalBackend

__all__ = ["Backend", "LocalBackend"]
