"""The water-filling: its leap lands where adding workers one by one lands, to the last bit."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from conveyor.engine.policies import water_fill
from conveyor.engine.policies.water_fill import _books, _first_at, _leap, fill


@dataclass(frozen=True)
class Shape:
    cpus: float = 1.0
    gpus: float = 0.0
    memory_bytes: float | None = 0.0
    nvdecs: float = 0.0
    nvencs: float = 0.0
    pinned: int | None = None


def one_by_one(stages, weights, active, wanted, limits, rooms, pace_cap=math.inf):
    """The filling as it was written first: one heap pop per worker."""
    import heapq

    wanted = list(wanted)
    cpus, gpus, memory, decoders, encoders = rooms
    heap = [(wanted[i] / weights[i], i) for i in range(len(stages)) if active[i]]
    heapq.heapify(heap)
    while heap:
        pace, i = heapq.heappop(heap)
        s = stages[i]
        if s.pinned is not None:
            break
        if wanted[i] >= limits[i]:
            continue
        if pace >= pace_cap:
            break
        need = water_fill.needs(s)
        if (
            need[0] > cpus + 1e-9
            or need[1] > gpus + 1e-9
            or need[2] > memory
            or need[3] > decoders + 1e-9
            or need[4] > encoders + 1e-9
        ):
            break
        wanted[i] += 1
        cpus -= need[0]
        gpus -= need[1]
        memory -= need[2]
        decoders -= need[3]
        encoders -= need[4]
        heapq.heappush(heap, (wanted[i] / weights[i], i))
    return wanted


def test_fills_the_slowest_stage_first_until_the_cpus_run_out():
    stages = [Shape(cpus=1.0), Shape(cpus=2.0)]
    # stage 1 weighs twice as much: it gets two workers for each of stage 0's, and the last
    # two CPUs (stage 0 at pace 3, stage 1 at 2)
    got = fill(stages, [1.0, 2.0], [True, True], [1, 1], [100, 100], (10.0, 0, 0, 0, 0))
    assert got == [3, 5]
    assert got == one_by_one(stages, [1.0, 2.0], [True, True], [1, 1], [100, 100], (10.0,) * 5)


def test_a_stage_at_its_limit_leaves_the_rest_to_the_others():
    stages = [Shape(), Shape()]
    rooms = (50.0, 0.0, math.inf, math.inf, math.inf)
    assert fill(stages, [1.0, 1.0], [True, True], [1, 1], [3, 100], rooms) == [3, 49]


def test_a_pinned_stage_stops_the_filling_where_it_is_the_slowest():
    stages = [Shape(), Shape(pinned=2)]
    rooms = (1000.0, 0.0, math.inf, math.inf, math.inf)
    # stage 1's pace is 2 / 4 = 0.5: stage 0 grows until it is as fast, then nothing moves
    assert fill(stages, [1.0, 4.0], [True, True], [1, 2], [100, 2], rooms) == [1, 2]
    assert fill(stages, [0.1, 4.0], [True, True], [1, 2], [100, 2], rooms) == [1, 2]


def test_the_pace_cap_holds_every_stage():
    stages = [Shape(), Shape()]
    rooms = (1e6, 0.0, math.inf, math.inf, math.inf)
    got = fill(stages, [2.0, 1.0], [True, True], [1, 1], [10**6, 10**6], rooms, pace_cap=100.0)
    assert got == [200, 100]


def test_leaps_over_thousands_of_workers_and_leaves_the_last_few_to_the_loop():
    stages = [Shape(cpus=1.0), Shape(cpus=0.5, gpus=1.0), Shape(cpus=4.0), Shape(0.25, 0.25)]
    weights = [12.5, 100.0, 90.0, 180.0]
    wanted = [1, 1, 1, 1]
    limits = [1 << 30] * 4
    rooms = (16000.0, 2000.0 - 1.25, math.inf, math.inf, math.inf)
    leapt = list(wanted)
    left = _leap(stages, weights, [True] * 4, leapt, limits, rooms, math.inf)
    assert sum(leapt) > 5000  # most of the way in one step
    assert left[1] >= 0
    got = fill(stages, weights, [True] * 4, wanted, limits, rooms)
    assert got == one_by_one(stages, weights, [True] * 4, wanted, limits, rooms)


def test_needs_not_exact_in_binary_are_filled_one_by_one():
    stages = [Shape(cpus=0.1), Shape(cpus=0.3)]
    assert _books((100.0, 0.0, 0.0, 0.0, 0.0), [water_fill.needs(s) for s in stages]) is None
    rooms = (100.0, 0.0, math.inf, math.inf, math.inf)
    got = fill(stages, [1.0, 3.0], [True, True], [1, 1], [10**6] * 2, rooms)
    assert got == one_by_one(stages, [1.0, 3.0], [True, True], [1, 1], [10**6] * 2, rooms)


def test_first_at_divides_as_the_filling_does():
    for weight in (0.3, 1.0, 7.7, 1e-9, 123456.789):
        for pace in (0.0, 0.5, 1.0, 3.3333333333333335, 1e6):
            n = _first_at(pace, weight, 0, 10**7)
            assert n == 10**7 or n / weight >= pace
            assert n == 0 or (n - 1) / weight < pace


@pytest.mark.parametrize("seed", range(300))
def test_the_same_workers_as_one_by_one_on_random_stages(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    binary = rng.random() < 0.7  # mostly quantities exact in binary, as real ones are

    def amount(choices, odd):
        return rng.choice(choices) if binary else rng.choice(choices + odd)

    stages = [
        Shape(
            cpus=amount([0.0, 0.25, 0.5, 1.0, 4.0], [0.1, 0.3, 1.7]),
            gpus=amount([0.0, 0.0, 0.25, 1.0, 2.0], [0.2, 0.33]),
            memory_bytes=rng.choice([None, 0.0, 2.0**30, 3 * 2.0**29]),
            nvdecs=amount([0.0, 0.0, 1.0], [0.3]),
            nvencs=amount([0.0, 0.0, 0.5], [0.7]),
            pinned=rng.randint(1, 5) if rng.random() < 0.15 else None,
        )
        for _ in range(n)
    ]
    weights = [rng.choice([1e-9, 0.01, 0.3, 1.0, 12.5, 90.0, 180.0, rng.uniform(0, 200)]) or 1.0
               for _ in range(n)]  # fmt: skip
    active = [rng.random() < 0.9 for _ in range(n)]
    wanted = [s.pinned if s.pinned is not None else rng.randint(0, 3) for s in stages]
    limits = [rng.choice([1, 5, 50, 3000]) for _ in range(n)]
    rooms = (
        rng.choice([0.0, 3.0, 16000.0, rng.uniform(0, 5000), math.inf]),
        rng.choice([0.0, 2.0, 2000.0, rng.uniform(0, 500), -1.0]),
        rng.choice([math.inf, 100 * 2.0**30, rng.uniform(0, 1e12), -5.0]),
        rng.choice([math.inf, 7.0, 100.0]),
        rng.choice([math.inf, 0.0, 24.0]),
    )
    pace_cap = rng.choice([math.inf, math.inf, rng.uniform(0.01, 100.0)])
    expected = one_by_one(stages, weights, active, wanted, limits, rooms, pace_cap)
    assert fill(stages, weights, active, wanted, limits, rooms, pace_cap) == expected
