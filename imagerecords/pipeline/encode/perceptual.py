"""A 64-bit perceptual hash (DCT pHash) of an image already decoded by the shard writer."""

from __future__ import annotations

from typing import Optional

import numpy as np
from PIL import Image

# Why DCT pHash rather than dHash or aHash: its 8x8 lowest frequencies of a 32x32 thumbnail survive
# resizing, JPEG recompression and small crops (which move edges dHash compares pixel by pixel),
# and it costs one 32x32 box thumbnail and two 32x32 matrix products (~50 us) per image.
NAME = "phash-dct-64"
_SIDE = 32
_LOW = 8


def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix (rows: frequencies), so that D @ X @ D.T is X's 2-D DCT."""
    k = np.arange(n)[:, None]
    m = np.cos(np.pi * (2 * np.arange(n)[None, :] + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    m[0] /= np.sqrt(2.0)
    return m


_DCT_LOW = _dct_matrix(_SIDE)[:_LOW]  # only the 8 lowest frequencies are kept: 8x32, not 32x32
# Modes that resize as they are; others (palettes, 16-bit, float, CMYK) become grey first.
_RESIZABLE = ("L", "RGB", "RGBA", "LA", "RGBX", "RGBa", "La")


def phash(img: Image.Image) -> Optional[int]:
    """The 64-bit DCT hash of `img` (any size, any mode; upright): bit i (row-major over the 8x8 lowest
    frequencies) is set when that coefficient exceeds the median of the 63 non-DC ones. None for an
    image Pillow cannot thumbnail (its record is written all the same; it is not compared)."""
    try:
        small = img.resize((_SIDE, _SIDE), Image.Resampling.BOX) if img.mode in _RESIZABLE else \
            img.convert("L").resize((_SIDE, _SIDE), Image.Resampling.BOX)
        grey = np.asarray(small.convert("L"), dtype=np.float64)
    except (ValueError, OSError):
        return None
    low = (_DCT_LOW @ grey @ _DCT_LOW.T).ravel()
    bits = low > np.median(low[1:])
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def distance(a: int, b: int) -> int:
    """Hamming distance of two 64-bit hashes."""
    return bin(a ^ b).count("1")
