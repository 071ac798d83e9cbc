"""The declared features of one row as serialized tf.train.Feature values (imagerecords.format.features)."""

from __future__ import annotations

import io
import json
from typing import Callable, Dict, Sequence

from imagerecords.build import codec, input_files
from imagerecords.build.refs import ImageRef, LabelMap
from imagerecords.format import features as features_lib
from imagerecords.format import schema
from imagerecords.format.features import Feature, ValueProblem

# Pillow modes an image feature stores as they are, by channel count; 'P' is stored as its indices
# (a palette mask's class ids), '1' as 0/255 greyscale.
_MODES = {1: ("L", "I;16", "I;16B", "I;16L", "I", "P", "1"), 3: ("RGB",), 4: ("RGBA",)}


def encode_extras(ref: ImageRef, features: Sequence[Feature], labels: LabelMap,
                  read_bytes: Callable[[str], bytes], quality: int) -> Dict[str, bytes]:
    """{feature name: serialized Feature} of the ref's declared features.

    Raises:
      ValueProblem: naming the feature, for a value or an image file that cannot be stored.
    """
    values = json.loads(ref.extras) if ref.extras else {}
    out: Dict[str, bytes] = {}
    for feature in features:
        value = values.get(feature.name)
        if feature.dtype == "image":
            out[feature.name] = schema.bytes_feature(_image(feature, value, read_bytes, quality))
        else:
            checked = features_lib.check(feature, value)
            out[feature.name] = features_lib.encode(feature, checked, labels.list_vocabulary(feature.name))
    return out


def _image(feature: Feature, path: str, read_bytes: Callable[[str], bytes], quality: int) -> bytes:
    name = feature.name
    try:
        data = read_bytes(path)
    except input_files.Refused as e:
        raise ValueProblem(f"feature {name!r}: {path}: {e}") from None
    except OSError as e:
        raise ValueProblem(f"feature {name!r}: cannot read {path}: {input_files.describe_os_error(e)}") from None
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as e:  # Pillow raises many types for a broken file
        raise ValueProblem(f"feature {name!r}: {path} is not an image Pillow can decode ({type(e).__name__})") from None
    if img.mode not in _MODES[feature.channels]:
        have = len(img.getbands())
        raise ValueProblem(f"feature {name!r}: {path} has mode {img.mode} ({have} channel{'s' * (have != 1)}); "
                           f"the feature declares {feature.channels}")
    sixteen = img.mode.startswith("I")
    if sixteen and feature.bits != 16:
        raise ValueProblem(f"feature {name!r}: {path} is a 16-bit image; declare bits: 16 to keep its 16 bits")
    if (feature.encoding == "keep" and codec.sniff_format(data) == "png" and img.mode != "P"
            and sixteen == (feature.bits == 16)):
        return data  # the source bytes, byte for byte
    if feature.encoding == "keep" and data[:2] == b"\xff\xd8" and feature.bits == 8:
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
    if feature.encoding != "jpeg":
        return codec.png_bytes(img)
    if img.mode.startswith("I;16"):
        raise ValueProblem(f"feature {name!r}: {path} is a 16-bit image; JPEG stores 8 bits: use encoding png")
    buf = io.BytesIO()
    img.convert("L" if feature.channels == 1 else "RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()
