"""Exceptions a user may catch; each message names the stage or input and what is wrong."""

from __future__ import annotations

import pickle


class ConveyorError(Exception):
    """Base of every error Conveyor raises on purpose."""


class PipelineBuildError(ConveyorError, ValueError):
    """The pipeline cannot be built: an invalid stage, a name clash, a missing declared input."""

    @classmethod
    def not_copyable(cls, stage: str, exc: BaseException) -> PipelineBuildError:
        """A stage that cannot be copied or pickled, so cannot reach its workers: it holds
        something made for one process (a lock, an open file, a client)."""
        return cls(
            f"stage {stage!r} cannot be copied to its workers ({type(exc).__name__}: {exc}): "
            "make locks, open files, clients and models in setup(), not in __init__"
        )


class StageSetupError(ConveyorError):
    """A stage's ``setup`` or ``setup_on_node`` raised; the run was stopped.

    ``remote_traceback`` is the traceback text from the worker where it happened.
    """

    def __init__(self, stage: str, message: str, remote_traceback: str = "") -> None:
        self.stage = stage
        self.remote_traceback = remote_traceback
        text = f"stage {stage!r} failed to set up: {message}"
        if remote_traceback:
            text += f"\n--- traceback from the worker ---\n{remote_traceback.rstrip()}"
        super().__init__(text)


class PermanentError(ConveyorError):
    """Raise it (or a subclass) from a stage for an input that can never succeed.

    The input is recorded as a failure at once instead of being retried; use it for bad
    data (a malformed record, an unreadable file), not for flaky resources.
    """


class DeferredError(ConveyorError):
    """Raise it (or a subclass) from a stage for an input that only a later run can help:
    an API that refuses for the day, a quota spent, a server down for maintenance.

    The input fails at once, without the stage's further attempts (they would meet the same
    refusal); with a journal, the next run tries it again, where a ``PermanentError``'s
    input is finished. NeMo Curator's ``TransientDrop`` and ``FailedTask`` mean this.
    """


class UnpicklablePayload(PermanentError, TypeError):
    """A stage returned (or a run was given) an object that cannot be pickled, so it cannot
    go to another process. Pickling it again gives the same error, so the input fails at
    once instead of being run ``max_attempts`` times for nothing."""

    #: what makes an object unpicklable: pickle's own error, and what objects raise from
    #: ``__reduce__`` (locks, open files, sockets: TypeError; local classes: AttributeError)
    CAUSES = (pickle.PicklingError, TypeError, AttributeError, ValueError)

    @classmethod
    def of(cls, obj: object, exc: BaseException) -> UnpicklablePayload:
        kind = type(obj)
        return cls(
            f"a {kind.__module__}.{kind.__qualname__} cannot be pickled to pass it to another "
            f"process ({type(exc).__name__}: {exc}); what goes between stages (a run's tasks, "
            "a stage's outputs) must be data (arrays, bytes, strings, dicts, dataclasses), not "
            "handles such as locks, open files or clients"
        )


class OutputInUse(ConveyorError):
    """Another run is writing to the output folder (``conveyor.output_lock``): the message
    names it (process, host, since when, its command)."""


class BackendError(ConveyorError):
    """The backend could not do what the controller asked (e.g. a worker shape fits no node)."""


class EngineStalled(ConveyorError):
    """An unfinished run had nothing in flight and no worker starting for a long time.

    That can only be a defect of the engine itself; the run stops with its state in the
    message (what each stage holds, its workers, and why nothing moved) instead of hanging.
    """


class JournalError(ConveyorError, ValueError):
    """A journal cannot be used: an unreadable file, or a source task without a stable key."""


class TaskTimeout(ConveyorError):
    """A batch ran longer than its stage's ``timeout_s``: its worker was killed and replaced.

    Recorded (``FailureRecord.error_type == "TaskTimeout"``) for the input that timed out
    alone on every attempt; the other inputs of its batch are retried and go on.
    """
