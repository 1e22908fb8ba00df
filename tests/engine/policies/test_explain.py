"""Why the autoscaler moved a target, in words (the run report and event log show them)."""

from __future__ import annotations

from conveyor.engine.policies.autoscale import StageObservation, explain


def obs(name: str, task_time: float | None, workers: int, backlog: int, **kw: object):
    return StageObservation(
        name, cpus=1.0, gpus=0.0, task_time_s=task_time, workers=workers, backlog=backlog, **kw
    )


def test_the_bottleneck_is_named_with_its_pace() -> None:
    stages = [obs("read", 0.01, 1, 5), obs("infer", 0.5, 1, 40)]
    reasons = explain(stages, before=[1, 1], after=[1, 4])
    assert reasons[0] is None
    assert reasons[1] is not None and reasons[1].startswith("bottleneck")
    assert "2 source tasks/s" in reasons[1] and "40 queued" in reasons[1]


def test_a_stage_giving_back_workers_says_who_limits() -> None:
    stages = [obs("read", 0.01, 6, 50), obs("infer", 0.5, 1, 40)]
    reasons = explain(stages, before=[6, 1], after=[2, 1])
    assert reasons[0] is not None and reasons[0].startswith("spare capacity")
    assert "infer limits the pipeline to 2 source tasks/s" in reasons[0]


def test_finished_pinned_unmeasured_and_idle_stages() -> None:
    stages = [
        obs("done", 0.1, 2, 0, upstream_done=True),
        obs("pinned", 0.1, 1, 10, pinned=3),
        obs("new", None, 0, 10),
    ]
    reasons = explain(stages, before=[2, 1, 0], after=[0, 3, 1])
    assert reasons[0] == "finished: no input left"
    assert reasons[1] == "pinned to 3 workers"
    assert reasons[2] == "first worker of a stage with work"
    measured = [obs("a", 0.1, 4, 2), obs("b", 0.2, 4, 100)]
    assert explain(measured, [4, 4], [2, 4])[0] == "little work left: 2 queued for 4 workers"


def test_a_stage_cut_for_memory_says_so_with_the_figures() -> None:
    from conveyor.engine.policies.autoscale import Budget

    stages = [obs("infer", 0.5, 6, 100, memory_bytes=2**30)]
    budget = Budget(cpus=8, gpus=0, memory_bytes=4 * 2**30)
    reason = explain(stages, [6], [4], budget)[0]
    assert reason == "over the memory limit: 6 workers of 1024 MB each, 4.0 GB for all workers"
    # the same cut within the budget is spare capacity, not memory
    roomy = Budget(cpus=8, gpus=0, memory_bytes=64 * 2**30)
    assert not (explain(stages, [6], [4], roomy)[0] or "").startswith("over the memory")
