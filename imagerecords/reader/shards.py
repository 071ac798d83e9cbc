"""Records of one shard as a tf.data stream, checked against the manifest count; bad records fail or are skipped."""

from __future__ import annotations

import collections
import functools
import logging
import threading
from typing import Dict, Iterator, Optional, Sequence, Tuple

import tensorflow as tf

from imagerecords.format import access, files
from imagerecords.format import record_format
from imagerecords.format.errors import Error
from imagerecords.format.paths import has_scheme
from imagerecords.reader.info import file_size, read_range

log = logging.getLogger("imagerecords.reader")

# The dataset functions here have no Python control flow on tensors; AutoGraph has nothing to do.
_no_autograph = tf.autograph.experimental.do_not_convert


class ReadStats:
    """What one make_dataset call planned and what its reading found; pass one in to look after.

    The counts grow while the dataset is iterated (every epoch that meets a bad shard counts it
    again), from the tf.data threads, so read them after or between epochs.

    Attributes:
      plan: the HostPlan of this host (records per epoch, dropped or padded records).
      skipped: {shard path: records of the manifest's count not read, because they are corrupt or
        the file ends before them} ("skip" policy only).
      extra: {shard path: records the file holds past the manifest's count, not read} ("skip"
        policy only).
      records_read, bytes_read: records and shard bytes the resumable path (start_step or
        start_example given) read; 0 on the other path.
    """

    def __init__(self):
        self.plan = None
        self.skipped: Dict[str, int] = collections.Counter()
        self.extra: Dict[str, int] = collections.Counter()
        self.records_read = 0
        self.bytes_read = 0
        self._lock = threading.Lock()

    @property
    def total_skipped(self) -> int:
        with self._lock:
            return sum(self.skipped.values())

    @property
    def total_extra(self) -> int:
        with self._lock:
            return sum(self.extra.values())

    def _add_skipped(self, path: str, n: int) -> None:
        with self._lock:
            self.skipped[path] += n

    def _add_extra(self, path: str, n: int) -> None:
        with self._lock:
            self.extra[path] += n

    def _add_read(self, records: int, num_bytes: int) -> None:
        with self._lock:
            self.records_read += records
            self.bytes_read += num_bytes

    def __repr__(self) -> str:
        return f"ReadStats(plan={self.plan!r}, skipped={dict(self.skipped)!r}, extra={dict(self.extra)!r})"


def open_shards(shards: Sequence, dataset: str, policy: str, stats: Optional[ReadStats]) -> None:
    """Checks the shards a tf.data reader is about to read against manifest.json, in Python, before
    any dataset op runs (imagerecords.format.access.check_shards: one stat and three small reads per
    shard, the same rule the PyTorch and Grain readers apply), so a file the manifest does not describe is a plain
    exception from the make_dataset or as_dataset call, never a TensorFlow op error mid-epoch.

    Under "skip" a larger file's records are counted (its frame headers read once) and those past
    the manifest's count are left unread, counted in stats.extra with one warning; a smaller file
    is read as far as it goes, and the records it lacks are counted where they are missed.

    Args:
      shards: the ShardInfos to be read.
      dataset: the dataset folder (for the messages).
      policy: "fail" or "skip".
      stats: where "skip" counts the extra records.

    Raises:
      FileNotFoundError: naming every missing shard.
      imagerecords.format.access.ShardSizeError: ("fail") naming a shard of another size and what to do.
      imagerecords.format.access.ShardSwappedError: naming a shard of the listed size that is another build's.
    """
    counts = {s.path: s.count for s in shards}
    for path, size, listed in access.check_shards(dataset, [(s.path, s.num_bytes, s.ends_crc or None) for s in shards],
                                                  file_size, read_range, policy=policy):
        if size > listed:
            found = _count_frames(path)
            if found > counts[path]:
                _report_extra(path, counts[path], found, stats)


