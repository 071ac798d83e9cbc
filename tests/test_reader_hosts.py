"""Per-host split planning (imagerecords.reader.hosts), pure Python: disjoint, complete, balanced."""

import itertools

import pytest

from imagerecords.reader import hosts


def _records(slices):
    """(shard path, index in shard) of every record a host's slices select."""
    return [(s.path, i) for s in slices for i in range(s.offset, s.count, s.stride)]


CASES = [
    ([6, 6, 6, 7, 6, 6, 6, 7], [1, 2, 3, 4, 5, 8, 9, 16]),
    ([5, 5, 4, 4], [1, 2, 3, 4, 5, 7]),
    ([13] * 60 + [12] * 40, [1, 3, 7, 64, 150]),
    ([3, 0, 3, 2, 3], [2, 4, 6]),  # an empty shard
]


@pytest.mark.parametrize("counts,host_counts", CASES)
def test_hosts_disjoint_complete_balanced(counts, host_counts):
    files = [f"s{i:05d}" for i in range(len(counts))]
    everything = {(f, i) for f, c in zip(files, counts) for i in range(c)}
    for num_hosts in host_counts:
        per_host = [_records(slices) for slices in hosts.assign(files, counts, num_hosts)]
        union = list(itertools.chain.from_iterable(per_host))
        assert len(union) == len(set(union)) and set(union) == everything, num_hosts
        sizes = [len(r) for r in per_host]
        assert max(sizes) - min(sizes) <= 2, (num_hosts, sizes)
        for slices in hosts.assign(files, counts, num_hosts):
            assert [s.path for s in slices] == sorted(s.path for s in slices)  # shard order kept


def test_whole_shards_when_enough_else_by_record():
    files, counts = ["a", "b", "c", "d", "e"], [4, 4, 4, 4, 3]
    two = hosts.assign(files, counts, 2)
    assert sorted(s.path for s in two[0] + two[1] if s.stride == 1) == ["a", "b", "c", "d"]
    assert [s.path for s in two[0] if s.stride == 2] == ["e"] == [s.path for s in two[1] if s.stride == 2]
    seven = hosts.assign(files, counts, 7)
    assert all(s.stride == 7 and len(slices) == 5 for slices in seven for s in slices)


def test_plan_drop_and_pad():
    files, counts = ["a", "b", "c"], [5, 4, 4]
    drop = [hosts.plan(files, counts, 2, h, "drop") for h in range(2)]
    pad = [hosts.plan(files, counts, 2, h, "pad") for h in range(2)]
    assert {p.records_per_epoch for p in drop} == {6} and drop[0].dropped_total == 1
    assert {p.records_per_epoch for p in pad} == {7} and pad[0].padded_total == 1
    assert sum(p.num_records for p in drop) == 13
    with pytest.raises(ValueError, match="host_remainder='pad'|remainder='pad'"):
        hosts.plan(["a"], [2], 3, 0, "drop")
    with pytest.raises(ValueError, match=r"host_index must be in \[0, 2\)"):
        hosts.plan(files, counts, 2, 2, "pad")
