"""What every backend's workers do around a stage's code: tidying memory."""

from __future__ import annotations

import gc
import time
import weakref

from conveyor.backends.runtime import Tidier


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_tidying_frees_the_cycles_a_task_left_behind() -> None:
    tidier = Tidier()
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    del a, b
    tidier.after(0.1)
    assert alive() is None


def test_each_step_takes_a_bounded_share_of_the_busy_time() -> None:
    runs: list[str] = []

    def slow() -> None:  # costs at least 10 ms: runs again only after 10 ms / SHARE busy
        runs.append("slow")
        time.sleep(0.01)

    tidier = Tidier([slow, lambda: runs.append("quick")])
    for _ in range(5):
        tidier.after(0.3)  # 1.5 s busy in all: under 10 ms / 0.005 = 2 s
    assert runs.count("slow") == 1
    assert runs.count("quick") == 5
    tidier.after(100.0)
    assert runs.count("slow") == 2


def test_freezing_leaves_what_setup_built_out_of_later_collections() -> None:
    tidier = Tidier()
    built = [Node() for _ in range(1000)]
    try:
        tidier.freeze()
        assert gc.get_freeze_count() >= len(built)
    finally:
        gc.unfreeze()
