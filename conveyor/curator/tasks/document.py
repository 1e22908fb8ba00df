"""NeMo Curator's ``nemo_curator.tasks.document``: ``DocumentBatch`` (also in
``conveyor.curator.tasks``)."""

from conveyor.curator.tasks import DocumentBatch

__all__ = ["DocumentBatch"]
