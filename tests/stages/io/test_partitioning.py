"""FilePartitioningStage and list_files: stable order, grouping, filters, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.stages.io import FilePartitioningStage, list_files
from conveyor.tasks import EmptyTask, FileGroupTask


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    _touch(
        tmp_path,
        "b.jsonl",
        "a.jsonl",
        "c.jsonl",
        "sub/d.jsonl",
        "sub/e.txt",
        ".hidden.jsonl",
        ".cache/f.jsonl",
    )
    (tmp_path / "dir.jsonl").mkdir()  # a directory whose name matches: not a file
    return tmp_path


def test_list_files_is_sorted_filtered_and_recursive(tree: Path) -> None:
    found = [p.relative_to(tree).as_posix() for p in list_files(tree, "*.jsonl")]
    assert found == ["a.jsonl", "b.jsonl", "c.jsonl", "sub/d.jsonl"]


def test_list_files_not_recursive(tree: Path) -> None:
    found = [p.name for p in list_files(tree, "*.jsonl", recursive=False)]
    assert found == ["a.jsonl", "b.jsonl", "c.jsonl"]


def test_groups_of_n_files_with_a_short_last_group(tree: Path) -> None:
    stage = FilePartitioningStage(tree, "*.jsonl", files_per_partition=3, dataset_name="web")
    groups = stage.process(EmptyTask())
    assert [len(g.data) for g in groups] == [3, 1]
    assert all(isinstance(g, FileGroupTask) for g in groups)
    assert [Path(p).name for p in groups[0].data] == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert groups[1].data == [str(tree / "sub" / "d.jsonl")]
    assert [g.metadata["partition_index"] for g in groups] == [0, 1]
    assert {g.metadata["num_partitions"] for g in groups} == {2}
    assert {g.dataset_name for g in groups} == {"web"}


def test_same_tree_gives_the_same_partitions(tree: Path) -> None:
    stage = FilePartitioningStage(tree, "*.jsonl", files_per_partition=2)
    first = [g.content_id for g in stage.process(EmptyTask())]
    second = [g.content_id for g in stage.process(None)]
    assert first == second


def test_limit_and_reader_config_are_copied_per_group(tree: Path) -> None:
    stage = FilePartitioningStage(tree, "*.jsonl", limit=2, reader_config={"fields": ["text"]})
    groups = stage.process(EmptyTask())
    assert len(groups) == 2
    groups[0].reader_config["fields"].append("x")
    assert groups[1].reader_config == {"fields": ["text"]}
    assert stage.reader_config == {"fields": ["text"]}


def test_declares_io_bound_resources(tree: Path) -> None:
    assert FilePartitioningStage(tree).resources.cpus == 0.5


def test_missing_directory_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=r"nope.*does not exist"):
        FilePartitioningStage(missing, "*.jsonl").process(EmptyTask())


def test_file_instead_of_directory(tree: Path) -> None:
    with pytest.raises(NotADirectoryError, match=r"a\.jsonl.*expected a directory"):
        FilePartitioningStage(tree / "a.jsonl").process(EmptyTask())


def test_no_match_names_pattern_and_directory(tree: Path) -> None:
    stage = FilePartitioningStage(tree, "*.parquet")
    with pytest.raises(FileNotFoundError, match=r"no files matching '\*\.parquet' under"):
        stage.process(EmptyTask())
    assert FilePartitioningStage(tree, "*.parquet", allow_empty=True).process(EmptyTask()) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"files_per_partition": 0}, ValueError, "files_per_partition must be >= 1"),
        ({"files_per_partition": 1.5}, TypeError, "files_per_partition must be an int"),
        ({"files_per_partition": True}, TypeError, "files_per_partition must be an int"),
        ({"limit": 0}, ValueError, "limit must be None or >= 1"),
        ({"pattern": ""}, ValueError, "pattern must be a non-empty glob"),
    ],
)
def test_bad_settings_fail_at_construction(
    tmp_path: Path, kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        FilePartitioningStage(tmp_path, **kwargs)  # type: ignore[arg-type]
