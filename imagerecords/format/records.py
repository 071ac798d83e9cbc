"""TFRecord frames and their index files: the one place that writes, checks, scans and indexes them, without TensorFlow.

Every reader (tf.data, the resumable order, PyTorch), `verify` and the report frame and index
through this module, so a frame or an index file passes the same checks wherever it is read.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import BinaryIO, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import google_crc32c

from imagerecords.format.errors import Error

_MASK_DELTA = 0xA282EAD8
FRAME_HEADER = 8 + 4  # uint64 length + masked crc32c of the length
FRAME_FOOTER = 4  # masked crc32c of the data
# Bytes a frame adds around its record: uint64 length, its masked crc32c, and the data's crc32c.
FRAME_OVERHEAD = FRAME_HEADER + FRAME_FOOTER


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


def crc32c_text(checksum: "google_crc32c.Checksum") -> str:
    """A crc32c as GCS shows it in an object's metadata: base64 of the big-endian 4 bytes."""
    return base64.b64encode(checksum.digest()).decode("ascii")


def crc32c_of(data: bytes) -> str:
    """The crc32c of a whole file's bytes, as GCS shows it (crc32c_text)."""
    return crc32c_text(google_crc32c.Checksum(data))


def crc32c_of_stream(stream: BinaryIO, chunk: int = 1 << 20) -> str:
    """crc32c_of for a file read in chunks, so a large shard is never held whole."""
    checksum = google_crc32c.Checksum()
    for block in iter(lambda: stream.read(chunk), b""):
        checksum.update(block)
    return crc32c_text(checksum)


def frame_equal(frames: "np.ndarray") -> None:
    """Frames records of one length in place: `frames` is a (rows, FRAME_HEADER + length +
    FRAME_FOOTER) uint8 array whose middle holds the records; fills each row's header and footer
    with the bytes `frame` gives for that record."""
    # NumPy: 42 ms to import; only the bulk framing of equal-length records needs it
    import numpy as np

    rows, width = frames.shape
    size = width - FRAME_OVERHEAD
    length = struct.pack("<Q", size)
    frames[:, :8] = np.frombuffer(length, np.uint8)
    frames[:, 8:FRAME_HEADER] = np.frombuffer(struct.pack("<I", masked_crc32c(length)), np.uint8)
    # The C crc32c reads a contiguous array in place (each record's row of the matrix), not a memoryview.
    value = google_crc32c.value
    records = frames[:, FRAME_HEADER:FRAME_HEADER + size]
    crcs = np.fromiter((value(r) for r in records), np.uint64, rows)
    masked = (((crcs >> 15) | (crcs << 17)) + _MASK_DELTA) & 0xFFFFFFFF
    frames[:, FRAME_HEADER + size:] = masked.astype("<u4").view(np.uint8).reshape(rows, FRAME_FOOTER)


def frame_rows(rows: "np.ndarray") -> Tuple["np.ndarray", List[int]]:
    """Frames equal-length records given as the rows of a 2-D uint8 array, in bulk (frame_equal):
    (the frames back to back, each frame's length)."""
    # NumPy: as in frame_equal
    import numpy as np

    count, size = rows.shape
    frames = np.empty((count, size + FRAME_OVERHEAD), np.uint8)
    frames[:, FRAME_HEADER:FRAME_HEADER + size] = rows
    frame_equal(frames)
    return frames.reshape(-1), [size + FRAME_OVERHEAD] * count


