"""The record files' format, named here alone: every writer makes its record files with `writer`,
every reader of whole files goes through `read`, tf.data reads them with `tf_dataset`, the readers'
checks walk them with `frames`, `check_frame` and `salvage`, index files are made and checked with
`index_bytes`, `load_index` and `index_problems`, and a file's name, its index file's name and
TFDS's name for the format come from here. Today that is TFRecord (frames: format/records.py); a
second format is a second module of these names, chosen where the manifest is written and read.
"""

from __future__ import annotations

from typing import BinaryIO, Iterator, Sequence

from imagerecords.format import records

# Index files live in a sub-folder of the version folder, `index/<shard file name>.idx`
# (imagerecords.pipeline.write.dataset_files writes them): DALI's tfrecord2idx lines.
INDEX_DIR = "index"
INDEX_SUFFIX = ".idx"
FRAME_OVERHEAD = records.FRAME_OVERHEAD  # the fewest bytes one record takes in a file


SHARD_SUFFIX = ".tfrecord"
TFDS_FILE_FORMAT = "tfrecord"


def shard_prefix(name: str, split: str) -> str:
    """What every shard file name of a split begins with (`<name>-<split>.tfrecord`)."""
    return f"{name}-{split}{SHARD_SUFFIX}"


def shard_file_name(name: str, split: str, index: int, num_shards: int) -> str:
    """A shard's file name: the builder's pattern, from which a columnar split derives its names."""
    return f"{shard_prefix(name, split)}-{index:05d}-of-{num_shards:05d}"


def is_shard_name(name: str) -> bool:
    """Whether a file name is a shard's (or a shard's temporary file), by the format's suffix."""
    return SHARD_SUFFIX in name


def index_file_name(shard_filename: str) -> str:
    """The index file of a shard named `shard_filename` (relative to the dataset folder): in the
    `index` sub-folder of the shard's own folder."""
    folder, _, plain = shard_filename.rpartition("/")
    return f"{folder}/{INDEX_DIR}/{plain}{INDEX_SUFFIX}" if folder else f"{INDEX_DIR}/{plain}{INDEX_SUFFIX}"


def writer(stream: BinaryIO) -> records.RecordWriter:
    """The writer of one record file onto `stream` (its frames, offsets and checksum as it goes)."""
    return records.RecordWriter(stream)


def read(stream: BinaryIO, name: str = "<stream>") -> Iterator[bytes]:
    """The records of a whole file, in order; a bad frame raises CorruptRecordError naming `name`."""
    return records.read_records(stream, name)


# The readers' view of a file's frames, beside `read`: a header walk that stops at the first frame
# that fails or runs past the end ((offset, length) each), one frame's check at an offset (its
# length, or None), and the good records after a bad frame ((index, record or None, problem)).
FRAME_HEADER = records.FRAME_HEADER
CorruptRecordError = records.CorruptRecordError
frames = records.scan_headers
check_frame = records.check_frame
salvage = records.salvage
# Index files (DALI's tfrecord2idx lines): checked against what the manifest lists before use.
load_index = records.load_index
index_problems = records.index_problems


def index_bytes(offsets: Sequence[int], end: int) -> bytes:
    """The index file of a record file whose records start at `offsets` and which ends at `end`."""
    return records.format_index(records.index_entries(offsets, end))


def tf_dataset(path):
    """tf.data's reader of one record file (a scalar tf.string path), yielding serialized records."""
    import tensorflow as tf

    return tf.data.TFRecordDataset(path)
