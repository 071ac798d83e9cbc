"""The declared features of one row as serialized tf.train.Feature values (imagerecords.format.features)."""

from __future__ import annotations

import io
import json
from typing import Callable, Dict, Optional, Sequence

from PIL import Image

from imagerecords.format import codecs
from imagerecords.format.features import Feature, ValueProblem
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.refs import ImageRef, LabelMap
from imagerecords.pipeline.read import input_files

# Pillow modes an image feature stores as they are, by channel count; 'P' is stored as its indices
# (a palette mask's class ids), '1' as 0/255 greyscale.
_MODES = {1: ("L", "I;16", "I;16B", "I;16L", "I", "P", "1"), 3: ("RGB",), 4: ("RGBA",)}


def encode_extras(ref: ImageRef, features: Sequence[Feature], labels: LabelMap,
                  read_bytes: Callable[[str], bytes], quality: int,
                  geometry: Optional[codec.Geometry] = None, png_level: int = codec.PNG_LEVEL) -> Dict[str, bytes]:
    """{feature name: serialized Feature} of the ref's declared features.

    Args:
      geometry: how the main image was shrunk and rotated; an image feature that is not declared
        `independent` must be the image's size and is moved the same way.
      png_level: libdeflate level of the PNGs written for png/keep image features.

    Raises:
      ValueProblem: naming the feature, for a value or an image file that cannot be stored.
    """
    values = json.loads(ref.extras) if ref.extras else {}
    out: Dict[str, bytes] = {}
    for feature in features:
        value = values.get(feature.name)
        if feature.dtype == "image":
            follow = None if feature.independent else geometry
            # Reading and re-encoding the file is the builder's; storing the bytes is the kind's codec's.
            out[feature.name] = codecs.encode(feature, _image(feature, value, read_bytes, quality, follow,
                                                                             png_level))
        else:
            checked = codecs.check(feature, value)
            out[feature.name] = codecs.encode(feature, checked, labels.list_vocabulary(feature.name))
    return out


def _image(feature: Feature, path: str, read_bytes: Callable[[str], bytes], quality: int,
           follow: Optional[codec.Geometry] = None, png_level: int = codec.PNG_LEVEL) -> bytes:
    name = feature.name
    try:
        data = read_bytes(path)
    except input_files.Refused as e:
        raise ValueProblem(f"feature {name!r}: {path}: {e}") from None
    except OSError as e:
        raise ValueProblem(f"feature {name!r}: cannot read {path}: {input_files.describe_os_error(e)}") from None

    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as e:  # Pillow raises many types for a broken file
        raise ValueProblem(f"feature {name!r}: {path} is not an image Pillow can decode ({type(e).__name__})") from None
    if img.mode not in _MODES[feature.channels]:
        have = len(img.getbands())
        raise ValueProblem(f"feature {name!r}: {path} has mode {img.mode} ({have} channel{'s' * (have != 1)}); "
                           f"the feature declares {feature.channels}")
    if codec.deep_colour_png(codec.sniff_format(data) or "", data):
        raise ValueProblem(f"feature {name!r}: {path} is a 16-bit-per-channel colour PNG; Pillow reads it as 8 bits, "
                           "so it cannot be stored exactly (16 bits are kept for 1-channel images only)")
    sixteen = img.mode.startswith("I")
    if sixteen and feature.bits != 16:
        raise ValueProblem(f"feature {name!r}: {path} is a 16-bit image; declare bits: 16 to keep its 16 bits")
    if follow is not None and img.size != follow.size:
        raise ValueProblem(f"feature {name!r}: {path} is {img.width}x{img.height} pixels, its image is "
                           f"{follow.size[0]}x{follow.size[1]}; an image feature follows its image's resize and "
                           "rotation, so it must be the image's size (declare independent: true for an image of "
                           "its own size)")
    moves = follow is not None and follow.moves  # then re-encoded, moved as the image was
    if (not moves and feature.encoding == "keep" and codec.sniff_format(data) == "png" and img.mode != "P"
            and sixteen == (feature.bits == 16)):
        return data  # the source bytes, byte for byte
    if not moves and feature.encoding == "keep" and data[:2] == b"\xff\xd8" and feature.bits == 8:
        return data
    if img.mode == "P":
        img = Image.frombytes("L", img.size, img.tobytes())  # palette indices, not the colours they show
    elif img.mode == "1":
        img = img.convert("L")
    elif img.mode in ("I", "I;16B", "I;16L"):
        try:
            img = Image.fromarray(codec.sixteen_bit(img))  # I;16, values unchanged (refused beyond 0..65535)
        except codec.ImageError as e:
            raise ValueProblem(f"feature {name!r}: {path}: {e}") from None
    if feature.bits == 16 and img.mode == "L":
        img = img.convert("I;16")  # widened: the feature's one pixel type, values unchanged
    if moves:
        img = follow.follow(img)
    if feature.encoding != "jpeg":
        return codec.png_bytes(img, png_level)
    if img.mode.startswith("I;16"):
        raise ValueProblem(f"feature {name!r}: {path} is a 16-bit image; JPEG stores 8 bits: use encoding png")
    buf = io.BytesIO()
    img.convert("L" if feature.channels == 1 else "RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()
