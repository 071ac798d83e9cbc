"""Example schema presets: the one place that knows feature keys, for builder and reader alike."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

PRESETS = ("tfds", "tf-models")


@dataclasses.dataclass(frozen=True)
class SchemaKeys:
    """Feature keys of one preset.

    Attributes:
      image: key of the encoded JPEG bytes.
      label: key of the int64 label id (label offset already applied).
      filename: key of the source file name (bytes).
      height: key of the int64 image height in pixels.
      width: key of the int64 image width in pixels.
      image_format: key of the format string (b"JPEG"), or None when the preset has none.
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


def keys(preset: str) -> SchemaKeys:
    """Returns the feature keys of `preset`.

    Raises:
      ValueError: if `preset` is not one of PRESETS.
    """
    try:
        return _KEYS[preset]
    except KeyError:
        raise ValueError(f"unknown schema preset {preset!r}; choose one of {', '.join(PRESETS)}") from None


def make_example(
    preset: str,
    *,
    image: bytes,
    label: int,
    label_text: str,
    filename: str,
    height: int,
    width: int,
) -> bytes:
    """Builds one serialized tf.train.Example.

    Serialization is deterministic (map keys sorted), so equal inputs give equal bytes on every
    machine; the byte-identity of builds depends on it.

    Args:
      preset: schema preset name.
      image: JPEG bytes.
      label: label id, offset already applied.
      label_text: class name; stored only by presets that have a text key.
      filename: source file name (a path relative to the input root, or the key).
      height: image height in pixels.
      width: image width in pixels.

    Returns:
      The serialized Example.
    """
    from tensorflow.core.example import example_pb2, feature_pb2  # protos only: no TF runtime start

    k = keys(preset)

    def b(value: bytes) -> feature_pb2.Feature:
        return feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[value]))

    def i(value: int) -> feature_pb2.Feature:
        return feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[value]))

    feature = {
        k.image: b(image),
        k.label: i(label),
        k.filename: b(filename.encode("utf-8")),
        k.height: i(height),
        k.width: i(width),
    }
    if k.image_format:
        feature[k.image_format] = b(b"JPEG")
    if k.label_text:
        feature[k.label_text] = b(label_text.encode("utf-8"))
    example = example_pb2.Example(features=feature_pb2.Features(feature=feature))
    return example.SerializeToString(deterministic=True)


def parse_spec(preset: str) -> dict:
    """Returns the tf.io.parse_example feature spec for `preset` (imports TensorFlow)."""
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
