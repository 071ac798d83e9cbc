"""Declared features: the typed contract of what a record holds beyond the image and its class.

One spec drives both sides. The builder checks and encodes each value with `check` and `encode` (no TensorFlow,
deterministic bytes; each kind's code sits in imagerecords.format.codecs); manifest.json records the spec (`to_json`); the reader parses and decodes by
it (imagerecords.reader.features), and TFDS's features.json is made from it (`tfds_feature`).

Kinds, by `dtype`:
  image       a path column, read and stored like the main image (`encoding` png, keep or jpeg;
              `channels` 1, 3 or 4; 8- and 16-bit greyscale kept as they are under png and keep); it
              follows the main image's resize and EXIF rotation unless declared `independent`.
  class_list  several class names (or ids) per row: Int64List of ids; vocabulary `names`, given or
              the sorted names seen in the build.
  string      UTF-8 text (a caption, an id): one BytesList value.
  uint8 int32 int64 float16 float32 float64 bool
              a numeric tensor of `shape` (`[]` a scalar; `null` a variable dimension, at most one):
              `encoding: list` stores Int64List/FloatList, `encoding: bytes` stores the raw
              little-endian bytes (what `x.tobytes()` gives and `tf.io.decode_raw` reads). Bytes by
              default for more than one dimension and for float64 (FloatList is float32).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format import schema
from imagerecords.format.errors import Error

NUMERIC = ("uint8", "int32", "int64", "float16", "float32", "float64", "bool")
KINDS = ("image", "class_list", "string") + NUMERIC
IMAGE_ENCODINGS = ("png", "keep", "jpeg")
TENSOR_ENCODINGS = ("list", "bytes")
# Keys the builder writes itself (the schema presets' keys): a declared feature may not take them.
# '/'-separated parts ('image/object/bbox' as tf-models spells keys); a name becomes a file name
# (TFDS's `<name>.labels.txt`), so no part is empty, '.' or '..' (each starts with a letter, digit or '_').
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# C0, DEL and C1 controls and the line separators: a class name goes on one line of <name>.labels.txt.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class SpecError(Error, ValueError):
    """A feature declaration that cannot be used; the message names the feature."""


class ValueProblem(ValueError):
    """A row's value that does not fit its feature; the message names the feature (a rejected row)."""


@dataclasses.dataclass(frozen=True)
class Feature:
    """One declared feature.

    Attributes:
      name: the stored key, and the column that feeds it unless `column` says otherwise.
      dtype: one of KINDS.
      shape: dimensions of a numeric tensor, None for a variable one; () for a scalar.
      encoding: png/keep/jpeg for an image; list/bytes for a tensor; '' otherwise.
      column: the input column ('' = name).
      names: the vocabulary of a class_list ('' names when it is taken from the data).
      channels: an image's channel count.
      allow_nan: whether a float tensor may hold NaN or infinities.
      bits: an image's bits per channel, 8 or 16 (16: greyscale PNG only).
      independent: an image feature of its own size; otherwise it is a per-pixel companion of the
        main image (a mask) and follows its resize and EXIF rotation.
    """

    name: str
    dtype: str
    shape: Tuple[Optional[int], ...] = ()
    encoding: str = ""
    column: str = ""
    names: Tuple[str, ...] = ()
    channels: int = 0
    allow_nan: bool = False
    bits: int = 0
    independent: bool = False

    @property
    def source(self) -> str:
        return self.column or self.name

    @property
    def numeric(self) -> bool:
        return self.dtype in NUMERIC

    @property
    def bytes_like(self) -> bool:
        """Stored as one BytesList value: an image, a string or a raw-bytes tensor."""
        return self.dtype in ("image", "string") or self.encoding == "bytes"

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"dtype": self.dtype}
        if self.numeric:
            out["shape"] = list(self.shape)
        if self.encoding:
            out["encoding"] = self.encoding
        if self.column and self.column != self.name:
            out["column"] = self.column
        if self.dtype == "class_list":
            out["names"] = list(self.names)
        if self.dtype == "image":
            out["channels"] = self.channels
            out["bits"] = self.bits
            if self.independent:
                out["independent"] = True
        if self.allow_nan:
            out["allow_nan"] = True
        return out


