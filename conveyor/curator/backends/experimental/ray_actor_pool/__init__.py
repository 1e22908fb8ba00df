"""``nemo_curator.backends.experimental.ray_actor_pool``'s name for
``RayActorPoolExecutor``."""

from conveyor.curator.backends.ray_actor_pool import RayActorPoolExecutor

__all__ = ["RayActorPoolExecutor"]
