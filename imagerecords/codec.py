"""Image codec: sniff the format from bytes, decode with Pillow, normalise to RGB, resize, JPEG."""

from __future__ import annotations

import dataclasses
import io
from typing import Optional, Tuple

import numpy as np
from PIL import Image

# Decompression-bomb guard: Pillow warns above ~89 Mpx and raises above twice that. We raise our
# own clear error instead, at a limit well above any photo a vision dataset holds.
MAX_PIXELS = 200_000_000
Image.MAX_IMAGE_PIXELS = None

# Alpha is composited over this colour: transparent pixels become white, not black (what most
# viewers show for logos and product shots), and no colour is invented where alpha was 0.
ALPHA_BACKGROUND = (255, 255, 255)

_SIGNATURES = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)


# EXIF orientation tag value -> the operation that makes the image upright.
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


class ImageError(ValueError):
    """The bytes are not an image we can use; the message is the reason shown in errors.jsonl."""


def sniff_format(data: bytes) -> Optional[str]:
    """Returns 'jpeg', 'png', 'gif', 'bmp', 'tiff' or 'webp' from the leading bytes, else None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for magic, name in _SIGNATURES:
        if data.startswith(magic):
            return name
    return None


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How images are prepared.

    Attributes:
      max_side: if set, shrink so the longer side is at most this many pixels.
      short_side: if set, shrink so the shorter side is at most this many pixels.
      quality: JPEG quality (1-95) used whenever an image is re-encoded.
      reencode: re-encode JPEGs even when they could pass through byte for byte.
    """

    max_side: Optional[int] = None
    short_side: Optional[int] = None
    quality: int = 90
    reencode: bool = False

    def __post_init__(self):
        for name in ("max_side", "short_side"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive number of pixels, got {value}")
        if not 1 <= self.quality <= 95:
            raise ValueError(f"quality must be within 1..95 (libjpeg's useful range), got {self.quality}")


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    """A JPEG ready to store.

    Attributes:
      jpeg: the JPEG bytes.
      height: height in pixels.
      width: width in pixels.
      source_format: format sniffed from the input bytes.
      passthrough: True when `jpeg` is the input file unchanged.
    """

    jpeg: bytes
    height: int
    width: int
    source_format: str
    passthrough: bool


def target_size(width: int, height: int, options: ImageOptions) -> Tuple[int, int]:
    """Returns the (width, height) after the optional shrink; never enlarges, keeps aspect ratio."""
    scale = 1.0
    if options.max_side is not None:
        scale = min(scale, options.max_side / max(width, height))
    if options.short_side is not None:
        scale = min(scale, options.short_side / min(width, height))
    if scale >= 1.0:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(0x0112, 1))
    except Exception:  # a broken EXIF block must not cost the image; treat it as upright
        return 1


def _to_rgb(img: Image.Image) -> Image.Image:
    """Converts any Pillow mode to 8-bit RGB; alpha is composited over ALPHA_BACKGROUND."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit greyscale (PNG, TIFF): keep the top 8 bits. Pillow's own convert clips at 255.
        arr = np.asarray(img, dtype=np.uint32)
        return Image.fromarray((np.clip(arr, 0, 65535) >> 8).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        arr = np.asarray(img, dtype=np.float32)
        return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
        mode = "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        background = Image.new("RGB", rgba.size, ALPHA_BACKGROUND)
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    # CMYK (Pillow undoes Adobe's inverted CMYK), L, 1, P, YCbCr, LAB, HSV.
    return img.convert("RGB")


def prepare_image(data: bytes, options: ImageOptions = ImageOptions()) -> PreparedImage:
    """Turns image file bytes into a stored JPEG.

    A JPEG that is already 8-bit RGB (YCbCr), upright and within the size limits is passed through
    unchanged after a fast check that its entropy-coded data decodes (a DCT-scaled draft decode
    reads every coefficient, so truncation is caught). Everything else is decoded, EXIF-rotated,
    converted to RGB, shrunk if asked (JPEGs through a DCT-scaled draft) and encoded as JPEG.
    Animated images keep their first frame.

    Raises:
      ImageError: with the reason the bytes cannot be used.
    """
    fmt = sniff_format(data)
    if fmt is None:
        raise ImageError("not a supported image: unrecognized file signature")
    try:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        if width * height > MAX_PIXELS:
            raise ImageError(f"image too large: {width}x{height} pixels exceeds {MAX_PIXELS}")
        orientation = _orientation(img)
        tw, th = target_size(width, height, options)
        resize = (tw, th) != (width, height)
        if fmt == "jpeg" and not options.reencode and not resize and img.mode == "RGB" and orientation == 1:
            img.draft("RGB", (max(1, width // 8), max(1, height // 8)))
            img.load()
            return PreparedImage(data, height, width, fmt, passthrough=True)
        if resize and fmt == "jpeg":
            img.draft(img.mode if img.mode in ("RGB", "L") else None, (tw, th))
        img.load()
        img = _to_rgb(img)
        if resize:
            img = img.resize((tw, th), Image.Resampling.LANCZOS)
        if orientation in _TRANSPOSE:
            img = img.transpose(_TRANSPOSE[orientation])
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=options.quality)
        return PreparedImage(out.getvalue(), img.height, img.width, fmt, passthrough=False)
    except ImageError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ImageError(f"cannot decode {fmt}: {e}") from e
