"""The PNG writer (codec.png_bytes over png_writer.encode): every mode a build writes decodes to the
same pixels with Pillow and with tf.io.decode_png, and equal pixels give equal bytes.

Pixels are drawn here: seeded noise (every byte value, every filter's wrap-around) over smooth
gradients (the rows where the per-row filter choice differs).
"""

import io
import struct

import numpy as np
import pytest
from PIL import Image

from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.encode import png as png_writer


def _pixels(shape, dtype=np.uint8, seed=0):
    """Gradients in the top half, noise in the bottom half, of `shape` and `dtype`."""
    rng = np.random.default_rng(seed)
    top = 256 if dtype == np.uint8 else 65536
    out = rng.integers(0, top, shape).astype(dtype)
    yy, xx = np.mgrid[0:shape[0], 0:shape[1]]
    smooth = (xx * 7 + yy * 3) * (1 if dtype == np.uint8 else 251) % top
    half = shape[0] // 2
    out[:half] = (smooth[:half, :, None] if out.ndim == 3 else smooth[:half]).astype(dtype)
    return out


def _tf_decoded(data, dtype):
    import tensorflow as tf

    return tf.io.decode_png(data, dtype=tf.uint16 if dtype == np.uint16 else tf.uint8).numpy()


def _chunks(data):
    """The chunk types of a PNG, in order."""
    assert data[:8] == png_writer.SIGNATURE
    pos, kinds = 8, []
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        kinds.append(data[pos + 4:pos + 8].decode())
        pos += 12 + length
    return kinds


# Every Pillow mode the builds hand codec.png_bytes: _lossless's, image features' and array images'.
MODES = {"L": ((19, 23), np.uint8), "LA": ((19, 23, 2), np.uint8), "RGB": ((19, 23, 3), np.uint8),
         "RGBA": ((19, 23, 4), np.uint8), "I;16": ((19, 23), np.uint16)}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_decodes_to_its_pixels_with_pillow_and_tensorflow(mode):
    shape, dtype = MODES[mode]
    pixels = _pixels(shape, dtype)
    img = Image.fromarray(pixels) if mode == "I;16" else Image.fromarray(pixels, mode)
    assert img.mode == mode
    for level in (0, 1, 12):
        data = codec.png_bytes(img, level)
        assert _chunks(data) == ["IHDR", "IDAT", "IEND"]  # no text, time, ICC, EXIF or DPI
        back = Image.open(io.BytesIO(data))
        assert back.mode == mode, (mode, back.mode)
        assert np.array_equal(np.asarray(back), pixels), (mode, level)
        tf_pixels = _tf_decoded(data, dtype)
        assert tf_pixels.dtype == dtype
        assert np.array_equal(tf_pixels.reshape(pixels.shape), pixels), (mode, level)
        assert codec.stored_kind(data) == f"png:{1 if pixels.ndim == 2 else shape[2]}:{np.dtype(dtype).name}"


def test_big_endian_and_little_endian_16_bit_images_give_the_same_bytes():
    pixels = _pixels((9, 31), np.uint16, seed=3)
    want = codec.png_bytes(Image.fromarray(pixels))  # I;16
    assert codec.png_bytes(pixels) == want
    assert codec.png_bytes(pixels.astype(">u2")) == want
    assert codec.png_bytes(Image.fromarray(pixels).convert("I").convert("I;16")) == want
    assert int.from_bytes(want[24:25], "big") == 16  # IHDR bit depth


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("kind", ["NONE", "SUB", "UP", "AVERAGE", "PAETH", "ADAPTIVE"])
def test_every_filter_decodes_exactly(channels, dtype, kind):
    pixels = _pixels((21, 17, channels), dtype, seed=channels)
    data = png_writer.encode(pixels, 1, getattr(png_writer, kind))
    assert np.array_equal(_tf_decoded(data, dtype), pixels), (channels, dtype, kind)
    if dtype == np.uint8:  # Pillow reads 16-bit colour as 8 bits; TensorFlow's check covers it
        back = np.asarray(Image.open(io.BytesIO(data)))
        assert np.array_equal(back.reshape(pixels.shape), pixels), (channels, kind)


def test_rows_past_one_filter_block_decode_exactly():
    # Taller than one block of filtered rows: the first row of each block is filtered against the
    # last row of the block before.
    pixels = _pixels((png_writer._BLOCK_BYTES // (40 * 3) * 2 + 5, 40, 3), seed=4)
    data = codec.png_bytes(pixels)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), pixels)
    for kind in (png_writer.UP, png_writer.AVERAGE, png_writer.PAETH):
        assert np.array_equal(_tf_decoded(png_writer.encode(pixels, 1, kind), np.uint8), pixels), kind


