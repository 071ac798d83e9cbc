"""Image codec: sniff the format from bytes, decode with Pillow, resize, store as JPEG (8-bit RGB),
PNG (lossless, the source's channels and bit depth) or the source's own bytes."""

from __future__ import annotations

import dataclasses
import io
import math
import struct
from typing import Optional, Tuple

import numpy as np
from PIL import Image

from imagerecords.pipeline import naming
from imagerecords.pipeline.encode import perceptual as perceptual_lib
from imagerecords.pipeline.encode import png as png_writer
from imagerecords.pipeline.read.input_files import stable_text

# Decompression-bomb guard: an image above this many pixels is refused with our own error, from
# the dimensions in its header, before anything is decoded. Pillow's process-wide
# Image.MAX_IMAGE_PIXELS (~89 Mpx by default; Pillow warns above it and raises above twice it) is
# read, never changed: when it is lower it is the limit, so Pillow never warns about an image we
# accept. See pixel_limit().
MAX_PIXELS = 200_000_000

# Alpha is composited over this colour: transparent pixels become white, not black (what most
# viewers show for logos and product shots), and no colour is invented where alpha was 0.
ALPHA_BACKGROUND = (255, 255, 255)

# sniff_format's names -> Pillow's format ids: the bytes are opened only as what they say they are.
_PILLOW_FORMATS = {"jpeg": "JPEG", "png": "PNG", "gif": "GIF", "bmp": "BMP", "tiff": "TIFF", "webp": "WEBP"}

# --image_encoding values: what a record's image bytes are (see ImageOptions.image_encoding).
ENCODINGS = ("jpeg", "png", "keep", "raw")
# libdeflate level of every PNG the build writes unless --png_level says otherwise; fixed, so equal
# pixels give equal bytes. 1 by measurement on the photo corpus (README, --png_level): the fastest
# level that compresses, within 3% of level 6's bytes.
PNG_LEVEL = 1
PNG_LEVELS = range(13)  # libdeflate's: 10-12 search exhaustively, slow but smaller on flat pictures
# What writes the PNGs, recorded beside the level in manifest.json: the same level gave other bytes
# with Pillow's writer (zlib-ng), so a dataset of those is never appended to with these.
PNG_WRITER = "numpy-libdeflate"
# A manifest that records a level but no writer was written by Pillow's.
LEGACY_PNG_WRITER = "pillow"
# The level builds used before it was a setting: a manifest that records none was written with it.
LEGACY_PNG_LEVEL = 6

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
    """The bytes are not an image we can use; the message is the reason shown in errors.jsonl.

    Attributes:
      error: the type name of the exception behind the reason (Pillow's, when Pillow failed).
    """

    def __init__(self, reason: str, error: str = "ImageError"):
        super().__init__(reason)
        self.error = error


def pixel_limit() -> int:
    """Returns the most pixels an image may have: MAX_PIXELS, or Pillow's lower global limit."""
    pillow = Image.MAX_IMAGE_PIXELS
    return MAX_PIXELS if pillow is None else min(MAX_PIXELS, int(pillow))


# JPEG start-of-frame markers (they hold the image size); C4, C8 and CC are other segments.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> Optional[Tuple[int, int]]:
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # segments without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        if marker in _SOF:
            if i + 9 > n:
                return None
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return width, height
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def header_size(data: bytes, fmt: str) -> Optional[Tuple[int, int]]:
    """Returns (width, height) read from the file header without decoding, or None when the
    header is short or the format's header is not parsed here (TIFF: Pillow reads it)."""
    try:
        if fmt == "jpeg":
            return _jpeg_size(data)
        if fmt == "png" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if fmt == "gif":
            return struct.unpack("<HH", data[6:10])
        if fmt == "bmp":
            if struct.unpack("<I", data[14:18])[0] == 12:  # OS/2 BITMAPCOREHEADER
                return struct.unpack("<HH", data[18:22])
            width, height = struct.unpack("<ii", data[18:26])
            return abs(width), abs(height)
        if fmt == "webp":
            chunk = data[12:16]
            if chunk == b"VP8X":
                return (int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1)
            if chunk == b"VP8L":
                bits = int.from_bytes(data[21:25], "little")
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            if chunk == b"VP8 ":
                width, height = struct.unpack("<HH", data[26:30])
                return width & 0x3FFF, height & 0x3FFF
    except struct.error:
        return None
    return None