def from_json(name: str, d: Mapping[str, Any]) -> Feature:
    """Reads one declaration: a config file's entry, a flag's parse, or manifest.json's record.

    Raises:
      SpecError: naming the feature and what is wrong with it.
    """
    if not isinstance(d, Mapping):
        raise SpecError(f"feature {name!r}: expected a mapping such as {{dtype: float32, shape: [4]}}, got {d!r}")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise SpecError(f"feature {name!r}: a name is '/'-separated parts of letters, digits, '_', '.' and '-', each "
                        "starting with a letter, digit or '_' (the first with a letter or '_'): it becomes a file name")
    unknown = sorted(set(d) - {"dtype", "shape", "encoding", "column", "names", "channels", "allow_nan", "bits",
                               "independent"})
    if unknown:
        raise SpecError(f"feature {name!r}: unknown key(s) {', '.join(unknown)}")
    dtype = d.get("dtype")
    if dtype not in KINDS:
        raise SpecError(f"feature {name!r}: dtype {dtype!r} is not one of {', '.join(KINDS)}")
    shape = _shape(name, d.get("shape", []))
    if dtype not in NUMERIC and "shape" in d:
        raise SpecError(f"feature {name!r}: a {dtype} feature takes no shape")
    if dtype in NUMERIC and math.prod(s for s in shape if s is not None) * _itemsize(dtype) > MAX_RECORD_BYTES:
        # a reader would allocate it: [1000000000] float32 crashed as_dataset (SIGSEGV)
        raise SpecError(f"feature {name!r}: shape {list(shape)} of {dtype} is more than a record can hold "
                        f"({MAX_RECORD_BYTES:,} bytes, protobuf's limit on one message)")
    encoding = d.get("encoding", "")
    if dtype == "image":
        encoding = encoding or "png"
        if encoding not in IMAGE_ENCODINGS:
            raise SpecError(f"feature {name!r}: image encoding {encoding!r} is not one of {', '.join(IMAGE_ENCODINGS)}")
    elif dtype in NUMERIC:
        encoding = encoding or ("bytes" if len(shape) > 1 or dtype == "float64" else "list")
        if encoding not in TENSOR_ENCODINGS:
            raise SpecError(f"feature {name!r}: tensor encoding {encoding!r} is not one of {', '.join(TENSOR_ENCODINGS)}")
        if encoding == "list" and dtype == "float64":
            raise SpecError(f"feature {name!r}: float64 as a list would be rounded to float32 (FloatList); "
                            "use encoding: bytes")
    elif encoding:
        raise SpecError(f"feature {name!r}: a {dtype} feature takes no encoding")
    channels = d.get("channels", 0)
    if dtype == "image":
        channels = channels or 1
        if channels not in (1, 3, 4):
            raise SpecError(f"feature {name!r}: channels must be 1, 3 or 4, got {channels!r}")
    elif "channels" in d:
        raise SpecError(f"feature {name!r}: only an image feature takes channels")
    bits = d.get("bits", 0)
    if dtype == "image":
        bits = bits or 8
        if bits not in (8, 16) or (bits == 16 and (channels != 1 or encoding == "jpeg")):
            raise SpecError(f"feature {name!r}: bits is 8, or 16 for a 1-channel png/keep image; got {bits!r}")
    elif "bits" in d:
        raise SpecError(f"feature {name!r}: only an image feature takes bits")
    names = d.get("names", [])
    if dtype != "class_list" and "names" in d:
        raise SpecError(f"feature {name!r}: only a class_list feature takes names")
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise SpecError(f"feature {name!r}: names must be a list of class names")
    if len(set(names)) != len(names):
        raise SpecError(f"feature {name!r}: a class name repeats in names")
    column = d.get("column", "")
    if not isinstance(column, str):
        raise SpecError(f"feature {name!r}: column must be a column name, got {column!r}")
    allow_nan = d.get("allow_nan", False)
    if allow_nan not in (True, False) or (allow_nan and dtype not in ("float16", "float32", "float64")):
        raise SpecError(f"feature {name!r}: allow_nan is true or false, and only for float tensors")
    independent = d.get("independent", False)
    if independent not in (True, False) or (independent and dtype != "image"):
        raise SpecError(f"feature {name!r}: independent is true or false, and only for image features")
    return Feature(name, dtype, shape, encoding, column, tuple(names), channels, allow_nan, bits, independent)


