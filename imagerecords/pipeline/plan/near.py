"""Near-duplicate groups: written images whose perceptual hashes are within THRESHOLD bits.

Grouping never compares every pair. Each 64-bit hash is cut into 5 bands (13, 13, 13, 13 and 12
bits); two hashes within 9 bits of each other differ by at most one bit in some band (5 bands of 2
differing bits or more would be 10), so every such pair meets in a bucket keyed by (band, value)
where one side is stored exactly and the other probes it with its band as is or with one bit
flipped (5 exact keys and 64 probes per image). Cost: O(n) keys plus the candidates the buckets
hold, each checked with one popcount; for hashes spread evenly over the 2**13 values of a band
that is ~0.4% of all pairs (n=1M: ~2e9 checks spread over the workers). Real hashes are not even
(the DC bit is always set, low frequencies correlate): on the benchmark corpus of 400 photo-like
images the probes met ~3x the even share. The local engine runs the same test in one process (a
dict of buckets); Beam groups the keys with a GroupByKey (FindNearDuplicates).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from imagerecords.pipeline.encode.perceptual import NAME, distance
from imagerecords.pipeline.refs import GroupFlags

# Hamming distance (of 64 bits) at or under which two images are near-duplicates. Measured on the
# pictures of tests/support/near_corpus.py (40 copies per edit): resized (0.5x, 0.8x) copies are
# within 4 bits, quality-60 ones within 2, 2-4% crops within 12 (38 of 40 within 8); 200 distinct
# pictures are 12 bits apart or more (docs/building.md, "Near-duplicates"). Every hash has 32 bits
# set (a median split of 63 coefficients, and the DC bit), so distances are even: 8 also admits 9.
THRESHOLD = 8
BANDS: Tuple[Tuple[int, int], ...] = ((51, 13), (38, 13), (25, 13), (12, 13), (0, 12))  # (shift, width)

# (hash, content digest hex, (key, split, uri, label name), old): `old` marks an --append's record
# of the published dataset (its uri is the shard that holds it).
Item = Tuple[int, str, Tuple[str, str, str, str], bool]
Pair = Tuple[Item, Item]


# Per band: its shift, its mask, and the XOR masks of a probe (0: the value itself, then each bit).
_PROBES = tuple((shift, (1 << width) - 1, (0, *(1 << b for b in range(width)))) for shift, width in BANDS)


def stored_keys(h: int) -> List[int]:
    """The buckets a hash is stored under: band << 16 | the band's value."""
    return [band << 16 | (h >> shift) & mask for band, (shift, mask, _) in enumerate(_PROBES)]


def probe_keys(h: int) -> List[int]:
    """The buckets a hash looks in: its own, and each with one bit of the band flipped."""
    out = []
    for band, (shift, mask, flips) in enumerate(_PROBES):
        key = band << 16 | (h >> shift) & mask
        out.extend([key ^ flip for flip in flips])
    return out


def _near(a: Item, b: Item) -> bool:
    # An --append compares its images with the dataset's and with each other, not old with old.
    return a[2][0] != b[2][0] and not (a[3] and b[3]) and distance(a[0], b[0]) <= THRESHOLD


def _ordered(a: Item, b: Item) -> Pair:
    return (a, b) if a[2] < b[2] else (b, a)


def bucket_pairs(entries: Iterable[Tuple[bool, Item]]) -> Iterator[Pair]:
    """The near pairs one bucket holds, from its (probe?, item) entries: probes against the stored
    items (a pair may come from several buckets; `groups` counts it once)."""
    stored, probes = [], []
    for probe, item in entries:
        (probes if probe else stored).append(item)
    for p in probes:
        for s in stored:
            if _near(p, s):
                yield _ordered(p, s)


def keyed(item: Item) -> Iterator[Tuple[int, Tuple[bool, Item]]]:
    """An item under every bucket it is stored in or probes (Beam's GroupByKey input)."""
    for key in stored_keys(item[0]):
        yield key, (False, item)
    for key in probe_keys(item[0]):
        yield key, (True, item)


def content_key(item: Item) -> str:
    """What one_per_content keeps one item of: the content digest."""
    return item[1]


def first_of(a: Item, b: Item) -> Item:
    """The item of one content that stands for it: the smallest (key, split, uri, label)."""
    return a if a[2] <= b[2] else b


