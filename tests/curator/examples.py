"""The examples in ``examples/curator/``, imported by path (they are scripts, not a package),
and checks of what each must give whatever executor ran it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle
import pandas as pd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "curator"


def example(name: str) -> ModuleType:
    """``examples/curator/<name>.py`` as a module (imported once)."""
    key = f"curator_example_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
        # workers cannot import a module loaded by path: its classes travel by value
        cloudpickle.register_pickle_by_value(module)
    return sys.modules[key]


def check_seeds(out: list[Any]) -> None:
    """8 batches of 50 documents; those of 3 tokens or more kept and scored."""
    seeds = example("seeds_stages")
    expected = sum(
        int((d.to_pandas()["text"].str.split().map(len) >= 3).sum()) for d in seeds.documents()
    )
    assert len(out) == 8 and sum(t.num_items for t in out) == expected
    for task in out:
        df = task.to_pandas()
        assert (df["tokens"] >= 3).all() and (df["score"] == df["tokens"] * 0.1).all()
        assert df["worker"].str.startswith("ModelStage").all()


def check_text(workdir: Path, out: list[Any]) -> None:
    """Every document of 5 to 200 words is in the Parquet files written, scored."""
    written = sorted(path for task in out for path in task.data)
    assert written and all(Path(p).parent == workdir / "output" for p in written)
    got = pd.concat([pd.read_parquet(p) for p in written], ignore_index=True)
    source = pd.concat(
        [pd.read_json(p, lines=True) for p in sorted((workdir / "input").glob("*.jsonl"))]
    )
    words = source["text"].str.split().map(len)
    assert sorted(got["id"]) == sorted(source[words.between(5, 200)]["id"])
    assert (got["quality"] > 0).all()


def check_video(workdir: Path, out: list[Any]) -> None:
    """Two 2 s videos cut into four 1 s clips by Conveyor's stages; the slower half of each
    moved to ``filtered_clips`` by the Curator-style filter, and so filtered in its name;
    the two kept written, with their motion scores."""
    clips = [c for task in out for c in task.data.clips]
    assert len(clips) == 4
    kept = [c for c in clips if c.kept]
    assert [c.span for c in kept] == [(1.0, 2.0)] * 2
    assert {c.filtered_by for c in clips if not c.kept} == {"motion_threshold"}
    assert all(c.scores["motion_global_mean"] > 0 for c in clips)
    assert len(list((workdir / "output" / "clips").glob("*.mp4"))) == 2
    assert len(list((workdir / "output" / "videos").rglob("*.json"))) == 2
