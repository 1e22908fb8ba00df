"""The simulator models generator stages: outputs spread over each task's service time,
paused while the next stage has no room, a failure part way retried with nothing twice."""

from __future__ import annotations

from collections import Counter

from conveyor.executors import StreamingExecutor
from conveyor.result import RunResult
from conveyor.sim import parse_scenario_text

SCENARIO = """
name: streams
cluster:
  - {name: n, cpus: 8, gpus: 1}
stages:
  - name: split
    streams: true
    model: {service: {mean: 20.0}, output_ratio: 40, failure_rate: 0.3}
  - name: embed
    resources: {cpus: 1, gpus: 1}
    model: {service: {mean: 1.0}}
source: {tasks: 20}
"""


def run(text: str) -> RunResult:
    scenario = parse_scenario_text(text)
    executor = StreamingExecutor(scenario.backend(), edge_max_tasks=32)
    return scenario.pipeline().run(executor, initial_tasks=range(20))


def test_a_generator_stage_streams_pauses_and_retries_without_duplicates() -> None:
    result = run(SCENARIO)
    # each output exactly once (the simulator's outputs are their ids), though nearly a third of
    # the attempts broke off part way and were made again from the start
    assert result.stats["split"].retried > 0
    failed = {f.task for f in result.failures}
    assert all(f.attempts == 3 for f in result.failures)
    made = Counter(result.outputs)
    assert set(made.values()) == {1}
    assert all(label.rsplit(".", 1)[0] in {str(i) for i in range(20)} for label in made)
    complete = [str(i) for i in range(20) if str(i) not in failed]
    assert all(f"{i}.{j}" in made for i in complete for j in range(40))
    # the one GPU takes one output a second: the generators were held to the edge's budget
    assert result.stats["embed"].queue_hwm_tasks <= 40
    # the first output came long before a task's 20 s
    assert result.first_output_s is not None and result.first_output_s < 5.0


def test_without_streams_the_same_work_comes_out_a_task_at_a_time() -> None:
    result = run(SCENARIO.replace("streams: true", "streams: false"))
    assert result.first_output_s is not None and result.first_output_s > 15.0


HANGS = """
name: streams-hang
cluster:
  - {name: n, cpus: 4}
stages:
  - name: split
    streams: true
    timeout_s: 5
    model: {service: {mean: 8.0}, output_ratio: 10, hang_rate: 0.3}
  - name: sink
    model: {service: {mean: 0.1}}
source: {tasks: 20}
"""


def test_a_generator_that_stops_making_outputs_is_killed_at_its_timeout() -> None:
    # each output comes 0.8 s after the one before, 8 s a task: well within a 5 s gap, so
    # only a hung attempt (it makes none) is killed, 5 s after it started
    result = run(HANGS)
    assert result.stats["split"].timeouts > 0
    assert all(f.error_type == "TaskTimeout" and f.attempts == 3 for f in result.failures)
    done = {str(i) for i in range(20)} - {f.task for f in result.failures}
    made = Counter(result.outputs)
    assert set(made.values()) == {1}
    assert {label.rsplit(".", 1)[0] for label in made} == done