# The most one serialized Example can be (protobuf refuses messages of 2 GiB and more).
MAX_RECORD_BYTES = 2**31 - 1


def _itemsize(dtype: str) -> int:
    return 1 if dtype in ("bool", "uint8") else int(_NUMPY[dtype][-1])


def _shape(name: str, raw: Any) -> Tuple[Optional[int], ...]:
    if not isinstance(raw, (list, tuple)):
        raise SpecError(f"feature {name!r}: shape must be a list such as [], [4] or [null, 4], got {raw!r}")
    dims: List[Optional[int]] = []
    for dim in raw:
        if dim is None or dim == -1:
            dims.append(None)
        elif isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0:
            dims.append(dim)
        else:
            raise SpecError(f"feature {name!r}: dimension {dim!r} is not a size or null")
    if dims.count(None) > 1:
        raise SpecError(f"feature {name!r}: at most one dimension may be variable (null), got {raw!r}")
    return tuple(dims)


def parse_declarations(raw: Any, what: str = "features") -> Tuple[Feature, ...]:
    """Reads a config file's `features:` mapping {name: declaration}, in name order."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise SpecError(f"{what}: expected a mapping of feature name to declaration")
    # A declaration is a mapping, or the flag's text form ("float32[?,4]") as build() takes it.
    return tuple(parse_flag(f"{name}={raw[name]}", f"{what}: {name!r}: {raw[name]!r}")
                 if isinstance(raw[name], str) and isinstance(name, str) else from_json(name, raw[name])
                 for name in sorted(raw))


_FLAG_RE = re.compile(r"\s*([^=\s]+)\s*=\s*([a-z0-9_]+)\s*(?:\[([^\]]*)\])?\s*(?::\s*(\w+))?\s*")


def parse_flag(text: str, what: Optional[str] = None) -> Feature:
    """Reads `--feature NAME=DTYPE[DIMS][:ENCODING]`: `boxes=float32[?,4]`, `tags=class_list`,
    `score=float32`, `mask=image:png`, `x=float32[28,28]:bytes`; `?` is a variable dimension."""
    match = _FLAG_RE.fullmatch(text)
    if not match:
        raise SpecError(f"{what or f'--feature {text!r}'}: expected NAME=DTYPE[DIMS][:ENCODING], such as "
                        "boxes=float32[?,4]")
    name, dtype, dims, encoding = match.groups()
    d: Dict[str, Any] = {"dtype": dtype}
    if dims is not None:
        parts = [p.strip() for p in dims.split(",") if p.strip()]
        try:
            d["shape"] = [None if p in ("?", "null", "None") else int(p) for p in parts]
        except ValueError:
            raise SpecError(f"{what or f'--feature {text!r}'}: dimension sizes are integers or ?") from None
    if encoding:
        d["encoding"] = encoding
    return from_json(name, d)


def specs_to_json(features: Sequence[Feature]) -> Dict[str, Dict[str, Any]]:
    return {f.name: f.to_json() for f in sorted(features, key=lambda f: f.name)}


def specs_from_json(d: Mapping[str, Mapping[str, Any]]) -> Tuple[Feature, ...]:
    return tuple(from_json(name, d[name]) for name in sorted(d))


# Values --------------------------------------------------------------------------------------


def surrogate_problem(text: str) -> Optional[str]:
    """Why `text` cannot be written as UTF-8 (a lone surrogate, as a JSON \\ud800 escape gives), or None."""
    found = _SURROGATE_RE.search(text)
    return None if found is None else f"holds a lone surrogate U+{ord(found.group()):04X}, which UTF-8 cannot encode"


def _check_class_name(feature: Feature, name: str) -> None:
    found = _CONTROL_RE.search(name)
    if found is not None:
        raise ValueProblem(f"feature {feature.name!r}: class {name!r} holds control character "
                           f"U+{ord(found.group()):04X}: class names go one per line into {feature.name}.labels.txt, "
                           "which it would break or shift")
    problem = surrogate_problem(name)
    if problem:
        raise ValueProblem(f"feature {feature.name!r}: class {name!r} {problem}")


def past_names(feature: Feature, values: Sequence[Any], count: int) -> None:
    """Raises ValueProblem for a class id of `values` past a class list's `count` names."""
    for v in values:
        if _is_int(v) and v >= count:
            raise ValueProblem(f"feature {feature.name!r}: class id {v} is outside 0..{count - 1} "
                               f"(its {count} name{'s' * (count != 1)})")


