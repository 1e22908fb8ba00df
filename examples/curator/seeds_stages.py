"""NeMo Curator's resource-allocation example, ported by changing its imports.

A CPU tokenizer, a function-stage filter and a model stage that takes a quarter of a GPU
(four of its workers share one). The "model" scores each document from its token counts,
enough to show where the stage runs.
"""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd

from conveyor.curator.backends.xenna import XennaExecutor
from conveyor.curator.pipeline import Pipeline
from conveyor.curator.stages.core import ProcessingStage
from conveyor.curator.stages.function_decorators import processing_stage
from conveyor.curator.stages.resources import Resources
from conveyor.curator.tasks import DocumentBatch


class TokenizerStage(ProcessingStage[DocumentBatch, DocumentBatch]):
    name: str = "TokenizerStage"
    resources: Resources = Resources(cpus=1.0)  # CPU-only: no GPU needed

    def __init__(self) -> None:
        super().__init__()

    def process(self, task: DocumentBatch) -> DocumentBatch:
        df = task.to_pandas().copy()
        df["tokens"] = df["text"].str.split().map(len)
        return DocumentBatch(dataset_name=task.dataset_name, data=df, _metadata=task._metadata)

    def outputs(self) -> tuple[list[str], list[str]]:
        return ["data"], ["text", "tokens"]


class ModelStage(ProcessingStage[DocumentBatch, DocumentBatch]):
    name: str = "ModelStage"

    def __init__(self, model_path: str) -> None:
        super().__init__()
        self.model_path = model_path
        self.weight = 0.0

    def setup(self, worker_metadata: Any = None) -> None:
        self.weight = 0.1  # where a real stage loads its model
        self.worker = worker_metadata.worker_id if worker_metadata else "?"

    def inputs(self) -> tuple[list[str], list[str]]:
        return ["data"], ["tokens"]

    def process(self, task: DocumentBatch) -> DocumentBatch:
        df = task.to_pandas().copy()
        df["score"] = df["tokens"] * self.weight
        df["worker"] = self.worker
        return DocumentBatch(dataset_name=task.dataset_name, data=df, _metadata=task._metadata)


@processing_stage(name="custom_filter", resources=Resources(cpus=1))
def custom_filter_stage(task: DocumentBatch) -> DocumentBatch:
    df = task.to_pandas()
    return DocumentBatch(dataset_name=task.dataset_name, data=df[df["tokens"] >= 3])


def documents(batches: int = 8, rows: int = 50) -> list[DocumentBatch]:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
    return [
        DocumentBatch(
            dataset_name="seeds",
            data=pd.DataFrame({"text": [" ".join(words[: 1 + (b + r) % 9]) for r in range(rows)]}),
        )
        for b in range(batches)
    ]


def build() -> Pipeline:
    model_stage = ModelStage(model_path="path/to/model").with_(resources=Resources(gpus=0.25))
    return Pipeline(
        "seeds-stages",
        "tokenize, filter, score on a quarter GPU",
        [TokenizerStage(), custom_filter_stage, model_stage],
    )


def main(executor: Any = None) -> list[DocumentBatch]:
    if executor is None:
        from conveyor.backends.local import LocalBackend

        # two declared GPUs: the model stage runs here without one
        executor = XennaExecutor(backend=LocalBackend(num_gpus=2))
    return build().run(executor, documents())


if __name__ == "__main__":
    out = main()
    rows = sum(t.num_items for t in out)
    print(f"{len(out)} batches, {rows} documents kept", file=sys.stderr)
