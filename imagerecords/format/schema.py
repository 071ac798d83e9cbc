"""Example schema presets: the one place that knows feature keys, for builder and reader alike."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Collection, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format.errors import Error, NoSuchFeature, RecordUndecodable

PRESETS = ("tfds", "tf-models")


@dataclasses.dataclass(frozen=True)
class SchemaKeys:
    """Feature keys of one preset.

    Attributes:
      image: key of the encoded image bytes (JPEG, or PNG when built with --image_encoding png/keep).
      label: key of the int64 label id (label offset already applied).
      filename: key of the source file name (bytes).
      height: key of the int64 image height in pixels.
      width: key of the int64 image width in pixels.
      image_format: key of the format string (b"JPEG" or b"PNG"), or None when the preset has none.
      label_text: key of the class name (bytes), or None when the preset has none.
    """

    image: str
    label: str
    filename: str
    height: str
    width: str
    image_format: Optional[str] = None
    label_text: Optional[str] = None


_KEYS: Dict[str, SchemaKeys] = {
    # Loadable by tfds.builder_from_directory: these names match features.json (see metadata.py).
    "tfds": SchemaKeys(
        image="image", label="label", filename="image/filename", height="image/height", width="image/width"
    ),
    # The keys of TensorFlow Model Garden's ImageNet input pipeline and the classic ImageNet
    # conversion scripts, so existing trainers read the data unchanged.
    "tf-models": SchemaKeys(
        image="image/encoded",
        label="image/class/label",
        filename="image/filename",
        height="image/height",
        width="image/width",
        image_format="image/format",
        label_text="image/class/text",
    ),
}



class UnknownPreset(Error, ValueError):
    """A schema preset name that is not one of PRESETS."""


def keys(preset: str) -> SchemaKeys:
    """Returns the feature keys of `preset`.

    Raises:
      UnknownPreset (a ValueError): if `preset` is not one of PRESETS.
    """
    try:
        return _KEYS[preset]
    except KeyError:
        raise UnknownPreset(f"unknown schema preset {preset!r}; choose one of {', '.join(PRESETS)}") from None


def make_example(
    preset: str,
    *,
    image: bytes,
    label: int,
    label_text: str,
    filename: str,
    height: int,
    width: int,
    extra: Optional[Mapping[str, bytes]] = None,
    image_format: str = "jpeg",
) -> bytes:
    """Builds one serialized tf.train.Example.

    Serialization is deterministic (map keys sorted, no protobuf runtime involved), so equal inputs
    give equal bytes on every machine and version; the byte-identity of builds depends on it.

    Args:
      preset: schema preset name.
      image: the encoded image bytes.
      label: label id, offset already applied.
      label_text: class name; stored only by presets that have a text key.
      filename: source file name (a path relative to the input root, or the key).
      height: image height in pixels.
      width: image width in pixels.
      extra: {key: serialized tf.train.Feature} of the declared features (imagerecords.format.features).
      image_format: 'jpeg' or 'png', what `image` is; stored by presets that have a format key.

    Returns:
      The serialized Example.
    """
    k = keys(preset)
    small = {
        k.label: _int64_feature(label),
        k.filename: _bytes_feature(filename.encode("utf-8")),
        k.height: _int64_feature(height),
        k.width: _int64_feature(width),
    }
    if k.image_format:
        small[k.image_format] = _bytes_feature(image_format.upper().encode("ascii"))
    if k.label_text:
        small[k.label_text] = _bytes_feature(label_text.encode("utf-8"))
    if extra:
        small.update(extra)  # the spec refuses names the preset takes (features.check_names)
    return example_of(small, k.image, image)


def example_of(small: Mapping[str, bytes], large_key: Optional[str] = None, large: bytes = b"") -> bytes:
    """Serializes an Example of {key: serialized Feature} plus, optionally, one large bytes value.
    """
    # Example{features=1: Features{feature=1: map<string, Feature>}}; a map is a repeated entry
    # message {key=1, value=2}; entries are written in key order, so equal inputs give equal bytes.
    # The image is the only large value: its entry is written as headers around the bytes, so they
    # are copied once (into the final join) instead of once per nesting level.
    parts: List[bytes] = []
    for name in sorted([*small, *([large_key] if large_key is not None else [])]):
        if name != large_key:
            parts.append(_field(1, _field(1, name.encode("utf-8")) + _field(2, small[name])))
            continue
        value_header = _header(1, len(large))  # BytesList.value
        list_header = _header(1, len(value_header) + len(large))  # Feature.bytes_list
        feature_len = len(list_header) + len(value_header) + len(large)
        key_and_value_header = _field(1, name.encode("utf-8")) + _header(2, feature_len)  # entry key, value
        entry_header = _header(1, len(key_and_value_header) + feature_len)  # Features.feature entry
        parts += [entry_header, key_and_value_header, list_header, value_header, large]
    return b"".join([_header(1, sum(map(len, parts))), *parts])


def example_entry(name: str, feature: bytes) -> bytes:
    """One {key: Feature} entry of an Example's feature map, as example_of writes it."""
    return _field(1, _field(1, name.encode("utf-8")) + _field(2, feature))


def example_header(body_length: int) -> bytes:
    """What example_of writes before the entries, for entries of `body_length` bytes in all."""
    return _header(1, body_length)


# Protocol-buffer wire format, just what tf.train.Example needs. Writing and reading it here keeps
# TensorFlow (hundreds of MB and seconds of import per process) out of the Beam workers and the
# report; tests check both directions against TensorFlow's own messages.


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]  # tags and short lengths: most varints written


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    value &= 0xFFFFFFFFFFFFFFFF  # negative int64 values take ten bytes, two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _header(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited field (wire type 2) whose payload follows."""
    return _varint(number << 3 | 2) + _varint(length)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _header(number, len(payload)) + payload


