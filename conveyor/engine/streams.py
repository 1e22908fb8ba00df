"""A generator stage's batches (``StageSpec.streams``): outputs leave while the batch runs.

Each running batch may make a window of outputs (``policies.backpressure.stream_window``)
before it pauses at its ``yield``; the controller allows it more where the next edge has
room (``stream_grant``). What the batches of a stage may still make (``outstanding``)
counts on that edge, so backpressure sees it coming. A batch that fails after sending
outputs on leaves their ids with its inputs: the next attempt makes them again (same
position, same id) and they are dropped, not sent twice.

These functions keep the books of the records in ``engine.state``; the controller moves
the handles and talks to the backend.
"""

from __future__ import annotations

from conveyor.engine.messages import Handle
from conveyor.engine.state import Batch, StageState


def start(stage: StageState, batch: Batch, window: int | None) -> None:
    """``batch`` is sent: it may make ``window`` outputs (``None``: any number, one stage
    at a time) before it waits to be allowed more (``allow``)."""
    batch.allowed = window
    batch.window = window or 0
    batch.progress_at = batch.sent_at
    stage.outstanding += window or 0
    stage.streaming[batch.batch_id] = batch
    skip = [label for e in batch.entries if e.sent for label in e.sent]
    batch.skip = frozenset(skip) if skip else None


def made(stage: StageState, batch: Batch, outputs: list[Handle], now: float) -> None:
    """``batch`` made ``outputs`` by ``now``; where that used up its allowance it waits at
    its ``yield`` from now on."""
    before = batch.outstanding
    batch.made += len(outputs)
    size = sum(h.nbytes for h in outputs)
    batch.made_bytes += size
    stage.streamed += len(outputs)
    stage.streamed_bytes += size
    stage.outstanding -= before - batch.outstanding
    batch.progress_at = now
    if batch.allowed is not None and not batch.outstanding and batch.paused_at is None:
        batch.paused_at = now


def allow(stage: StageState, batch: Batch, more: int, now: float) -> None:
    """``batch`` may make ``more`` outputs from ``now`` (a paused one goes on)."""
    assert batch.allowed is not None
    batch.allowed += more
    stage.outstanding += more
    if batch.paused_at is not None:
        batch.paused_s += now - batch.paused_at
        batch.paused_at = None
    batch.progress_at = now


def end(stage: StageState, batch: Batch, now: float) -> None:
    """``batch`` ended (done, failed, or its worker gone) at ``now``: what it was allowed
    is no longer expected on the next edge."""
    if stage.streaming.pop(batch.batch_id, None) is None:
        return
    stage.outstanding -= batch.outstanding
    if batch.paused_at is not None:
        batch.paused_s += now - batch.paused_at
        batch.paused_at = None


def unsent(batch: Batch, outputs: list[Handle]) -> tuple[list[Handle], list[Handle]]:
    """``outputs`` split into those to send on and those an earlier attempt at the
    batch's inputs sent already (to drop)."""
    if not batch.skip:
        return outputs, []
    skip = batch.skip
    dropped = [h for h in outputs if h.label in skip]
    if not dropped:
        return outputs, []
    return [h for h in outputs if h.label not in skip], dropped


def keep_sent(batch: Batch) -> None:
    """``batch`` failed after sending outputs on: its inputs remember their ids, so the
    next attempt does not send them twice. Outputs made from the whole batch (``first*j``)
    tie its inputs together: they are tried again as one batch."""
    if not batch.sent:
        return
    entries = batch.entries
    if len(entries) > 1 and any("*" in label for label in batch.sent):
        shared = set(batch.sent) | set(batch.skip or ())
        for entry in entries:
            entry.sent = shared
        entries[0].together = entries[1:]
        return
    for entry in entries:
        prefix = entry.handle.label + "."
        mine = {
            label
            for label in batch.sent
            if label.startswith(prefix) and "." not in label[len(prefix) :]
        }
        if mine:
            entry.sent = (entry.sent or set()) | mine
