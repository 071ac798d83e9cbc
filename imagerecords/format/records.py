"""TFRecord framing: length, masked crc32c, data, masked crc32c — written without TensorFlow."""

from __future__ import annotations

import hashlib
import struct
from typing import BinaryIO, Iterable, Iterator, List, Sequence, Tuple

import google_crc32c

_MASK_DELTA = 0xA282EAD8
# Bytes a frame adds around its record: uint64 length, its masked crc32c, and the data's crc32c.
FRAME_OVERHEAD = 8 + 4 + 4


def masked_crc32c(data: bytes) -> int:
    """Returns the TFRecord-masked CRC-32C of `data` (rotate right by 15, add a constant)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """Returns `record` framed as one TFRecord entry."""
    length = struct.pack("<Q", len(record))
    return b"".join(
        (length, struct.pack("<I", masked_crc32c(length)), record, struct.pack("<I", masked_crc32c(record)))
    )


class RecordWriter:
    """Writes framed records to a binary stream while keeping a count, byte size and sha256.

    Attributes:
      count: records written so far.
      num_bytes: bytes written so far.
      offsets: byte offset of every record's frame.
    """

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._sha = hashlib.sha256()
        self.count = 0
        self.num_bytes = 0
        self.offsets: List[int] = []

    def write(self, record: bytes) -> None:
        data = frame(record)
        self._stream.write(data)
        self._sha.update(data)
        self.offsets.append(self.num_bytes)
        self.count += 1
        self.num_bytes += len(data)

    def sha256(self) -> str:
        return self._sha.hexdigest()

    @property
    def lengths(self) -> List[int]:
        """Byte length of every record's frame (record + FRAME_OVERHEAD), from the offsets."""
        return [length for _, length in index_entries(self.offsets, self.num_bytes)]

    def index(self) -> bytes:
        """The index file of what was written so far (see `format_index`)."""
        return format_index(index_entries(self.offsets, self.num_bytes))


# Index files ------------------------------------------------------------------------------------
# The `tfrecord2idx` format that DALI (tools/tfrecord2idx, fn.readers.tfrecord's index_path) and the
# PyPI `tfrecord` package (PyTorch; tfrecord/tools/tfrecord2idx.py) both read: one line per record,
# "<frame offset> <frame length>\n" in decimal ASCII, where the frame length counts the 16 framing
# bytes too, so offset + length is the next record's offset.


def index_entries(offsets: Sequence[int], end: int) -> List[Tuple[int, int]]:
    """Returns (offset, frame length) of each record from the frames' start offsets and the file size."""
    bounds = list(offsets) + [end]
    return [(start, stop - start) for start, stop in zip(bounds, bounds[1:])]


def format_index(entries: Iterable[Tuple[int, int]]) -> bytes:
    """Returns the tfrecord2idx index file bytes for (offset, frame length) entries."""
    return "".join(f"{offset} {length}\n" for offset, length in entries).encode("ascii")


def parse_index(data: bytes, name: str = "<index>") -> List[Tuple[int, int]]:
    """Returns the (offset, frame length) entries of a tfrecord2idx index file.

    Raises:
      ValueError: naming `name` and the line that is not two non-negative integers.
    """
    entries = []
    for number, line in enumerate(data.decode("ascii", errors="replace").splitlines(), 1):
        fields = line.split()
        if len(fields) != 2 or not all(f.isdigit() for f in fields):
            raise ValueError(f"{name}: line {number} is not '<offset> <length>': {line[:80]!r}")
        entries.append((int(fields[0]), int(fields[1])))
    return entries


class HashingReader:
    """Wraps a binary stream; keeps the byte count and sha256 of everything read through it, so a
    shard can be checked and parsed in one streaming pass."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._sha = hashlib.sha256()
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._sha.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self, chunk: int = 1 << 20) -> "HashingReader":
        """Reads the rest of the stream (hashing it) and returns self."""
        while self.read(chunk):
            pass
        return self

    def sha256(self) -> str:
        return self._sha.hexdigest()


class CorruptRecordError(ValueError):
    """A TFRecord frame failed its length or data checksum."""


def read_records(stream: BinaryIO, name: str = "<stream>") -> Iterator[bytes]:
    """Yields the records of a TFRecord stream, checking both checksums.

    Raises:
      CorruptRecordError: naming `name` and the byte offset of the bad frame.
    """
    offset = 0
    while True:
        header = stream.read(12)
        if not header:
            return
        if len(header) < 12:
            raise CorruptRecordError(f"{name}: truncated record header at byte {offset}")
        length_bytes, crc = header[:8], struct.unpack("<I", header[8:])[0]
        if masked_crc32c(length_bytes) != crc:
            raise CorruptRecordError(f"{name}: bad length checksum at byte {offset}")
        (length,) = struct.unpack("<Q", length_bytes)
        body = stream.read(length + 4)
        if len(body) < length + 4:
            raise CorruptRecordError(f"{name}: truncated record at byte {offset}")
        record = body[:length]
        if masked_crc32c(record) != struct.unpack("<I", body[length:])[0]:
            raise CorruptRecordError(f"{name}: bad data checksum at byte {offset}")
        yield record
        offset += 12 + length + 4
