"""``nemo_curator.backends.experimental.ray_data``'s name for ``RayDataExecutor``."""

from conveyor.curator.backends.ray_data import RayDataExecutor

__all__ = ["RayDataExecutor"]