def from_text(feature: Feature, text: str) -> Any:
    """A CSV cell's text as the value of a numeric or class_list feature (JSON, or names split at '|')."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueProblem(f"feature {feature.name!r}: a JSON value nested deeper than the parser's limit") from None
    except ValueError:
        if feature.dtype == "class_list":
            return [part for part in text.split("|") if part]
        raise ValueProblem(f"feature {feature.name!r}: {_short(text)} is not a number or a JSON list") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_NUMPY = {"bool": "bool", "uint8": "u1", "int32": "<i4", "int64": "<i8", "float16": "<f2", "float32": "<f4",
          "float64": "<f8"}


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate as its \\u escape


# Encoding: the tf.train.Feature message of a checked value ---------------------------------


def vocabulary_of(names: Sequence[str]) -> Dict[str, int]:
    return {name: i for i, name in enumerate(names)}


def raw_pixels_shape(feature: Optional[Feature]) -> Optional[Tuple[int, int, int]]:
    """(H, W, C) when `feature` holds an image's uint8 pixels as they are (an arrays build with
    --image_encoding raw: a uint8 tensor [H, W] or [H, W, C], C 1 or 3, stored as bytes), else None."""
    if feature is None or feature.dtype != "uint8" or feature.encoding != "bytes":
        return None
    shape = tuple(feature.shape or ())
    if len(shape) == 2:
        shape = shape + (1,)
    if len(shape) != 3 or shape[2] not in (1, 3) or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return shape


def tfds_feature(feature: Feature) -> Dict[str, Any]:
    """TFDS's features.json entry for the feature (what tfds.builder_from_directory decodes by)."""
    prefix = "tensorflow_datasets.core.features."
    if feature.dtype == "image" and feature.encoding == "raw":  # flat float32: reshape by image/height, width
        return {"pythonClassName": prefix + "tensor_feature.Tensor",
                "tensor": {"dtype": "float32", "encoding": "bytes", "shape": {"dimensions": ["-1"]}}}
    if feature.dtype == "image":
        return {"pythonClassName": prefix + "image_feature.Image",
                "image": {"dtype": "uint16" if feature.bits == 16 else "uint8",
                          "encodingFormat": "jpeg" if feature.encoding == "jpeg" else "png",
                          "shape": {"dimensions": ["-1", "-1", str(feature.channels)]}}}
    if feature.dtype == "string":
        return {"pythonClassName": prefix + "text_feature.Text", "text": {}}
    if feature.dtype == "class_list":
        return {"pythonClassName": prefix + "sequence_feature.Sequence",
                "sequence": {"feature": {"pythonClassName": prefix + "class_label_feature.ClassLabel",
                                         "classLabel": {"numClasses": str(len(feature.names))}},
                             "length": "-1"}}
    shape = {"dimensions": [str(-1 if d is None else d) for d in feature.shape]} if feature.shape else {}
    return {"pythonClassName": prefix + "tensor_feature.Tensor",
            "tensor": {"dtype": feature.dtype, "encoding": "bytes" if feature.encoding == "bytes" else "none",
                       "shape": shape}}


# The whole record: the schema preset's keys and the declared features ------------------------


def stored(manifest) -> Tuple[Feature, ...]:
    """Every feature a dataset's records hold, by key: the schema preset's own (image, label,
    filename, size) and the declared ones. An arrays build declares its image itself, and then
    its records hold the declared features only.

    Args:
      manifest: an imagerecords.format.manifest.Manifest.
    """
    declared = specs_from_json(manifest.features)
    k = schema.keys(manifest.schema)
    if declared_only(manifest):
        return declared
    if manifest.image_encoding == "jpeg":
        image = Feature(k.image, "image", encoding="jpeg", channels=3, bits=8)
    else:
        fmt, channels, bits = image_summary(manifest.image_kinds)
        encoding = "raw" if fmt == "raw" else manifest.image_encoding if fmt == "png" else "jpeg"
        image = Feature(k.image, "image", encoding=encoding, channels=channels, bits=bits)
    implied = [image, Feature(k.label, "int64"),
               Feature(k.filename, "string"), Feature(k.height, "int64"), Feature(k.width, "int64")]
    implied += [Feature(key, "string") for key in (k.image_format, k.label_text) if key]
    return tuple(sorted([*implied, *declared], key=lambda f: f.name))


