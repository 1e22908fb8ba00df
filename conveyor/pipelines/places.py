"""Where a run's sources may lie: never where the run itself writes.

A run owns some names under its output (its folders, its summary, the event log the
commands keep there) and ``--overwrite`` empties them; a source inside one of them would be
read while it is rewritten, and deleted by the next ``--overwrite``. An output *inside* an
input folder is fine: the listing leaves it out.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable
from typing import Any

#: what the commands write next to any run's results (``conveyor.monitor.event_log``)
MONITOR_FILES = ("events.jsonl", "report.html")


def _local_root(source: str) -> str | None:
    """The real path of a local source (a glob: the folder before its first wildcard), or
    None for a URL."""
    from conveyor.storage import is_url

    if is_url(source):
        return None
    path = os.path.expanduser(source.removeprefix("file://"))
    parts = path.split(os.sep)
    wild = [i for i, part in enumerate(parts) if glob.has_magic(part)]
    if wild:
        path = os.sep.join(parts[: wild[0]])
    return os.path.realpath(path or ".")


def source_problems(
    sources: Iterable[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    owned: Iterable[Any],
    owns: Callable[[str], bool] | None = None,
) -> list[str]:
    """What is wrong with where the sources lie: one line per source that is the output
    folder itself, or lies in one of the names the run owns under it (``owned``: folders or
    files, as names or as their paths; ``owns``: a test of other names there, such as the
    text run's ``part-NNNNN``)."""
    root = _local_root(os.fspath(output))
    if root is None:
        return []
    names = {getattr(place, "name", place) for place in owned} | set(MONITOR_FILES)
    problems = []
    for source in sources:
        where = _local_root(os.fspath(source))
        if where is None:
            continue
        if where == root and os.path.isfile(where):
            problems.append(f"OUTPUT is the INPUT file ({source}): give a folder to write to")
            continue
        if where == root:
            problems.append(
                f"OUTPUT is the INPUT folder ({source}): write to another folder (one inside "
                "INPUT is fine, it is not read)"
            )
            continue
        relative = os.path.relpath(where, root)
        if relative.startswith(os.pardir):
            continue
        top = relative.split(os.sep)[0]
        if top in names or (owns is not None and owns(top)):
            problems.append(
                f"INPUT {source} lies in {os.path.join(os.fspath(output), top)}, which the run "
                "writes over: move it out of OUTPUT, or write to another OUTPUT"
            )
    return problems
