"""Shard planning: how many shards a split gets and which shuffle hashes bound them.

The cut is exact (shard i holds the images ranked [i*n//S, (i+1)*n//S) in hash order, so sizes
differ by at most one) without sorting a split's hashes on one worker: count the hashes per
bucket (their top BUCKET_BITS bits), find the bucket and offset of every boundary rank from the
counts, then sort only the hashes of the buckets that hold a boundary.

Cost, n images in S shards per split: one pass that keeps 2**BUCKET_BITS counters per split
(512 KiB at most), then a sort of the ≤ S-1 boundary buckets, each about n / 2**BUCKET_BITS hashes:
14M images (ImageNet-21k) → ~214 hashes a bucket; 1B images in 5,000 shards → ~15,300 hashes a
bucket, 76M hashes (8 B each) spread over up to 4,999 groups; no worker holds a split's hashes.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format import record_format

BUCKET_BITS = 16
_SHIFT = 64 - BUCKET_BITS
# The boundary of a shard past the last hash: no 64-bit hash reaches it.
PAST_LAST = 2**64


def bucket_of(h: int) -> int:
    return h >> _SHIFT


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """How one split is cut into shards.

    Attributes:
      split: split name.
      count: images listed in the split.
      num_bytes: their input bytes (sizes seen at listing time; unknown sizes count 0).
      num_shards: shards of the split.
      boundaries: shuffle-hash lower bounds of shards 1..num_shards-1, so that shard i holds the
        images ranked [i*count//num_shards, (i+1)*count//num_shards) in hash order.
    """

    split: str
    count: int
    num_bytes: int
    num_shards: int
    boundaries: Tuple[int, ...]

    def shard_of(self, h: int) -> int:
        return bisect.bisect_right(self.boundaries, h)


@dataclasses.dataclass(frozen=True)
class CoarsePlan:
    """A split's plan before the exact boundary hashes are known.

    Attributes:
      split: split name.
      count: images in the split.
      num_bytes: their input bytes.
      num_shards: shards of the split.
      cuts: ((shard index i >= 1, bucket, offset of rank i*count//num_shards inside the bucket), ...).
    """

    split: str
    count: int
    num_bytes: int
    num_shards: int
    cuts: Tuple[Tuple[int, int, int], ...]

    @property
    def buckets(self) -> frozenset:
        return frozenset(b for _, b, _ in self.cuts)


# What an image of unknown size counts for in the shard plan: about ImageNet's mean JPEG.
UNSIZED_IMAGE_BYTES = 110_000


def choose_num_shards(count: int, num_bytes: int, num_shards: Optional[int], target_mb: float, min_shards: int) -> int:
    """Returns the shard count: as asked, or from the target size with a floor; never more than
    the image count (no empty shards), never fewer than one."""
    if num_shards is not None:
        return num_shards
    # No size known (URL rows, --skip_stat without a size column): by count, at an ImageNet-like size.
    num_bytes = num_bytes if num_bytes > 0 else count * UNSIZED_IMAGE_BYTES
    by_size = math.ceil(num_bytes / (target_mb * 1e6)) if num_bytes > 0 else 1
    return max(1, min(max(by_size, min_shards), count))


def add_to_counts(acc: Tuple[Dict[int, int], int], h: int, size: int) -> Tuple[Dict[int, int], int]:
    counts, total = acc
    b = h >> _SHIFT
    counts[b] = counts.get(b, 0) + 1
    return counts, total + max(size, 0)


def merge_counts(accs: Iterable[Tuple[Dict[int, int], int]]) -> Tuple[Dict[int, int], int]:
    merged: Dict[int, int] = {}
    total = 0
    for counts, t in accs:
        for b, c in counts.items():
            merged[b] = merged.get(b, 0) + c
        total += t
    return merged, total


def coarse_plan(split: str, counts: Mapping[int, int], num_bytes: int, num_shards: int) -> CoarsePlan:
    """Finds the bucket and in-bucket offset of every boundary rank from the bucket counts."""
    n = sum(counts.values())
    ranks = [(i, (i * n) // num_shards) for i in range(1, num_shards)] if n else []
    cuts = []
    before = 0
    ordered = sorted(counts.items())
    j = 0
    for i, rank in ranks:  # ranks ascend, so one walk over the buckets serves them all
        while before + ordered[j][1] <= rank:
            before += ordered[j][1]
            j += 1
        cuts.append((i, ordered[j][0], rank - before))
    return CoarsePlan(split, n, num_bytes, num_shards, tuple(cuts))


def cut_values(plan: CoarsePlan, bucket: int, sorted_hashes: Sequence[int]) -> List[Tuple[int, int]]:
    """Returns (shard index, boundary hash) for the cuts of `plan` that fall in `bucket`, given
    that bucket's hashes in ascending order."""
    return [(i, sorted_hashes[offset]) for i, b, offset in plan.cuts if b == bucket]


def finish_plan(plan: CoarsePlan, values: Iterable[Tuple[int, int]]) -> ShardPlan:
    """Turns a coarse plan and its exact boundary hashes into the ShardPlan."""
    by_index = dict(values)
    if plan.count == 0:
        # An empty split still gets one (empty) shard per requested shard.
        return ShardPlan(plan.split, 0, plan.num_bytes, plan.num_shards, tuple([PAST_LAST] * (plan.num_shards - 1)))
    missing = [i for i, _, _ in plan.cuts if i not in by_index]
    if missing:
        raise ValueError(f"shard plan of split {plan.split!r}: no boundary hash for shards {missing}")
    return ShardPlan(plan.split, plan.count, plan.num_bytes, plan.num_shards,
                     tuple(by_index[i] for i in range(1, plan.num_shards)))


def plan_shards(split: str, hashes: Sequence[int], num_bytes: int, num_shards: int) -> ShardPlan:
    """The same plan from a split's hashes held in one process (the in-process engine, tests):
    the same bucket counts and boundary-bucket sort, so both paths are one algorithm. Two passes
    over `hashes` (any order); only the boundary buckets' hashes are copied and sorted."""
    counts: Dict[int, int] = {}
    for h in hashes:
        b = h >> _SHIFT
        counts[b] = counts.get(b, 0) + 1
    coarse = coarse_plan(split, counts, num_bytes, num_shards)
    members: Dict[int, List[int]] = {b: [] for b in coarse.buckets}
    if members:
        for h in hashes:
            found = members.get(h >> _SHIFT)
            if found is not None:
                found.append(h)
    values = [v for b in sorted(members) for v in cut_values(coarse, b, sorted(members[b]))]
    return finish_plan(coarse, values)


def plan_sorted(split: str, sorted_hashes: Sequence[int], num_bytes: int, num_shards: int) -> ShardPlan:
    """plan_shards' plan from a split's hashes already in ascending order (a list or a NumPy array,
    sorted there in one call): shard i's boundary is the hash ranked i*count//num_shards, the
    value the bucket walk finds."""
    n = len(sorted_hashes)
    if n == 0:
        return finish_plan(coarse_plan(split, {}, num_bytes, num_shards), ())
    return ShardPlan(split, n, num_bytes, num_shards,
                     tuple(int(sorted_hashes[i * n // num_shards]) for i in range(1, num_shards)))


def shard_name(name: str, split: str, index: int, num_shards: int, fmt: str = record_format.DEFAULT) -> str:
    return record_format.get(fmt).shard_file_name(name, split, index, num_shards)
