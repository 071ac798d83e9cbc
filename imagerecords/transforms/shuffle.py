"""GlobalShuffle: a seeded, balanced cut of each split into shards; only references move."""

from __future__ import annotations

import array
from typing import Any, Dict, List, Optional, Tuple

import apache_beam as beam

from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.plan import shard_plan as planning
from imagerecords.pipeline.refs import ImageRef
from imagerecords.pipeline.plan.shard_plan import ShardPlan
from imagerecords.transforms.coders import KeyedRef, ShardGroup, ShardKey

__all__ = ["GlobalShuffle", "ShardKey"]


class _BucketCounts(beam.CombineFn):
    """Counts a split's shuffle hashes per bucket and sums its bytes: bounded by the bucket count,
    whatever the split's size."""

    def create_accumulator(self):
        return {}, 0

    def add_input(self, acc, element: Tuple[int, int]):
        return planning.add_to_counts(acc, element[0], element[1])

    def merge_accumulators(self, accs):
        return planning.merge_counts(accs)

    def extract_output(self, acc):
        return acc


class _SortedHashes(beam.CombineFn):
    """Collects one boundary bucket's hashes (8 bytes each) and sorts them."""

    def create_accumulator(self):
        return array.array("Q")

    def add_input(self, acc, h: int):
        acc.append(h)
        return acc

    def merge_accumulators(self, accs):
        out = array.array("Q")
        for a in accs:
            out.extend(a)
        return out

    def extract_output(self, acc):
        return sorted(acc)


class GlobalShuffle(beam.PTransform):
    """Groups refs into shards; only the references move (~120 bytes each), never image bytes.

    Input: ImageRef with its split set (AssignLabels' 'refs').
    Outputs: 'shards' ((ShardKey, [ImageRef sorted by shuffle hash, then key]), where ShardKey is
    (split, shard index, shards in the split)) and 'plans' ((split, ShardPlan)).

    The order depends only on each key and `seed`, so every runner and worker count gives the same
    shards. Shard sizes differ by at most one (keys listed twice share a hash and a shard). Every
    planned shard is emitted, empty or not.

    Args:
      seed: the salt of the shuffle hash.
      num_shards: shards per split; None picks them from the split's bytes (`target_shard_mb`,
        at least `min_shards`, at most one per image).
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

    @classmethod
    def of(cls, split, shards) -> "GlobalShuffle":
        """The shuffle a build's SplitOptions (its seed) and ShardOptions (the shard counts) ask for."""
        return cls(split.seed, shards.num_shards, shards.target_shard_mb, shards.min_shards)

    def _coarse(self, item) -> Tuple[str, planning.CoarsePlan]:
        split, (counts, num_bytes) = item
        n = planning.choose_num_shards(sum(counts.values()), num_bytes, self._num_shards, self._target_mb,
                                       self._min_shards)
        return split, planning.coarse_plan(split, counts, num_bytes, n)

    def expand(self, refs):
        seed = self._seed
        hashed = refs | "Hash" >> beam.Map(lambda r: (r.split, (refs_lib.shuffle_hash(seed, r.key), r.size)))
        # (split, (hash, size))
        coarse = (
            hashed
            | "CountPerBucket" >> beam.CombinePerKey(_BucketCounts())
            # (split, ({bucket: count}, bytes))
            | "CoarsePlan" >> beam.Map(self._coarse)
        )

        def in_boundary_bucket(item, plans: Dict[str, planning.CoarsePlan]):
            split, (h, _) = item
            if planning.bucket_of(h) in plans[split].buckets:
                yield (split, planning.bucket_of(h)), h

        def cuts(item, plans: Dict[str, planning.CoarsePlan]):
            (split, bucket), sorted_hashes = item
            return [(split, cut) for cut in planning.cut_values(plans[split], bucket, sorted_hashes)]

        boundaries = (
            hashed
            | "InBoundaryBucket" >> beam.FlatMap(in_boundary_bucket, beam.pvalue.AsDict(coarse))
            # ((split, bucket), hash), only for the <= num_shards-1 buckets that hold a boundary
            | "SortBoundaryBucket" >> beam.CombinePerKey(_SortedHashes())
            | "Cuts" >> beam.FlatMap(cuts, beam.pvalue.AsDict(coarse))
            # (split, (shard index, boundary hash))
        )
        plans = coarse | "Plan" >> beam.Map(
            lambda kv, values: (kv[0], planning.finish_plan(kv[1], values[kv[0]] if kv[1].cuts else ())),
            beam.pvalue.AsMultiMap(boundaries))
        # (split, ShardPlan)

        def key_by_shard(ref: ImageRef, plans: Dict[str, ShardPlan]):
            plan = plans[ref.split]
            h = refs_lib.shuffle_hash(seed, ref.key)
            return (ref.split, plan.shard_of(h), plan.num_shards), (h, ref)

        keyed = refs | "KeyByShard" >> beam.Map(key_by_shard, beam.pvalue.AsDict(plans)).with_output_types(KeyedRef)
        every_shard = plans | "EveryShard" >> beam.FlatMap(
            lambda kv: [((kv[0], i, kv[1].num_shards), None) for i in range(kv[1].num_shards)]
        ).with_output_types(Tuple[ShardKey, Optional[Tuple[Any, ImageRef]]])

        def in_order(item) -> Tuple[Tuple[str, int, int], List[ImageRef]]:
            key, members = item
            return key, assign_lib.shard_order(filter(None, members))

        shards = (
            (keyed, every_shard)
            | "Flatten" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            # (ShardKey, [(hash, ImageRef) | None])
            | "Sort" >> beam.Map(in_order).with_output_types(ShardGroup)
            # (ShardKey, [ImageRef sorted by hash])
        )
        return {"shards": shards, "plans": plans}