def test_equal_pixels_give_equal_bytes():
    pixels = _pixels((40, 30, 3), seed=5)
    for level in (0, 1, 6, 12):
        want = codec.png_bytes(Image.fromarray(pixels), level)
        assert codec.png_bytes(Image.fromarray(pixels.copy()), level) == want
        assert codec.png_bytes(pixels, level) == want
        assert codec.png_bytes(np.asfortranarray(pixels), level) == want  # another memory layout
        wide = np.zeros((40, 60, 3), np.uint8)
        wide[:, ::2] = pixels
        assert codec.png_bytes(wide[:, ::2], level) == want  # a strided view
    # An array row of one channel is the greyscale image it shows.
    grey = pixels[:, :, 0]
    assert codec.png_bytes(grey[:, :, None]) == codec.png_bytes(grey) == codec.png_bytes(Image.fromarray(grey))


def test_the_levels_trade_time_for_bytes_on_flat_pictures():
    yy, xx = np.mgrid[0:96, 0:128]
    flat = np.stack([(xx * 2) % 256, (yy * 3) % 256, ((xx // 8 + yy // 8) % 2) * 200], -1).astype(np.uint8)
    sizes = {level: len(codec.png_bytes(flat, level)) for level in (0, 1, 9, 12)}
    assert sizes[0] > flat.size  # stored, not compressed
    assert max(sizes[9], sizes[12]) < sizes[1] < sizes[0], sizes


def test_other_modes_and_dtypes_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^no PNG writer for Pillow mode P; convert it with _lossless first$"):
        codec.png_bytes(Image.new("P", (4, 4)))
    with pytest.raises(ValueError, match=r"^PNG stores uint8 or uint16 samples, not float32$"):
        codec.png_bytes(np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"^PNG stores 1 to 4 channels, not 5$"):
        codec.png_bytes(np.zeros((4, 4, 5), np.uint8))


def _many(count, shape, dtype=np.uint8):
    """`count` images of `shape`: seeded noise, smooth gradients and flat ones, in turn."""
    images = []
    for i in range(count):
        if i % 3 == 0:
            images.append(np.random.default_rng(i).integers(0, 256 if dtype == np.uint8 else 65536, shape).astype(dtype))
        elif i % 3 == 1:
            images.append(_pixels(shape, dtype, seed=i))
        else:
            images.append(np.full(shape, i * 37 % 256, dtype))
    return np.stack(images)


@pytest.mark.parametrize("shape", [(32, 32, 3), (32, 32), (32, 32, 1), (28, 28), (7, 5, 4), (1, 9, 2), (9, 1, 3)])
def test_encode_many_gives_each_image_the_bytes_of_encode(shape):
    images = _many(100, shape)
    for level in (0, 1, 9):
        many = png_writer.encode_many(images, level)
        assert len(many) == len(images)
        for i, data in enumerate(many):
            assert data == png_writer.encode(images[i], level), (shape, level, i)
    back = np.asarray(Image.open(io.BytesIO(many[1])))
    assert np.array_equal(back.reshape(images[1].shape), images[1])


def test_encode_many_across_blocks_and_for_large_and_16_bit_images():
    # More images than one filter block holds: each block starts on an image's first row.
    per_block = png_writer._BLOCK_BYTES // (16 * 16 * 3)
    images = _many(per_block * 2 + 3, (16, 16, 3))
    assert png_writer.encode_many(images, 1) == [png_writer.encode(im, 1) for im in images]
    large = _many(2, (png_writer._BLOCK_BYTES // (40 * 3) + 5, 40, 3))  # above one block: encode's own path
    assert png_writer.encode_many(large, 1) == [png_writer.encode(im, 1) for im in large]
    deep = _many(5, (9, 11), np.uint16)
    assert png_writer.encode_many(deep, 1) == [png_writer.encode(im, 1) for im in deep]
    assert png_writer.encode_many(images[:0], 1) == []


def test_encode_many_refuses_what_encode_refuses_in_one_line():
    with pytest.raises(ValueError, match=r"^encode_many takes images \(m, H, W\) or \(m, H, W, C\), not of shape \(4, 4\)$"):
        png_writer.encode_many(np.zeros((4, 4), np.uint8), 1)
    with pytest.raises(ValueError, match=r"^PNG stores uint8 or uint16 samples, not float32$"):
        png_writer.encode_many(np.zeros((2, 4, 4), np.float32), 1)
    with pytest.raises(ValueError, match=r"^PNG stores 1 to 4 channels, not 5$"):
        png_writer.encode_many(np.zeros((2, 4, 4, 5), np.uint8), 1)
