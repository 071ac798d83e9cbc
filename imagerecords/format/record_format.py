"""The record files' format, a choice per build: one `RecordFormat` interface and a registry of them
by name (as TFDS's `file_adapters.ADAPTER_FOR_FORMAT`), read back from manifest.json.

A format says its file names (suffix, shard and index names), makes the writer of one file (`write`,
`write_many`, then `close`: count, size, sha256, crc32c), reads a whole file (`read`), gives random
access to a split's records (`entries` and `record_at`: the index or its equivalent), the tf.data
reader where one exists, and TFDS's name for it. TFRecord (frames: format/records.py) is the
default and the only format whose framing anyone sees; ArrayRecord lives in
format/array_record_format.py. A new format is one module that subclasses `RecordFormat` and calls
`register` (see docs/formats.md).
"""

from __future__ import annotations

import hashlib
import importlib
from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from imagerecords.format import records
from imagerecords.format.errors import Error

# Index files live in a sub-folder of the version folder, `index/<shard file name>.idx`
# (imagerecords.pipeline.write.dataset_files writes them): DALI's tfrecord2idx lines.
INDEX_DIR = "index"
INDEX_SUFFIX = ".idx"
DEFAULT = "tfrecord"
CorruptRecordError = records.CorruptRecordError


class UnknownFormat(Error, ValueError):
    """A record format name that no module registered (a flag, build() or a manifest.json)."""


class FormatUnavailable(UnknownFormat):
    """A known record format whose library is not installed here."""


class RecordWriter:
    """What every format's writer of one file offers; after `close`: count, num_bytes, offsets (one
    locator per record, what `entries` gives back), sha256() and crc32c() of the whole file."""

    count: int
    num_bytes: int
    offsets: List[int]

    def write(self, record: bytes) -> None:
        raise NotImplementedError

    def write_many(self, batch: Sequence[bytes]) -> None:
        """Writes records in order; `batch` is a list of bytes or a 2-D uint8 array of equal-length ones."""
        for record in batch:
            self.write(bytes(record))

    def close(self) -> None:
        """Finishes the file (idempotent); the statistics hold from here on."""

    def ends_crc(self) -> Optional[str]:
        """The closed file's check of its ends (manifest.json's Shard.ends_crc; RecordFormat.ends_differ
        compares it), or None where the format keeps none."""
        return None

    def sha256(self) -> str:
        raise NotImplementedError

    def crc32c(self) -> str:
        raise NotImplementedError


class RecordFormat:
    """One record file format. Subclasses set the names and override the writer and readers.

    Attributes:
      name: the --record_format value and manifest.json's `record_format`.
      suffix: what every shard file name holds after `<name>-<split>` ('.tfrecord').
      tfds_name: the file_format TFDS names it by in dataset_info.json, or None where TFDS has none.
      writes_streams: its writer takes a binary stream (True) or a local path (False).
      index_files: it can write separate index files (--write_index); else records are found
        through `entries` alone (a built-in index) and --write_index is refused.
      min_record_bytes: the fewest bytes one record takes in a file (a manifest's count check).
    """

    name: str = ""
    suffix: str = ""
    tfds_name: Optional[str] = None
    writes_streams: bool = True
    index_files: bool = False
    min_record_bytes: int = 0

    # Names ------------------------------------------------------------------------------------------

    def shard_prefix(self, name: str, split: str) -> str:
        """What every shard file name of a split begins with (`<name>-<split><suffix>`)."""
        return f"{name}-{split}{self.suffix}"

    def shard_file_name(self, name: str, split: str, index: int, num_shards: int) -> str:
        return f"{self.shard_prefix(name, split)}-{index:05d}-of-{num_shards:05d}"

    # Writing ----------------------------------------------------------------------------------------

    def writer(self, target) -> RecordWriter:
        """The writer of one file onto `target`: a binary stream (writes_streams) or a local path."""
        raise NotImplementedError

    def index_bytes(self, offsets: Sequence[int], end: int) -> bytes:
        """The index file of a file whose records' locators are `offsets` and which ends at `end`
        (index_files formats only)."""
        raise NotImplementedError(f"{self.name} writes no index files")

    # Reading ----------------------------------------------------------------------------------------

    def read(self, stream: BinaryIO, name: str = "<stream>") -> Iterator[bytes]:
        """The records of a whole file read from `stream`, in order; a bad one raises
        CorruptRecordError naming `name`."""
        raise NotImplementedError

    def entries(self, files, dataset: str, shard_path: str, shard, index_path: Optional[str]) -> List[Tuple[int, int]]:
        """(locator, length) of every record of a shard (manifest Shard), for `record_at`; from its
        index file at `index_path` when it has one; `files` reads (format.files.Files: read,
        read_range). Raises IndexFileError or CorruptRecordError."""
        raise NotImplementedError

    def record_at(self, read_range: Callable[[str, int, int], bytes], dataset: str, shard_path: str,
                  offset: int, length: int) -> bytes:
        """The record at an `entries` locator, checked. Raises CorruptRecordError naming the shard."""
        raise NotImplementedError

    def count(self, stream: BinaryIO) -> Optional[int]:
        """The records of a whole file read from `stream` to its end (verify), None when it is damaged."""
        try:
            return sum(1 for _ in self.read(stream))
        except CorruptRecordError:
            return None

    def ends_differ(self, read_range: Callable[[int, int], bytes], num_bytes: int, ends: str) -> bool:
        """Whether a file of the listed size is not the one whose ends' check is `ends` (Shard.ends_crc,
        the writer's ends_crc), read with a few ranged reads: another build's shard of the same size."""
        return False

    def tf_dataset(self, path):
        """tf.data's reader of one file (a scalar tf.string path), or None where tf.data has none."""
        return None

    def __repr__(self) -> str:
        return f"<record format {self.name}>"


