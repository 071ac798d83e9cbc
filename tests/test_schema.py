"""The Example schema: our wire-format bytes parse to TensorFlow's message, and the parse spec reads them."""

import pytest
import tensorflow as tf

from imagerecords.format import schema


def tf_example(preset, image, label, text, filename, h, w):
    k = schema.keys(preset)
    b = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
    i = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
    feature = {k.image: b(image), k.label: i(label), k.filename: b(filename.encode()), k.height: i(h), k.width: i(w)}
    if k.image_format:
        feature[k.image_format] = b(b"JPEG")
    if k.label_text:
        feature[k.label_text] = b(text.encode())
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


@pytest.mark.parametrize("preset", schema.PRESETS)
@pytest.mark.parametrize("label,size", [(0, 0), (1, 5), (127, 300), (128, 70_000), (2**40, 3_000_000)])
def test_make_example_equals_tensorflow_serialization(preset, label, size):
    image = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    ours = schema.make_example(preset, image=image, label=label, label_text="ünïcode", filename="a/b.jpg",
                               height=size % 5000, width=17)
    theirs = tf_example(preset, image, label, "ünïcode", "a/b.jpg", size % 5000, 17)
    # Same message; map entries may come in another (equally valid) order than protobuf's
    # runtime picks, so compare parsed messages, and the sizes byte for byte.
    assert tf.train.Example.FromString(ours) == tf.train.Example.FromString(theirs)
    assert len(ours) == len(theirs)


@pytest.mark.parametrize("preset", schema.PRESETS)
def test_parse_spec_reads_what_make_example_writes(preset):
    raw = schema.make_example(preset, image=b"\xff\xd8jpeg", label=3, label_text="cat", filename="cat/1.jpg",
                              height=20, width=30)
    parsed = tf.io.parse_single_example(raw, schema.parse_spec(preset))
    k = schema.keys(preset)
    assert parsed[k.image].numpy() == b"\xff\xd8jpeg" and parsed[k.label].numpy() == 3
    assert (parsed[k.height].numpy(), parsed[k.width].numpy()) == (20, 30)
    assert parsed[k.filename].numpy() == b"cat/1.jpg"
    if k.label_text:
        assert parsed[k.label_text].numpy() == b"cat"


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="unknown schema preset 'coco'"):
        schema.keys("coco")


@pytest.mark.parametrize("preset", schema.PRESETS)
def test_read_int64_reads_our_and_tensorflows_examples(preset):
    k = schema.keys(preset)
    ours = schema.make_example(preset, image=b"x" * 300, label=2**33 + 5, label_text="t", filename="f",
                               height=7, width=9)
    assert schema.read_int64(ours, k.label) == 2**33 + 5 and schema.read_int64(ours, k.width) == 9
    theirs = tf_example(preset, b"y", 4, "t", "f", 1, 2)
    assert schema.read_int64(theirs, k.label) == 4
    with pytest.raises(KeyError, match="no int64 feature 'nope'"):
        schema.read_int64(ours, "nope")


def tf_values(raw):
    """{key: values} of a serialized Example as TensorFlow's own proto parser reads it."""
    out = {}
    for key, feature in tf.train.Example.FromString(raw).features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = list(getattr(feature, kind).value) if kind else []
    return out


@pytest.mark.parametrize("preset", schema.PRESETS)
def test_parse_example_reads_what_make_example_writes(preset):
    k = schema.keys(preset)
    raw = schema.make_example(preset, image=b"\xff\xd8jpeg", label=-3, label_text="cat", filename="a/b.jpg",
                              height=480, width=640)
    got = schema.parse_example(raw)
    assert got == tf_values(raw)
    assert got[k.image] == [b"\xff\xd8jpeg"] and got[k.label] == [-3] and got[k.filename] == [b"a/b.jpg"]
    assert got[k.height] == [480] and got[k.width] == [640]
    if k.label_text:
        assert got[k.label_text] == [b"cat"] and got[k.image_format] == [b"JPEG"]


def test_parse_example_reads_every_list_kind_tensorflow_writes():
    feature = {
        "bytes": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a", b"", "ü".encode()])),
        "ints": tf.train.Feature(int64_list=tf.train.Int64List(value=[-1, 0, 127, 128, 2**40, -(2**63)])),
        "floats": tf.train.Feature(float_list=tf.train.FloatList(value=[1.5, -2.25, 0.0])),
        "none": tf.train.Feature(),
    }
    raw = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
    got = schema.parse_example(raw)
    assert got == tf_values(raw)
    assert got == {"bytes": [b"a", b"", "ü".encode()], "ints": [-1, 0, 127, 128, 2**40, -(2**63)],
                   "floats": [1.5, -2.25, 0.0], "none": []}


def test_parse_example_reads_unpacked_repeated_numbers():
    # Int64List and FloatList written one field per value (proto2 style), which parsers must accept.
    ints = b"".join(b"\x08" + v for v in (b"\x05", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"))  # 5, -1
    floats = b"\x0d\x00\x00\xc0\x3f" + b"\x0d\x00\x00\x20\xc1"  # 1.5, -10.0 as fixed32
    entry = lambda key, feature: b"\x0a" + bytes([len(key) + len(feature) + 4]) + b"\x0a" + bytes([len(key)]) + key \
        + b"\x12" + bytes([len(feature)]) + feature
    features = entry(b"i", b"\x1a" + bytes([len(ints)]) + ints) + entry(b"f", b"\x12" + bytes([len(floats)]) + floats)
    raw = b"\x0a" + bytes([len(features)]) + features
    assert schema.parse_example(raw) == tf_values(raw) == {"i": [5, -1], "f": [1.5, -10.0]}


@pytest.mark.parametrize("preset", schema.PRESETS)
def test_parse_example_only_decodes_the_keys_asked_for(preset):
    k = schema.keys(preset)
    raw = schema.make_example(preset, image=b"x" * 1000, label=7, label_text="t", filename="f", height=1, width=2)
    assert schema.parse_example(raw, only={k.label, k.width}) == {k.label: [7], k.width: [2]}
    assert schema.parse_example(raw, only=()) == {}


def test_read_int64_refuses_a_feature_of_another_kind():
    raw = schema.make_example("tfds", image=b"x", label=1, label_text="t", filename="f", height=1, width=2)
    with pytest.raises(KeyError, match="no int64 feature 'image/filename'"):
        schema.read_int64(raw, "image/filename")
