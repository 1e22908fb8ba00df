"""Pool bookkeeping: counts and the buckets the controller picks workers from."""

from __future__ import annotations

from conveyor.engine.pool import Pool, Worker


def make(n: int) -> tuple[Pool, list[Worker]]:
    pool = Pool()
    workers = [Worker(f"w{i}", 0) for i in range(n)]
    for worker in workers:
        pool.add(worker)
    return pool, workers


def test_counts_follow_lifecycle() -> None:
    pool, (a, _b) = make(2)
    assert (pool.live_count, pool.ready_count) == (2, 0)
    assert pool.feedable(2) is None  # nobody ready yet
    pool.mark_ready(a)
    pool.mark_ready(a)  # idempotent
    assert (pool.live_count, pool.ready_count) == (2, 1)
    pool.mark_stopping(a)
    assert (pool.live_count, pool.ready_count) == (1, 0)
    assert pool.feedable(2) is None
    pool.remove("w0", now=0.0)
    pool.remove("w1", now=0.0)
    assert (pool.live_count, pool.ready_count, len(pool)) == (0, 0, 0)


def test_least_busy_first_and_depth_respected() -> None:
    pool, (a, b) = make(2)
    pool.mark_ready(a)
    pool.mark_ready(b)
    first = pool.feedable(1)
    assert first is not None
    pool.sent(first, [1], alone=False, now=0.0)
    second = pool.feedable(1)
    assert second is not None and second is not first
    pool.sent(second, [2], alone=False, now=0.0)
    assert pool.feedable(1) is None  # depth 1: both busy
    assert pool.feedable(2) in (a, b)  # depth 2: a second message may wait
    pool.batch_done(first, 1, now=0.0)
    assert pool.idle() is first


def test_alone_worker_gets_nothing_else_until_done() -> None:
    pool, (a,) = make(1)
    pool.mark_ready(a)
    pool.sent(a, [7], alone=True, now=0.0)
    assert pool.feedable(2) is None and pool.idle() is None
    pool.batch_done(a, 7, now=0.0)
    assert pool.idle() is a and not a.alone


def test_reserved_worker_runs_dry_for_a_suspect() -> None:
    pool, (a, b) = make(2)
    for worker in (a, b):
        pool.mark_ready(worker)
        pool.sent(worker, [int(worker.worker_id[1:])], alone=False, now=0.0)
    pool.reserve_for_suspect()
    reserved = pool.reserved
    assert reserved is not None
    assert pool.feedable(2) is not reserved and pool.feedable(2) is not None
    pool.batch_done(reserved, int(reserved.worker_id[1:]), now=0.0)
    assert pool.idle() is reserved
    pool.sent(reserved, [9], alone=True, now=0.0)
    assert pool.reserved is None


def test_batches_may_finish_out_of_order_across_messages() -> None:
    pool, (a,) = make(1)
    pool.mark_ready(a)
    pool.sent(a, [1, 2], alone=False, now=0.0)
    pool.sent(a, [3], alone=False, now=0.0)
    pool.batch_done(a, 3, now=0.0)  # the later message ends first
    assert a.in_flight == 1
    pool.batch_done(a, 1, now=0.0)
    pool.batch_done(a, 2, now=0.0)
    assert a.in_flight == 0 and pool.idle() is a
    pool.batch_done(a, 99, now=0.0)  # unknown batch: ignored
    assert a.in_flight == 0


def test_equally_busy_workers_on_the_data_node_come_first() -> None:
    pool = Pool()
    far, near, near2 = Worker("far", 0, node="A"), Worker("near", 0, node="B"), Worker("n2", 0)
    for worker in (far, near, near2):
        pool.add(worker)
        pool.mark_ready(worker)
    near2.node = None  # a worker with no node (single-machine backends) is never "local"
    assert pool.feedable(2, "B") is near
    pool.sent(near, [1], alone=False, now=0.0)
    # the idle worker elsewhere beats the busy one on the data's node
    assert pool.feedable(2, "B") is far
    pool.sent(far, [2], alone=False, now=0.0)
    assert pool.feedable(2, "B") is near2
    pool.sent(near2, [3], alone=False, now=0.0)
    assert pool.feedable(2, "B") is near  # everyone holds one: then the local one
    pool.sent(near, [4], alone=False, now=0.0)
    assert pool.feedable(2, "B") in (far, near2)
    assert pool.feedable(2, "nowhere") in (far, near2)
    pool.mark_stopping(far)
    pool.mark_stopping(near2)
    assert pool.feedable(2, "B") is None  # near is full, the others stop
    pool.batch_done(near, 1, now=0.0)
    assert pool.feedable(2, "B") is near


