"""The Example schema: our wire-format bytes parse to TensorFlow's message, and the parse spec reads them."""

import pytest
import tensorflow as tf

from imagerecords import schema


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
