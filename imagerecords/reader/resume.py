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

import dataclasses
import struct
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from imagerecords.format.paths import has_scheme
from imagerecords.format.records import FRAME_OVERHEAD, masked_crc32c, parse_index
from imagerecords.reader.shards import FRAME_HEADER, check_frame

# Records handed to one read call: enough to make the call's fixed cost small per record, few
# enough that parallel reads stay many.
TASK_RECORDS = 32


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a resumable stream starts: `consumed` positions of epoch `epoch`'s order are done."""

    epoch: int
    consumed: int


def position_of_step(step: int, batch_size: int, num_examples: int, num_hosts: int, remainder: str) -> Position:
    """The Position after `step` synchronous steps of `batch_size` per host on `num_hosts` hosts.

    Each host yields `per_host_records(num_examples, 0, num_hosts, remainder)` records per epoch,
    and batches run on across epoch boundaries.
    """
    per_epoch = per_host_records(num_examples, 0, num_hosts, remainder)
    if per_epoch == 0:
        return Position(0, 0)
    done = step * batch_size
    return Position(done // per_epoch, num_hosts * (done % per_epoch))


def position_of_example(example: int, num_examples: int) -> Position:
    """The Position of a global example count, where epoch e begins at e * num_examples."""
    return Position(example // num_examples, example % num_examples)


def per_host_records(num_examples: int, consumed: int, num_hosts: int, remainder: str) -> int:
    """Records each host yields from an epoch of which `consumed` positions are done.

    "drop": the positions left, divided by the hosts, rounded down (up to H-1 positions at the
    order's end are left out); "pad": rounded up, the hosts past the end yield padding.
    """
    left = max(num_examples - consumed, 0)
    return left // num_hosts if remainder == "drop" else -(-left // num_hosts)


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


class RecordTable:
    """Byte offset and frame length of every record of a split, by record id, and the reads by id.

    Offsets come from each shard's tfrecord2idx index file when the manifest names one (the shard
    itself is not touched), else from one pass over the shard's frame headers (12 bytes read per
    record, the data seeked over).
    """

    def __init__(self, files: Sequence[str], counts: Sequence[int], index_files: Sequence[Optional[str]],
                 policy: str, stats):
        self.files = list(files)
        self.policy = policy
        self.stats = stats
        shard, offset, length = [], [], []
        for i, (path, count, index) in enumerate(zip(files, counts, index_files)):
            entries = _index_entries(path, count, index, policy)
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
                if f is None:
                    f = handles[shard] = _open(self.files[shard])
                f.seek(start)
                data = f.read(end - start)
                n_bytes += len(data)
                pos = 0
                for i in run:
                    size = int(self.length[ids[i]])
                    length = check_frame(data, pos)  # both checksums, and the index's frame length
                    if length is None or length + FRAME_OVERHEAD != size:
                        self._bad(shard, f"the frame at byte {int(self.offset[ids[i]])} fails its checks")
                    else:
                        out[i] = data[pos + FRAME_HEADER:pos + FRAME_HEADER + length]
                        n_records += 1
                    pos += size
        finally:
            for f in handles.values():
                f.close()
        if self.stats is not None:
            self.stats._add_read(n_records, n_bytes)
        return out

    def _bad(self, shard: int, why: str) -> None:
        path = self.files[shard]
        if self.policy == "fail":
            raise ValueError(f"shard {path} is corrupt, truncated or unreadable: {why} "
                             "(ReadConfig(corrupt_records='skip') drops bad records)")
        if self.stats is not None:
            self.stats._add_skipped(path, 1)


def _open(path: str):
    return tf.io.gfile.GFile(path, "rb") if has_scheme(path) else open(path, "rb", buffering=0)


def _index_entries(path: str, count: int, index: Optional[str], policy: str) -> List[Tuple[int, int]]:
    if index:
        with tf.io.gfile.GFile(index, "rb") as f:
            entries = parse_index(f.read(), index)
        if len(entries) != count and policy == "fail":
            raise ValueError(f"index file {index} lists {len(entries)} records, manifest.json says {count} "
                             "for its shard (rebuild the dataset with --overwrite --write_index)")
        return entries
    return scan_headers(path, count)


def scan_headers(path: str, count: int) -> List[Tuple[int, int]]:
    """(offset, frame length) of the first `count` frames of `path`, reading only their 12-byte headers.

    Stops early at a header whose checksum fails or at the end of the file.
    """
    out = []
    with _open(path) as f:
        pos = 0
        for _ in range(count):
            f.seek(pos)
            header = f.read(FRAME_HEADER)
            if len(header) < FRAME_HEADER or masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]:
                break
            (length,) = struct.unpack("<Q", header[:8])
            out.append((pos, length + FRAME_OVERHEAD))
            pos += length + FRAME_OVERHEAD
    return out


def tasks(counts: Sequence[int], seed: int, start: Position, epochs: int, num_hosts: int, host: int,
          remainder: str, block: int, window: int, shuffle: bool) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Yields this host's (record ids, stream indices) in TASK_RECORDS pieces, epoch after epoch.

    A stream index is epoch * num_examples + position: it seeds the augmentation, so an example's
    crop depends on the seed, the epoch and its position in the global order, not on the host.
    Padding positions (past the order's end, "pad") have id -1.
    """
    total = int(sum(counts))
    epoch, consumed = start.epoch, start.consumed
    while epochs < 0 or epoch < epochs:
        order = epoch_order(counts, seed, epoch, block, window, shuffle)
        n = per_host_records(total, consumed, num_hosts, remainder)
        if n == 0 and consumed == 0:
            return  # every epoch would be empty
        positions = consumed + host + num_hosts * np.arange(n, dtype=np.int64)
        ids = np.where(positions < total, order[np.minimum(positions, max(total - 1, 0))], -1) if total else \
            np.full(n, -1, np.int64)
        stream = epoch * total + positions
        for lo in range(0, n, TASK_RECORDS):
            yield ids[lo:lo + TASK_RECORDS], stream[lo:lo + TASK_RECORDS]
        epoch, consumed = epoch + 1, 0
