"""TFRecord framing without TensorFlow, checked against TensorFlow's own writer and reader."""

import io

import pytest
import tensorflow as tf

from imagerecords import records


def test_framing_matches_tensorflow_writer(tmp_path):
    payloads = [b"", b"a", b"hello world" * 100, bytes(range(256))]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for p in payloads:
            w.write(p)
    with open(path, "rb") as f:
        want = f.read()
    buf = io.BytesIO()
    writer = records.RecordWriter(buf)
    for p in payloads:
        writer.write(p)
    assert buf.getvalue() == want
    assert writer.count == 4 and writer.num_bytes == len(want)
    assert writer.offsets[0] == 0 and writer.offsets[1] == 16


def test_tensorflow_reads_our_records(tmp_path):
    path = tmp_path / "ours.tfrecord"
    with open(path, "wb") as f:
        w = records.RecordWriter(f)
        for i in range(5):
            w.write(f"record {i}".encode())
    got = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    assert got == [f"record {i}".encode() for i in range(5)]


def test_read_records_names_the_file_and_offset_of_a_flipped_byte():
    buf = io.BytesIO()
    w = records.RecordWriter(buf)
    w.write(b"first")
    w.write(b"second")
    data = bytearray(buf.getvalue())
    data[w.offsets[1] + 14] ^= 0x01
    with pytest.raises(records.CorruptRecordError, match=r"shard-7: bad data checksum at byte 21"):
        list(records.read_records(io.BytesIO(bytes(data)), "shard-7"))
    assert list(records.read_records(io.BytesIO(buf.getvalue()))) == [b"first", b"second"]


def test_hashing_reader_hashes_what_is_parsed_and_the_rest():
    import hashlib

    buf = io.BytesIO()
    w = records.RecordWriter(buf)
    for i in range(3):
        w.write(bytes([i]) * 1000)
    data = buf.getvalue() + b"trailing"
    stream = records.HashingReader(io.BytesIO(data))
    first = next(records.read_records(stream))
    assert first == b"\x00" * 1000
    stream.drain(chunk=7)
    assert stream.num_bytes == len(data) and stream.sha256() == hashlib.sha256(data).hexdigest()
