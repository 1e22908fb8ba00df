"""File partitioning: turn a directory (or a URL's prefix) into ``FileGroupTask``s of N files.

Listing happens inside the stage (on a worker), not when the pipeline is built, so a pipeline
over a large bucket starts at once and the listing cost shows up in the stage's measurements.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.storage import ObjectPath, location
from conveyor.tasks import FileGroupTask


def list_files(
    directory: str | Path | ObjectPath, pattern: str = "*", recursive: bool = True
) -> list[Path] | list[ObjectPath]:
    """Files under ``directory`` (a path or a URL) whose name matches the glob ``pattern``, in a
    stable order.

    Hidden files and files inside hidden directories (a name starting with ``.``) are skipped:
    they are editor swap files, checksums, a writer's temporaries and the like, never data.
    The order is the sorted relative path, so the same tree always gives the same partitions.
    """
    root = location(directory)
    if isinstance(root, ObjectPath):
        return _list_objects(root, pattern, recursive)
    if not root.exists():
        raise FileNotFoundError(f"input directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"input path {str(root)!r} is a file, expected a directory")
    found = root.rglob(pattern) if recursive else root.glob(pattern)
    files = []
    for path in found:
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _list_objects(root: ObjectPath, pattern: str, recursive: bool) -> list[ObjectPath]:
    """``list_files`` under a URL: one listing of the prefix, matched like ``rglob``/``glob``."""
    try:
        info = root.info()
    except FileNotFoundError as exc:  # names the URL, or its missing bucket
        raise FileNotFoundError(f"input directory {exc}") from None
    if info["type"] != "directory":
        raise NotADirectoryError(f"input path {str(root)!r} is a file, expected a directory")
    depth = len(PurePosixPath(pattern).parts)
    files = []
    for entry in root.find():
        rel = PurePosixPath(entry.relative)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if (recursive or len(rel.parts) == depth) and rel.match(pattern):
            files.append(entry.path)
    return files


class FilePartitioningStage(ProcessingStage[Any, FileGroupTask]):
    """Lists files matching ``pattern`` under ``path`` and emits groups of ``files_per_partition``.

    It ignores its input (the pipeline's single seed task), so it belongs first in a pipeline.
    ``reader_config`` is deep-copied onto every group for the reader that consumes it. With no
    matching file it raises, naming the directory and pattern, unless ``allow_empty`` is set.
    """

    resources = Resources(cpus=0.5)

    def __init__(
        self,
        path: str | Path | ObjectPath,
        pattern: str = "*",
        files_per_partition: int = 1,
        *,
        recursive: bool = True,
        limit: int | None = None,
        dataset_name: str = "",
        reader_config: Mapping[str, Any] | None = None,
        allow_empty: bool = False,
    ) -> None:
        if isinstance(files_per_partition, bool) or not isinstance(files_per_partition, int):
            raise TypeError(
                f"FilePartitioningStage: files_per_partition must be an int, "
                f"got {files_per_partition!r}"
            )
        if files_per_partition < 1:
            raise ValueError(
                "FilePartitioningStage: files_per_partition must be >= 1, "
                f"got {files_per_partition}"
            )
        if limit is not None and (isinstance(limit, bool) or limit < 1):
            raise ValueError(f"FilePartitioningStage: limit must be None or >= 1, got {limit!r}")
        if not pattern:
            raise ValueError(
                "FilePartitioningStage: pattern must be a non-empty glob, e.g. '*.jsonl'"
            )
        self.path = str(path)
        self.pattern = pattern
        self.files_per_partition = files_per_partition
        self.recursive = recursive
        self.limit = limit
        self.dataset_name = dataset_name
        self.reader_config = dict(reader_config or {})
        self.allow_empty = allow_empty

    def partitions(self) -> list[list[str]]:
        """The groups of paths this stage emits (also handy to preview a run)."""
        files = list_files(self.path, self.pattern, self.recursive)
        if self.limit is not None:
            files = files[: self.limit]
        if not files and not self.allow_empty:
            raise FileNotFoundError(
                f"stage {self.name!r}: no files matching {self.pattern!r} under {self.path!r}"
                + ("" if self.recursive else " (recursive=False)")
            )
        paths = [str(p) for p in files]
        n = self.files_per_partition
        return [paths[i : i + n] for i in range(0, len(paths), n)]

    def process(self, task: Any) -> list[FileGroupTask]:
        groups = self.partitions()
        return [
            FileGroupTask(
                data=group,
                dataset_name=self.dataset_name,
                reader_config=copy.deepcopy(self.reader_config),
                metadata={"partition_index": i, "num_partitions": len(groups)},
            )
            for i, group in enumerate(groups)
        ]
