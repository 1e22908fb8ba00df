"""Bad media, told apart from bad code: an ``InputError`` (or FFmpeg's own errors) means the
input is at fault, is recorded on the video or clip as a failure, and is never retried."""

from __future__ import annotations

import errno

#: a file that cannot be read for the machine's reasons, not its content's
_ACCESS = frozenset({errno.EACCES, errno.EPERM, errno.EIO})


class InputError(Exception):
    """The input (a video, a clip) is bad: recorded on it as a failure, never retried."""


def input_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the media is bad rather than the code: ours and FFmpeg's."""
    import av

    return (InputError, av.FFmpegError, EOFError)


def access_error(exc: BaseException) -> bool:
    """Whether ``exc`` says a file could not be read for want of permission or a disk's I/O
    error: the machine's reason, which a later run may not meet, not the file's."""
    return isinstance(exc, OSError) and exc.errno in _ACCESS


def check_access(exc: BaseException, path: str) -> None:
    """Raise an ``OSError`` (not an ``InputError``) where ``exc`` says ``path`` could not be
    read for want of permission or a disk's I/O error: such a video was recorded as bad,
    and no rerun tried it again once the permissions were fixed; now it is incomplete."""
    if isinstance(exc, OSError) and access_error(exc):
        raise OSError(exc.errno, f"cannot read the file ({exc.strerror})", path) from None


def describe_error(exc: BaseException) -> str:
    """A one-line reason for a failure record."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    if isinstance(exc, InputError):
        return text or name
    return f"{name}: {text}" if text else name