def file_digests(path: str, chunk: int = 1 << 20) -> Tuple[int, str, str]:
    """(size, sha256, crc32c as GCS shows it) of a local file, read in chunks."""
    sha, crc, size = hashlib.sha256(), google_crc32c.Checksum(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            sha.update(block)
            crc.update(block)
            size += len(block)
    return size, sha.hexdigest(), crc32c_text(crc)


class RecordWriter:
    """Writes framed records to a binary stream while keeping a count, byte size, sha256 and the
    whole file's crc32c (the checksum GCS keeps for every object, so a commit can compare without
    reading the object back).

    Attributes:
      count: records written so far.
      num_bytes: bytes written so far.
      offsets: byte offset of every record's frame.
    """

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._sha = hashlib.sha256()
        self._crc = google_crc32c.Checksum()
        self.count = 0
        self.num_bytes = 0
        self.offsets: List[int] = []
        self._first_footer = self._last_footer = b""

    def write(self, record: bytes) -> None:
        data = frame(record)
        self._first_footer = self._first_footer or data[-FRAME_FOOTER:]
        self._last_footer = data[-FRAME_FOOTER:]
        self._stream.write(data)
        self._sha.update(data)
        self._crc.update(data)
        self.offsets.append(self.num_bytes)
        self.count += 1
        self.num_bytes += len(data)

    def write_framed(self, data: bytes, lengths: Sequence[int]) -> None:
        """Writes records already framed back to back (frame_equal's rows); `lengths` are their frame sizes."""
        if lengths:
            self._first_footer = self._first_footer or bytes(data[lengths[0] - FRAME_FOOTER:lengths[0]])
            self._last_footer = bytes(data[len(data) - FRAME_FOOTER:])
        self._stream.write(data)
        self._sha.update(data)
        # The C crc32c reads bytes or a contiguous NumPy array, not a memoryview: only a view is copied.
        self._crc.update(data if isinstance(data, bytes) or hasattr(data, "__array_interface__") else bytes(data))
        at = self.num_bytes
        for length in lengths:
            self.offsets.append(at)
            at += length
        self.count += len(lengths)
        self.num_bytes = at

    def sha256(self) -> str:
        return self._sha.hexdigest()

    def crc32c(self) -> str:
        return crc32c_text(self._crc)

    def ends_crc(self) -> Optional[str]:
        """The data checksums of the first and last records written (ends_crc), None for none."""
        return (self._first_footer + self._last_footer).hex() if self.count else None

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


class IndexFileError(Error, ValueError):
    """An index file is not the one manifest.json lists for its shard; its shard may be healthy."""


# What every reader says after an index file's problem: the shard is not blamed.
INDEX_MEND = "it is not the index this manifest lists (rebuild the dataset with --overwrite --write_index)"


def index_problems(data: bytes, name: str, *, count: int, num_bytes: int,
                   sha256: Optional[str] = None) -> Tuple[List[Tuple[int, int]], List[str]]:
    """Checks index file bytes against what manifest.json says of its shard.

    The checks: the sha256 (when the manifest records one), every line '<offset> <length>', the
    entry count against the shard's record count, the entries' end against the shard's size, and
    their layout (layout_problem: frames that follow each other from byte 0, inside the shard).

    Args:
      data: the index file's bytes.
      name: its path, for the messages.
      count, num_bytes, sha256: the shard's record count and size, and the index's digest, from
        manifest.json.

    Returns:
      (entries, problems): the (offset, frame length) entries parsed (empty when a line is not
      one), and each problem found, as a phrase without the file name.
    """
    problems = []
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        problems.append("its sha256 differs from manifest.json's")
    try:
        entries = parse_index(data, name)
    except ValueError as e:
        return [], problems + [str(e)[len(name) + 2:]]
    if len(entries) != count:
        problems.append(f"it lists {len(entries)} records, manifest.json says {count} for its shard")
    end = entries[-1][0] + entries[-1][1] if entries else 0
    if end != num_bytes:
        problems.append(f"its records end at byte {end}, manifest.json says its shard is {num_bytes} bytes")
    layout = layout_problem(entries, num_bytes)
    if layout:
        problems.append(layout)
    return entries, problems


def layout_problem(entries: Sequence[Tuple[int, int]], num_bytes: int) -> Optional[str]:
    """Why (offset, frame length) entries are not frames that follow each other from byte 0 inside a
    file of `num_bytes`, or None: a gap or overlap made a reader read one record twice and skip the
    next, and a length of 2**62 made one allocate it."""
    at = 0
    for line, (offset, length) in enumerate(entries, 1):
        if offset + length > num_bytes:
            return (f"line {line} says a frame of {length} bytes at byte {offset}, past its shard's end at byte "
                    f"{num_bytes}")
        if length < FRAME_OVERHEAD:
            return f"line {line} says a frame of {length} bytes; every frame takes at least {FRAME_OVERHEAD}"
        if offset != at:
            return (f"line {line} says offset {offset}, where the record before it ends at byte {at} (an index's "
                    "frames follow each other from byte 0)")
        at += length
    return None


def load_index(data: bytes, name: str, *, count: int, num_bytes: int,
               sha256: Optional[str] = None) -> List[Tuple[int, int]]:
    """The (offset, frame length) entries of an index file that passes every check of index_problems.

    Raises:
      IndexFileError: naming the file, its first problem, and how to mend it.
    """
    entries, problems = index_problems(data, name, count=count, num_bytes=num_bytes, sha256=sha256)
    if problems:
        raise IndexFileError(f"index file {name}: {problems[0]}; {INDEX_MEND}")
    return entries


def unpack_header(header: bytes) -> Optional[int]:
    """The record length a 12-byte frame header holds, or None when it is short or its checksum fails."""
    if len(header) < FRAME_HEADER:
        return None
    length_bytes = header[:8]
    if masked_crc32c(length_bytes) != struct.unpack("<I", header[8:FRAME_HEADER])[0]:
        return None
    return struct.unpack("<Q", length_bytes)[0]


def data_ok(record: bytes, footer: bytes) -> bool:
    """Whether `footer` (a frame's last 4 bytes) is the masked crc32c of `record`."""
    return len(footer) == FRAME_FOOTER and masked_crc32c(record) == struct.unpack("<I", footer)[0]


def check_frame(data: bytes, pos: int) -> Optional[int]:
    """Returns the record length of the frame at `pos` of `data` when both checksums hold, else None."""
    length = unpack_header(data[pos:pos + FRAME_HEADER])
    if length is None:
        return None
    end = pos + FRAME_HEADER + length
    if end + FRAME_FOOTER > len(data) or not data_ok(data[pos + FRAME_HEADER:end], data[end:end + FRAME_FOOTER]):
        return None
    return length


def next_frame(data: bytes, pos: int) -> int:
    """Returns the first offset >= pos where a whole frame checks out, or len(data)."""
    while pos + FRAME_HEADER <= len(data):
        if check_frame(data, pos) is not None:
            return pos
        pos += 1
    return len(data)


def salvage(data: bytes, start: int = 0) -> Iterator[Tuple[int, Optional[bytes], Optional[str]]]:
    """Yields (record index, record, None) for each good frame of `data` after its first `start`
    frames, and (index, None, problem) for each stretch that fails its checks.

    A frame whose length checksum holds but whose data checksum fails is one bad record. After a
    bad length checksum or a truncation the next frame's position is unknown, so the scan resumes
    at the next offset where a whole frame checks out, counting the lost stretch as one record.
    """
    pos = 0
    for _ in range(start):  # frames already read (and checked) by the caller
        length = unpack_header(data[pos:pos + FRAME_HEADER])
        if length is None:
            return
        pos += length + FRAME_OVERHEAD
    index = start
    while pos < len(data):
        length = check_frame(data, pos)
        if length is not None:
            yield index, data[pos + FRAME_HEADER:pos + FRAME_HEADER + length], None
            pos += length + FRAME_OVERHEAD
        else:
            length = unpack_header(data[pos:pos + FRAME_HEADER])
            if length is not None and pos + length + FRAME_OVERHEAD <= len(data):
                yield index, None, f"data checksum fails at byte {pos}"
                pos += length + FRAME_OVERHEAD
            else:
                yield index, None, f"bad or truncated frame at byte {pos}"
                pos = next_frame(data, pos + 1)
        index += 1


def record_of_frame(frame: bytes, length: int, where: str, mend: str = "") -> bytes:
    """The record of `frame` (read at an index entry of frame `length` bytes), both checksums checked.

    Raises:
      CorruptRecordError: `where` (the shard and the frame's byte offset), what failed, and `mend`.
    """
    if len(frame) != length:
        raise CorruptRecordError(f"{where}: read {len(frame)} of its {length} bytes; the file is shorter" + mend)
    size = unpack_header(frame)
    if size is None:
        raise CorruptRecordError(f"{where}: bad length checksum" + mend)
    if size + FRAME_OVERHEAD != length:
        raise CorruptRecordError(f"{where}: the frame holds {size} bytes, the index says {length - FRAME_OVERHEAD}"
                                 + mend)
    record = frame[FRAME_HEADER:FRAME_HEADER + size]
    if not data_ok(record, frame[FRAME_HEADER + size:]):
        raise CorruptRecordError(f"{where}: bad data checksum" + mend)
    return record


def scan_headers(stream: BinaryIO, count: int) -> List[Tuple[int, int]]:
    """(offset, frame length) of the first `count` frames of a seekable stream, reading only their
    12-byte headers; stops early at a header whose checksum fails, at a frame that runs past the end
    of the file (a crafted length behind a valid checksum), or at the end of the file."""
    out: List[Tuple[int, int]] = []
    stream.seek(0, 2)  # tell(), not seek's result: TensorFlow's GFile.seek returns None
    end = stream.tell()
    pos = 0
    for _ in range(count):
        stream.seek(pos)
        length = unpack_header(stream.read(FRAME_HEADER))
        if length is None or pos + length + FRAME_OVERHEAD > end:
            break
        out.append((pos, length + FRAME_OVERHEAD))
        pos += length + FRAME_OVERHEAD
    return out


def scan_frames(data: bytes, name: str = "<shard>") -> List[Tuple[int, int]]:
    """(offset, frame length) of every frame of a whole shard's bytes, which must end with its last frame.

    Raises:
      CorruptRecordError: naming `name` and the byte of the first bad header, or a last frame
        that runs past the end.
    """
    entries, pos = [], 0
    while pos < len(data):
        length = unpack_header(data[pos:pos + FRAME_HEADER])
        if length is None:
            raise CorruptRecordError(f"{name}: bad or truncated record header at byte {pos}")
        entries.append((pos, length + FRAME_OVERHEAD))
        pos += length + FRAME_OVERHEAD
    if pos != len(data):
        raise CorruptRecordError(f"{name}: the last record runs past the end of the file")
    return entries


class HashingReader:
    """Wraps a binary stream; keeps the byte count, sha256 and crc32c of everything read through it,
    so a shard can be checked and parsed in one streaming pass."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._sha = hashlib.sha256()
        self._crc = google_crc32c.Checksum()
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._sha.update(data)
        self._crc.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self, chunk: int = 1 << 20) -> "HashingReader":
        """Reads the rest of the stream (hashing it) and returns self."""
        while self.read(chunk):
            pass
        return self

    def sha256(self) -> str:
        return self._sha.hexdigest()

    def crc32c(self) -> str:
        return crc32c_text(self._crc)


class CorruptRecordError(Error, ValueError):
    """A TFRecord frame failed its length or data checksum."""


# What a damaged file's owner can do: the bytes themselves are gone.
_MEND = "restore the file from a copy, or rebuild the dataset"


_ONE_READ = 64 << 20  # a frame up to this size is read in one call; a larger one in steps, up to the file's end


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    """`size` bytes of `stream`, fewer at its end; never asks for more than _ONE_READ at once, so a
    header claiming 2**40 bytes ends at the file's end instead of allocating them."""
    if size <= _ONE_READ:
        return stream.read(size)
    parts, left = [], size
    while left:
        part = stream.read(min(left, _ONE_READ))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def count_frames(stream: BinaryIO) -> Optional[int]:
    """The frames of a whole stream, read to its end (headers checked, data read in steps, not
    checked); None when a header fails its checksum or the last frame runs past the end."""
    count = 0
    while True:
        header = stream.read(FRAME_HEADER)
        if not header:
            return count
        length = unpack_header(header)
        if length is None:
            return None
        left = length + FRAME_FOOTER
        while left:
            part = stream.read(min(left, _ONE_READ))
            if not part:
                return None
            left -= len(part)
        count += 1


def ends_differ(read_range: Callable[[int, int], bytes], num_bytes: int, ends_crc: str) -> bool:
    """Whether a file of `num_bytes` is not the shard whose first and last records' stored data
    checksums (frame footers) are `ends_crc` (16 hex digits, as manifest.json records it per shard),
    found with three small reads: the first header, the first footer, the file's last 4 bytes.

    A first header that fails its checksum or runs past the file is damage, not another build's
    shard: only the last record's checksum is compared then, and the frame checks name the damage.

    Args:
      read_range: (offset, length) -> the file's bytes there.
      num_bytes: the file's size.
      ends_crc: the shard's Shard.ends_crc.
    """
    want = bytes.fromhex(ends_crc)
    if read_range(max(num_bytes - FRAME_FOOTER, 0), FRAME_FOOTER) != want[FRAME_FOOTER:]:
        return True
    length = unpack_header(read_range(0, FRAME_HEADER))
    if length is None or length + FRAME_OVERHEAD > num_bytes:
        return False
    return read_range(FRAME_HEADER + length, FRAME_FOOTER) != want[:FRAME_FOOTER]


def ends_crc_of_records(first: bytes, last: bytes) -> str:
    """ends_crc of a shard whose first and last records are `first` and `last` (a reader of whole files)."""
    return (struct.pack("<I", masked_crc32c(first)) + struct.pack("<I", masked_crc32c(last))).hex()


def frames_problem(shard_path: str, dataset: str, count: int, num_bytes: int,
                   entries: Sequence[Tuple[int, int]]) -> Optional[str]:
    """Why shard `shard_path`, whose frame walk found (offset, frame length) `entries`, is not the
    file of `count` records over `num_bytes` bytes that manifest.json lists, or None. A walk that
    stopped after `count` frames short of the file's end means more records follow: every reader
    sizes its work by the count, so a shard listed as 0 records that holds 10 was read as empty."""
    end = entries[-1][0] + entries[-1][1] if entries else 0
    if len(entries) == count and end == num_bytes:
        return None
    if len(entries) == count and end < num_bytes:
        what = (f"its first {count} records end at byte {end} of its {num_bytes}: it holds more records than the "
                f"{count} manifest.json lists")
    else:
        what = f"its frames are {len(entries)} records over {end} bytes, manifest.json says {count} over {num_bytes}"
    return (f"shard {shard_path}: {what} (manifest.json is not the one its build wrote, or the file is not its "
            f"shard); `imagerecords verify {dataset}` checks every file")


def read_records(stream: BinaryIO, name: str = "<stream>") -> Iterator[bytes]:
    """Yields the records of a TFRecord stream, checking both checksums.

    Raises:
      CorruptRecordError: naming `name`, the bad frame's record number and byte offset, and the damaged byte range.
    """
    offset = index = 0
    while True:
        header = stream.read(FRAME_HEADER)
        if not header:
            return
        if len(header) < FRAME_HEADER:
            raise CorruptRecordError(f"{name}: truncated record header at byte {offset}")
        length = unpack_header(header)
        if length is None:
            raise CorruptRecordError(f"{name}: record {index} at byte {offset}: bad length checksum (its header, bytes "
                                     f"{offset} to {offset + 11}, changed; later records cannot be found): {_MEND}")
        body = _read_exactly(stream, length + FRAME_FOOTER)
        if len(body) < length + FRAME_FOOTER:
            raise CorruptRecordError(f"{name}: truncated record at byte {offset} (its header says {length:,} bytes; "
                                     f"{max(len(body) - FRAME_FOOTER, 0):,} follow): {_MEND}")
        record = body[:length]
        if not data_ok(record, body[length:]):
            raise CorruptRecordError(f"{name}: record {index} at byte {offset}: bad data checksum (its data, bytes "
                                     f"{offset + 12} to {offset + 11 + length}, changed after it was written): {_MEND}")
        yield record
        offset += 12 + length + 4
        index += 1
