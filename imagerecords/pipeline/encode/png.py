"""A PNG encoder from a pixel array: filters vectorised in NumPy over blocks of rows, libdeflate's
zlib stream (the `deflate` package), and no chunk beyond IHDR, IDAT and IEND.

Pillow's writer chooses a filter row by row in C and costs more than the deflate itself on photos
(README, --png_level); here the choice is made for all rows at once. The bytes are a fixed
function of the pixels, the filter, the level and the libdeflate build.
"""

from __future__ import annotations

import struct
from typing import List, Tuple

import deflate
import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"

# PNG's filter types (the byte that starts every filtered row).
NONE, SUB, UP, AVERAGE, PAETH = range(5)
# Each row with whichever of NONE, SUB, UP and AVERAGE leaves the least sum of |byte as signed|
# (libpng's heuristic). Paeth is left out of the choice: on photos it is the slowest to vectorise
# and its rows were rarely the least.
ADAPTIVE = 5

# The filter every PNG is written with, by measurement (README, --png_level): on photos and 32x32
# crops as small as Pillow's (which chooses among all five), on flat pictures smaller; AVERAGE
# alone is 1.5x as fast but writes flat pictures 2-3x larger.
FILTER = ADAPTIVE

# (channels, bit depth) -> PNG colour type.
_COLOUR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}

# One IDAT holds at most 2^31 - 1 bytes; split well below.
_IDAT_MAX = 1 << 30

# Bytes of rows filtered at a time: the filter's temporaries stay in cache and bounded for huge
# images; 128 KiB by measurement (README, --png_level): 64 KiB spent more in NumPy's per-call
# overhead, 1 MiB several times more in system time mapping fresh pages than the filter took.
_BLOCK_BYTES = 1 << 17


def _chunk(kind: bytes, data) -> list:
    """The parts of one chunk: length, type, data, CRC of type and data."""
    # libdeflate's CRC-32 (PNG's and zlib's) runs ~20x the speed of zlib.crc32 on an IDAT.
    return [struct.pack(">I", len(data)), kind, data, struct.pack(">I", deflate.crc32(data, deflate.crc32(kind)))]


def _neighbours(raw: np.ndarray, above: np.ndarray, bpp: int, height: int = 0):
    """(left, up) bytes of each byte of `raw` (rows x bytes, uint8): zeros left of the first pixel;
    `above` is the row before the first (zeros at the top of the image). With `height`, raw holds
    whole images of that many rows each, and each image's first row has zeros above it."""
    up = np.empty_like(raw)
    up[0] = above
    up[1:] = raw[:-1]
    if height:
        up[::height] = 0
    left = np.zeros_like(raw)
    left[:, bpp:] = raw[:, :-bpp]
    return left, up


def _average(left: np.ndarray, up: np.ndarray) -> np.ndarray:
    return (left & up) + ((left ^ up) >> 1)  # floor((left + up) / 2) without leaving uint8


def _filtered(raw: np.ndarray, above: np.ndarray, bpp: int, kind: int, out: np.ndarray, height: int = 0) -> None:
    """Writes rows of `raw` filtered with `kind` into `out` (rows x (1 + bytes)), type byte first;
    `height` as for _neighbours."""
    if kind == NONE:
        out[:, 0] = NONE
        out[:, 1:] = raw
        return
    left, up = _neighbours(raw, above, bpp, height)
    if kind == ADAPTIVE:
        residues = np.empty((4,) + raw.shape, np.uint8)  # NONE, SUB, UP, AVERAGE: index = filter type
        residues[0] = raw
        np.subtract(raw, left, out=residues[1])
        np.subtract(raw, up, out=residues[2])
        np.subtract(raw, _average(left, up), out=residues[3])
        # |byte as signed| of a uint8 v is min(v, 256 - v), and uint8 negation is 256 - v.
        best = np.minimum(residues, 0 - residues).sum(axis=2, dtype=np.uint32).argmin(axis=0)
        out[:, 0] = best
        out[:, 1:] = residues[best, np.arange(raw.shape[0])]
        return
    if kind == SUB:
        predicted = left
    elif kind == UP:
        predicted = up
    elif kind == AVERAGE:
        predicted = _average(left, up)
    elif kind == PAETH:
        corner = np.zeros_like(raw)
        corner[:, bpp:] = up[:, :-bpp]
        a, b, c = left.astype(np.int16), up.astype(np.int16), corner.astype(np.int16)
        pa, pb, pc = np.abs(b - c), np.abs(a - c), np.abs(a + b - 2 * c)
        predicted = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, corner))
    else:
        raise ValueError(f"no PNG filter {kind}")
    out[:, 0] = kind
    np.subtract(raw, predicted, out=out[:, 1:])


