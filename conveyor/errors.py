"""Exceptions a user may catch; each message names the stage or input and what is wrong."""

from __future__ import annotations


class ConveyorError(Exception):
    """Base of every error Conveyor raises on purpose."""


class PipelineBuildError(ConveyorError, ValueError):
    """The pipeline cannot be built: an invalid stage, a name clash, a missing declared input."""


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
