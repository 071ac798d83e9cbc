"""Unit tests of the image codec with real Pillow encode/decode."""

import io
import re
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from imagerecords.pipeline.encode import image_codec as codec


def encode(arr_or_img, fmt, **kw):
    img = arr_or_img if isinstance(arr_or_img, Image.Image) else Image.fromarray(arr_or_img)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def decode(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


@pytest.fixture
def pixels():
    # Smooth gradient: JPEG round trips stay within a few levels.
    y, x = np.mgrid[0:40, 0:64]
    return np.stack([x * 4, y * 6, (x + y) * 2], axis=-1).clip(0, 255).astype(np.uint8)


@pytest.mark.parametrize("fmt,name", [("JPEG", "jpeg"), ("PNG", "png"), ("GIF", "gif"), ("BMP", "bmp"),
                                      ("TIFF", "tiff"), ("WEBP", "webp")])
def test_sniff_format_reads_the_bytes(pixels, fmt, name):
    assert codec.sniff_format(encode(pixels, fmt)) == name


def test_sniff_format_ignores_names_and_rejects_text():
    assert codec.sniff_format(b"hello, not an image") is None
    with pytest.raises(codec.ImageError, match="unrecognized file signature"):
        codec.prepare_image(b"<html>404</html>")


def test_rgb_jpeg_passes_through_byte_for_byte(pixels):
    data = encode(pixels, "JPEG", quality=92)
    out = codec.prepare_image(data)
    assert out.passthrough and out.data == data
    assert (out.width, out.height) == (64, 40)


def test_reencode_forces_a_new_jpeg(pixels):
    data = encode(pixels, "JPEG", quality=92)
    out = codec.prepare_image(data, codec.ImageOptions(reencode=True, quality=50))
    assert not out.passthrough and out.data != data
    assert np.abs(decode(out.data) - pixels.astype(int)).mean() < 8


def test_png_is_converted_within_jpeg_tolerance(pixels):
    out = codec.prepare_image(encode(pixels, "PNG"))
    assert out.source_format == "png" and not out.passthrough
    assert np.abs(decode(out.data) - pixels.astype(int)).mean() < 3


def test_alpha_is_composited_over_white(pixels):
    rgba = np.dstack([pixels, np.zeros(pixels.shape[:2], np.uint8)])  # fully transparent
    out = codec.prepare_image(encode(rgba, "PNG"))
    assert decode(out.data).min() >= 250


def test_grey_cmyk_and_palette_become_rgb(pixels):
    for img in (Image.fromarray(pixels).convert("L"), Image.fromarray(pixels).convert("CMYK"),
                Image.fromarray(pixels).convert("P")):
        fmt = "PNG" if img.mode == "P" else "JPEG"
        out = codec.prepare_image(encode(img, fmt, **({"quality": 95} if fmt == "JPEG" else {})))
        assert not out.passthrough
        assert Image.open(io.BytesIO(out.data)).mode == "RGB"
    cmyk = codec.prepare_image(encode(Image.fromarray(pixels).convert("CMYK"), "JPEG", quality=95))
    assert np.abs(decode(cmyk.data) - pixels.astype(int)).mean() < 6


def test_16_bit_grey_png_keeps_its_range():
    ramp = (np.arange(64 * 8, dtype=np.uint16).reshape(8, 64) * 128).astype(np.uint16)
    out = codec.prepare_image(encode(Image.fromarray(ramp), "PNG"))
    got = decode(out.data)[..., 0]
    want = (ramp >> 8).astype(int)
    assert abs(got.mean() - want.mean()) < 3 and got.max() > 200


def test_exif_orientation_is_applied(pixels):
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    stored = Image.fromarray(pixels).transpose(Image.Transpose.ROTATE_90)
    out = codec.prepare_image(encode(stored, "JPEG", quality=95, exif=exif.tobytes()))
    assert not out.passthrough
    assert (out.width, out.height) == (64, 40)
    assert np.abs(decode(out.data) - pixels.astype(int)).mean() < 6


def test_resize_never_enlarges_and_keeps_aspect():
    assert codec.target_size(640, 480, codec.ImageOptions(max_side=320)) == (320, 240)
    assert codec.target_size(640, 480, codec.ImageOptions(short_side=240)) == (320, 240)
    assert codec.target_size(640, 480, codec.ImageOptions(max_side=400, short_side=100)) == (133, 100)
    assert codec.target_size(64, 48, codec.ImageOptions(max_side=320)) == (64, 48)


def test_shrinking_a_jpeg_uses_draft_and_hits_the_size():
    big = np.kron(np.arange(12, dtype=np.uint8).reshape(3, 4) * 20, np.ones((160, 160), np.uint8))
    data = encode(np.dstack([big] * 3), "JPEG", quality=95)
    out = codec.prepare_image(data, codec.ImageOptions(max_side=100))
    assert (out.width, out.height) == (100, 75)
    small = decode(out.data)
    assert abs(small[..., 0].mean() - big.mean()) < 3


def test_truncated_jpeg_is_an_error_naming_the_cause(pixels):
    data = encode(pixels, "JPEG", quality=95)
    with pytest.raises(codec.ImageError, match="^truncated JPEG: ") as e:
        codec.prepare_image(data[: len(data) // 2])
    assert e.value.error == "OSError"


def test_pillow_errors_become_text_without_reprs():
    # Pillow says "cannot identify image file <_io.BytesIO object at 0x...>": an address per run.
    with pytest.raises(codec.ImageError) as e:
        codec.prepare_image(b"\xff\xd8\xff" + b"garbage" * 10)
    assert str(e.value) == "not a decodable image (format unknown): the bytes start like JPEG but no decoder accepts them"
    assert e.value.error == "UnidentifiedImageError"
    with pytest.raises(codec.ImageError, match="^truncated PNG: ") as e:
        codec.prepare_image(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    assert e.value.error == "OSError"
    assert codec.stable_text("cannot identify image file <_io.BytesIO object at 0x7fd9c1a2b3c0>") == \
        "cannot identify image file <_io.BytesIO object>"


def test_pixel_limit_is_checked_from_the_header_without_changing_pillow():
    assert Image.MAX_IMAGE_PIXELS is not None  # importing codec leaves Pillow's guard on
    assert codec.pixel_limit() == min(codec.MAX_PIXELS, Image.MAX_IMAGE_PIXELS)
    # A PNG header claiming 20000 x 20000 pixels and no pixel data: refused from the header alone.
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    assert codec.header_size(data, "png") == (20000, 20000)
    with pytest.raises(codec.ImageError, match=f"^image too large: 20000x20000 pixels is over the limit of {codec.pixel_limit()} pixels$"):
        codec.prepare_image(data)


@pytest.mark.parametrize("fmt,name", [("JPEG", "jpeg"), ("PNG", "png"), ("GIF", "gif"), ("BMP", "bmp"), ("WEBP", "webp")])
def test_header_size_reads_real_headers(pixels, fmt, name):
    assert codec.header_size(encode(pixels, fmt), name) == (64, 40)


def test_pillow_decompression_bomb_error_becomes_ours(pixels, monkeypatch):
    # TIFF sizes are read by Pillow, whose bomb guard then raises; it must come out as ImageError.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64x40 = 2560 > 2 * 1000
    with pytest.raises(codec.ImageError, match="^image too large") as e:
        codec.prepare_image(encode(pixels, "TIFF"))
    assert e.value.error == "DecompressionBombError"
    with pytest.raises(codec.ImageError, match="^image too large: 64x40 pixels is over the limit of 1000 pixels$"):
        codec.prepare_image(encode(pixels, "JPEG"))


def test_options_are_validated():
    with pytest.raises(ValueError, match="quality"):
        codec.ImageOptions(quality=0)
    with pytest.raises(ValueError, match="max_side"):
        codec.ImageOptions(max_side=0)
    with pytest.raises(ValueError, match="max_file_mb must be a number of megabytes > 0, got 0"):
        codec.ImageOptions(max_file_mb=0)
    assert codec.ImageOptions(max_file_mb=0.5).max_file_bytes == 500_000


def _tiff(array, mode):
    out = io.BytesIO()
    Image.fromarray(array, mode).save(out, format="TIFF")
    return out.getvalue()


@pytest.mark.parametrize("values,reason", [
    (np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8), "a floating-point image (values 0..1)"),
    (np.full((8, 8), 300.5, np.float32), "a floating-point image (values 300.5..300.5)"),
    (np.array([[np.nan, 1.0]], np.float32), "with NaN or infinity"),
])
def test_a_float_image_that_8_bits_would_change_is_refused_not_clipped(values, reason):
    with pytest.raises(codec.ImageError, match=re.escape(reason) + r".*scale it to 8 or 16 bits first"):
        codec.prepare_image(_tiff(values, "F"))


def test_a_float_image_of_8_bit_values_keeps_them_and_a_wide_int_image_is_refused():
    gradient = np.arange(64, dtype=np.float32).reshape(8, 8) * 4  # 0..252, whole numbers
    out = np.asarray(Image.open(io.BytesIO(codec.prepare_image(_tiff(gradient, "F")).data)).convert("L"))
    assert np.abs(out.astype(int) - gradient.astype(int)).max() <= 3  # JPEG's error, not a clip
    with pytest.raises(codec.ImageError, match=r"32-bit integer image with values 70000..70000, outside 0..65535"):
        codec.prepare_image(_tiff(np.full((4, 4), 70000, np.int32), "I"))
