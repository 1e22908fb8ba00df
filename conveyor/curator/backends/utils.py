"""``nemo_curator.backends.utils``'s ``RayStageSpecKeys``: the keys a stage's
``ray_stage_spec()`` may return (what each means here: ``conveyor.curator.adapter``)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RayStageSpecKeys"]


class RayStageSpecKeys(StrEnum):
    IS_ACTOR_STAGE = "is_actor_stage"
    IS_FANOUT_STAGE = "is_fanout_stage"
    IS_RAFT_ACTOR = "is_raft_actor"
    IS_LSH_STAGE = "is_lsh_stage"
    IS_SHUFFLE_STAGE = "is_shuffle_stage"
    MAX_CALLS_PER_WORKER = "max_calls_per_worker"
    MIN_WORKERS = "min_workers"
    MAX_WORKERS = "max_workers"
    INITIAL_WORKERS = "initial_workers"
    RAY_REMOTE_ARGS = "ray_remote_args"
    RAY_NUM_CPUS = "ray_num_cpus"
