"""The resumable order: one global order per epoch that hosts consume by stride, read record by record at known offsets.

Epoch e's order depends on (seed, e) only, never on the host count:

1. The split's records, in shard order, are cut into blocks of `order_block` consecutive records
   of one shard (a shard's last block may be shorter). A seeded permutation of the blocks,
   concatenated, gives the epoch's block sequence.
2. That sequence is cut into windows of `order_window` positions, and each window is permuted by
   a permutation seeded by (seed, e, window) alone.

Position p of the order goes to host p mod H, so after every host took j records the first H*j
positions are consumed, whatever H is: a global example count says exactly what was consumed.
Records are read at their byte offsets (from the shard's index file, or from one scan of the
frame headers), so starting anywhere reads no record before the start.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from imagerecords.format.paths import has_scheme
from imagerecords.format import files, record_format
from imagerecords.format.errors import Error
from imagerecords.reader.hosts import Position, per_host_records, position_of_example, position_of_step  # noqa: F401
from imagerecords.reader.shards import check_count, open_shards

log = logging.getLogger("imagerecords.reader")

# Records handed to one read call: enough to make the call's fixed cost small per record, few
# enough that parallel reads stay many.
TASK_RECORDS = 32


def epoch_order(counts: Sequence[int], seed: int, epoch: int, block: int, window: int, shuffle: bool) -> np.ndarray:
    """Record ids (positions in the split's shard order) of epoch `epoch`'s global order.

    Args:
      counts: records per shard, in shard order.
      seed: the make_dataset seed.
      epoch: epoch number, from 0.
      block: records per block.
      window: positions per window.
      shuffle: False gives the split's own order (evaluation).
    """
    total = int(sum(counts))
    if not shuffle:
        return np.arange(total, dtype=np.int64)
    starts, lengths = [], []
    base = 0
    for count in counts:
        for s in range(0, count, block):
            starts.append(base + s)
            lengths.append(min(block, count - s))
        base += count
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    blocks = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0]))).permutation(len(starts))
    runs = [np.arange(starts[b], starts[b] + lengths[b], dtype=np.int64) for b in blocks]
    order = np.concatenate(runs) if runs else np.zeros(0, np.int64)
    for w, lo in enumerate(range(0, total, window)):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 1, w])))
        order[lo:lo + window] = order[lo:lo + window][rng.permutation(min(window, total - lo))]
    return order


class ReadProblem(Error, ValueError):
    """A shard the resumable order reads is damaged or gone; the message names it and what to do."""


class RecordTable:
    """Byte offset and frame length of every record of a split, by record id, and the reads by id.

    Offsets come from each shard's tfrecord2idx index file when the manifest names one (the shard
    itself is not touched), else from one pass over the shard's frame headers (12 bytes read per
    record, the data seeked over).
    """

    def __init__(self, files: Sequence[str], counts: Sequence[int], shards: Sequence, policy: str, stats,
                 dataset: str = ""):
        self.files = list(files)
        self.policy = policy
        self.stats = stats
        self.dataset = dataset
        self._warned, self._warn_lock = set(), threading.Lock()
        # The files are checked against manifest.json before any offset is trusted (one stat each).
        open_shards(shards, dataset, policy, stats)
        shard, offset, length = [], [], []
        for i, (path, count, info) in enumerate(zip(files, counts, shards)):
            entries = _index_entries(path, count, info, policy)
            if not info.index_path:  # an index file's count and end are checked by the index loader
                check_count(path, count, info.num_bytes, entries, policy, stats, dataset)
            shard.append(np.full(count, i, np.int32))
            off = np.full(count, -1, np.int64)
            ln = np.zeros(count, np.int64)
            if entries:
                e = np.asarray(entries[:count], np.int64).reshape(-1, 2)
                off[:len(e)], ln[:len(e)] = e[:, 0], e[:, 1]
            offset.append(off)
            length.append(ln)
        self.shard = np.concatenate(shard) if shard else np.zeros(0, np.int32)
        self.offset = np.concatenate(offset) if offset else np.zeros(0, np.int64)
        self.length = np.concatenate(length) if length else np.zeros(0, np.int64)

    def read(self, ids: np.ndarray) -> List[bytes]:
        """The records `ids` names, in that order; id -1 (padding) and a skipped bad record are b""."""
        out = [b""] * len(ids)
        real = [i for i in range(len(ids)) if ids[i] >= 0]
        # Sorted by file and offset, so neighbouring records are read in one request.
        real.sort(key=lambda i: (self.shard[ids[i]], self.offset[ids[i]]))
        n_bytes = n_records = 0
        handles = {}
        try:
            k = 0
            while k < len(real):
                first = ids[real[k]]
                shard, start = int(self.shard[first]), int(self.offset[first])
                end, run = start + int(self.length[first]), [real[k]]
                k += 1
                while (k < len(real) and self.shard[ids[real[k]]] == shard and start >= 0
                       and self.offset[ids[real[k]]] == end):
                    end += int(self.length[ids[real[k]]])
                    run.append(real[k])
                    k += 1
                if start < 0:
                    self._bad(shard, "the file ends before this record")
                    continue
                f = handles.get(shard)
                try:
                    if f is None:
                        f = handles[shard] = _open(self.files[shard])
                    f.seek(start)
                    data = f.read(end - start)
                except (OSError, tf.errors.OpError) as e:
                    raise self._unreadable(shard, e) from None
                n_bytes += len(data)
                pos = 0
                for i in run:
                    size = int(self.length[ids[i]])
                    length = record_format.check_frame(data, pos)  # both checksums, and the index's frame length
                    if length is None or length + record_format.FRAME_OVERHEAD != size:
                        self._bad(shard, f"the frame at byte {int(self.offset[ids[i]])} fails its checks")
                    else:
                        out[i] = data[pos + record_format.FRAME_HEADER:pos + record_format.FRAME_HEADER + length]
                        n_records += 1
                    pos += size
        finally:
            for f in handles.values():
                f.close()
        if self.stats is not None:
            self.stats._add_read(n_records, n_bytes)
        return out

    def _unreadable(self, shard: int, e: BaseException) -> ReadProblem:
        path = self.files[shard]
        if isinstance(e, (FileNotFoundError, tf.errors.NotFoundError)):
            return ReadProblem(f"shard {path} no longer exists: the dataset in {self.dataset or 'its folder'} was "
                               "rebuilt after this reader loaded its manifest.json, and the version that manifest "
                               "lists was removed (--keep_versions); load the dataset again")
        return ReadProblem(f"shard {path} cannot be read: {getattr(e, 'message', None) or e}")

    def _bad(self, shard: int, why: str) -> None:
        path = self.files[shard]
        if self.policy == "fail":
            raise ReadProblem(f"shard {path} is corrupt, truncated or unreadable: {why} "
                              "(ReadConfig(corrupt_records='skip') drops bad records)")
        if self.stats is not None:
            self.stats._add_skipped(path, 1)
        with self._warn_lock:  # one line per damaged shard, not one per record of a truncated one
            first = path not in self._warned
            self._warned.add(path)
        if first:
            log.warning("shard %s: skipped a bad record (%s); it is a padding element (label -1) in its place, "
                        "counted in ReadStats.skipped", path, why)


def _open(path: str):
    return tf.io.gfile.GFile(path, "rb") if has_scheme(path) else files.open_local(path, buffering=0)


def _index_entries(path: str, count: int, shard, policy: str) -> List[Tuple[int, int]]:
    """The (offset, frame length) entries of `shard` (a ShardInfo): from its index file, checked
    against manifest.json by the one index loader (so a stale index is named, never its healthy
    shard), else scanned from the frame headers."""
    index = shard.index_path
    if not index:
        return scan_headers(path, count)
    with _open(index) as f:
        data = f.read()
    return record_format.load_index(data, index, count=count, num_bytes=shard.num_bytes, sha256=shard.index_sha256)


def scan_headers(path: str, count: int) -> List[Tuple[int, int]]:
    """(offset, frame length) of the first `count` frames of `path`, reading only their 12-byte headers.

    Stops early at a header whose checksum fails or at the end of the file.
    """
    with _open(path) as f:
        return record_format.frames(f, count)


def host_epoch(counts: Sequence[int], seed: int, start: Position, epoch: int, num_hosts: int, host: int,
               remainder: str, block: int, window: int, shuffle: bool) -> Tuple[np.ndarray, np.ndarray]:
    """This host's (record ids, stream indices) of epoch `epoch`, from `start` when it is that epoch.

    A stream index is epoch * num_examples + position: it seeds the augmentation, so an example's
    crop depends on the seed, the epoch and its position in the global order, not on the host.
    Padding positions (past the order's end, "pad") have id -1.
    """
    total = int(sum(counts))
    consumed = start.consumed if epoch == start.epoch else 0
    n = per_host_records(total, consumed, num_hosts, remainder)
    positions = consumed + host + num_hosts * np.arange(n, dtype=np.int64)
    if not total:
        return np.full(n, -1, np.int64), epoch * total + positions
    order = epoch_order(counts, seed, epoch, block, window, shuffle)
    ids = np.where(positions < total, order[np.minimum(positions, total - 1)], -1)
    return ids, epoch * total + positions


def epochs_to_read(counts: Sequence[int], start: Position, epochs: int, num_hosts: int, remainder: str) -> int:
    """How many epochs from start.epoch yield anything: -1 for all of them (repeat forever), 0 when
    every epoch is empty for this host count (so an endless repeat never spins on empty epochs)."""
    if per_host_records(int(sum(counts)), 0, num_hosts, remainder) == 0:
        return 0
    return -1 if epochs < 0 else max(epochs - start.epoch, 0)


def tasks(counts: Sequence[int], seed: int, start: Position, epochs: int, num_hosts: int, host: int,
          remainder: str, block: int, window: int, shuffle: bool) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Yields this host's (record ids, stream indices) in TASK_RECORDS pieces, epoch after epoch (host_epoch)."""
    n_epochs = epochs_to_read(counts, start, epochs, num_hosts, remainder)
    epoch = start.epoch
    while n_epochs < 0 or epoch < start.epoch + n_epochs:
        ids, stream = host_epoch(counts, seed, start, epoch, num_hosts, host, remainder, block, window, shuffle)
        for lo in range(0, len(ids), TASK_RECORDS):
            yield ids[lo:lo + TASK_RECORDS], stream[lo:lo + TASK_RECORDS]
        epoch += 1
