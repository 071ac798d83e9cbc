"""The local engine's one plan (pipeline/plan/columns.py) against the plan GlobalShuffle makes.

The oracle is the ref-by-ref plan: per split, planning.plan_shards over the split's hashes with
the shard count from choose_num_shards, each ref in the shard ShardPlan.shard_of names. Both
tables (refs, an arrays build's rows) are planned by columns.plan, so this pins it for both.
"""

import numpy as np
import pytest

from imagerecords.builder.engines import local
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.plan import columns
from imagerecords.pipeline.plan import shard_plan as planning
from imagerecords.pipeline.refs import ImageRef


def _pairs(n, seed):
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**64, n, dtype=np.uint64)
    hashes[: n // 10] = hashes[n // 10: 2 * (n // 10)]  # repeated hashes (a key listed twice)
    splits = np.array(["train", "test", "validation"])[rng.choice(3, n, p=[0.7, 0.2, 0.1])]
    sizes = rng.integers(-1, 5000, n)  # -1: size unknown, which counts 0 bytes
    return [(int(h), ImageRef(f"k{i:06d}", f"/in/{i}.jpg", "cat", str(s), int(z), 0))
            for i, (h, s, z) in enumerate(zip(hashes.tolist(), splits.tolist(), sizes.tolist()))]


def _ref_by_ref(config, pairs):
    by_split = {}
    for h, ref in pairs:
        by_split.setdefault(ref.split, []).append((h, ref))
    plans, shards = {}, {}
    for split, members in by_split.items():
        num_bytes = sum(max(r.size, 0) for _, r in members)
        n = planning.choose_num_shards(len(members), num_bytes, config.shards.num_shards,
                                       config.shards.target_shard_mb, config.shards.min_shards)
        p = plans[split] = planning.plan_shards(split, [h for h, _ in members], num_bytes, n)
        for i in range(n):
            shards[(split, i, n)] = []
        for h, ref in members:
            shards[(split, p.shard_of(h), n)].append((h, ref))
    return plans, shards


@pytest.mark.parametrize("n,settings", [(1, {}), (50, {"num_shards": 7}), (5000, {"num_shards": 16}),
                                        (5000, {"target_shard_mb": 0.5}), (3000, {"min_shards": 40})])
def test_refs_are_cut_as_the_ref_by_ref_plan_cuts_them(n, settings):
    config = BuildConfig.of(input="/in", output="/out", **settings)
    pairs = _pairs(n, n)
    expected_plans, expected = _ref_by_ref(config, pairs)
    table = columns.RefTable(list(pairs))
    planned = local._Shards(table, config.shards)
    assert planned.plans == expected_plans
    assert planned.keys() == sorted(expected)
    for key in planned.keys():
        got = list(planned.take(key).pairs())
        # In hash order, each pair whole; the writer's sort (assign.shard_order) decides among equal hashes.
        assert [h for h, _ in got] == sorted(h for h, _ in expected[key]), key
        assert sorted(got, key=lambda p: (p[0], p[1].key)) == sorted(expected[key], key=lambda p: (p[0], p[1].key))
    # Each ref handed out is let go by the launcher.
    assert len(table) == n and all(r is None for r in table.refs)


def test_sizes_past_int64_neither_crash_nor_wrap_around():
    # A manifest's size column may say anything finite: a size past int64 is held at MAX_SIZE, and
    # sizes that sum past int64 are summed exactly (a wrapped, negative total would plan by count).
    config = BuildConfig.of(input="/in", output="/out", target_shard_mb=1)
    big = [2**64 + 5, 2**62, 2**62, 7, -1]
    pairs = [(h, ImageRef(f"k{i}", f"/in/{i}.jpg", "cat", "train", size, 0)) for i, (h, size) in
             enumerate(zip([5, 1, 4, 2, 3], big))]
    plans = local._Shards(columns.RefTable(pairs), config.shards).plans
    assert plans["train"].num_bytes == columns.MAX_SIZE + 2**62 + 2**62 + 7
    assert plans["train"].num_shards == 5  # as many shards as inputs, never more


def test_an_arrays_size_for_every_row_counts_as_the_same_sizes_one_by_one():
    rng = np.random.default_rng(1)
    hashes = rng.integers(0, 2**64, 4000, dtype=np.uint64)
    splits = rng.integers(0, 2, 4000)

    class Shards:
        num_shards, target_shard_mb, min_shards = None, 0.25, 1

    one = columns.plan(columns.Columns(hashes, splits, ["b", "a"], 300), Shards)
    each = columns.plan(columns.Columns(hashes, splits, ["b", "a"], np.full(4000, 300, np.int64)), Shards)
    assert one[0] == each[0] and one[0]["a"].num_shards > 1
    assert one[1].keys() == each[1].keys()
    assert all(np.array_equal(one[1][k], each[1][k]) for k in one[1])