def check_count(path: str, count: int, num_bytes: int, entries: Sequence[Tuple[int, int]], policy: str,
                stats: Optional[ReadStats], dataset: str) -> None:
    """Checks a walk of shard `path`'s first `count` frame headers (`entries`) against the manifest's
    `num_bytes`: frames that end before it mean the file holds more records than the count says
    ("fail" raises; "skip" reads the first `count` and counts the rest in stats.extra). A walk that
    found fewer frames is left to the reads, which name the record the file lacks.

    Raises:
      CorruptRecordError: ("fail") naming the shard, the count and where its frames end.
    """
    problem = access.frames_problem(path, dataset, count, num_bytes, entries)
    if problem is None or len(entries) != count:
        return
    if policy == "fail":
        raise record_format.CorruptRecordError(problem)
    if file_size(path) != num_bytes:
        return  # another size: open_shards counted its extra records already
    found = _count_frames(path)
    if found > count:
        _report_extra(path, count, found, stats)


def _count_frames(path: str) -> int:
    """Frames of `path` up to its end or its first header whose checksum fails (headers only read)."""
    with (tf.io.gfile.GFile(path, "rb") if has_scheme(path) else open(path, "rb")) as f:
        return len(record_format.frames(f, 2**62))


@_no_autograph
def shard_records(path: tf.Tensor, count: tf.Tensor, num_bytes: tf.Tensor, stride: tf.Tensor, offset: tf.Tensor,
                  *, policy: str, stats: Optional[ReadStats], dataset: str = "") -> tf.data.Dataset:
    """Returns the records of shard `path` whose index is `offset` mod `stride`.

    TFRecordDataset's own error for a bad frame ("corrupted record at 1283") does not say which
    file, and after it the file yields nothing more. So the shard is read with errors ignored (it
    stops at the first bad frame) and cut at the manifest's count; a tail dataset, made only when
    the file ends before that count, handles the shortfall: "fail" raises an error naming the
    shard, and "skip" reads the rest of the shard in Python, frame by frame, dropping the frames
    whose checksums fail.

    A shard of another size than manifest.json lists was refused (or, under "skip", its extra
    records counted) by open_shards before this dataset was made; here the records past the count
    are simply never read.

    A healthy shard's records thus pass through TensorFlow's own dataset ops only (no Python-made
    function runs per record): a per-record check or filter function costs about as much as
    reading the record itself. Before TensorFlow reads a local shard, its frame headers are walked
    once (12 bytes each): TensorFlow is handed only the frames whose length fits in the file, as a
    crafted length (2**40 behind a valid header checksum) made its reader crash the process.

    Args:
      path: scalar tf.string, the shard file.
      count: scalar int64, the shard's record count from the manifest.
      num_bytes: scalar int64, the shard's size from the manifest.
      stride: scalar int64, keep every stride-th record ...
      offset: scalar int64, ... starting at this index.
      policy: "fail" or "skip".
      stats: where "skip" counts skipped records; needed for "skip".
      dataset: the dataset folder (for the messages).

    Returns:
      A dataset of serialized records (scalar tf.string).
    """

    # Frames TensorFlow may read: those before the first header that fails or runs past the file;
    # and why the shard is refused before any of them is read ('' when it is not).
    fit, refused = tf.py_function(functools.partial(_frames_that_fit, policy=policy, stats=stats, dataset=dataset),
                                  [path, count, num_bytes], (tf.int64, tf.string))
    fit.set_shape([])
    refused.set_shape([])

    def records_read() -> tf.Tensor:
        # Only on the error paths: count what TFRecordDataset can read before a bad frame or the end.
        return (record_format.tf_dataset(path).ignore_errors().take(fit)
                .reduce(tf.constant(0, tf.int64), _no_autograph(lambda n, _: n + 1)))

    def nothing() -> tf.data.Dataset:
        # Made inside the control_dependencies block below, so that the Assert runs before it.
        return tf.data.Dataset.from_tensors(tf.constant("")).take(0)

    if policy == "fail":
        @_no_autograph
        def short(_):
            read = records_read()
            message = _text("shard ", path, " is corrupt, truncated or unreadable: ", read, " records read before "
                            "the file ended or a frame failed its checks, manifest.json says ", count,
                            " (ReadConfig(corrupt_records='skip') drops bad records)")
            with tf.control_dependencies([tf.debugging.Assert(tf.greater_equal(read, count), [message])]):
                return nothing()
    else:
        def tail(path_: bytes, count_: int, start: int) -> Iterator[bytes]:
            for _, record in _recover(path_.decode("utf-8"), int(start), int(count_), stats):
                yield record

        @_no_autograph
        def short(_):
            return tf.data.Dataset.from_generator(tail, args=(path, count, records_read()),
                                                  output_signature=tf.TensorSpec([], tf.string))

    @_no_autograph
    def refuse(_):
        with tf.control_dependencies([tf.debugging.Assert(tf.equal(refused, ""), [refused])]):
            return nothing()

    # The tail is made when the file is used up before `count` records, so never for a healthy shard.
    records = (tf.data.Dataset.range(1).flat_map(refuse)
               .concatenate(record_format.tf_dataset(path)
                            .ignore_errors()  # ends the file at the first frame that fails its checks
                            .take(fit)
                            .concatenate(tf.data.Dataset.range(1).flat_map(short))
                            .take(count)))
    # Every host sees the same records in the same order, so selecting by position keeps the
    # hosts' shares disjoint and complete even after skipped records.
    return records.shard(stride, offset)