def one_per_content(items: Iterable[Item]) -> List[Item]:
    """One item per content digest. Copies of one content are exact duplicates (their own rows);
    pairing them too made a manifest of 100,000 rows over 40 files compare billions of pairs."""
    kept: Dict[str, Item] = {}
    for item in items:
        other = kept.get(item[1])
        kept[item[1]] = item if other is None else first_of(other, item)
    return sorted(kept.values(), key=lambda i: i[2])


def find_pairs(items: Sequence[Item]) -> List[Pair]:
    """Every near pair of `items`, in one process: the buckets as a dict, each item probing it."""
    items = one_per_content(items)
    buckets: Dict[int, List[Item]] = {}
    for item in items:
        for key in stored_keys(item[0]):
            buckets.setdefault(key, []).append(item)
    out = []
    get = buckets.get
    for item in items:
        for key in probe_keys(item[0]):
            found = get(key)
            if found:
                # Each pair is met from both sides: kept from its first member's.
                out.extend([(item, other) for other in found if other[2] > item[2] and _near(item, other)])
    return out


KIND = "near"  # a near-duplicate group's "kind" in duplicates.jsonl (identical files' rows have none)


@dataclasses.dataclass(frozen=True)
class NearGroup(GroupFlags):
    """Images within THRESHOLD bits of one another, linked pair by pair (one duplicates.jsonl row of
    kind "near").

    Attributes:
      members: ((key, split, uri, label name), ...) sorted.
      hashes: each member's hash, in the members' order.
      distance: the largest Hamming distance between two members.
    """

    members: Tuple[Tuple[str, str, str, str], ...]
    hashes: Tuple[int, ...]
    distance: int

    def to_json(self) -> str:
        return json.dumps({"conflict": self.conflicts, "distance": self.distance, "kind": KIND,
                           "labels": list(self.labels), "leak": self.leaks,
                           "members": [{"key": k, "label": label, "phash": f"{h:016x}", "split": s, "uri": u}
                                       for (k, s, u, label), h in zip(self.members, self.hashes)],
                           "splits": list(self.splits)}, sort_keys=True, ensure_ascii=False)


def groups(pairs: Iterable[Pair]) -> List[NearGroup]:
    """The connected groups of `pairs` (union-find), sorted; a group whose members all hold the same
    bytes is left out (an exact duplicate, already a duplicates.jsonl row of its own)."""
    parent: Dict[Tuple[str, str, str, str], Tuple[str, str, str, str]] = {}
    items: Dict[Tuple[str, str, str, str], Item] = {}

    def root(m):
        while parent[m] != m:
            parent[m] = parent[parent[m]]
            m = parent[m]
        return m

    for a, b in pairs:
        for item in (a, b):
            if item[2] not in parent:
                parent[item[2]] = item[2]
                items[item[2]] = item
        ra, rb = root(a[2]), root(b[2])
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the smaller root wins: the result does not depend on order
    members: Dict[Tuple[str, str, str, str], List[Item]] = {}
    for m in sorted(parent):
        members.setdefault(root(m), []).append(items[m])
    out = []
    for group in members.values():
        if len({item[1] for item in group}) == 1:
            continue
        hashes = [item[0] for item in group]
        far = max(distance(a, b) for i, a in enumerate(hashes) for b in hashes[i + 1:])
        out.append(NearGroup(tuple(item[2] for item in group), tuple(hashes), far))
    return sorted(out, key=lambda g: (not g.leaks, not g.conflicts, g.members))


def hashes_text(hashes: Sequence[Optional[int]], keys_sha256: str) -> bytes:
    """A shard's hashes file: a header naming the hash and the keys file it goes with (the manifest
    records that one's digest), then one line per record in shard order, 16 hex digits or '-' (none)."""
    lines = [json.dumps({"hash": NAME, "keys_sha256": keys_sha256}, sort_keys=True)]
    lines += ["-" if h is None else f"{h:016x}" for h in hashes]
    return ("\n".join(lines) + "\n").encode("ascii")


def parse_hashes(data: bytes, keys_sha256: Optional[str], count: int) -> Optional[List[Optional[int]]]:
    """The hashes of a hashes file written with the keys file of digest `keys_sha256` and `count`
    records, or None when it is another's, another hash's or not one."""
    try:
        head, *rows = data.decode("ascii").rstrip("\n").split("\n")
        header = json.loads(head)
        if header != {"hash": NAME, "keys_sha256": keys_sha256} or len(rows) != count:
            return None
        return [None if r == "-" else int(r, 16) for r in rows]
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
