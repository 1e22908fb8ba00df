"""Tracebacks from workers that name the user's files.

A stage defined in a script's ``__main__`` or a notebook cell travels by value
(cloudpickle), which names its code ``<dynamic-code>`` (so that its bytes do not depend on
where it was defined): a worker's traceback then read ``File "<dynamic-code>", line 6, in
process``, with no file and no source line. The driver still has the stage's code, with its
real file: ``named_sources`` puts the file and the line's source back.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Iterator
from types import CodeType
from typing import Any

DYNAMIC = "<dynamic-code>"
_FRAME = re.compile(r'^(?P<indent> *)File "<dynamic-code>", line (?P<line>\d+), in (?P<name>\S+)$')


def _codes(code: CodeType) -> Iterator[CodeType]:
    """``code`` and the code of every function, lambda and class body inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _stage_codes(stage: Any) -> list[CodeType]:
    """The code of the stage's class (and its bases') methods and of the functions it holds
    (``@processing_stage`` keeps the function it wraps)."""
    found: list[CodeType] = []
    owners = [vars(cls) for cls in type(stage).__mro__ if cls is not object]
    owners.append(getattr(stage, "__dict__", {}))
    for namespace in owners:
        for value in list(namespace.values()):
            wrapped = (getattr(value, "__func__", None), getattr(value, "fget", None))
            for candidate in (value, *wrapped):
                code = getattr(candidate, "__code__", None)
                if isinstance(code, CodeType):
                    found.extend(_codes(code))
    return found


def named_sources(text: str, stage: Any) -> str:
    """``text`` (a worker's traceback) with each ``<dynamic-code>`` frame of ``stage``'s code
    given its file and source line, where the driver has them."""
    if DYNAMIC not in text:
        return text
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for code in _stage_codes(stage):
        lines = [line for _, _, line in code.co_lines() if line is not None]
        if lines and code.co_filename != DYNAMIC:  # (a notebook cell's name will do too)
            first = min(code.co_firstlineno, *lines)
            spans.setdefault(code.co_name, []).append((first, max(lines), code.co_filename))

    out = []
    for line in text.splitlines():
        frame = _FRAME.match(line)
        if frame is not None:
            number, name = int(frame["line"]), frame["name"]
            where = [f for first, last, f in spans.get(name, ()) if first <= number <= last]
            if len(set(where)) == 1:
                out.append(f'{frame["indent"]}File "{where[0]}", line {number}, in {name}')
                source = linecache.getline(where[0], number).strip()
                if source:
                    out.append(f"{frame['indent']}  {source}")
                continue
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
