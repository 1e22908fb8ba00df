"""Water-filling: give one worker at a time to the slowest stage while it fits what is left.

The autoscaler (``autoscale.plan``) decides which stages may grow, how far (``limits``) and
how much of each resource is left (``rooms``); this module adds the workers. Workers go in the
order of their stage's pace before each one (workers over the stage's weight, ties to the
earlier stage); the filling stops at the first worker that does not fit, at a pinned stage
(more workers elsewhere would not raise throughput) or at ``pace_cap``. A stage that reaches
its limit leaves the filling to the others.

At thousands of workers a decision, adding them one by one is most of a simulated run's time.
``_leap`` first adds, in one step, every worker below a pace at which all of them are sure to
fit, using exact integer books where every quantity is a binary fraction (as CPU counts such
as 0.25 or 4 and byte counts are); the loop then adds the last few one by one. Where a
quantity is not exact in binary (0.1 CPUs), the loop does all the work: either way the
targets are those of the one-by-one filling, to the last bit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Protocol

#: the bisection of ``_leap`` stops after this many halvings (the loop does the rest)
_LEAP_STEPS = 64
#: integers up to this are exact as floats, and so are sums and differences of them
_EXACT = 1 << 53


class Shape(Protocol):
    """What one worker of a stage takes (``StageObservation`` is one)."""

    @property
    def cpus(self) -> float: ...
    @property
    def gpus(self) -> float: ...
    @property
    def memory_bytes(self) -> float | None: ...
    @property
    def nvdecs(self) -> float: ...
    @property
    def nvencs(self) -> float: ...
    @property
    def pinned(self) -> int | None: ...


def needs(stage: Shape) -> tuple[float, float, float, float, float]:
    """What one more worker of ``stage`` takes from ``rooms``, in their order."""
    return stage.cpus, stage.gpus, stage.memory_bytes or 0.0, stage.nvdecs, stage.nvencs


def fill(
    stages: Sequence[Shape],
    weights: Sequence[float],
    active: Sequence[bool],
    wanted: Sequence[int],
    limits: Sequence[int],
    rooms: tuple[float, float, float, float, float],
    pace_cap: float = math.inf,
) -> list[int]:
    """Workers per stage after the filling, from ``wanted`` (the workers it starts with).

    ``rooms``: CPUs, GPUs, memory (bytes), NVDEC and NVENC units left for the workers it adds.
    A worker fits where each of its needs is at most what is left (CPUs, GPUs and units with
    1e-9 to spare for rounding). ``pace_cap``: no worker is added to a stage already this fast.
    """
    wanted = list(wanted)
    cpus, gpus, memory, decoders, encoders = _leap(
        stages, weights, active, wanted, limits, rooms, pace_cap
    )
    heap = [(wanted[i] / weights[i], i) for i in range(len(stages)) if active[i]]
    heapq.heapify(heap)
    # a stage keeps the workers coming while it stays the slowest (what a pop of the heap
    # would give again): the same steps as one push and pop per worker
    while heap:
        pace, i = heapq.heappop(heap)
        s = stages[i]
        if s.pinned is not None:
            break  # a pinned bottleneck: more workers elsewhere would not raise throughput
        limit = limits[i]
        need_cpus, need_gpus, weight, need_decs, need_encs = needs(s)
        stop = False
        while True:
            if wanted[i] >= limit:
                break  # no more work for it to take: the next stage may still need help
            if pace >= pace_cap:
                stop = True  # bound by the CPUs: another worker would only wait for one
                break
            if (
                need_cpus > cpus + 1e-9
                or need_gpus > gpus + 1e-9
                or weight > memory
                or need_decs > decoders + 1e-9
                or need_encs > encoders + 1e-9
            ):
                stop = True  # the bottleneck cannot grow: more elsewhere would not help
                break
            wanted[i] += 1
            cpus -= need_cpus
            gpus -= need_gpus
            memory -= weight
            decoders -= need_decs
            encoders -= need_encs
            pace = wanted[i] / weights[i]
            if heap and (pace, i) > heap[0]:
                heapq.heappush(heap, (pace, i))
                break
        if stop:
            break
    return wanted


def _leap(
    stages: Sequence[Shape],
    weights: Sequence[float],
    active: Sequence[bool],
    wanted: list[int],
    limits: Sequence[int],
    rooms: tuple[float, float, float, float, float],
    pace_cap: float,
) -> tuple[float, float, float, float, float]:
    """Add to ``wanted`` (in place) every worker the filling would add below a pace at which
    all of them fit; returns ``rooms`` less what they take.

    Below a pace ``p``, stage ``i`` gets the workers ``n`` with ``n / weights[i] < p``: the
    filling adds them all, in some order, before any worker at ``p`` or above. Where what
    is left after all of them is at least 0 in every room, each fitted when its turn came (what
    was left then was at least its own need), so the one-by-one loop would add them all too.
    The pace is found by bisection on exact integer books (each room and need scaled by a
    common power of two); rooms where that is not exact leave ``wanted`` as it is.
    """
    movers = [
        i for i, s in enumerate(stages) if active[i] and s.pinned is None and wanted[i] < limits[i]
    ]
    if not movers:
        return rooms
    bound = pace_cap
    for i, s in enumerate(stages):
        if active[i] and s.pinned is not None:
            bound = min(bound, wanted[i] / weights[i])  # the filling stops at a pinned stage
    books = _books(rooms, [needs(stages[i]) for i in movers])
    if books is None:
        return rooms

    def taken(pace: float) -> list[int]:
        return [_first_at(pace, weights[i], wanted[i], limits[i]) - wanted[i] for i in movers]

    def fits(counts: list[int]) -> bool:
        for book in books:
            if book is not None:
                left, per_worker, _ = book
                if sum(c * n for c, n in zip(counts, per_worker, strict=True)) > left:
                    return False
        return True

    low = min(wanted[i] / weights[i] for i in movers)  # nothing below it: fits
    high = min(bound, math.nextafter(max(limits[i] / weights[i] for i in movers), math.inf))
    if not high > low:
        return rooms
    counts = taken(high)
    if not fits(counts):
        # first where the rooms run out as if workers came in fractions (one worker of each
        # stage short of it, then at it), then halving: until a worker or so a stage is left
        starts = [wanted[i] for i in movers]
        ends = [limits[i] for i in movers]
        scales = [weights[i] for i in movers]
        guesses = [
            _level(books, scales, starts, ends, spare=True),
            _level(books, scales, starts, ends, spare=False),
        ]
        low_total, high_total = 0, sum(counts)
        for step in range(_LEAP_STEPS):
            if high_total - low_total <= len(movers):
                break  # the loop adds the few between
            middle = guesses[step] if step < len(guesses) else math.nan
            if not low < middle < high:
                middle = low + (high - low) / 2
                if not low < middle < high:
                    break
            counts = taken(middle)
            if fits(counts):
                low, low_total = middle, sum(counts)
            else:
                high, high_total = middle, sum(counts)
        counts = taken(low)
    if not any(counts):
        return rooms
    left_rooms = list(rooms)
    for r, book in enumerate(books):
        if book is not None:
            left, per_worker, exponent = book
            used = sum(c * n for c, n in zip(counts, per_worker, strict=True))
            left_rooms[r] = math.ldexp(float(left - used), -exponent)
    for i, count in zip(movers, counts, strict=True):
        wanted[i] += count
    return left_rooms[0], left_rooms[1], left_rooms[2], left_rooms[3], left_rooms[4]


def _level(
    books: Sequence[tuple[int, list[int], int] | None],
    weights: Sequence[float],
    starts: Sequence[int],
    ends: Sequence[int],
    spare: bool,
) -> float:
    """The pace at which the first room runs out were workers divisible: stage ``i`` then
    holds ``pace * weights[i]`` workers, within ``[starts[i], ends[i]]``. ``spare``: with one
    worker of each stage left over (the counts are whole, up to one more each). A guess."""
    level = math.inf
    points = sorted({s / w for s, w in zip(starts, weights, strict=True)}
                    | {e / w for e, w in zip(ends, weights, strict=True)})  # fmt: skip
    for book in books:
        if book is None:
            continue
        left, per_worker, _ = book
        room = float(left) - (sum(per_worker) if spare else 0)

        def used(pace: float, per_worker: list[int] = per_worker) -> float:
            return sum(
                n * min(max(pace * w - s, 0.0), e - s)
                for n, w, s, e in zip(per_worker, weights, starts, ends, strict=True)
            )

        before, used_before = points[0], 0.0
        for point in points[1:]:
            now = used(point)
            if now > room:
                span = now - used_before
                share = max(0.0, room - used_before) / span if span > 0 else 0.0
                level = min(level, before + share * (point - before))
                break
            before, used_before = point, now
    return level


def _books(
    rooms: Sequence[float], per_stage: Sequence[Sequence[float]]
) -> list[tuple[int, list[int], int] | None] | None:
    """Per room: what is left and each stage's need per worker as integers in units of
    ``2**-exponent``, and that exponent; ``None`` for a room without a limit (infinite).
    ``None`` in all where some room or need is not exact that way (or not a number >= 0)."""
    books: list[tuple[int, list[int], int] | None] = []
    for r, left in enumerate(rooms):
        values = [need[r] for need in per_stage]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            return None
        if left == math.inf:
            books.append(None)  # never short: inf less any need is inf
            continue
        if not (math.isfinite(left) and left >= 0):
            return None
        ratios = [v.as_integer_ratio() for v in (left, *values)]
        exponent = max(den.bit_length() - 1 for _, den in ratios)
        scaled = [num << (exponent - (den.bit_length() - 1)) for num, den in ratios]
        if scaled[0] >= _EXACT:
            return None  # what is left (and so all between it and 0) must be exact as a float
        books.append((scaled[0], scaled[1:], exponent))
    return books


def _first_at(pace: float, weight: float, low: int, high: int) -> int:
    """The fewest workers ``n`` in ``[low, high]`` with ``n / weight >= pace`` (``high`` if
    none), the division as the filling does it (monotonic in ``n``)."""
    if low >= high:
        return low
    estimate = pace * weight
    n = max(low, math.ceil(estimate)) if estimate < high else high
    while n > low and (n - 1) / weight >= pace:
        n -= 1
    while n < high and n / weight < pace:
        n += 1
    return n
