"""Generated image files of every kind the image pipeline meets (never third-party media):
ordinary pictures in each format, the awkward ones (EXIF-rotated, CMYK, 16-bit, palette
with transparency, animated), and the bad ones (empty, not an image, truncated, a
decompression bomb)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from conveyor.samples.image import encode, render_image


def picture(seed: int = 0, width: int = 160, height: int = 120) -> np.ndarray:
    return render_image(seed, width, height)


def saved(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def exif_rotated(seed: int = 0) -> bytes:
    """A 160 x 120 JPEG whose EXIF says: turn 90 degrees clockwise to view (orientation 6)."""
    image = Image.fromarray(picture(seed))
    exif = image.getexif()
    exif[0x0112] = 6
    return saved(image, "JPEG", exif=exif)


def cmyk(seed: int = 0) -> bytes:
    return saved(Image.fromarray(picture(seed)).convert("CMYK"), "JPEG")


def png16(seed: int = 0) -> bytes:
    """A 16-bit greyscale PNG whose levels run over the whole 16-bit range."""
    grey = picture(seed).astype(np.uint32).mean(axis=2) * 257
    return saved(Image.fromarray(grey.astype(np.uint16)), "PNG")


def palette_with_transparency(seed: int = 0) -> bytes:
    image = Image.fromarray(picture(seed)).convert("P", palette=Image.Palette.ADAPTIVE)
    return saved(image, "PNG", transparency=0)


def animated_gif(seed: int = 0) -> bytes:
    frames = [Image.fromarray(picture(seed + k)) for k in range(3)]
    return saved(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)


def bomb(width: int = 12_000, height: int = 10_000) -> bytes:
    """A PNG of a few kilobytes that would decode to ``width x height`` pixels."""
    return saved(Image.new("L", (width, height)), "PNG")


def truncated_jpeg(seed: int = 0) -> bytes:
    data = encode(picture(seed), quality=90)
    return data[: len(data) // 2]


def truncated_png(seed: int = 0) -> bytes:
    data = encode(picture(seed), "PNG")
    return data[: len(data) // 2]


GOOD = {
    "photo.jpg": lambda: encode(picture(1), quality=90),
    "drawing.png": lambda: encode(picture(2), "PNG"),
    "web.webp": lambda: encode(picture(3), "WEBP"),
    "scan.tiff": lambda: encode(picture(4), "TIFF"),
    "old.bmp": lambda: encode(picture(5), "BMP"),
    "new.avif": lambda: encode(picture(6), "AVIF"),
    "rotated.jpg": lambda: exif_rotated(7),
    "print.jpg": lambda: cmyk(8),
    "deep.png": lambda: png16(9),
    "clear.png": lambda: palette_with_transparency(10),
    "moving.gif": lambda: animated_gif(11),
}
BAD = {
    "empty.jpg": (lambda: b"", "zero bytes"),
    "notes.png": (lambda: b"these are notes, not an image\n", "not an image"),
    "cut.jpg": (lambda: truncated_jpeg(12), "truncated"),
    "cut.png": (lambda: truncated_png(13), "truncated"),
    "bomb.png": (lambda: bomb(), "decompression bomb"),
}


def write_kinds(folder: Path) -> dict[str, bytes]:
    """Every good and bad kind under ``folder`` (the bad ones in ``bad/``); returns the
    bytes by relative path."""
    written = {}
    for name, make in GOOD.items():
        written[name] = make()
    for name, (make, _) in BAD.items():
        written[f"bad/{name}"] = make()
    for relative, data in written.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return written


def brightness_scorer(folder: Path) -> str:
    """A TorchScript aesthetic model in ``folder``: the mean brightness of the frame, times
    10 (LAION's scale)."""
    import torch

    class Brightness(torch.nn.Module):
        def forward(self, frames: torch.Tensor) -> torch.Tensor:
            return frames.mean(dim=(1, 2, 3)) * 10

    path = folder / "brightness.pt"
    torch.jit.script(Brightness()).save(str(path))
    return str(path)