# The registry -----------------------------------------------------------------------------------------

_FORMATS: Dict[str, RecordFormat] = {}
# Formats registered on first use, so that a TFRecord reader never imports a format's library: the
# module that registers each, and the package its library comes in.
_LAZY = {"array_record": ("imagerecords.format.array_record_format", "array-record")}


def register(fmt: RecordFormat) -> RecordFormat:
    """Adds a format under its name (a test or a plug-in module calls this); returns it."""
    if not fmt.name or not fmt.suffix or "/" in fmt.suffix:
        raise ValueError(f"a record format needs a name and a file suffix, got {fmt.name!r}, {fmt.suffix!r}")
    _FORMATS[fmt.name] = fmt
    return fmt


def names() -> Tuple[str, ...]:
    return tuple(sorted(set(_FORMATS) | set(_LAZY)))


def get(name: Optional[str] = None) -> RecordFormat:
    """The format named `name` (None: the default, TFRecord).

    Raises:
      UnknownFormat: naming the formats there are; FormatUnavailable, one whose library is missing.
    """
    name = name or DEFAULT
    if name not in _FORMATS and name in _LAZY:
        module, package = _LAZY[name]
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise FormatUnavailable(f"record format {name!r} needs the {package} package, which is not installed here "
                                    f"({e.name or e}): pip install {package} (imagerecords[build] brings it)") from None
    try:
        return _FORMATS[name]
    except (KeyError, TypeError):
        raise UnknownFormat(f"record format {name!r:.80} is not one of {', '.join(names())}") from None


def of(manifest) -> RecordFormat:
    """The format a manifest's records are in (a manifest without the field: TFRecord)."""
    return get(getattr(manifest, "record_format", None))


def is_shard_name(name: str) -> bool:
    """Whether a file name is a shard's (or a shard's temporary file), by any format's suffix."""
    return any(fmt.suffix in name for fmt in _FORMATS.values()) or any(f".{n}" in name for n in _LAZY)


# TFRecord --------------------------------------------------------------------------------------------


class _TFRecordWriter(RecordWriter):
    """records.RecordWriter as a format writer: write_many frames equal-length records in bulk."""

    def __init__(self, stream: BinaryIO):
        self._w = records.RecordWriter(stream)

    count = property(lambda self: self._w.count)
    num_bytes = property(lambda self: self._w.num_bytes)
    offsets = property(lambda self: self._w.offsets)

    def write(self, record: bytes) -> None:
        self._w.write(record)

    def write_many(self, batch) -> None:
        if hasattr(batch, "shape") and len(batch.shape) == 2:
            data, lengths = records.frame_rows(batch)
            self._w.write_framed(data, lengths)
        else:
            data = [records.frame(bytes(r)) for r in batch]
            self._w.write_framed(b"".join(data), [len(d) for d in data])

    def sha256(self) -> str:
        return self._w.sha256()

    def crc32c(self) -> str:
        return self._w.crc32c()

    def ends_crc(self) -> Optional[str]:
        return self._w.ends_crc()