def stored_image(manifest) -> Optional[Feature]:
    """The stored feature under the schema preset's image key (an encoded image, an arrays build's
    raw pixels or other tensor), or None when the records hold none."""
    key = schema.keys(manifest.schema).image
    return next((f for f in stored(manifest) if f.name == key), None)


def declared_only(manifest) -> bool:
    """Whether the records hold the declared features and nothing else: an arrays build's (older
    manifests say so only by declaring the preset's image or label, which no other build may)."""
    k = schema.keys(manifest.schema)
    return manifest.features_only or k.image in manifest.features or k.label in manifest.features


def image_summary(image_kinds: Mapping[str, int]) -> Tuple[str, int, int]:
    """(format, channels, bits) one decoder reads every record of these kinds with (Manifest.image_kinds,
    'format:channels:dtype' -> records): 16 bits when any record has them (8-bit ones decode scaled
    by 257); the records' channel count when they share one, else 3 (grey becomes RGB, alpha is
    dropped), or 4 when every record is a PNG and some have alpha (a JPEG decodes to 1 or 3 only)."""
    formats = {k.split(":")[0] for k in image_kinds} or {"jpeg"}
    channels = {int(k.split(":")[1]) for k in image_kinds} or {3}
    if formats == {"raw"}:  # --image_encoding raw: float32 pixels, their channels per record
        return "raw", (channels.pop() if len(channels) == 1 else 0), 32
    bits = 16 if any(k.endswith(":uint16") for k in image_kinds) else 8
    if len(channels) == 1:
        count = channels.pop()
    elif formats == {"png"} and channels & {2, 4}:
        count = 4
    else:
        count = 3
    if "jpeg" in formats and count in (2, 4):
        count = 3
    return ("jpeg" if formats == {"jpeg"} else "png"), count, bits


def tfrecord_description(features: Sequence[Feature]) -> Dict[str, str]:
    """The `description` of the `tfrecord` package's readers (PyTorch): {key: 'byte' | 'int' | 'float'}."""
    out = {}
    for f in features:
        if f.bytes_like:
            out[f.name] = "byte"
        elif f.dtype in ("float16", "float32"):
            out[f.name] = "float"
        else:
            out[f.name] = "int"
    return out


def describe(feature: Feature) -> str:
    """One feature in a line of `imagerecords inspect`: 'float32[?,4] (bytes)', 'class_list (3 names)'."""
    if feature.dtype == "image" and feature.encoding == "raw":
        return f"image raw float32, {feature.channels or 'mixed'} channel(s)"
    if feature.dtype == "image":
        return f"image {feature.encoding}, {feature.channels} channel(s), {feature.bits}-bit"
    if feature.dtype == "class_list":
        return f"class_list ({len(feature.names)} names)"
    if feature.numeric:
        dims = ",".join("?" if d is None else str(d) for d in feature.shape)
        return f"{feature.dtype}[{dims}] ({feature.encoding})"
    return feature.dtype


def stored_problem(feature: Feature, values: Optional[List[Any]]) -> Optional[str]:
    """Why one record's parsed values (schema.parse_example's list) do not fit the feature, or None."""
    if values is None:
        return f"feature {feature.name!r} is missing"
    bytes_like = feature.bytes_like
    if bytes_like:
        if len(values) != 1 or not isinstance(values[0], bytes):
            return f"feature {feature.name!r}: expected one bytes value"
        if feature.encoding == "bytes":
            itemsize = _itemsize(feature.dtype)
            fixed = math.prod(d for d in feature.shape if d is not None)
            if len(values[0]) % (itemsize * max(fixed, 1)) or (None not in feature.shape
                                                               and len(values[0]) != itemsize * fixed):
                return f"feature {feature.name!r}: {len(values[0])} bytes do not make a {describe(feature)}"
        return None
    want = float if feature.dtype in ("float16", "float32") else int
    if values and not all(isinstance(v, want) for v in values):
        return f"feature {feature.name!r}: holds {type(values[0]).__name__} values, the spec says {want.__name__}"
    fixed = math.prod(d for d in feature.shape if d is not None)
    if feature.numeric and None not in feature.shape and len(values) != fixed:
        return f"feature {feature.name!r}: {len(values)} values, {describe(feature)} holds {fixed}"
    if feature.dtype == "class_list" and any(v < 0 or (feature.names and v >= len(feature.names)) for v in values):
        return f"feature {feature.name!r}: a class id outside 0..{len(feature.names) - 1}"
    return None


