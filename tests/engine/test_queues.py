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


def test_a_worker_takes_inputs_stored_on_its_node_first_within_the_look_ahead() -> None:
    queue = EdgeQueue()
    nodes = ["A", "B", "A", None, "B"] + ["A"] * (EdgeQueue.LOOKAHEAD + 8) + ["B"]
    for i, node in enumerate(nodes):
        queue.push(Entry(Handle(b"", 1, str(i), node)))
    assert [e.handle.label for e in queue.take(2, "B")] == ["1", "4"]  # B's, skipping A's
    assert [e.handle.label for e in queue.take(1, "A")] == ["0"]  # the oldest is local
    assert [e.handle.label for e in queue.take(1, None)] == ["2"]  # no node: oldest first
    # nothing on C within the look-ahead: the oldest, and the order of the rest is kept
    assert [e.handle.label for e in queue.take(2, "C")] == ["3", "5"]
    # the last B is beyond the look-ahead: a B worker takes the oldest instead
    assert [e.handle.label for e in queue.take(1, "B")] == ["6"]
    assert (len(queue), queue.bytes) == (len(nodes) - 7, len(nodes) - 7)