def test_avoided_nodes_get_work_only_when_the_stage_has_no_one_else() -> None:
    pool = Pool()
    bad, bad2, good = Worker("bad", 0, node="B"), Worker("bad2", 0, node="B"), Worker("g", 0)
    good.node = "A"
    for worker in (bad, bad2, good):
        pool.add(worker)
        pool.mark_ready(worker)
    avoid = frozenset({"B"})
    assert pool.ready_elsewhere(avoid) and not pool.ready_elsewhere(frozenset({"A", "B"}))
    # a suspect goes to the idle worker elsewhere, whatever the order of the idle ones
    assert pool.idle(avoid) is good
    # a fresh batch too, even one whose data lies on the avoided node
    assert pool.feedable(2, "B", avoid) is good
    pool.sent(good, [1], alone=False, now=0.0)
    # the one elsewhere is busy: a suspect waits for it (it is reserved to run dry) ...
    assert pool.idle(avoid) is None
    pool.reserve_for_suspect(avoid)
    assert pool.reserved is good
    # ... and fresh work waits too rather than go to the avoided node
    assert pool.feedable(2, None, avoid) is None
    assert pool.feedable(2, None) in (bad, bad2)  # nothing avoided: as before
    pool.batch_done(good, 1, now=0.0)
    assert pool.idle(avoid) is good
    # with no ready worker elsewhere the avoided node gets the work: nothing stalls
    pool.mark_stopping(good)
    pool.reserved = None
    assert not pool.ready_elsewhere(avoid)
    assert pool.idle(avoid) in (bad, bad2)
    assert pool.feedable(1, None, avoid) in (bad, bad2)


def test_a_reservation_on_an_avoided_node_moves_elsewhere() -> None:
    pool = Pool()
    bad, good = Worker("bad", 0, node="B"), Worker("good", 0, node="A")
    for worker in (bad, good):
        pool.add(worker)
        pool.mark_ready(worker)
        pool.sent(worker, [int(worker is good)], alone=False, now=0.0)
    pool.reserve_for_suspect()  # before "B" was suspect: any worker
    pool.reserved = bad
    pool.reserve_for_suspect(frozenset({"B"}))
    assert pool.reserved is good
    pool.reserve_for_suspect(frozenset({"A", "B"}))  # no one elsewhere: kept as it is
    assert pool.reserved is good


def test_ready_counts_by_node_follow_the_lifecycle() -> None:
    pool = Pool()
    a, b = Worker("a", 0, node="B"), Worker("b", 0, node="B")
    for worker in (a, b):
        pool.add(worker)
    avoid = frozenset({"B"})
    assert not pool.ready_elsewhere(frozenset())  # nobody ready at all
    pool.mark_ready(a)
    pool.mark_ready(a)
    pool.mark_ready(b)
    assert not pool.ready_elsewhere(avoid) and pool.ready_elsewhere(frozenset({"C"}))
    pool.mark_stopping(a)
    pool.remove("a", now=0.0)
    pool.remove("b", now=0.0)
    assert pool.ready_count == 0 and not pool._ready_on


def test_may_feed_any_is_false_only_where_feedable_finds_none() -> None:
    pool, (a, b) = make(2)
    assert not pool.may_feed_any(2)  # nobody ready
    pool.mark_ready(a)
    pool.mark_ready(b)
    assert pool.may_feed_any(1)
    pool.sent(a, [1], alone=False, now=0.0)
    pool.sent(b, [2], alone=False, now=0.0)
    assert not pool.may_feed_any(1) and pool.feedable(1) is None
    assert pool.may_feed_any(2)
    pool.reserved = a  # running dry for a suspect: b alone may take more
    assert pool.may_feed_any(2) and pool.feedable(2) is b
    pool.sent(b, [3], alone=False, now=0.0)
    assert not pool.may_feed_any(2) and pool.feedable(2) is None


def test_the_time_workers_hold_work_is_kept_as_sums() -> None:
    """What a busy fraction over a window shorter than a batch needs, at no cost per
    snapshot: a stage of thousands of workers made every snapshot a loop over them."""
    pool = Pool()
    a, b = Worker("a", 0), Worker("b", 0)
    for w in (a, b):
        pool.add(w)
        pool.mark_ready(w)
    pool.sent(a, [1], alone=False, now=1.0)
    pool.sent(a, [2], alone=False, now=2.0)  # a second message: the same spell
    assert pool.occupied_s(3.0) == 2.0
    pool.batch_done(a, 1, now=4.0)
    pool.sent(b, [3], alone=False, now=4.0)
    assert pool.occupied_s(5.0) == 4.0 + 1.0
    pool.batch_done(a, 2, now=6.0)  # a's spell ends: 5 s
    assert pool.occupied_s(7.0) == 5.0 + 3.0
    pool.remove("b", now=8.0)  # a worker gone ends its spell too
    assert pool.occupied_s(100.0) == 5.0 + 4.0