class TFRecord(RecordFormat):
    name = "tfrecord"
    suffix = ".tfrecord"
    tfds_name = "tfrecord"
    index_files = True
    min_record_bytes = records.FRAME_OVERHEAD

    def writer(self, target: BinaryIO) -> RecordWriter:
        return _TFRecordWriter(target)

    def index_bytes(self, offsets: Sequence[int], end: int) -> bytes:
        return records.format_index(records.index_entries(offsets, end))

    def read(self, stream: BinaryIO, name: str = "<stream>") -> Iterator[bytes]:
        return records.read_records(stream, name)

    def entries(self, files, dataset, shard_path, shard, index_path):
        if index_path:
            return records.load_index(files.read(index_path), index_path, count=shard.count, num_bytes=shard.num_bytes,
                                      sha256=shard.index_sha256)
        entries = records.scan_frames(files.read(shard_path), shard_path)
        problem = records.frames_problem(shard_path, dataset, shard.count, shard.num_bytes, entries)
        if problem:
            raise CorruptRecordError(problem)
        return entries

    def record_at(self, read_range, dataset, shard_path, offset, length):
        return records.record_of_frame(read_range(shard_path, offset, length), length,
                                       f"{shard_path}: record at byte {offset}",
                                       f" (`imagerecords verify {dataset} --records` checks every shard)")

    def count(self, stream: BinaryIO) -> Optional[int]:
        return records.count_frames(stream)

    def ends_differ(self, read_range, num_bytes, ends):
        return records.ends_differ(read_range, num_bytes, ends)

    def tf_dataset(self, path):
        # TensorFlow: 3.4 s to import, and the trainer's own install; only tf.data needs it
        import tensorflow as tf

        return tf.data.TFRecordDataset(path)

    # TFRecord's own, for the readers that walk its frames (tf.data's shard checks, the resumable order,
    # verify's index check): a header walk, one frame's check, the good records after a bad frame.
    FRAME_HEADER = records.FRAME_HEADER
    FRAME_OVERHEAD = records.FRAME_OVERHEAD
    frames = staticmethod(records.scan_headers)
    check_frame = staticmethod(records.check_frame)
    salvage = staticmethod(records.salvage)
    load_index = staticmethod(records.load_index)
    index_problems = staticmethod(records.index_problems)


TFRECORD = register(TFRecord())

# The TFRecord names that readers of TFRecord alone (tf.data, the resumable order) use.
FRAME_OVERHEAD = TFRECORD.FRAME_OVERHEAD  # the fewest bytes one record takes in any format's file
FRAME_HEADER = TFRECORD.FRAME_HEADER
SHARD_SUFFIX = TFRECORD.suffix
TFDS_FILE_FORMAT = TFRECORD.tfds_name
frames = TFRECORD.frames
check_frame = TFRECORD.check_frame
salvage = TFRECORD.salvage
load_index = TFRECORD.load_index
index_problems = TFRECORD.index_problems


def shard_prefix(name: str, split: str, fmt: Optional[RecordFormat] = None) -> str:
    return (fmt or TFRECORD).shard_prefix(name, split)


def shard_file_name(name: str, split: str, index: int, num_shards: int, fmt: Optional[RecordFormat] = None) -> str:
    return (fmt or TFRECORD).shard_file_name(name, split, index, num_shards)


def index_file_name(shard_filename: str) -> str:
    """The index file of a shard named `shard_filename` (relative to the dataset folder): in the
    `index` sub-folder of the shard's own folder."""
    folder, _, plain = shard_filename.rpartition("/")
    return f"{folder}/{INDEX_DIR}/{plain}{INDEX_SUFFIX}" if folder else f"{INDEX_DIR}/{plain}{INDEX_SUFFIX}"


def writer(stream: BinaryIO) -> RecordWriter:
    """A TFRecord writer onto `stream` (its frames, offsets and checksum as it goes)."""
    return TFRECORD.writer(stream)


def read(stream: BinaryIO, name: str = "<stream>", fmt: Optional[RecordFormat] = None) -> Iterator[bytes]:
    """The records of a whole file in `fmt` (default TFRecord), in order."""
    return (fmt or TFRECORD).read(stream, name)


def tf_dataset(path):
    return TFRECORD.tf_dataset(path)


ENDS = 1 << 16  # bytes at each end of a file that ends_digest reads


def ends_digest(read_range: Callable[[int, int], bytes], size: int) -> str:
    """The sha256 (its first 8 bytes) of a file's first and last ENDS bytes (the whole file when it is smaller): the ends
    check of a format whose file sizes come in blocks, read with two ranged reads."""
    head = read_range(0, min(size, ENDS))
    tail = read_range(size - ENDS, ENDS) if size > ENDS else b""
    return hashlib.sha256(head + tail).hexdigest()[:16]  # 16 hex digits, as manifest.json's ends_crc


file_digests = records.file_digests  # (size, sha256, crc32c) of a local file: a path writer's statistics
