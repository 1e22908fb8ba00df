"""What every executor shares: a backend, controller settings, monitors, and the Run handle."""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from conveyor.engine.controller import Controller, ControllerConfig
from conveyor.engine.events import Monitor
from conveyor.engine.journal import Journal, JournalKey
from conveyor.engine.policies.autoscale import AutoscaleConfig
from conveyor.engine.spec import StageSpec
from conveyor.result import RunResult

if TYPE_CHECKING:
    from conveyor.backends.base import Backend


class Run:
    """An iterator over a running pipeline's last-stage outputs.

    Nothing starts until the first ``next()``. ``result`` is complete once the iterator is
    exhausted; ``close()`` (or leaving a ``with`` block) stops every worker early.
    """

    def __init__(self, controller: Controller) -> None:
        self._controller = controller
        self._iter: Iterator[Any] | None = None
        # held while the run moves on (``next``) and while it is closed: a close from another
        # thread waits for the iterating one, which the stop request lets go within a turn
        self._lock = threading.RLock()

    def __iter__(self) -> Run:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._iter is None:
                self._iter = iter(self._controller)
                _started.add(self)
            return next(self._iter)

    @property
    def result(self) -> RunResult:
        return self._controller.result

    @property
    def pipeline_name(self) -> str:
        return self._controller.pipeline_name

    @property
    def running(self) -> bool:
        """Started and neither exhausted nor closed: its workers are on the backend."""
        return self._iter is not None and not self._controller.closed

    def close(self) -> None:
        """Stop every worker and end the run early, also from a thread other than the one
        iterating it (a watchdog, a UI): the run stops at the loop's next turn (within a
        second), and the iterating thread's loop ends."""
        self._controller.request_stop()
        with self._lock:
            if self._iter is None:
                self._controller.close()
                return
            # (closed from inside the run, a monitor: "generator already executing", and the
            # stop request ends it)
            with contextlib.suppress(ValueError):
                self._iter.close()  # type: ignore[attr-defined]

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: runs started and not yet collected: those still running at exit are closed then, while
#: the modules their workers' teardown needs are there (it printed a traceback)
_started: weakref.WeakSet[Run] = weakref.WeakSet()


@atexit.register
def _close_running() -> None:
    for run in list(_started):
        if run.running:
            with contextlib.suppress(Exception):
                run.close()


def held(runner: Any) -> contextlib.AbstractContextManager[None]:
    """``runner.held()`` (an executor's or a backend's) for a workflow of several runs;
    nothing for one without it, or for ``None`` (each run then makes an executor of its
    own)."""
    hold = getattr(runner, "held", None)
    return hold() if hold is not None else contextlib.nullcontext()


class Executor:
    """Runs built pipelines on a backend (``LocalBackend()`` unless given).

    ``edge_max_tasks`` bounds the queues between stages that run at the same time; a
    stage-at-a-time executor (``BatchExecutor``) leaves them unbounded, since each stage's
    whole output waits for the next stage anyway."""

    stage_at_a_time = False

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        max_attempts: int = 3,
        autoscale: AutoscaleConfig | None = None,
        autoscale_interval_s: float = 1.0,
        edge_max_tasks: int = 1024,
        edge_max_bytes: int | None = None,
        stage_priority: bool = True,
        elastic_threads: bool = True,
        first_output_first: bool = True,
        monitors: Iterable[Monitor] = (),
    ) -> None:
        if backend is None:
            from conveyor.backends.local import LocalBackend

            backend = LocalBackend()
        elif isinstance(backend, type):
            raise TypeError(
                f"{type(self).__name__}: the backend must be an instance, "
                f"{backend.__name__}(), not the class {backend.__name__}"
            )
        elif isinstance(backend, (dict, str)) or not callable(getattr(backend, "submit", None)):
            raise TypeError(
                f"{type(self).__name__}: the first argument is the backend (LocalBackend(), "
                f"RayBackend(...)), got {backend!r}; settings are keywords, e.g. "
                f"{type(self).__name__}(autoscale_interval_s=2.0) (NeMo Curator's "
                "config={...} dicts are taken by conveyor.curator's XennaExecutor)"
            )
        self.backend = backend
        self.config = ControllerConfig(
            max_attempts=max_attempts,
            autoscale=autoscale or AutoscaleConfig(),
            autoscale_interval_s=autoscale_interval_s,
            edge_max_tasks=edge_max_tasks,
            edge_max_bytes=edge_max_bytes,
            stage_at_a_time=self.stage_at_a_time,
            stage_priority=stage_priority,
            elastic_threads=elastic_threads,
            first_output_first=first_output_first,
        )
        self.monitors = list(monitors)
        # one run at a time holds the backend; a run its caller dropped unfinished is
        # collected (its workers stopped), not kept alive here to refuse the next one
        self._last: weakref.ref[Run] | None = None

    def held(self) -> contextlib.AbstractContextManager[None]:
        """A block of several runs (a workflow's passes): what the backend starts for a run
        and can keep for the next (``RayBackend``'s private cluster) stays until it ends."""
        return held(self.backend)

    def start(
        self,
        specs: list[StageSpec],
        initial_tasks: Iterable[Any] | None = None,
        pipeline_name: str = "pipeline",
        *,
        journal: Journal | None = None,
        journal_key: JournalKey | None = None,
        description: str = "",
    ) -> Run:
        last = self._last() if self._last is not None else None
        if last is not None and last.running:
            raise RuntimeError(
                f"{type(self).__name__} is still running pipeline "
                f"{last.pipeline_name!r} (a stream neither exhausted nor closed): "
                f"finish or close() it before running {pipeline_name!r} on this executor, or "
                "give that one an executor of its own"
            )
        controller = Controller(
            specs,
            self.backend,
            initial_tasks,
            self.config,
            pipeline_name,
            self.monitors,
            journal=journal,
            journal_key=journal_key,
            description=description,
        )
        run = Run(controller)
        self._last = weakref.ref(run)
        return run