def _check_pixels(width: int, height: int) -> None:
    limit = pixel_limit()
    if width * height > limit:
        raise ImageError(f"image too large: {width}x{height} pixels is over the limit of {limit} pixels")


# What Pillow raises on bytes it cannot use (its plugins let struct/index errors through).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, IndexError, KeyError, TypeError,
                  ZeroDivisionError)


def _decode_reason(fmt: str, e: BaseException) -> str:
    """Our text for a Pillow failure: never a repr (Pillow's "cannot identify image file
    <_io.BytesIO object at 0x...>" would make errors.jsonl differ between two builds)."""
    name = fmt.upper()
    if isinstance(e, Image.UnidentifiedImageError):
        return f"not a decodable image (format unknown): the bytes start like {name} but no decoder accepts them"
    message = stable_text(str(e)).strip()
    if "truncated" in message.lower():
        return f"truncated {name}: {message}"
    return f"cannot decode {name}: {message}" if message else f"cannot decode {name} ({type(e).__name__})"


def sniff_format(data: bytes) -> Optional[str]:
    """Returns 'jpeg', 'png', 'gif', 'bmp', 'tiff' or 'webp' from the leading bytes, else None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for magic, name in _SIGNATURES:
        if data.startswith(magic):
            return name
    return None


@naming.declare
@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How images are prepared.

    Attributes:
      max_side: if set, shrink so the longer side is at most this many pixels.
      short_side: if set, shrink so the shorter side is at most this many pixels.
      quality: JPEG quality (1-100; above 95 files grow fast for little gain) used whenever an
        image is encoded as JPEG.
      reencode: re-encode images even when they could pass through byte for byte.
      max_file_mb: input files larger than this many megabytes (10^6 bytes) are rejected without
        being read whole (a stray video or disk image in the input costs no memory).
      image_encoding: what is stored: 'jpeg' (8-bit RGB JPEG; upright RGB JPEGs pass through), 'png'
        (every image re-encoded as a lossless, pixel-exact PNG in its own channels: grey, grey+alpha,
        RGB, RGBA; 16-bit grey stays 16-bit; palettes become RGB or RGBA) or 'keep' (a PNG or JPEG is
        stored as its source bytes, any other format as 'png' does; one that must be resized or
        rotated is re-encoded in its own format: PNG losslessly, JPEG at `quality`) or 'raw' (the
        decoded pixels as little-endian float32, H x W x C, exactly: float TIFFs, 16- and 32-bit
        integer images; image/height and image/width give the shape). A uint8 image array of an
        .npz or .npy input defaults to 'png'.
      png_level: libdeflate level (0-12) of every PNG the build writes (--image_encoding png,
        keep's conversions, uint8 arrays, png image features): 1 (the default) is the fast one and,
        on photos, within 3% of the rest; higher levels take longer and pay off on flat pictures
        (masks, drawings); 10-12 search exhaustively (10x slower than 9); 0 stores without
        compression. The bytes are fixed by the level and the libdeflate build that constraints.txt pins.
    """

    max_side: Optional[int] = None
    short_side: Optional[int] = None
    quality: int = 90
    reencode: bool = False
    max_file_mb: float = 64.0
    image_encoding: str = "jpeg"
    png_level: int = PNG_LEVEL

    def __post_init__(self):
        for name in ("max_side", "short_side"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive number of pixels, got {value}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be within 1..100 (libjpeg's range), got {self.quality}")
        if isinstance(self.png_level, bool) or not isinstance(self.png_level, int) or self.png_level not in PNG_LEVELS:
            raise ValueError(f"png_level must be a whole number within 0..12 (libdeflate's levels), got {self.png_level!r}")
        if self.image_encoding not in ENCODINGS:
            raise ValueError(f"image_encoding must be one of {', '.join(ENCODINGS)}, got {self.image_encoding!r}")
        if not (isinstance(self.max_file_mb, (int, float)) and math.isfinite(self.max_file_mb) and self.max_file_mb > 0):
            raise ValueError(f"max_file_mb must be a number of megabytes > 0, got {self.max_file_mb!r}")

    @property
    def max_file_bytes(self) -> int:
        """The input size limit in bytes."""
        return int(self.max_file_mb * 1e6)


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    """An encoded image ready to store.

    Attributes:
      data: the stored bytes (a JPEG or a PNG).
      height: height in pixels.
      width: width in pixels.
      source_format: format sniffed from the input bytes.
      passthrough: True when `data` is the input file unchanged.
      format: 'jpeg' or 'png', what `data` is.
      phash: the upright image's perceptual.phash when asked for (prepare_image's `perceptual`), else None.
    """

    data: bytes
    height: int
    width: int
    source_format: str
    passthrough: bool
    format: str = "jpeg"
    phash: Optional[int] = None


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


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How prepare_image moved the main image's pixels: shrunk from the file's `size` to `target`
    ((width, height) both), then turned by its EXIF `orientation`. A mask of `size` follows it."""

    size: Tuple[int, int]
    target: Tuple[int, int]
    orientation: int = 1

    def follow(self, img: Image.Image) -> Image.Image:
        """`img` (of `size`) moved as the image was; nearest-neighbour, so a mask's class ids stay ids."""
        if self.target != self.size:
            img = img.resize(self.target, Image.Resampling.NEAREST)
        return img.transpose(_TRANSPOSE[self.orientation]) if self.orientation in _TRANSPOSE else img

    @property
    def moves(self) -> bool:
        return self.target != self.size or self.orientation in _TRANSPOSE


def geometry(data: bytes, options: ImageOptions) -> Geometry:
    """The Geometry prepare_image gave an image it prepared from `data` (read from its header)."""
    img = Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[sniff_format(data)]])
    return Geometry(img.size, target_size(*img.size, options), _orientation(img))


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(0x0112, 1))
    except Exception:  # a broken EXIF block must not cost the image; treat it as upright
        return 1


