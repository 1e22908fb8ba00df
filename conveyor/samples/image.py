"""Generated images for the image pipeline's tests, demo runs and benchmarks (no third-party
media): each seed gives another picture (a gradient, a texture, a few shapes, a little
noise), far from the others in perceptual hash and in embedding, and ``write_shards`` lays
them out as img2dataset does (``key.jpg``, ``key.txt`` caption, ``key.json`` per sample,
and a Parquet table of each shard beside it).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: the sizes ``mixed_size`` draws from: small web images to camera photos, some portrait
MIXED_SIZES: tuple[tuple[int, int], ...] = (
    (320, 240), (480, 360), (640, 480), (800, 600), (1024, 768), (1280, 960), (600, 800),
    (512, 512), (1600, 1200), (360, 640),
)  # fmt: skip
CAPTIONS = ("a picture", "shapes on a gradient", "an abstract pattern", "colourful forms")


#: pictures are drawn at most this wide or high, then scaled to the size asked for
DRAWN_SIDE = 256


def render_image(seed: int, width: int = 320, height: int = 240) -> np.ndarray:
    """A synthetic picture (``height x width x 3`` uint8 RGB), the same for the same seed;
    drawn at most ``DRAWN_SIDE`` pixels a side and scaled up (a large one costs little)."""
    scale = min(1.0, DRAWN_SIDE / max(width, height))
    drawn = _draw(seed, max(1, round(width * scale)), max(1, round(height * scale)))
    if drawn.shape[:2] == (height, width):
        return drawn
    from PIL import Image

    return np.asarray(Image.fromarray(drawn).resize((width, height), Image.Resampling.BILINEAR))


def _draw(seed: int, width: int, height: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * u + np.sin(angle) * v + 1.5) / 3.0
    low, high = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    image = low + ramp[..., None] * (high - low)
    frequency = rng.uniform(3, 25, 2)
    texture = np.sin(2 * np.pi * (frequency[0] * u + rng.uniform())) * np.cos(
        2 * np.pi * (frequency[1] * v + rng.uniform())
    )
    image += texture[..., None] * rng.uniform(-60, 60, 3)
    for _ in range(int(rng.integers(3, 9))):
        cx, cy = rng.uniform(0, 1, 2)
        size = rng.uniform(0.05, 0.35)
        colour = rng.uniform(0, 255, 3)
        if rng.random() < 0.5:
            inside = (u - cx) ** 2 + ((v - cy) * height / width) ** 2 < size**2
        else:
            inside = (np.abs(u - cx) < size) & (np.abs(v - cy) < size * rng.uniform(0.3, 1.5))
        image[inside] = colour
    image += rng.normal(0, 6, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def mixed_size(seed: int) -> tuple[int, int]:
    """A (width, height) of ``MIXED_SIZES`` for ``seed``."""
    return MIXED_SIZES[seed % len(MIXED_SIZES)]


def encode(pixels: np.ndarray, fmt: str = "JPEG", **options: object) -> bytes:
    """``pixels`` in an image format (Pillow's name: JPEG, PNG, WEBP, ...)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **options)
    return out.getvalue()


def write_folder(
    root: str | os.PathLike[str],
    count: int,
    *,
    seed: int = 0,
    sizes: Sequence[tuple[int, int]] = (),
) -> list[Path]:
    """``count`` JPEG files ``img-NNNNNN.jpg`` under ``root`` (sizes cycle through
    ``sizes``, default ``MIXED_SIZES``)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    sizes = tuple(sizes) or MIXED_SIZES
    paths = []
    for i in range(count):
        width, height = sizes[i % len(sizes)]
        path = root / f"img-{i:06d}.jpg"
        path.write_bytes(encode(render_image(seed + i, width, height), quality=90))
        paths.append(path)
    return paths


def write_shards(
    root: str | os.PathLike[str],
    count: int,
    per_shard: int,
    *,
    seed: int = 0,
    sizes: Sequence[tuple[int, int]] = (),
    only: Sequence[int] | None = None,
) -> list[Path]:
    """``count`` images as img2dataset leaves them: ``NNNNN.tar`` shards of ``per_shard``
    samples (``key.jpg``, ``key.txt``, ``key.json``), each with its ``NNNNN.parquet``;
    ``only``: the numbers of the shards to write (processes can share the work)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    sizes = tuple(sizes) or MIXED_SIZES
    shards = []
    for shard, first in enumerate(range(0, count, per_shard)):
        if only is not None and shard not in only:
            continue
        path = root / f"{shard:05d}.tar"
        rows = []
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(first, min(count, first + per_shard)):
                width, height = sizes[i % len(sizes)]
                key = f"{i:09d}"
                caption = f"{CAPTIONS[i % len(CAPTIONS)]} {i}"
                meta = {"key": key, "url": f"http://127.0.0.1/{key}.jpg", "caption": caption,
                        "width": width, "height": height, "status": "success"}  # fmt: skip
                members = (
                    (f"{key}.jpg", encode(render_image(seed + i, width, height), quality=90)),
                    (f"{key}.txt", caption.encode()),
                    (f"{key}.json", json.dumps(meta).encode()),
                )
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                rows.append(meta)
        pq.write_table(pa.Table.from_pylist(rows), root / f"{shard:05d}.parquet")
        shards.append(path)
    return shards
