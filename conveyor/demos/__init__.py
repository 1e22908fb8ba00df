"""Self-checking demos on generated data: ``video`` (the flagship, ``conveyor demo``) and
``text`` (``conveyor text-demo``)."""

from __future__ import annotations

from pathlib import Path


def check_places(workdir: str | Path) -> None:
    """``ValueError`` unless ``workdir`` and its ``input`` and ``output`` are folders or not
    there yet (found before anything is written, rather than as a traceback halfway)."""
    root = Path(workdir)
    for place in (root, root / "input", root / "output"):
        if place.exists() and not place.is_dir():
            raise ValueError(f"--workdir: {place} is a file, expected a folder")
