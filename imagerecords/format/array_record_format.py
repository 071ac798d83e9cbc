"""ArrayRecord (`--record_format array_record`): Grain's and TFDS's random-access format, one record
per chunk ("group_size:1") so that any record is one seek; its footer is its index (no index files).

ArrayRecordWriter writes to a local path, and its bytes are the same for the same records, so a
shard's digests are those of the closed file. Reading needs a local file: a stream (a gs:// shard,
verify's hashing reader) is spooled to a temporary file first.
"""

from __future__ import annotations

import collections
import io
import os
import shutil
import tempfile
import threading
from typing import BinaryIO, Iterator, List, Optional

from array_record.python import array_record_module

from imagerecords.format import record_format
from imagerecords.format.errors import ReadError
from imagerecords.format.record_format import CorruptRecordError, RecordFormat, RecordWriter

# One record per chunk: random access reads one chunk. Uncompressed: the records are mostly JPEG or
# PNG bytes, which zstd (the default) cannot shrink, and it halved the writer's speed for nothing.
OPTIONS = "group_size:1,uncompressed"
_READ_BATCH = 256  # records read at once by a whole-file read


class ArrayRecordWriter(RecordWriter):
    def __init__(self, path: str):
        self._path = path
        self._writer = array_record_module.ArrayRecordWriter(path, OPTIONS)
        self.count = 0
        self.num_bytes = 0
        self.offsets: List[int] = []
        self._digests = None

    def write(self, record: bytes) -> None:
        self._writer.write(record)
        self.offsets.append(self.count)  # a record's locator is its number (the footer indexes it)
        self.count += 1

    def write_many(self, batch) -> None:
        for record in batch:
            self.write(record.tobytes() if hasattr(record, "tobytes") else record)

    def close(self) -> None:
        if self._digests is None:
            self._writer.close()
            self._digests = record_format.file_digests(self._path)
            self.num_bytes = self._digests[0]
            with open(self._path, "rb") as f:
                self._ends = record_format.ends_digest(_reader_of(f), self.num_bytes)

    def ends_crc(self) -> str:
        return self._ends

    def sha256(self) -> str:
        return self._digests[1]

    def crc32c(self) -> str:
        return self._digests[2]


_OPEN_READERS = 64  # per thread: a split of thousands of shards must not run out of file handles


class _Readers(threading.local):
    """Open readers by path, per thread (an ArrayRecordReader is not shared across threads), the
    least recently used closed past _OPEN_READERS."""

    def __init__(self):
        self.open: "collections.OrderedDict[str, object]" = collections.OrderedDict()


class ArrayRecord(RecordFormat):
    name = "array_record"
    suffix = ".array_record"
    tfds_name = "array_record"
    writes_streams = False
    index_files = False
    min_record_bytes = 16  # a chunk header alone is 40 bytes: no file holds more records than this allows

    def __init__(self):
        self._readers = _Readers()

    def writer(self, target: str) -> RecordWriter:
        return ArrayRecordWriter(target)

    def _open(self, path: str, dataset: str = ""):
        readers = self._readers.open
        reader = readers.get(path)
        if reader is not None:
            readers.move_to_end(path)
        else:
            try:
                reader = array_record_module.ArrayRecordReader(path)
            except (RuntimeError, ValueError, OSError) as e:
                raise CorruptRecordError(f"{path}: not a readable ArrayRecord file ({_first_line(e)})"
                                         + _mend(dataset)) from None
            readers[path] = reader
            while len(readers) > _OPEN_READERS:
                readers.popitem(last=False)[1].close()
        return reader

    def read(self, stream: BinaryIO, name: str = "<stream>") -> Iterator[bytes]:
        local = getattr(stream, "name", None)
        if isinstance(local, str) and isinstance(stream, io.BufferedReader) and os.path.isfile(local):
            yield from self._read_path(local, name, stream)
            return
        with tempfile.NamedTemporaryFile(suffix=self.suffix) as spool:
            shutil.copyfileobj(stream, spool, 1 << 20)
            spool.flush()
            yield from self._read_path(spool.name, name)

    def _read_path(self, path: str, name: str, stream: Optional[BinaryIO] = None) -> Iterator[bytes]:
        try:
            reader = array_record_module.ArrayRecordReader(path)
            total = reader.num_records()
        except (RuntimeError, ValueError, OSError) as e:
            raise CorruptRecordError(f"{name}: not a readable ArrayRecord file ({_first_line(e)})") from None
        try:
            for start in range(0, total, _READ_BATCH):
                try:
                    batch = reader.read(list(range(start, min(total, start + _READ_BATCH))))
                except (RuntimeError, ValueError, OSError) as e:
                    raise CorruptRecordError(f"{name}: a record from {start} on cannot be read ({_first_line(e)})"
                                             ) from None
                yield from batch
        finally:
            try:
                reader.close()
            except RuntimeError as e:  # a truncated file opens with no records and fails here
                raise CorruptRecordError(f"{name}: not a readable ArrayRecord file ({_first_line(e)})") from None
        if stream is not None:  # the caller may hash what it reads: let it see every byte
            while stream.read(1 << 20):
                pass

    def entries(self, files, dataset, shard_path, shard, index_path):
        if "://" in shard_path:  # the array_record package opens local paths only
            raise ReadError(f"{shard_path}: ArrayRecord shards are read from local files; copy the dataset folder "
                            "to a local disk first")
        count = self._open(shard_path, dataset).num_records()
        if count != shard.count:
            raise CorruptRecordError(f"{shard_path}: it holds {count} records, manifest.json says {shard.count}"
                                     + _mend(dataset))
        return [(i, 1) for i in range(count)]

    def ends_differ(self, read_range, num_bytes, ends):
        # Its sizes come in 64 KiB blocks, so a same-size file is likely: the ends' digest tells them apart.
        return record_format.ends_digest(read_range, num_bytes) != ends

    def record_at(self, read_range, dataset, shard_path, offset, length):
        try:
            return self._open(shard_path, dataset).read([offset])[0]
        except (RuntimeError, ValueError, OSError, IndexError) as e:
            raise CorruptRecordError(f"{shard_path}: record {offset} cannot be read ({_first_line(e)})"
                                     + _mend(dataset)) from None

    def __getstate__(self):
        return {}  # open readers stay in their process

    def __setstate__(self, state):
        self._readers = _Readers()


def _reader_of(f: BinaryIO):
    def read_range(offset: int, size: int) -> bytes:
        f.seek(offset)
        return f.read(size)

    return read_range


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _mend(dataset: str) -> str:
    return f" (`imagerecords verify {dataset} --records` checks every shard)" if dataset else ""


ARRAY_RECORD = record_format.register(ArrayRecord())
