"""FindNearDuplicates: written images whose perceptual hashes are within near.THRESHOLD bits."""

from __future__ import annotations

import functools
from typing import Iterable, List, Tuple

import apache_beam as beam

from imagerecords.pipeline.plan import near

__all__ = ["FindNearDuplicates"]


def _pairs(item: Tuple[int, Iterable[Tuple[bool, near.Item]]]) -> Iterable[near.Pair]:
    return near.bucket_pairs(item[1])


def _first(items: Iterable[near.Item]) -> near.Item:
    return functools.reduce(near.first_of, items)


def _groups(pairs: List[near.Pair]) -> List[near.NearGroup]:
    return near.groups(pairs)


class FindNearDuplicates(beam.PTransform):
    """Consumes near.Item per hashed image (WriteShards' NEAR output, and with --append the dataset's
    records); outputs one NearGroup per set of images linked by pairs within near.THRESHOLD bits.

    The pairs are found in buckets (near's banded multi-index: 5 stored and 64 probing keys per
    image, grouped by key on the workers); only the pairs, few, meet on one worker to be joined
    into groups, so the output does not depend on bundling or worker count.
    """

    def expand(self, items):
        return (
            items
            # one item per content digest: its copies are exact duplicates, reported as such
            | "ByContent" >> beam.Map(lambda item: (near.content_key(item), item))
            | "OnePerContent" >> beam.CombinePerKey(_first)
            | "Items" >> beam.Values()
            | "Keyed" >> beam.FlatMap(near.keyed)
            # (bucket: band << 16 | value, (probe?, item))
            | "ByBucket" >> beam.GroupByKey()
            | "Pairs" >> beam.FlatMap(_pairs)
            # (item, item) within the threshold, each pair once per bucket it meets in
            | "CollectPairs" >> beam.combiners.ToList()
            | "Groups" >> beam.FlatMap(_groups)
        )