def spec_code(features: Sequence[Feature], kind: str) -> str:
    """Source text of the parse spec a reader outside imagerecords needs ('tf', 'tfrecord', 'dali')."""
    lines = []
    if kind == "tfrecord":
        return json.dumps(tfrecord_description(features), indent=2, sort_keys=True)
    for f in features:
        bytes_like = f.bytes_like
        wire = "string" if bytes_like else "float32" if f.dtype in ("float16", "float32") else "int64"
        variable = f.dtype == "class_list" or (not bytes_like and None in f.shape)
        shape = [] if bytes_like else list(f.shape)
        if kind == "tf":
            entry = f"tf.io.VarLenFeature(tf.{wire})" if variable else f"tf.io.FixedLenFeature({shape}, tf.{wire})"
        elif kind == "dali":
            default = '""' if wire == "string" else "0.0" if wire == "float32" else "0"
            entry = (f"tfrec.VarLenFeature(tfrec.{wire}, {default})" if variable
                     else f"tfrec.FixedLenFeature({shape}, tfrec.{wire}, {default})")
        else:
            raise ValueError(f"spec kind {kind!r} is not tf, tfrecord or dali")
        lines.append(f"    {f.name!r}: {entry},")
    return "{\n" + "\n".join(lines) + "\n}"


def dali_features(features: Sequence[Feature], tfrec) -> Dict[str, Any]:
    """DALI's fn.readers.tfrecord `features` for these features; `tfrec` is nvidia.dali.tfrecord
    (passed in: this module imports no DALI). Bytes-like values are scalar strings, a fixed list its
    shape, a variable list or class list a VarLenFeature."""
    out = {}
    for f in features:
        bytes_like = f.bytes_like
        wire, default = ((tfrec.string, "") if bytes_like else
                         (tfrec.float32, 0.0) if f.dtype in ("float16", "float32") else (tfrec.int64, 0))
        if not bytes_like and (f.dtype == "class_list" or None in f.shape):
            out[f.name] = tfrec.VarLenFeature(wire, default)
        else:
            out[f.name] = tfrec.FixedLenFeature([] if bytes_like else list(f.shape), wire, default)
    return out


def image_to_numpy(feature: Feature, data: bytes, height: int = 0, width: int = 0) -> "np.ndarray":
    """One stored image of an image feature as NumPy [H, W, C], as reader.as_dataset decodes it: uint8
    (uint16 for 16 bits) with the feature's channels; a raw image (--image_encoding raw) float32,
    shaped by the record's height and width.

    Raises:
      ValueError: raw bytes that do not fill height x width, or bytes no decoder reads.
    """
    # NumPy: 42 ms to import; only decoding to an array needs it
    import numpy as np

    if feature.encoding == "raw":
        pixels = np.frombuffer(data, "<f4")
        if not height or not width or pixels.size % (height * width):
            raise ValueError(f"feature {feature.name!r}: {pixels.size} raw values do not fill {height} x {width}")
        return pixels.reshape(height, width, -1)
    # Pillow: 9.8 ms, and the reader-only install has none; raw pixels decode without it
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        # The builder stores the declared channels; a palette image's values are its indices (a mask's ids).
        if feature.bits != 16 and img.mode != "P" and len(img.getbands()) != feature.channels \
                and feature.channels in (1, 3, 4):
            img = img.convert({1: "L", 3: "RGB", 4: "RGBA"}[feature.channels])
        array = np.array(img, dtype=np.uint16 if feature.bits == 16 else np.uint8)
    return array[:, :, None] if array.ndim == 2 else array
