"""Whose output a folder is: a command never writes into, resumes or ``--overwrite``s the
output of another.

The video, image and text runs write the same names at an output's top (``summary.json``,
the event log, ``.conveyor/``), so a text run into a video output replaced its summary and
swept the video's staging, and ``conveyor image --overwrite`` deleted a video run's tables.
Each run records its command (``"command"`` in ``.conveyor/config.json`` and in
``summary.json``); outputs written before that are known by what they hold. A standalone
``conveyor dedup`` output is no command's, and ``conveyor dedup`` writes into no run's
output: there a run's own ``--dedup`` writes the same two files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: the key naming the command in an output's ``.conveyor/config.json`` and ``summary.json``
COMMAND = "command"

#: a summary written before it named its command: its command by the key only it has
_SUMMARY_KEYS = (("videos", "video"), ("images", "image"), ("documents", "text"))


def output_kind(output: str | os.PathLike[str]) -> str | None:
    """``"video"``, ``"image"`` or ``"text"``: the command whose output ``output`` is, or
    None for a folder none of them wrote (a missing one, a dedup's, the user's)."""
    root = _root(output)
    config = _read(root / ".conveyor" / "config.json")
    if config is not None:  # an image run's options name its image filters
        return str(config.get(COMMAND) or ("image" if "min_size" in config else "video"))
    summary = _read(root / "summary.json")
    if summary is not None:
        if isinstance(summary.get(COMMAND), str):
            return str(summary[COMMAND])
        for key, kind in _SUMMARY_KEYS:
            if key in summary:
                return kind
    internal = root / ".conveyor"
    if any(_exists(internal / name) for name in ("staging", "ready")):
        return "text"  # a text run under way (the others write their config first)
    return None


def check_owner(output: str | os.PathLike[str], command: str) -> str | None:
    """``ValueError`` where ``output`` holds another command's output (or a file a run would
    replace); else the output's kind (``output_kind``)."""
    kind = output_kind(output)
    if kind is not None and kind != command:
        raise ValueError(
            f"OUTPUT {os.fspath(output)} holds {whose(kind)}: write the {command} run to "
            "another OUTPUT"
        )
    if kind is not None:
        return kind
    root = _root(output)
    if _exists(root / "summary.json"):
        raise ValueError(
            f"OUTPUT {os.fspath(output)} holds a summary.json no Conveyor run wrote, which "
            f"the {command} run would replace: move it, or write to another OUTPUT"
        )
    if _exists(root / "dedup.json"):  # a run's own dedup writes the same two files
        raise ValueError(
            f"OUTPUT {os.fspath(output)} holds a conveyor dedup output (dedup.json, "
            f"duplicates.parquet): write the {command} run to another OUTPUT"
        )
    return None


def check_clearable(output: str | os.PathLike[str], command: str, owned: Iterable[Any]) -> None:
    """``ValueError`` unless ``--overwrite`` may empty ``owned`` under ``output``: the
    output is this command's, or holds none of those names (``--overwrite`` deleted a
    user's ``videos/`` and ``metadata/`` in a folder no run had written)."""
    if check_owner(output, command) == command:
        return
    found = sorted(p.name for p in owned if _exists(p))
    if found:
        raise ValueError(
            f"OUTPUT {os.fspath(output)} holds {', '.join(found)}, which no {command} run "
            "wrote there: --overwrite would delete them; move them, or write to another "
            "OUTPUT"
        )


def nesting_problem(output: str | os.PathLike[str]) -> str | None:
    """Why a local ``output`` may not be written, or None: it lies in a folder an enclosing
    output's run owns (``out/clips/x``), which that run's next ``--overwrite`` deleted and
    which no longer read as one dataset."""
    from conveyor.storage import is_url

    text = os.fspath(output)
    if not text or is_url(text):
        return None
    path = Path(os.path.abspath(os.path.expanduser(text)))
    for above in path.parents:
        kind = output_kind(above)
        if kind is None:
            continue
        top = path.relative_to(above).parts[0]
        if top in owned_names(kind):
            return (
                f"OUTPUT {text} lies in {above / top}, which {whose(kind)} owns: write to "
                "another OUTPUT"
            )
    return None


def owned_names(kind: str) -> list[str]:
    """The names a run of ``kind`` writes at its output's top."""
    if kind == "text":
        from conveyor.pipelines.text import DOCUMENTS, INTERNAL, SUMMARY

        return [DOCUMENTS, INTERNAL, SUMMARY]
    if kind == "image":
        from conveyor.pipelines.image import owned
    else:
        from conveyor.pipelines.video import owned
    folders, files = owned(".")
    return [p.name for p in [*folders, *files]]


def _root(output: str | os.PathLike[str]) -> Any:
    from conveyor.storage import location

    return location(os.fspath(output))


def whose(kind: str) -> str:
    """``"a video run's output"``."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} run's output"


def _read(path: Any) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _exists(path: Any) -> bool:
    try:
        return bool(path.exists())
    except OSError:
        return False
