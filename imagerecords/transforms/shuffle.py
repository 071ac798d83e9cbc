"""GlobalShuffle: a seeded, balanced cut of each split into shards; only references move."""

from __future__ import annotations

import array
from typing import Dict, List, Optional, Tuple

import apache_beam as beam

from imagerecords import refs as refs_lib
from imagerecords.refs import ImageRef, ShardPlan

__all__ = ["GlobalShuffle", "ShardKey"]

# (split, shard index, number of shards of the split)
ShardKey = Tuple[str, int, int]


class _HashesAndBytes(beam.CombineFn):
    """Collects a split's 64-bit shuffle hashes (8 bytes each, not Python ints) and its bytes."""

    def create_accumulator(self):
        return array.array("Q"), 0

    def add_input(self, acc, element: Tuple[int, int]):
        hashes, total = acc
        hashes.append(element[0])
        return hashes, total + max(element[1], 0)

    def merge_accumulators(self, accs):
        hashes, total = array.array("Q"), 0
        for h, t in accs:
            hashes.extend(h)
            total += t
        return hashes, total

    def extract_output(self, acc):
        hashes, total = acc
        return sorted(hashes), total


class GlobalShuffle(beam.PTransform):
    """Groups refs into shards: (ShardKey, [ImageRef sorted by shuffle hash, then key]).

    The order depends only on each key and `seed`, so every runner and worker count gives the same
    shards. Shard sizes differ by at most one (keys listed twice share a hash and a shard). Every
    planned shard is emitted, empty or not. A second output 'plans' holds (split, ShardPlan).
    """

    def __init__(self, seed: int = 0, num_shards: Optional[int] = None, target_shard_mb: float = 192.0, min_shards: int = 8):
        super().__init__()
        if num_shards is not None and num_shards < 1:
            raise ValueError(f"GlobalShuffle: num_shards must be >= 1, got {num_shards}")
        if target_shard_mb <= 0:
            raise ValueError(f"GlobalShuffle: target_shard_mb must be > 0, got {target_shard_mb}")
        self._seed = seed
        self._num_shards = num_shards
        self._target_mb = target_shard_mb
        self._min_shards = min_shards

    def _plan(self, item) -> Tuple[str, ShardPlan]:
        split, (hashes, num_bytes) = item
        n = refs_lib.choose_num_shards(len(hashes), num_bytes, self._num_shards, self._target_mb, self._min_shards)
        return split, refs_lib.plan_shards(split, hashes, num_bytes, n)

    def expand(self, refs):
        seed = self._seed
        plans = (
            refs
            | "HashAndSize" >> beam.Map(lambda r: (r.split, (refs_lib.shuffle_hash(seed, r.key), r.size)))
            | "PerSplit" >> beam.CombinePerKey(_HashesAndBytes())
            # (split, ([sorted hash], bytes))
            | "Plan" >> beam.Map(self._plan)
        )

        def key_by_shard(ref: ImageRef, plans: Dict[str, ShardPlan]):
            plan = plans[ref.split]
            h = refs_lib.shuffle_hash(seed, ref.key)
            return (ref.split, plan.shard_of(h), plan.num_shards), (h, ref)

        keyed = refs | "KeyByShard" >> beam.Map(key_by_shard, beam.pvalue.AsDict(plans))
        every_shard = plans | "EveryShard" >> beam.FlatMap(
            lambda kv: [((kv[0], i, kv[1].num_shards), None) for i in range(kv[1].num_shards)]
        )

        def in_order(item) -> Tuple[Tuple[str, int, int], List[ImageRef]]:
            key, members = item
            # Hash order; the rest of the key only orders repeats of one key, so which repeat is
            # kept (and which rejected as a duplicate) never depends on the runner's grouping.
            hashed = sorted(filter(None, members), key=lambda hr: (hr[0], hr[1].key, hr[1].uri, hr[1].label or "", hr[1].label_id))
            return key, [r for _, r in hashed]

        shards = (
            (keyed, every_shard)
            | "Flatten" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            # (ShardKey, [(hash, ImageRef) | None])
            | "Sort" >> beam.Map(in_order)
            # (ShardKey, [ImageRef sorted by hash])
        )
        return {"shards": shards, "plans": plans}