def _frames_that_fit(path: tf.Tensor, count: tf.Tensor, num_bytes: tf.Tensor, *, policy: str,
                     stats: Optional[ReadStats], dataset: str) -> Tuple[int, str]:
    """(how many of a local shard's first `count` frames have a header that passes its checksum and a
    length within the file, why the shard is refused or ''): record_format.frames reads the headers
    only, and check_count refuses frames that run past the count. A remote shard's headers would each
    cost a request: its `count` is trusted to TensorFlow's reader.

    A shard that is gone is 0 frames: TFRecordDataset's open of a missing file fails, and
    ignore_errors would retry it forever (as_dataset once spun a thread for ever on one)."""
    name, wanted, size = path.numpy().decode("utf-8"), int(count.numpy()), int(num_bytes.numpy())
    try:
        if has_scheme(name):
            return (wanted, "") if tf.io.gfile.exists(name) else (0, _gone(name, dataset))
        stream = files.open_local(name, buffering=0)
    except FileNotFoundError:
        return 0, _gone(name, dataset)
    except (OSError, Error, tf.errors.OpError) as e:
        return 0, f"shard {name} cannot be read: {getattr(e, 'message', None) or e}"
    with stream:
        entries = record_format.frames(stream, wanted)
    try:
        check_count(name, wanted, size, entries, policy, stats, dataset)
    except record_format.CorruptRecordError as e:
        return 0, str(e)
    return len(entries), ""


def _gone(path: str, dataset: str) -> str:
    # A rebuild never rewrites a listed file, but removes versions past --keep_versions: a reader
    # still on an older manifest then finds its files gone, and says so rather than TF's bare NotFound.
    return (f"shard {path} no longer exists: the dataset in {dataset or 'its folder'} was rebuilt after this reader "
            "loaded its manifest.json, and the version that manifest lists was removed (--keep_versions); load the "
            "dataset again")


def _text(*parts) -> tf.Tensor:
    """Joins strings and int tensors into one message; tf.strings.format would quote the path."""
    return tf.strings.join([p if isinstance(p, str) or p.dtype == tf.string else tf.strings.as_string(p)
                            for p in parts])


def _recover(path: str, start: int, count: int, stats: ReadStats) -> Iterator[Tuple[int, bytes]]:
    """Yields (index, record) for the good frames of `path` after its first `start` records
    (record_format.salvage). The records skipped are the manifest count minus the
    records read, so the count is exact even when a stretch of several frames was lost.
    """
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    good, first_problem = start, None
    for index, record, problem in record_format.salvage(data, start):
        if record is None:
            first_problem = first_problem or problem
            continue
        yield index, record
        good += 1
    lost = count - good
    if lost > 0:
        stats._add_skipped(path, lost)
        if first_problem is None:
            log.warning("shard %s holds %d records, manifest.json says %d: %d record(s) missing (counted in "
                        "ReadStats.skipped)", path, good, count, lost)
        else:
            log.warning("skipped %d corrupt record(s) in shard %s (%s); read %d of %d", lost, path,
                        first_problem, good, count)


def _report_extra(path: str, count: int, found: int, stats: Optional[ReadStats]) -> None:
    if stats is not None:
        stats._add_extra(path, found - count)
    log.warning("shard %s holds %d records, manifest.json says %d: read its first %d, %d left out (counted in "
                "ReadStats.extra)", path, found, count, count, found - count)
