"""The pipelines' configs checked field by field for what their annotations promise.

A script's ``VideoConfig(limit=True)`` meant one video, ``dedup="no"`` turned dedup on,
``crf="5"`` said "'<=' not supported between int and str", and a NaN threshold was written
into the output's recorded options, where ``NaN != NaN`` refused every resume after. The
command line refuses such values before they reach a config; this does the same for every
config whose fields are numbers or switches, by their annotations.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

#: the most a ``limit`` may be: Python's slices stop at ``sys.maxsize``
LIMIT_MAX = 2**62

#: annotations (as written) this check judges; any other (text, paths, choices) is left to
#: the config's own checks
_SIMPLE = {"bool", "int", "float", "None"}


def type_problems(config: Any) -> list[str]:
    """One line per field of the dataclass ``config`` whose value is not what its
    annotation (``bool``, ``int``, ``float``, optionally ``| None``) allows: a switch that is
    not True or False, a bool or text where a number goes, a fraction where a whole number
    goes, a number that is not finite."""
    problems = []
    for f in dataclasses.fields(config):
        kinds = {part.strip() for part in str(f.type).split("|")}
        if not kinds <= _SIMPLE:
            continue
        problem = _problem(getattr(config, f.name), kinds)
        if problem:
            problems.append(f"{f.name} {problem}")
    return problems


def check_types(config: Any) -> None:
    """``ValueError`` with every ``type_problems`` of ``config``: raised before its own
    checks, which compare the numbers."""
    problems = type_problems(config)
    if problems:
        raise ValueError("; ".join(problems))


def _problem(value: Any, kinds: set[str]) -> str | None:
    if value is None:
        return None if "None" in kinds else "must be given, got None"
    if kinds <= {"bool", "None"}:
        return None if isinstance(value, bool) else f"must be True or False, got {value!r}"
    number = "a whole number" if "float" not in kinds else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be {number}, got {value!r}"
    if isinstance(value, float) and "float" not in kinds:
        return f"must be a whole number, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    return None


def limit_problems(limit: int | None) -> list[str]:
    """Why ``limit`` cannot be one (its type is ``type_problems``'s): none, or one line."""
    if limit is None or isinstance(limit, bool) or not isinstance(limit, int):
        return []
    if limit < 1:
        return [f"limit must be >= 1, got {limit}"]
    if limit > LIMIT_MAX:
        return [f"limit must be at most 2**62, got {limit}"]
    return []


def absolute(path: str | os.PathLike[str]) -> str:
    """``path`` with ``~`` expanded and made absolute (a URL as it is): a run's workers, on
    this machine or on Ray, find it wherever they run (a relative ``~/out`` was made as a
    folder named ``~``)."""
    from conveyor.storage import is_url, normalize

    text = normalize(os.fspath(path))
    return text if is_url(text) else normalize(os.path.abspath(os.path.expanduser(text)))


def model_problems(
    config: Any, names: tuple[str, ...], packaged: str | None = None, *, optional: bool = True
) -> list[str]:
    """One line per model field of ``config`` (a path, or the ``packaged`` model's name;
    None where ``optional``) that is empty (``Path("").exists()`` is the current folder's),
    not a path, or missing."""
    from pathlib import Path

    problems = []
    for name in names:
        value = getattr(config, name)
        if (value is None and optional) or (packaged is not None and value == packaged):
            continue
        if not isinstance(value, (str, os.PathLike)):
            problems.append(f"{name} must be a path, got {value!r}")
        elif not os.fspath(value).strip():
            problems.append(f"{name} must not be empty")
        elif not Path(value).expanduser().exists():
            problems.append(f"{name.replace('_', ' ')} path {os.fspath(value)!r} does not exist")
    return problems


def package_problems(wanted: Sequence[tuple[str, str, str]]) -> list[str]:
    """``(module, what needs it, extra)`` for each package the options need: the missing
    ones said now, with the extra that installs them, rather than as a worker's
    ``ModuleNotFoundError`` once the run started."""
    import importlib.util

    return [
        f"{what} needs the {module} package (pip install 'conveyor[{extra}]')"
        for module, what, extra in wanted
        if importlib.util.find_spec(module) is None
    ]
