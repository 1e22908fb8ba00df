"""The plain-script contender: image curation as a user writes it in an afternoon, no Conveyor.

For every WebDataset tar under INPUT (name order), one sample after the other: read the
image, open it with Pillow, apply its EXIF orientation and make it RGB, hash its bytes
(BLAKE2b) and take its perceptual hash (``imagehash.phash``), resize it so that its shorter
side is 256 pixels; every ``--batch`` images, embed the batch with the packaged
EfficientNet-Lite0 (the same ``load_frame_encoder`` as Conveyor) and score it with Open-NSFW
(the same packaged ONNX model), both with ``--threads`` threads; drop images that are too
small, NSFW or exact duplicates of an earlier one; append the kept ones (jpg, json, npy) to
``OUTPUT/kept.tar`` and write every image's row to ``OUTPUT/metadata.parquet``. A bad image
is skipped with its reason. The baseline of ``benchmarks/image.py``; time it by hand with::

    python benchmarks/plain_image.py INPUT OUTPUT
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SIDE = 256
MIN_SIZE = 64
NSFW_THRESHOLD = 0.8


def samples(folder: Path, limit: int | None) -> Any:
    """(key, jpeg bytes) of every sample of the tars under ``folder``, in name order."""
    count = 0
    for shard in sorted(folder.rglob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if not member.name.endswith(".jpg"):
                    continue
                if limit is not None and count >= limit:
                    return
                data = tar.extractfile(member)
                assert data is not None
                yield f"{shard.name}/{member.name[:-4]}", data.read()
                count += 1


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import imagehash
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from PIL import Image, ImageOps

    from conveyor.cluster import WorkerInfo
    from conveyor.media.models import load_frame_encoder
    from conveyor.stages.video.nsfw import OpenNSFW

    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    encoder = load_frame_encoder("efficientnet-lite0", "cpu")
    nsfw = OpenNSFW(WorkerInfo("plain", "plain", "local"), args.threads)
    args.output.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    batch: list[tuple[dict[str, Any], bytes, np.ndarray]] = []
    with tarfile.open(args.output / "kept.tar", "w") as kept:

        def flush() -> None:
            features, _ = encoder.encode_each([pixels for _, _, pixels in batch])
            scores = nsfw.probabilities([pixels for _, _, pixels in batch])
            for (row, data, _), vector, score in zip(batch, features, scores, strict=True):
                row["nsfw"] = float(score)
                if score >= NSFW_THRESHOLD:
                    row["filtered_by"] = "nsfw"
                    continue
                buffer = io.BytesIO()
                np.save(buffer, vector)
                for ext, payload in (
                    ("jpg", data), ("json", json.dumps(row).encode()), ("npy", buffer.getvalue())
                ):  # fmt: skip
                    info = tarfile.TarInfo(f"{row['id']}.{ext}")
                    info.size = len(payload)
                    kept.addfile(info, io.BytesIO(payload))
            batch.clear()

        for key, data in samples(args.input, args.limit):
            digest = hashlib.blake2b(data, digest_size=16).hexdigest()
            row: dict[str, Any] = {"id": digest[:24], "key": key, "filtered_by": None}
            rows.append(row)
            try:
                with Image.open(io.BytesIO(data)) as opened:
                    image = ImageOps.exif_transpose(opened).convert("RGB")
            except Exception as exc:  # noqa: BLE001 - a bad image is skipped with its reason
                row["filtered_by"] = f"error: {exc}"
                continue
            row["width"], row["height"] = image.size
            row["phash"] = str(imagehash.phash(image))
            if min(image.size) < MIN_SIZE:
                row["filtered_by"] = "too_small"
                continue
            if digest in seen:
                row["filtered_by"] = "duplicate"
                continue
            seen.add(digest)
            scale = min(1.0, SIDE / min(image.size))
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            batch.append((row, data, np.asarray(image.resize(size, Image.Resampling.BILINEAR))))
            if len(batch) >= args.batch:
                flush()
        if batch:
            flush()
    pq.write_table(pa.Table.from_pylist(rows), args.output / "metadata.parquet")
    result = {
        "images": len(rows),
        "kept": sum(r["filtered_by"] is None for r in rows),
        "wall_s": round(time.perf_counter() - started, 3),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