_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def sixteen_bit(img: Image.Image):
    """The pixels of a 16-bit (or 32-bit integer) greyscale image as a uint16 array."""
    arr = np.asarray(img, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > 65535):
        raise ImageError(f"a 32-bit integer image with values {arr.min()}..{arr.max()}, outside 0..65535: "
                         "8- and 16-bit storage would clip them; convert it to 8 or 16 bits first")
    return arr.astype(np.uint16)


def _float_to_l(img: Image.Image) -> Image.Image:
    """A float image that holds whole values 0..255 as mode L; any other is refused, never changed."""
    arr = np.asarray(img, dtype=np.float32)
    # 0..1 data would become 0 and 1, so only a float image that holds 8-bit values already is kept.
    if not np.isfinite(arr).all() or (arr.size and (arr.min() < 0 or arr.max() > 255)) \
            or not np.array_equal(arr, np.rint(arr)):
        finite = arr[np.isfinite(arr)]
        span = f"{float(finite.min()):.4g}..{float(finite.max()):.4g}" if finite.size else "none finite"
        extra = "" if finite.size == arr.size else ", with NaN or infinity"
        raise ImageError(f"a floating-point image (values {span}{extra}): 8-bit storage would clip or round "
                         "them; store its pixels exactly with --image_encoding raw (float32), or scale it to 8 or 16 bits first")
    return Image.fromarray(arr.astype(np.uint8), "L")


