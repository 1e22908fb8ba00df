"""A built stage as the engine sees it: shape, batch size, pin, and the serialized stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from conveyor.errors import PipelineBuildError
from conveyor.resources import Resources


@dataclass(eq=False)
class StageSpec:
    """Immutable description of one stage of a built pipeline.

    ``payload`` is the stage object serialized by value once on the driver, so stages defined
    in ``__main__``, a notebook cell or a function work on every backend.
    """

    index: int
    name: str
    resources: Resources
    batch_size: int
    num_workers: int | None
    stage: Any = field(repr=False)
    has_node_setup: bool = False
    #: seconds a batch may run before its worker is killed (``ProcessingStage.timeout_s``)
    timeout_s: float | None = None
    #: the longest a task waits for its batch to fill before a partial batch goes
    #: (``ProcessingStage.batch_wait_s``; ``None``: until full or the stage's input ends)
    batch_wait_s: float | None = None
    #: the most threads a batch may get while cores idle (``ProcessingStage.max_threads``)
    max_threads: int | None = None
    #: times an input is tried (``ProcessingStage.max_attempts``; ``None``: the executor's)
    max_attempts: int | None = None
    #: batches a worker runs before it is replaced (``ProcessingStage.max_batches_per_worker``)
    max_batches_per_worker: int | None = None
    #: ``process``/``process_batch`` is a generator: outputs leave as they are made
    #: (``conveyor.stage.yields_outputs``)
    streams: bool = False
    _payload: bytes | None = field(default=None, repr=False)

    @property
    def payload(self) -> bytes:
        if self._payload is None:
            try:
                self._payload = cloudpickle.dumps(self.stage, protocol=5)
            except Exception as exc:  # TypeError, PicklingError, ...: whatever it holds
                raise PipelineBuildError.not_copyable(self.name, exc) from exc
        return self._payload
