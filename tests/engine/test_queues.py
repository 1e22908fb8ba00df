"""EdgeQueue accounting: counts, bytes, high-water marks, suspects apart from fresh work."""

from __future__ import annotations

from conveyor.engine.messages import Handle
from conveyor.engine.queues import EdgeQueue, Entry


def entry(label: str, nbytes: int) -> Entry:
    return Entry(Handle(b"", nbytes, label))


def test_take_cuts_batches_in_arrival_order_and_tracks_bytes() -> None:
    queue = EdgeQueue()
    for i in range(5):
        queue.push(entry(str(i), 10 * (i + 1)))
    assert (len(queue), queue.bytes) == (5, 150)
    batch = queue.take(2)
    assert [e.handle.label for e in batch] == ["0", "1"]
    assert (len(queue), queue.bytes) == (3, 120)
    assert [e.handle.label for e in queue.take(10)] == ["2", "3", "4"]
    assert (len(queue), queue.bytes) == (0, 0)
    assert (queue.hwm_tasks, queue.hwm_bytes) == (5, 150)


def test_suspects_count_for_backpressure_but_never_join_a_batch() -> None:
    queue = EdgeQueue()
    queue.push(entry("a", 5))
    queue.push_suspect(entry("s", 7))
    state = queue.state(expected_tasks=2, expected_bytes=3)
    assert (state.queued_tasks, state.queued_bytes) == (2, 12)
    assert (state.expected_tasks, state.expected_bytes) == (2, 3)
    assert [e.handle.label for e in queue.take(5)] == ["a"]
    assert queue.pop_suspect().handle.label == "s"
    assert (len(queue), queue.bytes) == (0, 0)
