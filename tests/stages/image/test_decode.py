"""Decoding and normalising: every bad kind fails alone with its reason, every awkward kind
becomes an upright 8-bit RGB working copy, and the shard payload is the bytes as read only
when nothing about the image changed."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from conveyor.stages.image.decode import WORK_MAX_SIDE, WORK_SIDE, ImageDecoder, to_rgb
from conveyor.tasks.image import ImageBatch, ImageRecord

from .kinds import BAD, GOOD, bomb, exif_rotated, picture, png16, saved


def decode(data: bytes, key: str = "x", decoder: ImageDecoder | None = None) -> ImageRecord:
    image = ImageRecord(key, key, 0, data=data)
    (decoder or ImageDecoder()).process(ImageBatch(data=[image]))
    return image


def test_every_bad_kind_fails_alone_with_its_reason() -> None:
    images = [
        ImageRecord(name, name, i, data=make()) for i, (name, (make, _)) in enumerate(BAD.items())
    ]
    good = ImageRecord("fine.jpg", "fine.jpg", 99, data=GOOD["photo.jpg"]())
    ImageDecoder().process(ImageBatch(data=[*images, good]))
    for image, (name, (_, reason)) in zip(images, BAD.items(), strict=True):
        assert image.filtered_by == "error", name
        assert image.errors["ImageDecoder"].startswith(reason), (name, image.errors)
        assert image.pixels is None and image.payload is None
    assert good.kept and good.pixels is not None and not good.errors


def test_a_truncated_image_keeps_what_its_header_says() -> None:
    """Its metadata row had its format and mode, but no size, though the header was read."""
    image = decode(BAD["cut.jpg"][0]())
    assert image.errors["ImageDecoder"].startswith("truncated")
    assert (image.format, image.width, image.height) == ("JPEG", 160, 120)


def test_a_bomb_is_refused_from_its_header_and_max_pixels_moves_the_limit() -> None:
    image = decode(bomb(12_000, 10_000))
    assert "12000 x 10000 = 120,000,000 pixels" in image.errors["ImageDecoder"]
    small = decode(bomb(3_000, 2_000), decoder=ImageDecoder(max_pixels=5_000_000))
    assert "over the limit of 5,000,000" in small.errors["ImageDecoder"]
    allowed = decode(bomb(3_000, 2_000), decoder=ImageDecoder(max_pixels=6_000_000))
    assert allowed.kept and (allowed.width, allowed.height) == (3_000, 2_000)
    assert max(allowed.pixels.shape[:2]) <= WORK_MAX_SIDE


@pytest.mark.parametrize("name", sorted(GOOD))
def test_every_good_kind_becomes_an_rgb_working_copy(name: str) -> None:
    image = decode(GOOD[name](), name)
    assert image.kept, image.errors
    assert image.pixels is not None and image.pixels.dtype == np.uint8
    assert image.pixels.ndim == 3 and image.pixels.shape[2] == 3
    assert min(image.pixels.shape[:2]) == min(WORK_SIDE, image.width, image.height)
    assert len(image.phash or "") == 16 and len(image.content_hash or "") == 32
    with Image.open(io.BytesIO(image.payload or b"")) as stored:
        assert stored.mode in ("RGB", "L") and stored.size == (image.width, image.height)
        assert getattr(stored, "n_frames", 1) == 1


def test_an_unchanged_jpeg_png_or_webp_is_stored_as_read() -> None:
    for name, ext in (("photo.jpg", "jpg"), ("drawing.png", "png"), ("web.webp", "webp")):
        data = GOOD[name]()
        image = decode(data, name)
        assert image.payload == data and image.payload_ext == ext and image.normalised == []


def test_exif_orientation_is_applied() -> None:
    upright = np.asarray(Image.fromarray(picture(7)).transpose(Image.Transpose.ROTATE_270))
    image = decode(exif_rotated(7))
    assert (image.width, image.height) == (120, 160)
    assert image.normalised[0] == "exif-rotated" and image.payload_ext == "jpg"
    with Image.open(io.BytesIO(image.payload or b"")) as stored:
        assert stored.size == (120, 160)
        assert not stored.getexif().get(0x0112, 1) > 1
        difference = np.abs(np.asarray(stored.convert("RGB"), np.int16) - upright).mean()
    assert difference < 12  # the same picture, upright (two JPEG generations apart)


def test_cmyk_16_bit_palette_and_animation_are_normalised() -> None:
    notes = {name: decode(GOOD[name](), name).normalised for name in GOOD}
    assert notes["print.jpg"] == ["cmyk", "re-encoded as jpg"]
    assert notes["deep.png"] == ["16-bit", "re-encoded as png"]
    assert notes["clear.png"] == ["alpha", "re-encoded as png"]
    assert notes["moving.gif"] == ["palette", "first of 3 frames", "re-encoded as png"]
    assert notes["scan.tiff"] == ["re-encoded as png"] and notes["new.avif"] == [
        "re-encoded as jpg"
    ]


def test_sixteen_bit_levels_are_scaled_not_clipped() -> None:
    image = decode(png16(9))
    expected = picture(9).astype(np.float32).mean(axis=2)
    grey = image.pixels[..., 0].astype(np.float32)
    assert image.pixels.shape[:2] == expected.shape
    assert np.abs(grey - expected).mean() < 2.0  # 16-bit levels back on the 8-bit scale


def test_a_sixteen_bit_file_s_levels_are_sixteen_bit_whatever_their_range() -> None:
    """Levels up to 255 were taken for 8-bit ones, up to 256 for 16-bit: two near images,
    one shown bright, the other black."""
    ramp = np.tile(np.arange(256, dtype=np.uint16), (16, 1))
    low, high = (decode(saved(Image.fromarray(ramp + extra), "PNG")) for extra in (0, 1))
    assert low.pixels.max() == 1 and high.pixels.max() == 1  # both 1/257 of full scale
    assert low.normalised == high.normalised == ["16-bit", "re-encoded as png"]


def test_a_48_bit_png_is_made_8_bit_not_stored_as_read() -> None:
    """Pillow opens it as 8-bit RGB, and the file went into the shards as it was: 16 bits
    per channel under a record saying RGB."""
    cv2 = pytest.importorskip("cv2")
    deep = (picture(4).astype(np.uint16) * 257)[..., ::-1]  # BGR for OpenCV
    ok, data = cv2.imencode(".png", np.ascontiguousarray(deep))
    assert ok and data.tobytes()[24] == 16
    image = decode(data.tobytes())
    assert image.normalised == ["16-bit", "re-encoded as png"]
    stored = Image.open(io.BytesIO(image.payload))
    assert stored.mode == "RGB" and stored.tobytes()[:3] == bytes(picture(4)[0, 0])


def test_a_png_colour_key_is_transparency() -> None:
    """A PNG's tRNS colour key was ignored: the keyed colour stayed, as read."""
    pixels = picture(5)
    pixels[:, :40] = (10, 20, 30)
    rgb = decode(saved(Image.fromarray(pixels), "PNG", transparency=(10, 20, 30)))
    assert rgb.normalised == ["alpha", "re-encoded as png"]
    assert (rgb.pixels[:, :30] == 255).all()  # the keyed colour composited on white
    grey = picture(6).mean(axis=2).astype(np.uint8)
    grey[:, :40] = 7
    keyed = decode(saved(Image.fromarray(grey, "L"), "PNG", transparency=7))
    assert (
        keyed.normalised == ["alpha", "re-encoded as png"] and (keyed.pixels[:, :30] == 255).all()
    )