def _to_rgb(img: Image.Image) -> Image.Image:
    """Converts any Pillow mode to 8-bit RGB; alpha is composited over ALPHA_BACKGROUND."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in _SIXTEEN_BIT:
        # 16-bit greyscale (PNG, TIFF): keep the top 8 bits. Pillow's own convert clips at 255.
        return Image.fromarray((sixteen_bit(img) >> 8).astype("uint8"), "L").convert("RGB")
    if mode == "F":
        return _float_to_l(img).convert("RGB")
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


def _lossless(img: Image.Image) -> Image.Image:
    """The image in a mode PNG stores exactly: L, LA, RGB, RGBA or I;16, with the same pixel values.

    Palettes become RGB (RGBA when a colour is transparent), a tRNS colour key becomes an alpha
    channel, 1-bit becomes L (0 and 255), 32-bit integers within 0..65535 become I;16. CMYK, YCbCr,
    LAB and HSV have no PNG form and are converted to RGB (Pillow's conversion, not exact).
    """
    mode = img.mode
    keyed = "transparency" in img.info
    if mode in _SIXTEEN_BIT:
        return Image.fromarray(sixteen_bit(img))  # I;16: PNG's 16-bit greyscale
    if mode == "F":
        return _float_to_l(img)
    if mode in ("L", "RGB") and not keyed:
        return img
    if mode in ("LA", "RGBA"):
        return img
    if mode == "1":
        return img.convert("L")
    if mode in ("L", "La"):
        return img.convert("LA")
    if mode in ("P", "PA", "RGB", "RGBa"):
        return img.convert("RGBA" if keyed or mode in ("PA", "RGBa") else "RGB")
    return img.convert("RGB")


# Pillow modes png_writer encodes (their arrays are uint8 or uint16 with 1-4 channels); _lossless,
# image features and array images produce no other.
_OWN_PNG_MODES = ("L", "LA", "RGB", "RGBA", "I;16", "I;16B", "I;16L")


def png_bytes(img, level: int = PNG_LEVEL) -> bytes:
    """Deterministic PNG bytes of a Pillow image (a mode of _OWN_PNG_MODES) or a uint8/uint16 array
    (H, W) or (H, W, 1-4): the pixels only (no text, time, ICC, EXIF or DPI chunk), filtered and
    deflated by png_writer at the given libdeflate level."""
    if isinstance(img, Image.Image):
        if img.mode not in _OWN_PNG_MODES:
            raise ValueError(f"no PNG writer for Pillow mode {img.mode}; convert it with _lossless first")
        img = np.asarray(img)
    return png_writer.encode(img, level)


def _png_header(data: bytes) -> Tuple[int, int, bool]:
    """(bit depth, colour type, has a tRNS chunk) of a PNG, from its chunks before the image data."""
    depth, colour = data[24], data[25]
    pos, transparent = 8, False
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind in (b"IDAT", b"IEND"):
            break
        transparent = transparent or kind == b"tRNS"
        pos += 12 + length
    return depth, colour, transparent


def prepared_kind(image: "PreparedImage") -> str:
    """stored_kind of a prepared image; a raw one says its channels: 'raw:C:float32'."""
    if image.format == "raw":
        return f"raw:{len(image.data) // (4 * max(image.height * image.width, 1))}:float32"
    return stored_kind(image.data)


def stored_kind(data: bytes) -> str:
    """'format:channels:dtype' of stored image bytes, as TensorFlow's decode_png / decode_jpeg
    (channels=0) return them, read from the header alone: e.g. 'png:1:uint16', 'jpeg:3:uint8'."""
    fmt = sniff_format(data)
    if fmt == "png" and len(data) >= 26:
        depth, colour, transparent = _png_header(data)
        channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(colour, 3)
        if transparent and colour in (0, 2, 3):
            channels += 1  # TensorFlow turns a tRNS chunk into an alpha channel
        return f"png:{channels}:{'uint16' if depth == 16 else 'uint8'}"
    if fmt == "jpeg":
        i, n = 2, len(data)
        while i + 10 <= n and data[i] == 0xFF:
            marker = data[i + 1]
            if marker in _SOF:
                return f"jpeg:{data[i + 9]}:uint8"
            if marker == 0xFF or marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                i += 1 if marker == 0xFF else 2
                continue
            i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
        return "jpeg:3:uint8"
    return f"{fmt}:0:uint8"


# Pillow modes whose pixels float32 holds exactly, as they are; other modes become RGB or RGBA first.
_RAW_MODES = ("F", "I", "I;16", "I;16L", "I;16B", "I;16N", "L", "LA", "RGB", "RGBA")
_FLOAT32_EXACT = 2**24  # integers beyond it are not all float32 values


def deep_colour_png(fmt: str, data: bytes) -> bool:
    """A PNG of 16 bits per channel with colour or alpha: Pillow decodes it to 8 bits per channel."""
    return fmt == "png" and len(data) > 25 and data[24] == 16 and data[25] != 0


def keyed_sixteen_bit_grey_png(fmt: str, data: bytes) -> bool:
    """A 16-bit greyscale PNG with a transparent grey level (a tRNS chunk): no Pillow mode holds it with its
    transparency, so re-encoding it would drop the transparency."""
    if fmt != "png" or len(data) < 26 or data[24] != 16 or data[25] != 0:
        return False
    return _png_header(data)[2]


def _keyed_grey_error(what: str) -> ImageError:
    return ImageError(f"a 16-bit greyscale PNG with a transparent grey level (tRNS): {what} without losing its "
                      "transparency; store it unchanged with --image_encoding keep (without --max_side, "
                      "--short_side or --reencode)")


def _deep_colour_error(what: str) -> ImageError:
    return ImageError(f"a 16-bit-per-channel colour PNG: Pillow reads it as 8 bits, so {what}; store it unchanged "
                      "with --image_encoding keep (without --max_side, --short_side or --reencode)")


def _raw(data: bytes, fmt: str, options: ImageOptions) -> PreparedImage:
    """--image_encoding raw: the decoded, upright pixels as little-endian float32 (H x W x C).
    Exact unless --max_side/--short_side resample them (LANCZOS, in float32)."""
    if deep_colour_png(fmt, data):
        raise _deep_colour_error("--image_encoding raw cannot hold its pixels exactly")
    if keyed_sixteen_bit_grey_png(fmt, data):
        raise _keyed_grey_error("--image_encoding raw cannot hold it")
    try:
        img = Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[fmt]])
        _check_pixels(*img.size)
        orientation = _orientation(img)
        img.load()
        if img.mode not in _RAW_MODES:
            img = img.convert("RGBA" if "A" in img.getbands() or "transparency" in img.info else "RGB")
        if orientation in _TRANSPOSE:
            img = img.transpose(_TRANSPOSE[orientation])
        arr = np.asarray(img)
        if arr.dtype.kind in "iu" and arr.size and (int(arr.min()) < -_FLOAT32_EXACT or int(arr.max()) > _FLOAT32_EXACT):
            raise ImageError(f"a 32-bit integer image with values {arr.min()}..{arr.max()}: float32 holds integers "
                             f"exactly only within ±{_FLOAT32_EXACT}; convert it to 16 bits first")
        arr = arr.astype(np.float32)
        if arr.ndim == 2:
            arr = arr[..., None]
        tw, th = target_size(arr.shape[1], arr.shape[0], options)
        if (tw, th) != (arr.shape[1], arr.shape[0]):
            arr = np.stack([np.asarray(Image.fromarray(arr[..., c], "F").resize((tw, th), Image.Resampling.LANCZOS))
                            for c in range(arr.shape[2])], axis=-1)
    except ImageError:
        raise
    except (Image.DecompressionBombError, *_DECODE_ERRORS) as e:
        raise _as_image_error(fmt, e) from e
    height, width = arr.shape[:2]
    return PreparedImage(np.ascontiguousarray(arr, dtype="<f4").tobytes(), height, width, fmt, passthrough=False,
                         format="raw")


def _phash(img: Image.Image, wanted: bool) -> Optional[int]:
    return perceptual_lib.phash(img) if wanted else None


def _as_image_error(fmt: str, e: BaseException) -> ImageError:
    """The rejected row's error for a failure while decoding bytes sniffed as `fmt`."""
    if isinstance(e, Image.DecompressionBombError):
        return ImageError(f"image too large: {stable_text(str(e))}", type(e).__name__)
    return ImageError(_decode_reason(fmt, e), type(e).__name__)


def _target(fmt: str, options: ImageOptions) -> str:
    """The stored format of an image sniffed as `fmt`."""
    if options.image_encoding == "keep":
        return fmt if fmt in ("jpeg", "png") else "png"
    return options.image_encoding


def prepare_image(data: bytes, options: ImageOptions = ImageOptions(), perceptual: bool = False) -> PreparedImage:
    """Turns image file bytes into the stored image: a JPEG or a PNG (options.image_encoding).

    'jpeg': a JPEG that is already 8-bit RGB (YCbCr), upright and within the size limits is passed
    through unchanged after a fast check that its entropy-coded data decodes (a DCT-scaled draft
    decode reads every coefficient, so truncation is caught). Everything else is decoded,
    EXIF-rotated, converted to RGB, shrunk if asked (JPEGs through a DCT-scaled draft) and encoded
    as JPEG. 'png': everything is decoded, EXIF-rotated, shrunk if asked and encoded as a PNG in
    its own channels and bit depth (see _lossless). 'keep': a PNG, or an 8-bit RGB or greyscale
    JPEG, that is upright and within the size limits is passed through after a full (PNG) or draft
    (JPEG) decode; one that is not is re-encoded in its own format; other formats as 'png'.
    Animated images keep their first frame. With `perceptual`, the image's perceptual hash is taken
    from the pixels decoded here (a pass-through JPEG's 1/8-scale draft), never from a second decode.

    Raises:
      ImageError: with the reason the bytes cannot be used.
    """
    fmt = sniff_format(data)
    if fmt is None:
        raise ImageError("not a supported image: unrecognized file signature")
    size = header_size(data, fmt)
    if size is not None:
        _check_pixels(*size)
    target = _target(fmt, options)
    keep = options.image_encoding == "keep"
    if target == "raw":
        return _raw(data, fmt, options)
    try:
        img = Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[fmt]])
        width, height = img.size
        _check_pixels(width, height)
        orientation = _orientation(img)
        tw, th = target_size(width, height, options)
        resize = (tw, th) != (width, height)
        unchanged = not options.reencode and not resize and orientation == 1
        # Greyscale JPEGs pass through only under 'keep': 'jpeg' stores 3 channels (today's RGB records).
        jpeg_modes = ("RGB", "L") if keep else ("RGB",)
        if target == "jpeg" and fmt == "jpeg" and unchanged and img.mode in jpeg_modes:
            img.draft(img.mode, (max(1, width // 8), max(1, height // 8)))
            img.load()
            return PreparedImage(data, height, width, fmt, passthrough=True, phash=_phash(img, perceptual))
        if target == "png" and fmt == "png" and keep and unchanged:
            img.load()  # the whole stream must decode: a truncated PNG is a rejected row, not a record
            return PreparedImage(data, height, width, fmt, passthrough=True, format="png", phash=_phash(img, perceptual))
        if resize and fmt == "jpeg":
            img.draft(img.mode if img.mode in ("RGB", "L") else None, (tw, th))
        img.load()
        if target == "png":
            how = "resized or rotated" if options.image_encoding == "keep" else "re-encoded"
            if deep_colour_png(fmt, data):
                raise _deep_colour_error(f"it cannot be {how} exactly")
            if keyed_sixteen_bit_grey_png(fmt, data):
                raise _keyed_grey_error(f"it cannot be {how}")
            img = _lossless(img)
        elif not (keep and img.mode == "L"):
            img = _to_rgb(img)
        if resize:
            img = img.resize((tw, th), Image.Resampling.LANCZOS)
        if orientation in _TRANSPOSE:
            img = img.transpose(_TRANSPOSE[orientation])
        if target == "png":
            return PreparedImage(png_bytes(img, options.png_level), img.height, img.width, fmt, passthrough=False,
                                 format="png", phash=_phash(img, perceptual))
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=options.quality)
        return PreparedImage(out.getvalue(), img.height, img.width, fmt, passthrough=False, phash=_phash(img, perceptual))
    except ImageError:
        raise
    except (Image.DecompressionBombError, *_DECODE_ERRORS) as e:
        raise _as_image_error(fmt, e) from e
