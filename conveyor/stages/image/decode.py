"""Decoding and normalising images, each failing alone with its reason.

``ImageDecoder`` takes each image's bytes and:

- refuses what is not an image: zero bytes, bytes Pillow cannot identify, a file that ends
  before its pixels do (truncated), more pixels than ``max_pixels`` (a decompression bomb:
  the size is read from the header, before any pixel is decoded);
- normalises what is one: the EXIF orientation applied, CMYK, palette, bilevel, 16-bit and
  other modes made 8-bit RGB, transparency composited on white, an animation's first frame;
- hashes it: ``content_hash`` (BLAKE2b of the bytes, for exact duplicates) and ``phash``
  (``imagehash``'s perceptual hash of the working copy, for near duplicates);
- keeps a *working copy* for the stages after it (RGB, shorter side ``WORK_SIDE``, longer
  side at most ``WORK_MAX_SIDE``): a JPEG is decoded straight at about that size (Pillow's
  DCT scaling, ``draft``), a fraction of the cost of the full size;
- decides what the output shard holds: the bytes as read when the image is a JPEG, PNG or
  WebP that needed no change (RGB or grey, upright, one frame), else the normalised image
  re-encoded (PNG for a lossless source, JPEG at quality 95 for a lossy one), so that any
  reader of the shards gets an upright RGB image.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from typing import Any

import numpy as np

from conveyor.resources import Resources
from conveyor.stages.image.base import BadImage, ImageStage
from conveyor.tasks.image import ImageRecord

#: the working copy's shorter side (the models read 224 or 256 pixels)
WORK_SIDE = 256
#: the working copy's longer side at most (an extreme aspect ratio is shrunk further)
WORK_MAX_SIDE = 1024
#: pixels an image may have: Pillow's own limit (a 9,459 x 9,459 image), past which an
#: image is taken for a decompression bomb
MAX_PIXELS = 89_478_485
#: formats whose bytes go into the shards as read when nothing about the image changed
KEPT_FORMATS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}
#: formats re-encoded losslessly when they must be re-encoded
LOSSLESS = frozenset({"PNG", "GIF", "BMP", "TIFF", "PPM", "TGA", "ICO"})
JPEG_QUALITY = 95
#: EXIF's orientation tag
ORIENTATION = 0x0112


def _open(data: bytes, max_pixels: int) -> Any:
    """The image's header, read by Pillow (nothing decoded yet); our own pixel limit
    replaces Pillow's so that the reason names the image's size and the limit."""
    from PIL import Image, UnidentifiedImageError

    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise BadImage("not an image: Pillow cannot identify its format") from None
    except Exception as exc:  # noqa: BLE001 - a malformed header raises anything
        raise BadImage(f"not an image: {_reason(exc)}") from None
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    width, height = image.size
    if width * height > max_pixels:
        image.close()
        raise BadImage(
            f"decompression bomb: {width} x {height} = {width * height:,} pixels, over the "
            f"limit of {max_pixels:,} (--max-pixels)"
        )
    if width < 1 or height < 1:
        image.close()
        raise BadImage(f"empty image: {width} x {height} pixels")
    return image


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _work_size(width: int, height: int) -> tuple[int, int]:
    scale = min(WORK_SIDE / min(width, height), WORK_MAX_SIDE / max(width, height), 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def to_rgb(image: Any, changes: list[str]) -> Any:
    """``image`` as 8-bit RGB, noting in ``changes`` what that changed."""
    from PIL import Image

    mode = image.mode
    keyed = "transparency" in image.info  # a colour that is transparent (PNG's tRNS)
    if mode == "RGB" and not keyed:
        return image
    if mode == "L" and not keyed:
        return image.convert("RGB")
    if mode.startswith("I") or mode == "F":
        values = np.asarray(image)
        label = "16-bit"
        if mode == "F":
            label = "float"
            top = float(values.max()) if values.size else 0.0
            values = values * (255.0 if top <= 1.0 else 255.0 / max(top, 1.0))
        elif values.size and (int(values.max()) > 65535 or int(values.min()) < 0):
            # 32-bit levels (a scientific TIFF): scaled to their range; divided as 16-bit
            # levels they clipped to white, and the image was filtered as blank
            label = "32-bit"
            low, top = min(0, int(values.min())), int(values.max())
            values = (values.astype(np.float64) - low) * (255.0 / max(top - low, 1))
        elif mode.startswith("I;16") or (values.size and int(values.max()) > 255):
            # 16-bit levels: a 16-bit file's always (its levels up to 255 were taken for
            # 8-bit ones, and 256 for 16-bit: two near images, one bright, one black)
            values = values / 257.0
        changes.append(label)
        grey = np.clip(np.rint(values), 0, 255).astype(np.uint8)
        key = image.info.get("transparency")
        if isinstance(key, int) and not isinstance(key, bool):  # a 16-bit PNG's tRNS level
            keyed = np.asarray(image) == key
            if keyed.any():
                changes.append("alpha")
                grey[keyed] = 255  # transparent: composited on white
        return Image.fromarray(grey, "L").convert("RGB")
    transparent = mode in ("RGBA", "LA", "PA", "La", "RGBa") or (
        mode in ("P", "RGB", "L") and "transparency" in image.info  # (PNG's colour key too)
    )
    if transparent:
        changes.append("alpha")
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    changes.append({"P": "palette", "1": "bilevel", "CMYK": "cmyk"}.get(mode, mode.lower()))
    return image.convert("RGB")


class ImageDecoder(ImageStage):
    """Each image's bytes -> its size, format, hashes, working copy and shard payload (see
    the module doc); a bad image fails with its reason."""

    resources = Resources(cpus=1)

    def __init__(self, max_pixels: int = MAX_PIXELS) -> None:
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
            raise ValueError(f"max_pixels must be an int >= 1, got {max_pixels!r}")
        import imagehash  # noqa: F401 - a missing package is an error now, not in a worker

        self.max_pixels = max_pixels

    def process_image(self, image: ImageRecord) -> None:
        from PIL import ImageOps

        data = image.data or b""
        image.num_bytes = len(data)
        if not data:
            raise BadImage("zero bytes: the file is empty")
        image.content_hash = hashlib.blake2b(data, digest_size=16).hexdigest()
        with _open(data, self.max_pixels) as source:
            image.format, image.mode = source.format, source.mode
            image.frames = int(getattr(source, "n_frames", 1) or 1)
            try:
                orientation = int(source.getexif().get(ORIENTATION, 1) or 1)
            except Exception:  # noqa: BLE001 - a damaged EXIF block is no reason to fail
                orientation = 1
            if orientation not in range(1, 9):  # no orientation EXIF defines: upright
                orientation = 1
            # the size its header gives, upright: kept in the metadata row of an image whose
            # pixels fail to decode (a truncated file), as its format and mode are
            width, height = source.size
            image.width, image.height = (
                (height, width) if orientation in (5, 6, 7, 8) else (width, height)
            )
            deep = _png_bit_depth(data) == 16  # Pillow gives a 48-bit RGB PNG as 8-bit RGB
            kept = (
                image.format in KEPT_FORMATS
                and image.mode in ("RGB", "L")
                and orientation == 1
                and image.frames == 1
                and not deep
                and "transparency" not in source.info
            )
            # a re-encoded image keeps its colour profile (an RGB one: the pixels stay as
            # they are); it was dropped, and colour-managed readers saw P3 photos as sRGB
            icc = source.info.get("icc_profile")
            icc = icc if isinstance(icc, bytes) and icc[16:20] == b"RGB " else None
            stored = source.size
            if kept and image.format == "JPEG":
                # decoded at the smallest DCT scale at least as large as the working copy
                source.draft("RGB", _work_size(*stored))
            changes: list[str] = []
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # EXIF and palette notes: not failures
                    source.load()
                    upright = ImageOps.exif_transpose(source) if orientation != 1 else source
                    rgb = to_rgb(upright, changes)
            except Exception as exc:  # noqa: BLE001 - damaged pixel data raises anything
                raise BadImage(_damage(exc)) from None
            if orientation != 1:
                changes.insert(0, "exif-rotated")
            if deep and "16-bit" not in changes:
                changes.append("16-bit")
            if image.frames > 1:
                changes.append(f"first of {image.frames} frames")
            self._finish(image, rgb, changes, stored if kept else None, icc)

    @staticmethod
    def _finish(
        image: ImageRecord, rgb: Any, changes: list[str], stored: Any, icc: bytes | None = None
    ) -> None:
        """The payload (the bytes as read where ``stored``, the size they have, is given),
        the perceptual hash and the working copy of a decoded image."""
        import imagehash
        from PIL import Image

        if stored is not None:  # upright already: the size as stored
            (image.width, image.height), image.payload = stored, image.data
            image.payload_ext = KEPT_FORMATS[image.format or ""]
        else:
            image.width, image.height = rgb.size
            image.payload, image.payload_ext = _encode(rgb, image.format, icc)
            changes.append(f"re-encoded as {image.payload_ext}")
        image.normalised = changes
        image.data = None
        small = rgb.resize(_work_size(*rgb.size), Image.Resampling.BILINEAR, reducing_gap=2.0)
        image.phash = str(imagehash.phash(small))
        image.pixels = np.asarray(small, dtype=np.uint8)


def _damage(exc: BaseException) -> str:
    text = str(exc)
    if "truncated" in text or isinstance(exc, EOFError):
        return f"truncated: {text or 'the data ends early'}"
    return f"damaged: {_reason(exc)}"


def _encode(rgb: Any, source_format: str | None, icc: bytes | None = None) -> tuple[bytes, str]:
    """The normalised image for the shards: PNG for a lossless source, else JPEG, with the
    source's RGB colour profile where it had one."""
    out = io.BytesIO()
    # said always, None too: Pillow's PNG writer falls back to the image's own profile,
    # and a grey or CMYK one went into an RGB file
    if source_format in LOSSLESS:
        rgb.save(out, format="PNG", compress_level=3, icc_profile=icc)
        return out.getvalue(), "png"
    rgb.save(out, format="JPEG", quality=JPEG_QUALITY, icc_profile=icc)
    return out.getvalue(), "jpg"


def _png_bit_depth(data: bytes) -> int | None:
    """The bit depth a PNG's header gives (its IHDR chunk comes first), or None."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) > 24:
        return data[24]
    return None