def test_a_sixteen_bit_png_s_transparent_level_is_transparency() -> None:
    """Its transparent level came out black: the 16-bit branch came before transparency."""
    ramp = np.tile(np.arange(0, 65536, 256, dtype=np.uint16), (16, 1))
    keyed = decode(saved(Image.fromarray(ramp), "PNG", transparency=0))
    assert keyed.normalised == ["16-bit", "alpha", "re-encoded as png"]
    assert (keyed.pixels[..., 0][:, 0] == 255).all() and keyed.pixels[0, 1, 0] == 1


def test_a_re_encoded_image_keeps_its_rgb_colour_profile() -> None:
    """A rotated phone photo with a Display P3 profile came out without it, read as sRGB."""
    from PIL import ImageCms

    profile = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    source = Image.open(io.BytesIO(exif_rotated(2)))
    rotated = decode(saved(source, "JPEG", exif=source.getexif(), icc_profile=profile))
    assert rotated.normalised[0] == "exif-rotated"
    assert Image.open(io.BytesIO(rotated.payload)).info.get("icc_profile") == profile
    # a CMYK profile is not an RGB image's: it is left out
    cmyk_profile = b"\0" * 16 + b"CMYK" + b"\0" * 108
    cmyk = decode(saved(Image.fromarray(picture(2)).convert("CMYK"), "JPEG",
                        icc_profile=cmyk_profile))  # fmt: skip
    assert "icc_profile" not in Image.open(io.BytesIO(cmyk.payload)).info
    # nor a grey one, in a PNG: Pillow's PNG writer fell back to the image's own profile
    grey_profile = b"\0" * 16 + b"GRAY" + b"\0" * 108
    grey = Image.fromarray(picture(3).mean(axis=2).astype(np.uint8), "L")
    exif = grey.getexif()
    exif[0x0112] = 6
    rotated_grey = decode(saved(grey, "PNG", icc_profile=grey_profile, exif=exif))
    assert rotated_grey.payload_ext == "png"
    assert "icc_profile" not in Image.open(io.BytesIO(rotated_grey.payload)).info


