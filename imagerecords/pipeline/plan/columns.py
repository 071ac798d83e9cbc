"""The local engine's one plan: a build's kept inputs as columns, each split cut into shards.

Every local build reaches the plan as a Table: a refs build (files, manifests, URLs, a registered
source, an append) as RefTable, an arrays build as array_rows.RowTable. Both give the same columns
(each input's shuffle hash, split and bytes), so the shard count, the boundaries and each input's
shard are decided once, here, for every input kind; a shard is the positions of its inputs in the
table, in hash order, and the table turns them into what its writer takes (refs, or an arrays
shard's rows) only when the shard is handed out.

Chosen by measurement over "the columns become refs" (docs/building.md, "One plan"): 200,000
float32 rows built ref by ref took 4.4x the wall time of the columnar build (6.04 s against 1.35 s).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Protocol, Sequence, Tuple, Union

import numpy as np

from imagerecords.pipeline.plan import shard_plan as planning
from imagerecords.pipeline.refs import ImageRef

# (split, shard index, shards in the split)
ShardKey = Tuple[str, int, int]

# A size column is int64: a listed size past it (a manifest's size column may say anything finite) is
# held as this, a file of 9.2 EB, which plans as many shards as the split has inputs either way.
MAX_SIZE = 2**63 - 1


def _total(sizes: Any) -> int:
    """The sum of the known sizes (negative: unknown, 0), exact: summed as Python ints when an
    int64 sum could overflow."""
    known = np.maximum(sizes, 0)
    if not len(known) or int(known.max()) <= MAX_SIZE // len(known):
        return int(known.sum())
    return sum(known.tolist())


@dataclasses.dataclass
class Columns:
    """What the plan reads of a build's kept inputs, one entry per input.

    Attributes:
      hashes: each input's shuffle hash (uint64).
      splits: each input's index into `names` (int64).
      names: the split names.
      sizes: each input's bytes (int64; a negative size is unknown and counts 0), or one size for
        every input.
    """

    hashes: Any
    splits: Any
    names: Sequence[str]
    sizes: Union[int, Any]


class Table(Protocol):
    """A build's kept inputs: the plan's columns, and the members of a shard from its positions."""

    def __len__(self) -> int: ...

    def columns(self) -> Columns: ...

    def members(self, key: ShardKey, positions: Any) -> Any: ...


def plan(columns: Columns, shards) -> Tuple[Dict[str, planning.ShardPlan], Dict[ShardKey, Any]]:
    """Each split's ShardPlan and each shard's positions (int64, in hash order), from the shard
    settings `shards` (config.shards): the plan GlobalShuffle makes (planning.plan_sorted is
    planning.plan_shards on sorted hashes). Equal hashes keep the table's order, which for an
    arrays build is the key order assign.shard_order breaks ties by."""
    plans: Dict[str, planning.ShardPlan] = {}
    members: Dict[ShardKey, Any] = {}
    for s in sorted(range(len(columns.names)), key=lambda s: columns.names[s]):
        split = columns.names[s]
        mine = np.flatnonzero(columns.splits == s)
        if not len(mine):
            continue
        order = mine[np.argsort(columns.hashes[mine], kind="stable")]
        ordered = columns.hashes[order]
        count = len(order)
        sizes = columns.sizes
        num_bytes = count * max(sizes, 0) if isinstance(sizes, int) else _total(sizes[order])
        n = planning.choose_num_shards(count, num_bytes, shards.num_shards, shards.target_shard_mb, shards.min_shards)
        p = plans[split] = planning.plan_sorted(split, ordered, num_bytes, n)
        # Shard i holds the hashes in [boundary i, boundary i+1) (ShardPlan.shard_of).
        cuts = np.searchsorted(ordered, np.array(p.boundaries, np.uint64), side="left").tolist() if n > 1 else []
        for i, (lo, hi) in enumerate(zip([0] + cuts, cuts + [count])):
            members[(split, i, n)] = order[lo:hi]
    return plans, members


@dataclasses.dataclass
class RefShard:
    """One shard of a refs build as its writer gets it: its refs and their shuffle hashes (uint64),
    in hash order. No (hash, ref) pair is made in the launcher: a new object per input there would
    have its collector walk every ref still held (1.36 s against 0.18 s for 500,000 refs)."""

    hashes: Any
    refs: List[ImageRef]

    def __len__(self) -> int:
        return len(self.refs)

    def pairs(self) -> Iterator[Tuple[int, ImageRef]]:
        """(shuffle hash, ref) of each member, what assign.shard_order sorts."""
        return zip(self.hashes.tolist(), self.refs)


class RefTable:
    """A refs build's kept refs as the plan's columns; a shard's members are its RefShard, and each
    ref handed out is forgotten here."""

    def __init__(self, pairs: List[Tuple[int, ImageRef]]):
        """Takes over `pairs` (assigned refs with their shuffle hashes), holding each ref in its slot."""
        n = len(pairs)
        names: Dict[str, int] = {}
        self.hashes = np.fromiter((h for h, _ in pairs), np.uint64, n)
        self.splits = np.fromiter((names.setdefault(r.split, len(names)) for _, r in pairs), np.int64, n)
        self.sizes = np.fromiter((min(r.size, MAX_SIZE) for _, r in pairs), np.int64, n)
        self.names = list(names)
        for i in range(n):  # the pair and its hash object go; the hash stays in its column
            pairs[i] = pairs[i][1]
        self.refs: List[ImageRef] = pairs  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.refs)

    def columns(self) -> Columns:
        return Columns(self.hashes, self.splits, self.names, self.sizes)

    def members(self, key: ShardKey, positions: Any) -> RefShard:
        refs, at = self.refs, positions.tolist()
        taken = [refs[i] for i in at]
        for i in at:
            refs[i] = None  # type: ignore[call-overload]
        return RefShard(self.hashes[positions], taken)
