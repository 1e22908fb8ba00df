"""Whether the installed packages have their bytecode, for ``machine_line`` and ``make
bytecode`` (exit status 1 where some is missing). Imports nothing heavy: ``make`` runs it
before anything is compiled."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable

#: packages the benchmarks' and tests' processes import, whose bytecode is looked for
BYTECODE_PROBES = ("numpy", "pyarrow", "psutil", "av", "torch", "ray")


def without_bytecode(names: Iterable[str] | None = None) -> list[str]:
    """The installed ``names`` whose bytecode is missing. Every process then compiles them as
    it imports them (1.8x the CPU of the test suite), which a pip-installed
    environment never does: a run's figures would overstate the cost of starting processes,
    and so ours against a one-process script. ``names``: ``BYTECODE_PROBES`` by default;
    packages not installed are left out."""
    missing = []
    for name in BYTECODE_PROBES if names is None else names:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        if not os.path.exists(importlib.util.cache_from_source(spec.origin)):
            missing.append(name)
    return missing


if __name__ == "__main__":
    sys.exit(1 if without_bytecode() else 0)
