"""Following sources: what is still alive of each source task, through maps, splits and merges.

A source is followed (``Lineage.tracked``) where its end must be known or its input kept:

- with a journal, a source is recorded as finished once nothing made from it is left (its last
  output handed to the caller, filtered, or failed), so a re-run skips it;
- where stored payloads can be lost (``keep_sources``: a cluster's node leaves and takes its
  object store along), the source's handle is kept until then, so that a lost input further
  down can be made again from it (``rerun``).

Labels say where an output comes from: ``7.2`` is the third output made from source ``7``,
``7*1`` an output made from a whole batch whose first input was ``7`` (a merge: it descends
from every source of that batch, ``Merge.roots``).
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.engine.journal import Journal
from conveyor.engine.messages import Handle
from conveyor.engine.queues import Entry

#: losses of one input forgiven (made again without spending an attempt): a node's fault,
#: not the input's; past this a loop of losses spends attempts and ends
FORGIVEN_LOSSES = 4


@dataclass(eq=False, slots=True)
class Root:
    """A source task while anything made from it is alive (``live``): a lost payload
    downstream is made again from its ``handle`` (kept where payloads can be lost), and its
    journal ``key`` is recorded once nothing is left."""

    handle: Handle | None
    key: str | None = None
    live: int = 1
    #: per input label descending from it, losses forgiven so far (``FORGIVEN_LOSSES``)
    losses: dict[str, int] | None = None
    #: something made from it failed for good: journaled as failed (tried again next run)
    failed: bool = False


@dataclass(eq=False, slots=True)
class Merge:
    """The sources behind the outputs of a batch that did not map inputs one to one."""

    roots: tuple[str, ...]
    live: int = 0


def maps_one_to_one(entries: list[Entry], outputs: list[Handle]) -> bool:
    """Each input made one output of the same label (a map, not a split or a merge)."""
    return len(entries) == len(outputs) and all(
        e.handle.label == h.label for e, h in zip(entries, outputs, strict=True)
    )


def root_label(label: str) -> str:
    """The source task a label descends from ("7.2.0" and "7*1" come from "7")."""
    return label.split(".", 1)[0].split("*", 1)[0]


def merge_label(label: str) -> str | None:
    """The label of the merged output a label descends from ("7*1.0" comes from "7*1")."""
    star = label.rfind("*")
    if star < 0:
        return None
    dot = label.find(".", star)
    return label if dot < 0 else label[:dot]


class Lineage:
    """What is alive of each followed source; a source with nothing left is journaled and
    let go. Without a journal and where payloads cannot be lost, it follows nothing and each
    call returns at once."""

    def __init__(self, keep_sources: bool, journal: Journal | None = None) -> None:
        self.keep_sources = keep_sources
        self.journal = journal
        self.tracked = keep_sources or journal is not None
        self.roots: dict[str, Root] = {}
        self.merges: dict[str, Merge] = {}

    def follow(self, label: str, handle: Handle, key: str | None) -> None:
        """A source task was admitted as ``label`` (``key``: its journal key)."""
        if self.tracked:
            self.roots[label] = Root(handle if self.keep_sources else None, key)

    def running(self, label: str) -> bool:
        """Whether the source ``label`` is followed now (something made from it is alive)."""
        return label in self.roots

    def made(self, label: str, entries: list[Entry]) -> None:
        """An output ``label`` of a batch of ``entries``: one made from the whole batch
        (``first*j``) descends from every source of the batch, each alive until it is done.
        One made from such an output (``first*j.k``) is counted with it (``live``)."""
        if (
            self.tracked
            and "*" in label
            and label not in self.merges
            and merge_label(label) == label
        ):
            roots: dict[str, None] = {}
            for entry in entries:
                roots.update(dict.fromkeys(self._roots_of(entry.handle.label)))
            self.merges[label] = Merge(tuple(roots))

    def fail(self, label: str) -> None:
        """Something made from the sources of ``label`` failed for good."""
        if self.tracked:
            for name in self._roots_of(label):
                root = self.roots.get(name)
                if root is not None:
                    root.failed = True

    def _roots_of(self, label: str) -> tuple[str, ...]:
        merged = merge_label(label)
        if merged is not None and merged in self.merges:
            return self.merges[merged].roots
        return (root_label(label),)

    def live(self, label: str, delta: int) -> None:
        """Count what is alive of each source a label descends from; a source with nothing
        left is finished (journaled) and let go."""
        if not self.tracked:
            return
        if "*" in label and self.merges:
            merged = merge_label(label)
            merge = self.merges.get(merged) if merged is not None else None
            if merge is not None:
                merge.live += delta
                if merge.live <= 0:
                    del self.merges[merged]  # type: ignore[arg-type]
                for name in merge.roots:
                    self._count(name, delta)
                return
        self._count(root_label(label), delta)

    def _count(self, name: str, delta: int) -> None:
        root = self.roots.get(name)
        if root is None:
            return
        root.live += delta
        if root.live <= 0:
            del self.roots[name]
            if root.key is not None and self.journal is not None:
                self.journal.record(root.key, failed=root.failed)

    def rerun(self, label: str) -> Handle | None:
        """The source a lost input ``label`` can be made again from, counted alive once more
        for the run it starts; ``None`` where that cannot work (a batch-level output, a source
        already let go, sources not kept)."""
        root = self.roots.get(root_label(label)) if self.keep_sources else None
        if root is None or root.handle is None or "*" in label:
            return None
        root.live += 1
        return root.handle

    def forgive_loss(self, entry: Entry) -> bool:
        """Whether this loss of ``entry`` is its node's alone: its handle names the node, its
        source is kept, and it was forgiven fewer than ``FORGIVEN_LOSSES`` times; counts it
        if so."""
        label = entry.handle.label
        root = self.roots.get(root_label(label)) if self.keep_sources else None
        if entry.handle.node is None or root is None:
            return False
        if root.losses is None:
            root.losses = {}
        count = root.losses.get(label, 0)
        if count >= FORGIVEN_LOSSES:
            return False
        root.losses[label] = count + 1
        return True
