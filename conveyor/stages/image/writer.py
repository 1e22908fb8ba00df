"""Writing a part: its metadata, its embeddings, its kept samples, and last its record.

``metadata/part-NNNNNN.parquet`` has a row per input image of the part (``METADATA``: kept,
filtered and failed alike); ``embeddings/part-NNNNNN.parquet`` the kept images' vectors
(``id``, ``order``, ``embedding``, and ``pixels`` and ``aesthetic`` for the keep rules: what
``conveyor.dedup.semantic_dedup`` reads); the kept images' samples (image, ``.json`` meta,
``.npy`` embedding) are staged as one tar under ``.conveyor/staging`` until the shards are
packed after the run. Every file is written under a temporary name and renamed, named by the
part's number, and the record ``.conveyor/parts/part-NNNNNN.json`` comes last: a part with a
record is complete, and a part done again replaces exactly the files it had begun.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from typing import Any

from conveyor.media.tar_shards import check_key
from conveyor.resources import Resources
from conveyor.stage import ProcessingStage
from conveyor.stages.image.layout import ImageLayout
from conveyor.tasks.image import ERROR_FILTER, ImageBatch, ImageRecord

#: the score columns of the metadata (``None`` where the stage did not run)
SCORES = ("aspect_ratio", "contrast", "nsfw", "aesthetic", "clip_score")


def metadata_schema() -> Any:
    """One schema for every part's metadata, so the parts read as one table."""
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("key", pa.string()),
            ("source", pa.string()),
            ("order", pa.int64()),
            ("caption", pa.string()),
            ("num_bytes", pa.int64()),
            ("width", pa.int32()),
            ("height", pa.int32()),
            ("format", pa.string()),
            ("mode", pa.string()),
            ("frames", pa.int32()),
            ("normalised", pa.list_(pa.string())),
            ("image_ext", pa.string()),
            ("content_hash", pa.string()),
            ("phash", pa.string()),
            *[(name, pa.float64()) for name in SCORES],
            ("tags", pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64())]))),
            ("has_embedding", pa.bool_()),
            ("filtered_by", pa.string()),
            ("failed_stage", pa.string()),
            ("error", pa.string()),
            ("duplicate_of", pa.string()),
            # the input's own fields for the image (a sample's .json, a row's columns)
            ("input_meta", pa.string()),
        ]
    )


def image_meta(image: ImageRecord) -> dict[str, Any]:
    """An image's row of the metadata (and, for a kept one, its ``.json`` in the shards)."""
    stage, reason = next(iter(image.errors.items()), (None, None))
    return {
        "id": image.id,
        "key": image.key,
        "source": image.source,
        "order": image.order,
        "caption": image.caption,
        "num_bytes": image.num_bytes,
        "width": image.width or None,
        "height": image.height or None,
        "format": image.format,
        "mode": image.mode,
        "frames": image.frames,
        "normalised": list(image.normalised),
        "image_ext": image.payload_ext if image.kept else None,
        "content_hash": image.content_hash,
        "phash": image.phash,
        **{name: image.scores.get(name) for name in SCORES},
        "tags": [{"label": label, "score": score} for label, score in image.tags],
        "has_embedding": image.embedding is not None,
        "filtered_by": image.filtered_by,
        "failed_stage": stage,
        "error": reason,
        "duplicate_of": image.duplicate_of,
        "input_meta": None if image.extra is None else json.dumps(image.extra, default=str),
    }


def embedding_table(images: list[ImageRecord]) -> Any:
    """``id``, ``order``, ``embedding`` of the images with a vector (``None``: none has),
    and what the dedup's keep rules order by (``dedup.DEDUP_KEEP``): ``pixels`` and the
    ``aesthetic`` score."""
    import numpy as np
    import pyarrow as pa

    rows = [image for image in images if image.embedding is not None]
    if not rows:
        return None
    vectors = np.stack([np.asarray(image.embedding, np.float32) for image in rows])
    dim = vectors.shape[1]
    offsets = pa.array(np.arange(0, len(rows) * dim + 1, dim, dtype=np.int32))
    return pa.table(
        {
            "id": pa.array([image.id for image in rows], pa.string()),
            "order": pa.array([image.order for image in rows], pa.int64()),
            "embedding": pa.ListArray.from_arrays(offsets, pa.array(vectors.reshape(-1))),
            "pixels": pa.array([image.width * image.height or None for image in rows], pa.int64()),
            "aesthetic": pa.array([image.scores.get("aesthetic") for image in rows], pa.float64()),
        }
    )


def sample_members(image: ImageRecord, meta: dict[str, Any]) -> list[tuple[str, bytes]]:
    """A kept image's tar members: the image, its meta and (where it has one) its vector."""
    check_key(image.id, "image id")
    members = [
        (f"{image.id}.{image.payload_ext}", image.payload or b""),
        (f"{image.id}.json", (json.dumps(meta, ensure_ascii=False) + "\n").encode()),
    ]
    if image.embedding is not None:
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, np.asarray(image.embedding, dtype=np.float32), allow_pickle=False)
        members.append((f"{image.id}.npy", buffer.getvalue()))
    return members


def tar_bytes(samples: list[list[tuple[str, bytes]]]) -> bytes:
    """Samples' members as one tar, in order."""
    out = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for members in samples:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), now, 0o644
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def part_record(task: ImageBatch) -> dict[str, Any]:
    """What a complete part's record says: its key, counts and failures."""
    assert task.part is not None
    filtered: dict[str, int] = {}
    for image in task.data:
        if image.filtered_by is not None and image.filtered_by != ERROR_FILTER:
            filtered[image.filtered_by] = filtered.get(image.filtered_by, 0) + 1
    return {
        "key": list(task.part.key),
        "part": task.part.index,
        "images": len(task.data),
        "kept": sum(image.kept for image in task.data),
        "filtered": dict(sorted(filtered.items())),
        "failures": [
            {"key": image.key, "stage": stage, "reason": reason}
            for image in task.data
            for stage, reason in image.errors.items()
        ],
        # images that could not be read for now: the next run does the part again
        "read_again": sum(image.again for image in task.data),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class ImageWriter(ProcessingStage[ImageBatch, ImageBatch]):
    """Write each part's metadata, embeddings and kept samples, then its record; the task
    goes on with the record and without its images, so what reaches the driver is small."""

    resources = Resources(cpus=0.5)

    def __init__(self, output: str) -> None:
        self.output = str(output)

    def process(self, task: ImageBatch) -> ImageBatch:
        import pyarrow as pa

        assert task.part is not None, "an ImageBatch from ImageReader carries its part"
        index = task.part.index
        layout = ImageLayout(self.output)
        metas = [image_meta(image) for image in task.data]
        table = pa.Table.from_pylist(metas, schema=metadata_schema())
        layout.write_parquet(layout.metadata_path(index), table)
        kept = [(image, meta) for image, meta in zip(task.data, metas, strict=True) if image.kept]
        vectors = embedding_table([image for image, _ in kept])
        if vectors is not None:
            layout.write_parquet(layout.part_embeddings(index), vectors)
        else:
            layout.part_embeddings(index).unlink(missing_ok=True)
        staged = [sample_members(image, meta) for image, meta in kept]
        layout.write_bytes(layout.staged_samples(index), tar_bytes(staged))
        record = part_record(task)
        layout.write_json(layout.part_record(index), record)
        return ImageBatch(
            data=[], dataset_name=task.dataset_name, metadata=task.metadata, part=task.part,
            record=record,
        )  # fmt: skip
