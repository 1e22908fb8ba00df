"""The books of generator batches (``engine.streams``): allowances on the next edge, pauses,
outputs an earlier attempt sent already."""

from __future__ import annotations

from conveyor.engine import streams
from conveyor.engine.messages import Handle
from conveyor.engine.queues import Entry
from conveyor.engine.spec import StageSpec
from conveyor.engine.state import Batch, StageState
from conveyor.resources import Resources
from conveyor.result import StageStats


def stage() -> StageState:
    spec = StageSpec(0, "split", Resources(cpus=1), 1, None, None, streams=True)
    return StageState(spec, StageStats(spec.name))


def batch(*labels: str, sent_at: float = 1.0) -> Batch:
    return Batch(7, 0, "w", [Entry(Handle(None, 8, label)) for label in labels], False, sent_at)


def outputs(*labels: str) -> list[Handle]:
    return [Handle(None, 10, label) for label in labels]


def test_an_allowance_counts_on_the_next_edge_until_made_or_ended() -> None:
    s, b = stage(), batch("0")
    streams.start(s, b, window=3)
    assert (s.outstanding, b.outstanding, b.progress_at) == (3, 3, 1.0)
    streams.made(s, b, outputs("0.0", "0.1"), now=2.0)
    assert (s.outstanding, s.streamed, s.streamed_bytes, b.made) == (1, 2, 20, 2)
    streams.end(s, b, now=3.0)
    assert s.outstanding == 0 and not s.streaming
    streams.end(s, b, now=4.0)  # once only
    assert s.outstanding == 0


def test_a_batch_that_used_its_allowance_waits_and_its_wait_is_not_work() -> None:
    s, b = stage(), batch("0")
    streams.start(s, b, window=1)
    streams.made(s, b, outputs("0.0"), now=2.0)
    assert b.paused_at == 2.0
    streams.allow(s, b, 2, now=5.0)
    assert (b.paused_at, b.paused_s, b.allowed, s.outstanding) == (None, 3.0, 3, 2)
    unlimited = batch("1")
    streams.start(s, unlimited, window=None)  # one stage at a time: no limit, no pause
    streams.made(s, unlimited, outputs("1.0", "1.1"), now=6.0)
    assert unlimited.paused_at is None and unlimited.outstanding == 0


def test_outputs_an_earlier_attempt_sent_are_dropped_on_the_next() -> None:
    first = batch("0", "1")
    first.sent = ["0.0", "1.0"]
    streams.keep_sent(first)  # it failed after sending these
    again = Batch(8, 0, "w", first.entries, False)
    streams.start(stage(), again, window=None)
    send, drop = streams.unsent(again, outputs("0.0", "0.1", "1.0"))
    assert [h.label for h in send] == ["0.1"] and [h.label for h in drop] == ["0.0", "1.0"]
    fresh = batch("2")
    streams.start(stage(), fresh, window=None)
    assert streams.unsent(fresh, outputs("2.0")) == (outputs("2.0"), [])


def test_outputs_of_a_whole_batch_tie_its_inputs_together() -> None:
    failed = batch("0", "1")
    failed.sent = ["0*0"]
    streams.keep_sent(failed)
    first, second = failed.entries
    assert first.sent == second.sent == {"0*0"} and first.together == [second]