def _bytes_feature(value: bytes) -> bytes:
    return _field(1, _field(1, value))  # Feature{bytes_list=1: BytesList{value=1}}


def _int64_feature(value: int) -> bytes:
    return _field(3, _field(1, _varint(value)))  # Feature{int64_list=3: Int64List{packed value=1}}


bytes_feature = _bytes_feature


def int64_list_feature(values: Sequence[int]) -> bytes:
    """Feature{int64_list}: packed varints, as TensorFlow writes them; an empty list has no field."""
    return _field(3, _field(1, b"".join(map(_varint, values))) if values else b"")


def float_list_feature(packed_le_float32: bytes) -> bytes:
    """Feature{float_list} from the values already packed as little-endian float32."""
    return _field(2, _field(1, packed_le_float32) if packed_le_float32 else b"")


def parse_spec(preset: str) -> dict:
    """Returns the tf.io.parse_example feature spec for `preset` (imports TensorFlow)."""
    # TensorFlow: 3.4 s to import, and the trainer's own install; only a tf.data parse spec needs it
    import tensorflow as tf

    k = keys(preset)
    spec = {
        k.image: tf.io.FixedLenFeature([], tf.string),
        k.label: tf.io.FixedLenFeature([], tf.int64),
        k.filename: tf.io.FixedLenFeature([], tf.string, default_value=""),
        k.height: tf.io.FixedLenFeature([], tf.int64, default_value=0),
        k.width: tf.io.FixedLenFeature([], tf.int64, default_value=0),
    }
    if k.image_format:
        spec[k.image_format] = tf.io.FixedLenFeature([], tf.string, default_value="JPEG")
    if k.label_text:
        spec[k.label_text] = tf.io.FixedLenFeature([], tf.string, default_value="")
    return spec


def parse_example(data: bytes, only: Optional[Collection[str]] = None) -> Dict[str, List[Any]]:
    """Returns {feature key: values} of a serialized tf.train.Example, without TensorFlow.

    This is the one Example decoder (`make_example`'s inverse); it reads TensorFlow's bytes too.

    Args:
      data: the serialized Example.
      only: if given, the keys to decode; other features are skipped undecoded, so reading a
        label next to a large image costs no copy of the image.

    Returns:
      bytes_list values as bytes, int64_list values as int (negative ones too), float_list values
      as float; a feature with no list set has [].

    Raises:
      RecordUndecodable (a ValueError): for bytes that are not a serialized Example.
    """
    out: Dict[str, List[Any]] = {}
    try:
        for number, _, features in _message_fields(memoryview(data)):
            if number != 1:  # Example.features
                continue
            for entry_number, _, entry in _message_fields(features):
                if entry_number != 1:  # Features.feature, a map: repeated entries {key=1, value=2}
                    continue
                key, value = _map_entry(entry)
                if key is not None and (only is None or key in only):
                    out[key] = _feature_values(value)
    except (IndexError, ValueError, struct.error) as e:  # a varint or a float run cut short, an odd wire type
        raise RecordUndecodable(f"not a serialized tf.train.Example ({e or 'cut short'})") from None
    return out


def read_int64(example: bytes, key: str) -> int:
    """Returns the first int64 value of feature `key` in a serialized Example, without TensorFlow.

    Raises:
      NoSuchFeature (a KeyError): if the Example has no int64 feature `key`.
    """
    values = parse_example(example, only=(key,)).get(key)
    if not values or not isinstance(values[0], int):
        raise NoSuchFeature(f"the Example has no int64 feature {key!r}")
    return values[0]


def _map_entry(entry: memoryview) -> Tuple[Optional[str], memoryview]:
    key, value = None, memoryview(b"")
    for number, _, v in _message_fields(entry):
        if number == 1:
            key = bytes(v).decode("utf-8", errors="replace")
        elif number == 2:
            value = v
    return key, value


def _feature_values(feature: memoryview) -> List[Any]:
    for kind, _, values in _message_fields(feature):
        if kind == 1:  # bytes_list {value=1 repeated bytes}
            return [bytes(v) for n, _, v in _message_fields(values) if n == 1]
        if kind == 3:  # int64_list {value=1 repeated int64, packed or not}
            return [_signed(x) for n, wire, v in _message_fields(values) if n == 1 for x in _varints(v, wire)]
        if kind == 2:  # float_list {value=1 repeated float, packed or not}
            out: List[Any] = []
            for n, _, v in _message_fields(values):
                if n == 1:
                    out.extend(struct.unpack(f"<{len(v) // 4}f", v))
            return out
    return []


def _varints(value: Any, wire: int) -> Iterator[int]:
    """The integers of one repeated-varint field: a single varint (wire 0) or a packed run (wire 2)."""
    if wire == 0:
        yield value
        return
    pos = 0
    while pos < len(value):
        number, pos = _read_varint(value, pos)
        yield number


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value  # int64 is stored as two's complement


def _read_varint(buf: memoryview, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _message_fields(buf: memoryview) -> Iterator[Tuple[int, int, Any]]:
    """Yields (field number, wire type, value) of a serialized message: an int for a varint, a
    slice of `buf` (no copy when it is a memoryview) for the other wire types."""
    pos = 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        else:
            raise RecordUndecodable(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):  # a slice past the end is silently short: the message was cut
            raise RecordUndecodable(f"field {number} runs past the end of its message")
        yield number, wire, value
