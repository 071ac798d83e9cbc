"""Per-host split of a split's shards: disjoint, complete, and the same record count on every host.

The policy, in full (docs/reader.md repeats it):

1. Shards are sorted by record count (largest first, then by index) and dealt round-robin, whole,
   to the hosts while every host can get one more: each host gets `num_shards // num_hosts` shards.
   The builder's shard sizes differ by at most one, so after this step hosts differ by at most one
   record.
2. The `num_shards % num_hosts` shards left over (all of them when there are more hosts than
   shards) are split by record: every host reads them and keeps every `num_hosts`-th record,
   counted over the leftover shards taken together, so hosts again differ by at most one record.
3. Hosts now hold disjoint sets of records that together are the whole split, but their counts may
   differ by a record or two. Every host then yields the same number of records per epoch:
   - "drop" (the default when training): the smallest host count. The few records over it on the
     other hosts are not read this epoch; with shuffled file order they are other records each
     epoch. The number is known up front (HostPlan.dropped_total) and logged.
   - "pad" (the default for evaluation): the largest host count. Hosts with fewer records append
     padding elements (label PAD_LABEL = -1, image all zeros) so metrics can mask them; every
     record is read exactly once.

Equal record counts give equal batch counts for any batch size and drop_remainder setting.
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

from imagerecords.format.errors import ReadError

REMAINDER_POLICIES = ("drop", "pad")


@dataclasses.dataclass(frozen=True)
class FileSlice:
    """Records one host reads from one shard: those whose index in the file is `offset` mod `stride`.

    Attributes:
      path: shard file.
      count: records in the whole shard (from the manifest).
      stride: 1 for a shard the host reads whole, else the number of hosts.
      offset: index within the shard of the first record this host keeps.
    """

    path: str
    count: int
    stride: int = 1
    offset: int = 0

    @property
    def num_selected(self) -> int:
        return len(range(self.offset, self.count, self.stride))


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """What one host reads per epoch.

    Attributes:
      num_hosts: hosts (input pipelines) sharing the split.
      host_index: this host, in [0, num_hosts).
      slices: the shards (or parts of shards) this host reads, in shard order.
      num_records: records in those slices, per the manifest.
      records_per_epoch: records (padding included) this host yields per epoch; the same on every
        host.
      remainder: "drop" or "pad".
      host_counts: every host's num_records, by host index.
    """

    num_hosts: int
    host_index: int
    slices: Tuple[FileSlice, ...]
    num_records: int
    records_per_epoch: int
    remainder: str
    host_counts: Tuple[int, ...]

    @property
    def padded(self) -> int:
        """Padding elements this host appends per epoch ("pad")."""
        return max(self.records_per_epoch - self.num_records, 0)

    @property
    def dropped_total(self) -> int:
        """Records not read per epoch, over all hosts."""
        return sum(max(n - self.records_per_epoch, 0) for n in self.host_counts)

    @property
    def padded_total(self) -> int:
        """Padding elements per epoch, over all hosts."""
        return sum(max(self.records_per_epoch - n, 0) for n in self.host_counts)


def assign(files: Sequence[str], counts: Sequence[int], num_hosts: int) -> List[List[FileSlice]]:
    """Returns every host's slices (each list in shard order), by the policy in the module docstring.

    Raises:
      ValueError: when num_hosts < 1 or files and counts differ in length.
    """
    if num_hosts < 1:
        raise ReadError(f"num_hosts must be >= 1, got {num_hosts}")
    if len(files) != len(counts):
        raise ReadError(f"{len(files)} files but {len(counts)} counts")
    order = sorted(range(len(files)), key=lambda i: (-counts[i], i))
    whole = (len(files) // num_hosts) * num_hosts
    per_host: List[List[Tuple[int, FileSlice]]] = [[] for _ in range(num_hosts)]
    for rank, i in enumerate(order[:whole]):
        per_host[rank % num_hosts].append((i, FileSlice(files[i], counts[i])))
    # Leftover shards, split by record over their concatenation. Host h keeps the records whose
    # position g in that concatenation has g % H == H - 1 - h: the extra records of this step go
    # to the last hosts, while step 1 gives its extra records (larger shards) to the first ones.
    start = 0
    for i in sorted(order[whole:]):
        for h in range(num_hosts):
            offset = (num_hosts - 1 - h - start) % num_hosts
            per_host[h].append((i, FileSlice(files[i], counts[i], num_hosts, offset)))
        start += counts[i]
    return [[s for _, s in sorted(slices, key=lambda t: t[0])] for slices in per_host]


def plan(files: Sequence[str], counts: Sequence[int], num_hosts: int, host_index: int,
         remainder: str) -> HostPlan:
    """Returns host `host_index`'s HostPlan.

    Args:
      files: the split's shard files, in shard order.
      counts: records per shard, from the manifest.
      num_hosts: hosts sharing the split.
      host_index: this host.
      remainder: "drop" (every host yields the smallest host count) or "pad" (the largest, padded).

    Raises:
      ValueError: naming the bad value for a host index out of range, an unknown remainder policy,
        or a "drop" plan that would leave a host with no records.
    """
    if not 0 <= host_index < num_hosts:
        raise ReadError(f"host_index must be in [0, {num_hosts}), got {host_index}")
    if remainder not in REMAINDER_POLICIES:
        raise ReadError(f"remainder must be one of {REMAINDER_POLICIES}, got {remainder!r}")
    hosts = assign(files, counts, num_hosts)
    host_counts = tuple(sum(s.num_selected for s in slices) for slices in hosts)
    per_epoch = min(host_counts) if remainder == "drop" else max(host_counts)
    if per_epoch == 0 and sum(counts) > 0:
        raise ReadError(f"{sum(counts)} records cannot be split over {num_hosts} hosts with "
                        "remainder='drop' (some host would get none); use remainder='pad'")
    return HostPlan(num_hosts, host_index, tuple(hosts[host_index]), host_counts[host_index], per_epoch,
                    remainder, host_counts)


# The resumable order's positions (reader/resume.py): plain arithmetic, here so that step and
# example counts need no TensorFlow.
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
