"""``nemo_curator.backends.xenna.executor``'s name."""

from conveyor.curator.backends.xenna import XennaExecutor

__all__ = ["XennaExecutor"]
