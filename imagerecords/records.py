"""TFRecord framing: length, masked crc32c, data, masked crc32c — written without TensorFlow."""

from __future__ import annotations

import hashlib
import struct
from typing import BinaryIO, Iterator

import google_crc32c

_MASK_DELTA = 0xA282EAD8


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
      offsets: byte offset of every record's start (the `.index` a random-access reader needs).
    """

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._sha = hashlib.sha256()
        self.count = 0
        self.num_bytes = 0
        self.offsets = []

    def write(self, record: bytes) -> None:
        data = frame(record)
        self._stream.write(data)
        self._sha.update(data)
        self.offsets.append(self.num_bytes)
        self.count += 1
        self.num_bytes += len(data)

    def sha256(self) -> str:
        return self._sha.hexdigest()


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
