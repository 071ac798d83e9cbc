"""Records of one shard as a tf.data stream, checked against the manifest count; bad records fail or are skipped."""

from __future__ import annotations

import collections
import logging
import struct
import threading
from typing import Dict, Iterator, Optional, Tuple

import tensorflow as tf

from imagerecords.records import masked_crc32c

log = logging.getLogger("imagerecords.reader")

_HEADER = 12  # uint64 length + masked crc32c of the length
_FOOTER = 4  # masked crc32c of the data

# The dataset functions here have no Python control flow on tensors; AutoGraph has nothing to do.
_no_autograph = tf.autograph.experimental.do_not_convert


class ReadStats:
    """What one make_dataset call planned and what its reading found; pass one in to look after.

    Counts of skipped records grow while the dataset is iterated (every epoch that meets a bad
    record counts it again), from the tf.data threads, so read them after or between epochs.

    Attributes:
      plan: the HostPlan of this host (records per epoch, dropped or padded records).
      skipped: {shard path: records skipped so far} ("skip" policy only).
    """

    def __init__(self):
        self.plan = None
        self.skipped: Dict[str, int] = collections.Counter()
        self._lock = threading.Lock()

    @property
    def total_skipped(self) -> int:
        with self._lock:
            return sum(self.skipped.values())

    def _add_skipped(self, path: str, n: int) -> None:
        with self._lock:
            self.skipped[path] += n

    def __repr__(self) -> str:
        return f"ReadStats(plan={self.plan!r}, skipped={dict(self.skipped)!r})"


@_no_autograph
def shard_records(path: tf.Tensor, count: tf.Tensor, stride: tf.Tensor, offset: tf.Tensor, *,
                  policy: str, stats: Optional[ReadStats]) -> tf.data.Dataset:
    """Returns the records of shard `path` whose index is `offset` mod `stride`.

    TFRecordDataset's own error for a bad frame ("corrupted record at 1283") does not say which
    file, and after it the file yields nothing more. So the shard is read with errors ignored (it
    stops at the first bad frame) and cut at the manifest's count; a tail dataset, made only when
    the file ends before that count, handles the shortfall: "fail" raises an error naming the
    shard, and "skip" reads the rest of the shard in Python, frame by frame, dropping the frames
    whose checksums fail. A shard longer than its count is read up to the count.

    A healthy shard's records thus pass through TensorFlow's own dataset ops only (no Python-made
    function runs per record): a per-record check or filter function costs about as much as
    reading the record itself.

    Args:
      path: scalar tf.string, the shard file.
      count: scalar int64, the shard's record count from the manifest.
      stride: scalar int64, keep every stride-th record ...
      offset: scalar int64, ... starting at this index.
      policy: "fail" or "skip".
      stats: where "skip" counts skipped records; needed for "skip".

    Returns:
      A dataset of serialized records (scalar tf.string).
    """

    def records_read() -> tf.Tensor:
        # Only on the error path: count again what TFRecordDataset could read before the bad frame.
        return (tf.data.TFRecordDataset(path).ignore_errors()
                .reduce(tf.constant(0, tf.int64), _no_autograph(lambda n, _: n + 1)))

    if policy == "fail":
        @_no_autograph
        def short(_):
            read = records_read()
            message = tf.strings.format(
                "shard {} is corrupt, truncated or unreadable: {} records read before the first bad frame, "
                "manifest.json says {} (ReadConfig(corrupt_records='skip') drops bad records)",
                (path, read, count), summarize=-1)
            with tf.control_dependencies([tf.debugging.Assert(tf.greater_equal(read, count), [message])]):
                return tf.data.Dataset.from_tensors(tf.constant("")).take(0)
    else:
        def tail(path_: bytes, count_: int, start: int) -> Iterator[bytes]:
            for _, record in _recover(path_.decode("utf-8"), int(start), int(count_), stats):
                yield record

        @_no_autograph
        def short(_):
            return tf.data.Dataset.from_generator(tail, args=(path, count, records_read()),
                                                  output_signature=tf.TensorSpec([], tf.string))

    # The tail is made when the file is used up before `count` records, so never for a healthy shard.
    records = (tf.data.TFRecordDataset(path)
               .ignore_errors()  # ends the file at the first frame that fails its checks
               .concatenate(tf.data.Dataset.range(1).flat_map(short))
               .take(count))
    # Every host sees the same records in the same order, so selecting by position keeps the
    # hosts' shares disjoint and complete even after skipped records.
    return records.shard(stride, offset)


def _recover(path: str, start: int, count: int, stats: ReadStats) -> Iterator[Tuple[int, bytes]]:
    """Yields (index, record) for the good frames of `path` after its first `start` records.

    A frame whose length checksum holds but whose data checksum fails is skipped whole. After a
    bad length checksum or a truncation the position of the next frame is unknown, so the reader
    looks for the next offset where a whole frame checks out. Indices after such a search count
    the lost stretch as one record. The records skipped are the manifest count minus the records
    read, so the count is exact even when a stretch of several frames was lost.
    """
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    pos = 0
    for _ in range(start):  # these frames were read (and checked) by TFRecordDataset already
        if pos + _HEADER > len(data):
            break
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        pos += _HEADER + length + _FOOTER
    index, good, first_problem = start, start, None
    while pos < len(data):
        frame = _check_frame(data, pos)
        if frame is not None:
            length = frame
            yield index, data[pos + _HEADER:pos + _HEADER + length]
            good += 1
            index += 1
            pos += _HEADER + length + _FOOTER
            continue
        header_ok = (pos + _HEADER <= len(data)
                     and masked_crc32c(data[pos:pos + 8]) == struct.unpack("<I", data[pos + 8:pos + 12])[0])
        if header_ok:
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            if pos + _HEADER + length + _FOOTER <= len(data):
                first_problem = first_problem or f"data checksum fails at byte {pos}"
                pos += _HEADER + length + _FOOTER
                index += 1
                continue
        first_problem = first_problem or f"bad or truncated frame at byte {pos}"
        pos = _next_frame(data, pos + 1)
        index += 1
    lost = count - good
    if lost > 0:
        stats._add_skipped(path, lost)
        log.warning("skipped %d corrupt record(s) in shard %s (%s); read %d of %d", lost, path,
                    first_problem or "records missing", good, count)


def _check_frame(data: bytes, pos: int) -> Optional[int]:
    """Returns the data length of the frame at `pos` when both checksums hold, else None."""
    if pos + _HEADER > len(data):
        return None
    length_bytes = data[pos:pos + 8]
    if masked_crc32c(length_bytes) != struct.unpack("<I", data[pos + 8:pos + 12])[0]:
        return None
    (length,) = struct.unpack("<Q", length_bytes)
    end = pos + _HEADER + length
    if end + _FOOTER > len(data):
        return None
    if masked_crc32c(data[pos + _HEADER:end]) != struct.unpack("<I", data[end:end + _FOOTER])[0]:
        return None
    return length


def _next_frame(data: bytes, pos: int) -> int:
    """Returns the first offset >= pos where a whole frame checks out, or len(data)."""
    while pos + _HEADER <= len(data):
        if _check_frame(data, pos) is not None:
            return pos
        pos += 1
    return len(data)