def _as_bytes(pixels: np.ndarray, lead: int) -> Tuple[np.ndarray, int, int]:
    """(the samples as bytes, of shape lead axes + (H, W * bytes per pixel); bit depth; channels) of
    an array whose first `lead` axes count images, then (H, W) or (H, W, C)."""
    if pixels.ndim == lead + 2:
        pixels = pixels[..., None]
    if pixels.ndim != lead + 3:
        raise ValueError(f"PNG pixels are (H, W) or (H, W, C), not of shape {pixels.shape[lead:]}")
    if pixels.dtype.kind == "u" and pixels.dtype.itemsize == 2:
        depth, pixels = 16, pixels.astype(">u2", copy=False)  # PNG's samples are big-endian
    elif pixels.dtype == np.uint8:
        depth = 8
    else:
        raise ValueError(f"PNG stores uint8 or uint16 samples, not {pixels.dtype}")
    channels = pixels.shape[-1]
    if channels not in _COLOUR_TYPES:
        raise ValueError(f"PNG stores 1 to 4 channels, not {channels}")
    shape = pixels.shape[:-2] + (pixels.shape[-2] * channels * depth // 8,)
    return np.ascontiguousarray(pixels).view(np.uint8).reshape(shape), depth, channels


def _png(rows: np.ndarray, width: int, depth: int, channels: int, level: int) -> bytes:
    """The PNG file of filtered `rows` (C-contiguous, rows x (1 + bytes)): IHDR, IDAT(s), IEND."""
    data = memoryview(deflate.zlib_compress(memoryview(rows).cast("B"), level))
    header = struct.pack(">IIBBBBB", width, len(rows), depth, _COLOUR_TYPES[channels], 0, 0, 0)
    parts = [SIGNATURE, *_chunk(b"IHDR", header)]
    for i in range(0, max(len(data), 1), _IDAT_MAX):
        parts += _chunk(b"IDAT", data[i:i + _IDAT_MAX])
    return b"".join(parts + _chunk(b"IEND", b""))


def encode(pixels: np.ndarray, level: int, kind: int = FILTER) -> bytes:
    """PNG bytes of a uint8 or uint16 array of shape (H, W) or (H, W, C), C in 1..4 (grey, grey +
    alpha, RGB, RGBA), at libdeflate `level` (0..12), with no chunk beyond IHDR, IDAT and IEND."""
    raw, depth, channels = _as_bytes(pixels, 0)
    height, stride = raw.shape
    bpp = channels * depth // 8
    rows = np.empty((height, stride + 1), np.uint8)
    step = max(1, _BLOCK_BYTES // max(stride, 1))
    above = np.zeros(stride, np.uint8)
    for top in range(0, height, step):
        block = raw[top:top + step]
        _filtered(block, above, bpp, kind, rows[top:top + step])
        above = block[-1]
    return _png(rows, pixels.shape[1], depth, channels, level)


def encode_many(pixels: np.ndarray, level: int) -> List[bytes]:
    """PNG bytes of each of a block of same-shape images: a uint8 or uint16 array (m, H, W) or
    (m, H, W, C), C in 1..4. The filter runs over many images at once (each image's first row with
    zeros above it), then each image is deflated on its own; each result is byte-equal to
    encode(pixels[i], level).

    Raises:
      ValueError: for another dtype, rank or channel count (as encode does).
    """
    if pixels.ndim not in (3, 4):
        raise ValueError(f"encode_many takes images (m, H, W) or (m, H, W, C), not of shape {pixels.shape}")
    raw, depth, channels = _as_bytes(pixels, 1)
    count, height, stride = raw.shape
    if not height * stride or height * stride > _BLOCK_BYTES:  # encode's blocks of rows bound the temporaries
        return [encode(image, level) for image in pixels]
    bpp = channels * depth // 8
    width = pixels.shape[2]
    flat = raw.reshape(count * height, stride)
    rows = np.empty((count * height, stride + 1), np.uint8)
    step = max(1, _BLOCK_BYTES // max(height * stride, 1)) * height  # whole images at a time
    above = np.zeros(stride, np.uint8)
    for top in range(0, count * height, step):
        _filtered(flat[top:top + step], above, bpp, FILTER, rows[top:top + step], height)
    return [_png(rows[i:i + height], width, depth, channels, level) for i in range(0, count * height, height)]
