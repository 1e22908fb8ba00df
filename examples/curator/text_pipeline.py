"""A text pipeline in NeMo Curator's style: JSONL in, a word-count filter, a scoring stage
on a quarter GPU, Parquet out. Its source runs on NeMo Curator 1.4 with ``nemo_curator`` in
its import lines (``benchmarks/curator.py --peer`` runs it on both).

``python examples/curator/text_pipeline.py WORKDIR`` writes sample JSONL files under
``WORKDIR/input`` and the kept documents under ``WORKDIR/output``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from conveyor.curator.backends.xenna import XennaExecutor
from conveyor.curator.pipeline import Pipeline
from conveyor.curator.stages.base import CompositeStage, ProcessingStage
from conveyor.curator.stages.function_decorators import processing_stage
from conveyor.curator.stages.resources import Resources
from conveyor.curator.tasks import DocumentBatch, EmptyTask, FileGroupTask


class FilePartitioningStage(ProcessingStage[EmptyTask, FileGroupTask]):
    """The input folder's ``*.jsonl`` files, ``files_per_partition`` per task."""

    name = "file_partitioning"
    resources = Resources(cpus=0.5)

    def __init__(self, path: str, files_per_partition: int = 1) -> None:
        self.path = path
        self.files_per_partition = files_per_partition

    def num_workers(self) -> int:
        return 1  # one lister

    def process(self, task: EmptyTask) -> list[FileGroupTask]:
        files = sorted(str(p) for p in Path(self.path).glob("*.jsonl"))
        n = self.files_per_partition
        config = {"lines": True}
        return [
            FileGroupTask(dataset_name="jsonl", data=files[i : i + n], reader_config=config)
            for i in range(0, len(files), n)
        ]


class JsonlReaderStage(ProcessingStage[FileGroupTask, DocumentBatch]):
    name = "jsonl_reader"
    resources = Resources(cpus=1)

    def process(self, task: FileGroupTask) -> DocumentBatch:
        frames = [pd.read_json(path, **task.reader_config) for path in task.data]
        df = pd.concat(frames, ignore_index=True)
        return DocumentBatch(
            dataset_name=task.dataset_name, data=df, _metadata={"source_files": task.data}
        )

    def outputs(self) -> tuple[list[str], list[str]]:
        return ["data"], ["id", "text"]


class JsonlReader(CompositeStage[EmptyTask, DocumentBatch]):
    """Partitioning then reading, as NeMo Curator's readers are built."""

    name = "jsonl_reader_composite"

    def __init__(self, path: str, files_per_partition: int = 1) -> None:
        super().__init__()
        self.path = path
        self.files_per_partition = files_per_partition

    def decompose(self) -> list[ProcessingStage[Any, Any]]:
        return [FilePartitioningStage(self.path, self.files_per_partition), JsonlReaderStage()]


@processing_stage(name="word_count_filter", resources=Resources(cpus=1))
def word_count_filter(task: DocumentBatch) -> DocumentBatch | None:
    df = task.to_pandas()
    kept = df[df["text"].str.split().map(len).between(5, 200)]
    if kept.empty:
        return None  # nothing left of this batch
    return DocumentBatch(dataset_name=task.dataset_name, data=kept.reset_index(drop=True))


class QualityScorer(ProcessingStage[DocumentBatch, DocumentBatch]):
    """A model stage: four workers share a GPU. The "model" is a word-length score."""

    name = "quality_scorer"
    resources = Resources(cpus=1, gpus=0.25)
    batch_size = 4

    def setup(self, worker_metadata: Any = None) -> None:
        allocation = getattr(worker_metadata, "allocation", None)
        self.gpus = tuple(gpu.index for gpu in getattr(allocation, "gpus", ()))

    def process(self, task: DocumentBatch) -> DocumentBatch:
        return self.process_batch([task])[0]

    def process_batch(self, tasks: list[DocumentBatch]) -> list[DocumentBatch]:
        out = []
        for task in tasks:
            df = task.to_pandas().copy()
            words = df["text"].str.split()
            df["quality"] = words.map(lambda w: sum(map(len, w)) / max(1, len(w)))
            df["gpu"] = ",".join(map(str, self.gpus))
            out.append(
                DocumentBatch(dataset_name=task.dataset_name, data=df, _metadata=task._metadata)
            )
        return out


class ParquetWriter(ProcessingStage[DocumentBatch, FileGroupTask]):
    name = "parquet_writer"
    resources = Resources(cpus=0.5)

    def __init__(self, path: str) -> None:
        self.path = path

    def setup_on_node(self, node_info: Any = None, worker_metadata: Any = None) -> None:
        os.makedirs(self.path, exist_ok=True)  # once per node

    def process(self, task: DocumentBatch) -> FileGroupTask:
        name = f"{task.task_id.replace('.', '-')}.parquet"
        final = os.path.join(self.path, name)
        temp = final + ".tmp"
        task.to_pandas().to_parquet(temp, index=False)
        os.replace(temp, final)  # a retry writes the same file again
        return FileGroupTask(dataset_name=task.dataset_name, data=[final])


def write_inputs(folder: Path, files: int = 6, rows: int = 40) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    sentence = "curation at scale needs stages that stream and balance themselves well"
    words = sentence.split()
    for f in range(files):
        with open(folder / f"part-{f:03d}.jsonl", "w") as out:
            for r in range(rows):
                n = (f * 7 + r * 3) % 14 + 1
                out.write(json.dumps({"id": f"{f}-{r}", "text": " ".join(words[:n])}) + "\n")
    return folder


def build(workdir: Path) -> Pipeline:
    pipeline = Pipeline("text-curation", "JSONL -> word count filter -> score -> Parquet")
    pipeline.add_stage(JsonlReader(str(workdir / "input"), files_per_partition=2))
    pipeline.add_stage(word_count_filter)
    pipeline.add_stage(QualityScorer())
    pipeline.add_stage(ParquetWriter(str(workdir / "output")))
    return pipeline


def main(workdir: Path, executor: Any = None) -> list[FileGroupTask]:
    write_inputs(workdir / "input")
    if executor is None:
        from conveyor.backends.local import LocalBackend

        executor = XennaExecutor(backend=LocalBackend(num_gpus=1))
    return build(workdir).run(executor)


if __name__ == "__main__":
    written = main(Path(sys.argv[1] if len(sys.argv) > 1 else "curator-text"))
    print(f"{len(written)} Parquet files", file=sys.stderr)
