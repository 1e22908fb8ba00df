"""Lineage: what is alive of each source, through maps, splits and merges; journal records
once nothing is left; sources kept to make a lost input again; losses forgiven a few times."""

from __future__ import annotations

from conveyor.engine.lineage import (
    FORGIVEN_LOSSES,
    Lineage,
    maps_one_to_one,
    merge_label,
    root_label,
)
from conveyor.engine.messages import Handle
from conveyor.engine.queues import Entry


class Journal:
    """Keeps the keys recorded, as ``engine.journal.Journal.record`` would write them."""

    def __init__(self) -> None:
        self.recorded: list[str] = []
        self.failed: list[str] = []

    def record(self, key: str, failed: bool = False) -> None:
        self.recorded.append(key)
        if failed:
            self.failed.append(key)


def handle(label: str, node: str | None = None) -> Handle:
    return Handle(object(), 8, label, node)


def entry(label: str, node: str | None = None) -> Entry:
    return Entry(handle(label, node))


def test_labels_name_their_source_and_their_merge() -> None:
    assert root_label("7") == root_label("7.2.0") == root_label("7*1") == "7"
    assert merge_label("7.2") is None
    assert merge_label("7*1") == merge_label("7*1.0") == "7*1"
    assert merge_label("3.1*0.4") == "3.1*0"


def test_maps_one_to_one_wants_the_same_labels_in_order() -> None:
    inputs = [entry("1"), entry("2")]
    assert maps_one_to_one(inputs, [handle("1"), handle("2")])
    assert not maps_one_to_one(inputs, [handle("2"), handle("1")])
    assert not maps_one_to_one(inputs, [handle("1.0"), handle("1.1"), handle("2.0")])


def test_untracked_follows_nothing() -> None:
    lineage = Lineage(keep_sources=False)
    lineage.follow("0", handle("0"), None)
    lineage.made("0*0", [entry("0")])
    lineage.live("0", -1)
    assert not lineage.tracked and not lineage.roots and not lineage.merges
    assert lineage.rerun("0") is None


def test_a_source_is_journaled_once_its_last_output_is_done() -> None:
    journal = Journal()
    lineage = Lineage(keep_sources=False, journal=journal)  # type: ignore[arg-type]
    lineage.follow("a", handle("a"), "key-a")
    assert lineage.running("a") and lineage.roots["a"].handle is None  # not kept
    # it split in two: each output alive, then the input let go
    lineage.live("a.0", 1)
    lineage.live("a.1", 1)
    lineage.live("a", -1)
    lineage.live("a.0", -1)
    assert journal.recorded == [] and lineage.running("a")
    lineage.live("a.1", -1)
    assert journal.recorded == ["key-a"] and not lineage.running("a")
    assert journal.failed == []


def test_a_merge_keeps_every_source_of_its_batch_alive() -> None:
    journal = Journal()
    lineage = Lineage(keep_sources=False, journal=journal)  # type: ignore[arg-type]
    for name in ("a", "b"):
        lineage.follow(name, handle(name), f"key-{name}")
    batch = [entry("a"), entry("b")]
    lineage.made("a*0", batch)
    lineage.live("a*0", 1)
    assert lineage.merges["a*0"].roots == ("a", "b")
    for item in batch:
        lineage.live(item.handle.label, -1)
    assert journal.recorded == []  # the merged output is alive: both sources too
    # it splits: its outputs count with it (no merge of their own, which nothing let go)
    lineage.made("a*0.0", [entry("a*0")])
    lineage.live("a*0.0", 1)
    lineage.live("a*0", -1)
    assert list(lineage.merges) == ["a*0"] and journal.recorded == []
    lineage.fail("a*0.0")  # it failed: both its sources are journaled as failed
    lineage.live("a*0.0", -1)
    assert sorted(journal.recorded) == ["key-a", "key-b"] and not lineage.merges
    assert sorted(journal.failed) == ["key-a", "key-b"]


def test_a_kept_source_runs_again_for_a_lost_input() -> None:
    lineage = Lineage(keep_sources=True)
    source = handle("s")
    lineage.follow("s", source, None)
    assert lineage.rerun("s.3") is source
    assert lineage.roots["s"].live == 2  # the run it starts counts
    assert lineage.rerun("s*0") is None  # made from a whole batch: no single source
    assert lineage.rerun("t.0") is None  # never followed (or let go)


def test_losses_of_an_input_are_forgiven_a_few_times_where_a_node_is_named() -> None:
    lineage = Lineage(keep_sources=True)
    lineage.follow("s", handle("s"), None)
    lost = entry("s.0", node="n1")
    assert [lineage.forgive_loss(lost) for _ in range(FORGIVEN_LOSSES + 1)] == [
        *([True] * FORGIVEN_LOSSES),
        False,
    ]
    assert not lineage.forgive_loss(entry("s.1"))  # no node to blame
    assert not Lineage(keep_sources=False).forgive_loss(lost)  # no source kept
