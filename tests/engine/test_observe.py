"""Stage measurements: EWMA task time, fan-out, output size and setup time."""

from __future__ import annotations

import pytest

from conveyor.engine.observe import Ewma, StageMeter


# -- Ewma ---------------------------------------------------------------------------------
def test_ewma_starts_unset() -> None:
    assert Ewma().value is None
    assert Ewma().alpha == 0.3


def test_first_sample_is_taken_as_is() -> None:
    ewma = Ewma(alpha=0.1)
    ewma.update(7.0)
    assert ewma.value == 7.0


def test_later_samples_move_the_mean_by_alpha() -> None:
    ewma = Ewma(alpha=0.25)
    ewma.update(10.0)
    ewma.update(20.0)
    assert ewma.value == pytest.approx(12.5)
    ewma.update(20.0)
    assert ewma.value == pytest.approx(14.375)


def test_weight_scales_the_step() -> None:
    ewma = Ewma(alpha=0.1, value=0.0)
    ewma.update(10.0, weight=3.0)
    assert ewma.value == pytest.approx(3.0)


def test_step_is_capped_at_the_sample() -> None:
    ewma = Ewma(alpha=0.5, value=1.0)
    ewma.update(9.0, weight=10.0)
    assert ewma.value == 9.0


def test_zero_weight_leaves_the_mean() -> None:
    ewma = Ewma(alpha=0.5, value=4.0)
    ewma.update(100.0, weight=0.0)
    assert ewma.value == 4.0


def test_converges_to_a_constant_input() -> None:
    ewma = Ewma()
    ewma.update(100.0)
    for _ in range(60):
        ewma.update(1.0)
    assert ewma.value == pytest.approx(1.0, abs=1e-6)


# -- StageMeter ---------------------------------------------------------------------------
def test_new_meter_is_unmeasured() -> None:
    meter = StageMeter()
    assert not meter.measured
    assert meter.task_time.value is None
    assert meter.fanout.value is None
    assert meter.out_bytes.value is None
    assert meter.setup_s.value is None


def test_record_measures_per_input_task() -> None:
    meter = StageMeter()
    meter.record(tasks_in=4, tasks_out=8, out_bytes=4000, busy_s=2.0)
    assert meter.measured
    assert meter.task_time.value == pytest.approx(0.5)
    assert meter.fanout.value == pytest.approx(2.0)
    assert meter.out_bytes.value == pytest.approx(1000.0)


def test_before_the_first_roll_values_are_running_totals() -> None:
    meter = StageMeter()
    meter.record(tasks_in=1, tasks_out=1, out_bytes=100, busy_s=1.0)
    meter.record(tasks_in=2, tasks_out=0, out_bytes=0, busy_s=4.0)
    # weighted by tasks: 5 s over 3 tasks, 1 output over 3 inputs
    assert meter.task_time.value == pytest.approx(5 / 3)
    assert meter.fanout.value == pytest.approx(1 / 3)
    assert meter.out_bytes.value == pytest.approx(100 / 3)


def test_roll_folds_one_interval_at_a_time_weighted_by_tasks() -> None:
    meter = StageMeter()
    meter.record(tasks_in=2, tasks_out=2, out_bytes=0, busy_s=2.0)
    meter.roll()
    assert meter.rolled and meter.task_time.value == pytest.approx(1.0)
    # a full interval (SAMPLE_TASKS tasks or more) moves the mean by alpha = 0.5
    for _ in range(StageMeter.SAMPLE_TASKS):
        meter.record(tasks_in=1, tasks_out=3, out_bytes=30, busy_s=2.0)
    assert meter.task_time.value == pytest.approx(1.0)  # unchanged until the roll
    meter.roll()
    assert meter.task_time.value == pytest.approx(1.5)
    assert meter.fanout.value == pytest.approx(1.0 + 0.5 * (3.0 - 1.0))
    meter.roll()  # an interval without batches changes nothing
    assert meter.task_time.value == pytest.approx(1.5)


def test_a_handful_of_long_tasks_moves_the_mean_a_little() -> None:
    meter = StageMeter()
    meter.record(tasks_in=10, tasks_out=10, out_bytes=0, busy_s=10.0)
    meter.roll()
    meter.record(tasks_in=1, tasks_out=1, out_bytes=0, busy_s=3.0)  # one noisy long task
    meter.roll()
    weight = max(StageMeter.MIN_WEIGHT, 1 / StageMeter.SAMPLE_TASKS)
    assert meter.task_time.value == pytest.approx(1.0 + 0.5 * weight * (3.0 - 1.0))


def test_filtering_batch_gives_zero_fanout() -> None:
    meter = StageMeter()
    meter.record(tasks_in=10, tasks_out=0, out_bytes=0, busy_s=1.0)
    assert meter.fanout.value == 0.0
    assert meter.task_time.value == pytest.approx(0.1)


@pytest.mark.parametrize("tasks_in", [0, -1])
def test_batches_without_inputs_are_ignored(tasks_in: int) -> None:
    meter = StageMeter()
    meter.record(tasks_in=tasks_in, tasks_out=5, out_bytes=10, busy_s=3.0)
    assert not meter.measured
    assert meter.fanout.value is None


def test_setup_time_is_smoothed_with_its_own_alpha() -> None:
    meter = StageMeter()
    assert meter.setup_s.alpha == 0.5
    meter.setup_s.update(90.0)
    meter.setup_s.update(30.0)
    assert meter.setup_s.value == pytest.approx(60.0)
    assert not meter.measured  # setup alone does not count as a task-time measurement


def test_meters_do_not_share_state() -> None:
    a, b = StageMeter(), StageMeter()
    a.record(1, 1, 1, 1.0)
    assert b.task_time.value is None


@pytest.mark.parametrize(
    ("held_s", "task_time"),
    [
        (1.01, 1.0),  # within the tolerance: when results are seen jitters, it is not a cost
        (1.5, 1.5),  # a call held the worker half as long again: that is its capacity
        (2.5, 1.0),  # far beyond the work: the worker waited on the dispatcher, not on itself
        (None, 1.0),  # not given: the busy time
    ],
)
def test_task_time_is_what_a_worker_is_held_within_bounds(
    held_s: float | None, task_time: float
) -> None:
    meter = StageMeter()
    meter.record(
        tasks_in=2,
        tasks_out=2,
        out_bytes=0,
        busy_s=2.0,
        held_s=None if held_s is None else 2 * held_s,
    )
    assert meter.task_time.value == pytest.approx(task_time)
    assert meter.busy_time.value == pytest.approx(1.0)  # messages are sized by the work
    meter.roll()
    meter.record(tasks_in=2, tasks_out=2, out_bytes=0, busy_s=2.0, held_s=1.0)  # below busy
    meter.roll()
    assert meter.busy_time.value == pytest.approx(1.0)
    assert meter.task_time.value == pytest.approx(task_time + 0.5 * 0.1 * (1.0 - task_time))


def test_meter_keeps_cpu_time_only_where_it_is_measured() -> None:
    meter = StageMeter()
    meter.record(2, 2, 0, busy_s=2.0)
    assert meter.cpu_time.value is None
    meter.record(2, 2, 0, busy_s=2.0, cpu_s=1.0)
    assert meter.cpu_time.value == pytest.approx(0.25)  # 1 s over the 4 tasks so far
    meter.roll()
    meter.record(4, 4, 0, busy_s=4.0, cpu_s=4.0)
    meter.roll()
    assert 0.25 < meter.cpu_time.value < 1.0