def test_an_orientation_exif_does_not_define_is_upright() -> None:
    """Orientation 9 was labelled exif-rotated, and the JPEG re-encoded for nothing."""
    image = Image.fromarray(picture(1))
    exif = image.getexif()
    exif[0x0112] = 9
    data = saved(image, "JPEG", exif=exif)
    decoded = decode(data)
    assert decoded.normalised == [] and decoded.payload == data


def test_an_animated_gif_keeps_its_first_frame() -> None:
    image = decode(GOOD["moving.gif"]())
    assert image.frames == 3
    first = picture(11).astype(np.int16)
    assert np.abs(image.pixels.astype(np.int16) - first).mean() < 20  # a 256-colour GIF


def test_transparency_is_composited_on_white() -> None:
    rgba = np.zeros((40, 40, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:, 20:, 3] = 255  # the left half fully transparent
    image = decode(saved(Image.fromarray(rgba, "RGBA"), "PNG"))
    assert (image.pixels[:, :20] == 255).all() and (image.pixels[:, 20:, 0] == 200).all()


def test_float_images_are_scaled_to_eight_bits() -> None:
    values = np.linspace(0, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    changes: list[str] = []
    rgb = to_rgb(Image.fromarray(values, "F"), changes)
    assert rgb.mode == "RGB" and changes == ["float"]  # it read "f"
    assert np.asarray(rgb)[-1, -1, 0] == 255 and np.asarray(rgb)[0, 0, 0] == 0


def test_32_bit_levels_are_scaled_to_their_range() -> None:
    """Divided as 16-bit levels they clipped to white: the picture was filtered as blank,
    labelled "16-bit"."""
    values = np.linspace(0, 2**31 - 1, 64 * 64).astype(np.int32).reshape(64, 64)
    changes: list[str] = []
    grey = np.asarray(to_rgb(Image.fromarray(values, "I"), changes))[..., 0]
    assert changes == ["32-bit"] and grey.min() == 0 and grey.max() == 255
    assert 120 < grey.mean() < 135


def test_a_large_jpeg_is_decoded_at_the_working_size() -> None:
    data = saved(Image.fromarray(picture(3, 2400, 1800)), "JPEG", quality=85)
    image = decode(data)
    assert (image.width, image.height) == (2400, 1800) and image.payload == data
    assert image.pixels.shape == (WORK_SIDE, round(WORK_SIDE * 4 / 3), 3)


def test_max_pixels_is_validated() -> None:
    with pytest.raises(ValueError, match="max_pixels"):
        ImageDecoder(max_pixels=0)
