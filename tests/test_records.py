"""TFRecord framing without TensorFlow, checked against TensorFlow's own writer and reader."""

import io

import pytest
import tensorflow as tf

from imagerecords.format import records


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
    with pytest.raises(records.CorruptRecordError,
                       match=r"shard-7: record 1 at byte 21: bad data checksum \(its data, bytes 33 to 38, "):
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


@pytest.mark.slow
def test_index_is_what_tfrecord2idx_writes_for_a_tensorflow_file(tmp_path):
    from test_index import without_tensorflow

    payloads = [b"", b"a", b"hello world" * 100, bytes(range(256)) * 40]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for p in payloads:
            w.write(p)
    reference = tmp_path / "tf.idx"
    without_tensorflow("from tfrecord.tools.tfrecord2idx import create_index\n"
                       "create_index(ARGS[0], ARGS[1])\nRESULT = None", [path, str(reference)])
    buf = io.BytesIO()
    writer = records.RecordWriter(buf)
    for p in payloads:
        writer.write(p)
    # "offset frame_length\n": a frame is the record plus 16 framing bytes.
    assert writer.index() == reference.read_bytes() == b"0 16\n16 17\n33 1116\n1149 10256\n"
    assert writer.lengths == [len(p) + records.FRAME_OVERHEAD for p in payloads]
    assert records.index_entries(writer.offsets, writer.num_bytes) == list(zip(writer.offsets, writer.lengths))
    assert records.parse_index(writer.index()) == [(0, 16), (16, 17), (33, 1116), (1149, 10256)]
    assert records.index_entries([], 0) == [] and records.format_index([]) == b""


@pytest.mark.parametrize("data, line", [(b"0 16\n16\n", 2), (b"0 16\n-1 17\n", 2), (b"0 x\n", 1), (b"0 16 3\n", 1)])
def test_parse_index_names_the_file_and_the_bad_line(data, line):
    with pytest.raises(ValueError, match=rf"^idx-7: line {line} is not '<offset> <length>'"):
        records.parse_index(data, "idx-7")


def test_the_writers_crc32c_is_the_one_gcs_shows_for_the_object():
    # GCS's object metadata holds base64 of the big-endian crc32c of the whole object; the
    # Castagnoli check value of b"123456789" is 0xE3069283.
    assert records.crc32c_text(records.google_crc32c.Checksum(b"123456789")) == "4waSgw=="
    buf = io.BytesIO()
    writer = records.RecordWriter(buf)
    for record in (b"a", b"bb" * 1000, b""):
        writer.write(record)
    assert writer.crc32c() == records.crc32c_text(records.google_crc32c.Checksum(buf.getvalue()))
    reader = records.HashingReader(io.BytesIO(buf.getvalue())).drain(7)
    assert reader.crc32c() == writer.crc32c() and reader.sha256() == writer.sha256()


def test_frames_in_bulk_are_the_frames_of_each_record_and_write_framed_hashes_them_as_written():
    import numpy as np

    rng = np.random.default_rng(5)
    rows, size = 37, 301
    frames = np.zeros((rows, records.FRAME_OVERHEAD + size), np.uint8)
    frames[:, records.FRAME_HEADER:records.FRAME_HEADER + size] = rng.integers(0, 256, (rows, size), np.uint8)
    records.frame_equal(frames)
    expected = [records.frame(frames[i, records.FRAME_HEADER:records.FRAME_HEADER + size].tobytes()) for i in range(rows)]
    assert [frames[i].tobytes() for i in range(rows)] == expected
    one_by_one = io.BytesIO()
    reference = records.RecordWriter(one_by_one)
    for frame in expected:
        reference.write(frame[records.FRAME_HEADER:-records.FRAME_FOOTER])
    # The frames as a view, as the array itself (hashed without a copy) and as bytes, in two calls.
    for data in (memoryview(frames.reshape(-1)), frames.reshape(-1), frames.tobytes()):
        bulk = io.BytesIO()
        writer = records.RecordWriter(bulk)
        cut = frames.shape[1] * 20
        writer.write_framed(data[:cut], [frames.shape[1]] * 20)
        writer.write_framed(data[cut:], [frames.shape[1]] * (rows - 20))
        assert bulk.getvalue() == one_by_one.getvalue()
        assert (writer.sha256(), writer.crc32c(), writer.offsets) == (reference.sha256(), reference.crc32c(),
                                                                      reference.offsets)
