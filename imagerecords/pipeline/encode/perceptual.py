"""A 64-bit perceptual hash (DCT pHash) of an image already decoded by the shard writer."""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np
from PIL import Image

# Why DCT pHash rather than dHash or aHash: its 8x8 lowest frequencies of a 32x32 thumbnail survive
# resizing, JPEG recompression and small crops (which move the edges dHash compares pixel by pixel).
# Cost: the box thumbnail and the DCT are folded into two small matrix products per image (~20 us
# on a pass-through JPEG's 1/8-scale draft); a larger image is first reduced by Pillow to ~64 px.
NAME = "phash-dct-64"
_SIDE = 32
_LOW = 8
_REDUCED = 64  # a decoded image's shorter side above 2x this is box-reduced (Image.reduce) to about it
# Modes whose array is not brightness (palette indices, ink, other colour spaces): made RGB first.
_TO_RGB = ("P", "PA", "CMYK", "YCbCr", "LAB", "HSV")
_REDUCIBLE = ("L", "LA", "La", "RGB", "RGBA", "RGBa", "RGBX", "I", "F")


def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix (rows: frequencies), so that D @ X @ D.T is X's 2-D DCT."""
    k = np.arange(n)[:, None]
    m = np.cos(np.pi * (2 * np.arange(n)[None, :] + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    m[0] /= np.sqrt(2.0)
    return m


_DCT_LOW = _dct_matrix(_SIDE)[:_LOW]  # only the 8 lowest frequencies are kept: 8x32, not 32x32


@functools.lru_cache(maxsize=1024)
def _project(n: int) -> np.ndarray:
    """8 x n: a line of n pixels box-averaged into 32 cells (each pixel weighted by its overlap with
    the cell), then taken to its 8 lowest DCT frequencies, as one matrix."""
    edges = np.arange(_SIDE + 1) * (n / _SIDE)
    pixels = np.arange(n)
    overlap = np.clip(np.minimum(edges[1:, None], pixels + 1) - np.maximum(edges[:-1, None], pixels), 0, None)
    return _DCT_LOW @ (overlap / overlap.sum(axis=1, keepdims=True))


def _brightness(img: Image.Image) -> np.ndarray:
    """The image's brightness as a 2-D float array (any scale: the hash compares with a median)."""
    if img.mode in _TO_RGB:
        img = img.convert("RGB")
    elif img.mode not in _REDUCIBLE:  # 16-bit grey, bilevel: Image.reduce takes neither
        img = img.convert("F")
    if min(img.size) >= 2 * _REDUCED:
        img = img.reduce(min(img.size) // _REDUCED)
    if img.mode not in ("L", "I", "F"):
        img = img.convert("L")  # ITU-R 601 luma; alpha is left out
    return np.asarray(img, dtype=np.float64)


def phash(img: Image.Image) -> Optional[int]:
    """The 64-bit DCT hash of `img` (any size, any mode; upright): the 8x8 lowest DCT frequencies of
    its 32x32 box-averaged brightness, bit i (row-major) set when that coefficient exceeds the median
    of the 63 non-DC ones. None for an image whose pixels Pillow cannot give (its record is written
    all the same; it is not compared)."""
    try:
        grey = _brightness(img)
    except (ValueError, OSError, TypeError):
        return None
    if grey.ndim != 2 or 0 in grey.shape:
        return None
    low = (_project(grey.shape[0]) @ grey @ _project(grey.shape[1]).T).ravel()
    # The median of 63 values is the 32nd smallest: a partition, not a sort.
    bits = low > np.partition(low[1:], _LOW * _LOW // 2 - 1)[_LOW * _LOW // 2 - 1]
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def distance(a: int, b: int) -> int:
    """Hamming distance of two 64-bit hashes."""
    return bin(a ^ b).count("1")
