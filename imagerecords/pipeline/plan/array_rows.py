"""An arrays input's rows as NumPy columns: listed and assigned without a ref per row.

The local engine's launcher takes this path for an arrays build (engines/local.py): row indices,
64-bit shuffle hashes, split codes and label codes are arrays, planned by the plan every local
build takes (columns.plan, over RowTable), and each shard goes to its writer as (shard key,
RowShard), whose refs are made there. Every value is the one the ref path gives (arrays.list_refs,
refs.shuffle_hash / assign_split, assign.assign, assign.shard_order), so the shards, errors.jsonl
and duplicates.jsonl are byte-identical (tested).
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.plan import columns as columns_lib
from imagerecords.pipeline.refs import DuplicateGroup, ImageRef, LabelMap, Rejected
from imagerecords.pipeline.read import array_files as arrays

# Keys spell the row in 9 digits: below this many rows their text order is their row order,
# which the shard order's tie-break (equal hashes, by key) relies on.
MAX_ROWS = 10**9


def applies(config) -> bool:
    """Whether a build (a BuildConfig) takes this path: a local arrays input, not an append (which
    compares each row with the published dataset, ref by ref)."""
    return (arrays.is_arrays_input(config.input) and "://" not in config.input and not config.publish.append
            and not config.features)


@dataclasses.dataclass
class Listed:
    """An arrays input's usable rows, in row order.

    Attributes:
      path: the input as given (the refs' uri prefix).
      rows: the row indices (int64) whose label can be a class.
      codes: each of those rows' index into `texts` (int64).
      texts: the distinct label texts, as a ref's `label`.
      rejected: the rows whose label cannot be a class (arrays.list_refs' rows).
      row_bytes: a row's bytes over every array (a ref's `size`).
    """

    path: str
    rows: Any
    codes: Any
    texts: List[str]
    rejected: List[Rejected]
    row_bytes: int

    def key(self, i: int) -> str:
        return arrays.row_key(self.path, i)

    def uri(self, i: int) -> str:
        return arrays.row_uri(self.path, i)


def list_rows(path: str, preset: str, image_encoding: str) -> Listed:
    """arrays.list_refs' rows as columns: the same rows kept, the same rows rejected for the same reasons."""
    arrays.forget_if_changed(path)
    source, n, columns = arrays.opened(path, preset, image_encoding)
    if n >= MAX_ROWS:
        raise ValueError(f"{n} rows: the columnar listing orders keys of 9 digits")
    row_bytes = sum(a.itemsize * (int(a.size // a.shape[0]) if a.shape[0] else 0) for a in source.values())
    label = next((c for c in columns if c.role in ("class", "names")), None)
    listed = Listed(path, np.arange(n, dtype=np.int64), np.zeros(n, np.int64), [""], [], row_bytes)
    if label is None:
        return listed
    values = source[label.array]
    bad: Dict[int, str] = {}  # row -> why its label cannot be a class
    if label.role == "class":
        negative = np.flatnonzero(values < 0)
        above = np.flatnonzero(values > arrays.MAX_CLASS_ID)
        for i in negative.tolist() + above.tolist():
            bad[i] = arrays.class_id_problem(int(values[i]))
        distinct, inverse = np.unique(values, return_inverse=True)
        texts = [str(int(v)) for v in distinct.tolist()]
    else:
        distinct, inverse = np.unique(values, return_inverse=True)
        texts, problems = [], {}
        for k, v in enumerate(distinct.tolist()):
            text = arrays.label_text(v)
            texts.append(text)
            problem = arrays.class_name_problem(text)
            if problem is not None:
                problems[k] = problem
        inverse = inverse.reshape(-1)
        for k, problem in problems.items():
            for i in np.flatnonzero(inverse == k).tolist():
                bad[i] = problem
    inverse = inverse.reshape(-1).astype(np.int64)
    # Distinct values can share a text (a bytes label and its escape): one code per text.
    table = sorted(set(texts))
    index = {t: c for c, t in enumerate(table)}
    codes = np.array([index[t] for t in texts], np.int64).reshape(-1)[inverse]
    keep = np.ones(n, bool)
    if bad:
        keep[np.fromiter(bad, np.int64, len(bad))] = False
        listed.rejected = [Rejected(listed.uri(i), bad[i], listed.key(i), stage="label") for i in sorted(bad)]
    used = np.unique(codes[keep])
    # Only the texts of kept rows make the vocabulary: renumber the codes over them.
    renumber = np.full(len(table), -1, np.int64)
    renumber[used] = np.arange(len(used))
    listed.rows = np.flatnonzero(keep).astype(np.int64)
    listed.codes = renumber[codes[keep]]
    listed.texts = [table[c] for c in used.tolist()]
    return listed


# Rows per task when hashes are shared by worker processes: below this many, one process does it.
HASH_CHUNK = 50_000


def hashes(salt: str, path: str, rows, pool=None) -> Any:
    """refs.hash64(salt, key) of each row's key, as a uint64 array; with a process `pool` (an
    Executor) and enough rows, in chunks on its workers (a Python call per row: ~1 s per million)."""
    if pool is not None and len(rows) >= 2 * HASH_CHUNK:
        chunks = [rows[i:i + HASH_CHUNK] for i in range(0, len(rows), HASH_CHUNK)]
        return np.concatenate(list(pool.map(hashes, [salt] * len(chunks), [path] * len(chunks), chunks)))

    prefix = arrays.key_prefix(path).encode("utf-8")
    start = hashlib.blake2b(digest_size=8, person=refs_lib._person(salt))
    out = bytearray()
    for i in rows.tolist():
        h = start.copy()  # a copy of the salted state costs less than a new hash with its salt
        h.update(b"%s%09d" % (prefix, i))
        out += h.digest()
    return np.frombuffer(bytes(out), ">u8").astype(np.uint64)


def _hash_range(salt: str, path: str, lo: int, hi: int) -> Any:
    return hashes(salt, path, np.arange(lo, hi, dtype=np.int64))


class RowHashes:
    """hashes(salt, path, rows) for rows of 0..n-1, started at once on a process pool's workers (a
    key's hash needs only its row number, so they run while the launcher lists the labels) and
    gathered by `of`; the chunks no worker has started by then are hashed by the caller."""

    CHUNK = 20_000

    def __init__(self, salt: str, path: str, n: int, pool=None):
        self._salt, self._path, self._all = salt, path, None
        self._chunks = [(lo, min(n, lo + self.CHUNK)) for lo in range(0, n, self.CHUNK)]
        self._futures = ([pool.submit(_hash_range, salt, path, lo, hi) for lo, hi in self._chunks]
                         if pool is not None and n >= 2 * HASH_CHUNK else [None] * len(self._chunks))

    def of(self, rows) -> Any:
        """hashes(salt, path, rows)."""
        if self._all is None:
            parts = [_hash_range(self._salt, self._path, lo, hi) if f is None or f.cancel() else f.result()
                     for (lo, hi), f in zip(self._chunks, self._futures)]
            self._all = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        return self._all[rows]


@dataclasses.dataclass
class Assigned:
    """The listed rows with a split and a label id (assign.assign's results).

    Attributes:
      rows, codes, hashes: the kept rows, their label codes and shuffle hashes.
      texts: the label text of each label code.
      splits: each kept row's index into `names`.
      names: split names.
      label_ids: the label id of each label code.
      rejected: the rows assign.assign turns away.
    """

    rows: Any
    codes: Any
    hashes: Any
    texts: List[str]
    splits: Any
    names: List[str]
    label_ids: List[int]
    rejected: List[Rejected]


def assign(listed: Listed, labels: LabelMap, splits: Optional[Sequence[Tuple[str, float]]], split_seed: int,
           seed: int, pool=None, shuffled: Optional[RowHashes] = None, split: Optional[RowHashes] = None) -> Assigned:
    """assign.assign of every listed row, with each kept row's shuffle hash (hashes, on `pool`'s
    workers, or from `shuffled` and `split`, the RowHashes of the shuffle and split salts)."""
    rows, codes = listed.rows, listed.codes
    if splits:
        names = [name for name, _ in splits]
        u = (split.of(rows) if split is not None else hashes(refs_lib.split_salt(split_seed), listed.path, rows, pool)
             ).astype(np.float64) / 2.0**64
        # refs.assign_split on NumPy: the first split whose running sum exceeds u, else the last.
        split_of = np.minimum(np.searchsorted(np.array(refs_lib.split_bounds(splits)), u, side="right"), len(names) - 1)
    else:
        names = ["train"]
        split_of = np.zeros(len(rows), np.int64)
    rejected: List[Rejected] = []
    keep = np.ones(len(rows), bool)
    for s, name in enumerate(names):
        problem = refs_lib.split_name_problem(name)
        if problem:
            for k in np.flatnonzero(split_of == s).tolist():
                i = int(rows[k])
                rejected.append(Rejected(listed.uri(i), problem, listed.key(i), name, stage="label"))
            keep &= split_of != s
    label_ids = []
    for c, text in enumerate(listed.texts):
        label_id = labels.label_id(text)
        label_ids.append(-1 if label_id is None else label_id)
        if label_id is None:
            reason = refs_lib.unknown_label_reason(labels, text)
            for k in np.flatnonzero(keep & (codes == c)).tolist():
                i = int(rows[k])
                rejected.append(Rejected(listed.uri(i), reason, listed.key(i), names[split_of[k]], stage="label"))
            keep &= codes != c
    rows, codes, split_of = rows[keep], codes[keep], split_of[keep]
    shuffle = shuffled.of(rows) if shuffled is not None else hashes(refs_lib.shuffle_salt(seed), listed.path, rows, pool)
    return Assigned(rows, codes, shuffle, listed.texts, split_of, names, label_ids, rejected)


@dataclasses.dataclass
class RowShard:
    """One shard's rows as its writer gets them: what it needs to make their refs, in shard order.

    Attributes:
      path: the arrays input as given.
      split: the shard's split.
      size: each ref's size (the row's bytes).
      rows: the rows (int64), in shard order.
      codes: each row's index into `labels`.
      labels: (label text, label id) per code.
    """

    path: str
    split: str
    size: int
    rows: Any
    codes: Any
    labels: Tuple[Tuple[str, int], ...]

    def __len__(self) -> int:
        return len(self.rows)

    def ref(self, k: int) -> ImageRef:
        """The ref of the shard's row at position `k` (refs()[k])."""
        i, (text, label_id) = int(self.rows[k]), self.labels[int(self.codes[k])]
        return ImageRef(arrays.row_key(self.path, i), arrays.row_uri(self.path, i), text, self.split, self.size,
                        label_id, row=i)

    def refs(self) -> List[ImageRef]:
        """The shard's refs in shard order: those assign.shard_order gives from the ref path's pairs."""
        key, uri = arrays.key_prefix(self.path).replace("%", "%%") + arrays.ROW_NUMBER, arrays.uri_prefix(self.path)
        texts = [sys.intern(t) for t, _ in self.labels]
        ids = [i for _, i in self.labels]
        split, size = self.split, self.size
        return [ImageRef(key % i, f"{uri}{i}", texts[c], split, size, ids[c], row=i)
                for i, c in zip(self.rows.tolist(), self.codes.tolist())]


class RowTable:
    """An arrays build's assigned rows as the plan's columns (columns.plan); a shard's members are
    its RowShard."""

    def __init__(self, assigned: Assigned, path: str, row_bytes: int):
        self.assigned, self._path, self._row_bytes = assigned, path, row_bytes

    def __len__(self) -> int:
        return len(self.assigned.rows)

    def columns(self) -> columns_lib.Columns:
        a = self.assigned
        return columns_lib.Columns(a.hashes, a.splits, a.names, self._row_bytes)

    def members(self, key: columns_lib.ShardKey, positions: Any) -> RowShard:
        a = self.assigned
        codes = a.codes[positions]
        used = np.unique(codes)
        return RowShard(self._path, key[0], self._row_bytes, a.rows[positions], np.searchsorted(used, codes),
                        tuple((a.texts[c], a.label_ids[c]) for c in used.tolist()))


@dataclasses.dataclass
class RowContents:
    """A row shard's written records for the duplicate check, as its writer sends them back: each
    record's 16-byte content digest back to back, and its row (StagedShard.contents' compact form:
    a (digest, member) tuple per record cost the launcher more to unpickle and index than the rest
    of its work)."""

    digests: bytes
    rows: Any

    @classmethod
    def of(cls, contents: Sequence[Tuple[bytes, Tuple[str, str, str, str]]], shard: Optional["RowShard"] = None
           ) -> "RowContents":
        """`contents` in compact form; with the `shard` they were written from, its rows are taken as
        they are when every row was written (contents keep shard order, so they are then the same rows)."""
        if isinstance(contents, RowContents):  # a row shard's writer sends them so already
            return contents
        if shard is not None and len(contents) == len(shard):
            return cls(b"".join([d for d, _ in contents]), shard.rows)
        rows = np.fromiter((arrays.row_of(m[2])[1] for _, m in contents), np.int64, len(contents))
        return cls(b"".join(d for d, _ in contents), rows)


class Contents:
    """The duplicate check of a row build (engines/local.py's _Contents on columns): digests and
    rows gathered per shard, sorted once; members are made only for digests held by two rows."""

    def __init__(self, path: str, assigned: Assigned, labels: LabelMap):
        self._path = path
        top = int(assigned.rows.max()) + 1 if len(assigned.rows) else 0
        self._split = np.zeros(top, np.int64)
        self._split[assigned.rows] = assigned.splits
        self._code = np.zeros(top, np.int64)
        self._code[assigned.rows] = assigned.codes
        self._names = assigned.names
        # The label map's name of each code, as the shard writer records it.
        self._label = [labels.names[i - labels.offset] if 0 <= i - labels.offset < len(labels.names) else ""
                       for i in assigned.label_ids]
        self._digests: List[bytes] = []
        self._rows: List[Any] = []

    def add(self, contents) -> None:
        """One shard's contents: a RowContents, or (digest, member) pairs (a shard reused by --resume)."""
        if not isinstance(contents, RowContents):
            contents = RowContents.of(contents)
        self._digests.append(contents.digests)
        self._rows.append(contents.rows)

    def groups(self) -> List[DuplicateGroup]:
        """The DuplicateGroup of every digest two or more rows hold (refs.duplicate_group)."""
        if not self._rows:
            return []
        rows = np.concatenate(self._rows)
        halves = np.frombuffer(b"".join(self._digests), ">u8").reshape(-1, 2)
        # Only rows whose first half repeats can share a digest: one sort of a column finds them
        # (a lexsort of every row's two halves cost the launcher's end of a build 50 ms in 200,000).
        first = np.sort(halves[:, 0])
        repeats = first[1:][first[1:] == first[:-1]]
        if not len(repeats):
            return []
        candidates = np.flatnonzero(np.isin(halves[:, 0], repeats))
        rows, halves = rows[candidates], halves[candidates]
        order = np.lexsort((halves[:, 1], halves[:, 0]))
        ordered = halves[order]
        same = (ordered[1:] == ordered[:-1]).all(axis=1)
        found = []
        # Runs of equal digests: only those of two rows or more are visited (not one step per row).
        bounds = np.concatenate([[0], np.flatnonzero(~same) + 1, [len(order)]])
        repeated = np.flatnonzero(np.diff(bounds) > 1)
        for start, end in zip(bounds[repeated].tolist(), bounds[repeated + 1].tolist()):
            members = []
            for i in rows[order[start:end]].tolist():
                members.append((arrays.row_key(self._path, i), self._names[self._split[i]], arrays.row_uri(self._path, i),
                                self._label[self._code[i]]))
            group = refs_lib.duplicate_group(ordered[start].astype(">u8").tobytes(), members)
            if group is not None:
                found.append(group)
        return found
