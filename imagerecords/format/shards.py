"""A split's shards as the manifest lists them: one `Shard` per file, or, for a large split,
`ShardColumns` (the same shards as columns, a Shard made only when asked for)."""

from __future__ import annotations

import array
import bisect
import collections.abc
import dataclasses
import re
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format.errors import ManifestError
from imagerecords.format.paths import inside_problem, segment_problem
from imagerecords.format.record_format import FRAME_OVERHEAD, index_file_name, shard_file_name, shard_prefix


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard file of a split.

    Attributes:
      index: shard number within the split.
      filename: file name relative to the dataset folder.
      count: records in the shard.
      num_bytes: file size in bytes.
      sha256: hex digest of the file.
      labels: ((label id, records with it), ...) sorted by id; ids include the label offset.
      passthrough: records whose image bytes are the source file unchanged.
      index_file: path (relative to the dataset folder) of the shard's tfrecord2idx index file
        (one "offset frame_length" line per record), when one was written.
      index_sha256: hex digest of the index file.
      image_kinds: ((kind, records), ...) sorted, where kind is 'format:channels:dtype' of the stored
        image as TensorFlow decodes it ('png:1:uint16'); only for builds whose image encoding is
        not 'jpeg' (a 'jpeg' build stores 3-channel uint8 JPEGs only).
      keys_sha256: hex digest of the shard's keys file (`keys/<shard>.jsonl`, what --append reads
        instead of the shard), when its build recorded one: only a keys file of that digest is used.
      ends_crc: the data checksums (frame footers) of its first and last records, 16 hex digits
        (records.ends_differ), when its build recorded them: every reader compares them when it opens
        the shard (three small reads), so another build's shard of the same size is refused.
    """

    index: int
    filename: str
    count: int
    num_bytes: int
    sha256: str
    labels: Tuple[Tuple[int, int], ...] = ()
    passthrough: int = 0
    index_file: Optional[str] = None
    index_sha256: Optional[str] = None
    image_kinds: Tuple[Tuple[str, int], ...] = ()
    keys_sha256: Optional[str] = None
    ends_crc: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        out = {"index": self.index, "filename": self.filename, "count": self.count, "num_bytes": self.num_bytes,
               "sha256": self.sha256, "labels": {str(k): v for k, v in self.labels}, "passthrough": self.passthrough}
        if self.index_file:
            out["index_file"] = self.index_file
        if self.index_sha256:
            out["index_sha256"] = self.index_sha256
        if self.image_kinds:
            out["image_kinds"] = dict(self.image_kinds)
        if self.keys_sha256:
            out["keys_sha256"] = self.keys_sha256
        if self.ends_crc:
            out["ends_crc"] = self.ends_crc
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Shard":
        """Reads a shard's row (a manifest's, a staged record's, a build's results).

        Raises:
          ManifestError: when its file or index file name would lead outside the dataset folder.
        """
        if "filename" in d:
            check_inside("shard file name", d["filename"])
        if d.get("index_file") is not None:
            check_inside("index file name", d["index_file"])
        ends = d.get("ends_crc")
        if ends and not (isinstance(ends, str) and len(ends) == _ENDS and _HEX.fullmatch(ends)):
            raise ManifestError(f"shard {d.get('filename')!r}: ends_crc {ends!r} is not {_ENDS} lowercase hex digits")
        return cls(index=int(d["index"]), filename=str(d["filename"]), count=int(d["count"]),
                   num_bytes=int(d["num_bytes"]), sha256=str(d["sha256"]),
                   labels=tuple(sorted((int(k), int(v)) for k, v in dict(d.get("labels") or {}).items())),
                   passthrough=int(d.get("passthrough", 0)), index_file=d.get("index_file"),
                   index_sha256=d.get("index_sha256"),
                   image_kinds=tuple(sorted((str(k), int(v)) for k, v in dict(d.get("image_kinds") or {}).items())),
                   keys_sha256=str(d["keys_sha256"]) if d.get("keys_sha256") else None,
                   ends_crc=str(d["ends_crc"]) if d.get("ends_crc") else None)


def count_problem(count: int, num_bytes: int, min_bytes: int = FRAME_OVERHEAD) -> Optional[str]:
    """Why a shard cannot hold `count` records in `num_bytes` bytes, or None. Every reader sizes its
    work by the count: a manifest saying 2**29 records for a 351-byte file once made make_dataset
    touch 6.7 GB for 40 records. Checked by `load`, the loader of every reader and verify."""
    if count < 0 or num_bytes < 0:
        return f"a negative count ({count}) or size ({num_bytes})"
    if count * min_bytes > num_bytes:
        return (f"{count} records cannot fit in {num_bytes} bytes (each record's frame takes at least "
                f"{min_bytes}); manifest.json is not the one its build wrote")
    return None


def check_inside(what: str, name: Any, one_part: bool = False) -> None:
    problem = segment_problem(name) if one_part else inside_problem(name)
    if problem:
        raise ManifestError(f"{what} {name!r} {problem}; every name in a manifest stays inside the dataset "
                            "folder (this one was altered, or not written by imagerecords)")


_HEX = re.compile("[0-9a-f]*")
_ENDS = 16  # hex digits of one Shard.ends_crc


class ShardColumns(collections.abc.Sequence):
    """A large split's shards as columns (format 3): a Shard is made only when one is asked for.

    Counts and sizes are arrays of int64, digests one hex string, file names runs of the name
    pattern; so 572,917 shards (1B images) load in one JSON parse of ~60 MB and no per-shard
    object. Shards made here carry no label histograms (they are in the split's side file).

    Attributes:
      dataset, split: the names the shard files are derived from.
      counts, sizes: records and bytes per shard, in shard order.
      sha256: the shards' hex digests, concatenated.
      runs: ((folder, first, num_shards, length, indexed), ...): `length` consecutive shards named
        `folder/shard_file_name(dataset, split, first + k, num_shards)` ('' folder: the dataset
        folder itself), with index files when `indexed`.
      index_sha256: the index files' hex digests, concatenated, in shard order.
      keys_sha256: the keys files' hex digests, concatenated, in shard order ('' when none recorded).
      ends_crc: the shards' Shard.ends_crc, concatenated, in shard order ('' when none recorded).
    """

    __slots__ = ("dataset", "split", "counts", "sizes", "sha256", "runs", "index_sha256", "keys_sha256", "ends_crc",
                 "_starts", "_index_starts")

    def __init__(self, dataset: str, split: str, counts: Sequence[int], sizes: Sequence[int], sha256: str,
                 runs: Sequence[Tuple[str, int, int, int, bool]], index_sha256: str = "", keys_sha256: str = "",
                 ends_crc: str = ""):
        self.dataset, self.split = dataset, split
        self.counts, self.sizes = array.array("q", counts), array.array("q", sizes)
        self.sha256, self.index_sha256, self.keys_sha256, self.ends_crc = sha256, index_sha256, keys_sha256, ends_crc
        self.runs = tuple((str(f), int(a), int(n), int(k), bool(x)) for f, a, n, k, x in runs)
        self._starts, self._index_starts = [], []
        at = indexed = 0
        for _, first, of, length, has_index in self.runs:
            if length < 1 or first < 0 or first + length > of:
                raise ValueError(f"a file run of split {split!r} names shards {first}..{first + length - 1} of {of}")
            self._starts.append(at)
            self._index_starts.append(indexed)
            at += length
            indexed += length if has_index else 0
        n = len(self.counts)
        if len(self.sizes) != n or at != n or len(sha256) != 64 * n or len(index_sha256) != 64 * indexed:
            raise ValueError(f"the columns of split {split!r} disagree: {n} counts, {len(self.sizes)} sizes, "
                             f"{len(sha256) / 64:g} digests, {at} file names, {len(index_sha256) / 64:g} index "
                             f"digests for {indexed} index files")
        if len(keys_sha256) not in (0, 64 * n):
            raise ValueError(f"the columns of split {split!r} disagree: {n} shards, {len(keys_sha256) / 64:g} keys "
                             "file digests")
        if len(ends_crc) not in (0, _ENDS * n):
            raise ValueError(f"the columns of split {split!r} disagree: {n} shards, {len(ends_crc) / _ENDS:g} end "
                             "checksums")
        if not all(_HEX.fullmatch(v) for v in (sha256, index_sha256, keys_sha256, ends_crc)):
            raise ValueError(f"the digests of split {split!r} are not lowercase hex")

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.counts)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"shard {i} of a split of {n}")
        r = bisect.bisect_right(self._starts, i) - 1
        folder, first, of, _, indexed = self.runs[r]
        k = i - self._starts[r]
        plain = shard_file_name(self.dataset, self.split, first + k, of)
        filename = f"{folder}/{plain}" if folder else plain
        index_file = index_sha256 = None
        if indexed:
            j = self._index_starts[r] + k
            index_file, index_sha256 = index_file_name(filename), self.index_sha256[64 * j:64 * j + 64]
        return Shard(i, filename, self.counts[i], self.sizes[i], self.sha256[64 * i:64 * i + 64],
                     index_file=index_file, index_sha256=index_sha256,
                     keys_sha256=self.keys_sha256[64 * i:64 * i + 64] or None,
                     ends_crc=self.ends_crc[_ENDS * i:_ENDS * i + _ENDS] or None)

    def __iter__(self) -> Iterator["Shard"]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, collections.abc.Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to a tuple of the same shards, which hashes otherwise

    def __repr__(self) -> str:
        return f"ShardColumns({self.split!r}, {len(self)} shards)"

    @property
    def total_count(self) -> int:
        return sum(self.counts)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def to_json(self) -> Dict[str, Any]:
        out = {"count": self.counts.tolist(), "num_bytes": self.sizes.tolist(), "sha256": self.sha256,
               "files": [list(r) for r in self.runs]}
        if self.index_sha256:
            out["index_sha256"] = self.index_sha256
        if self.keys_sha256:
            out["keys_sha256"] = self.keys_sha256
        if self.ends_crc:
            out["ends_crc"] = self.ends_crc
        return out

    @classmethod
    def from_json(cls, dataset: str, split: str, d: Mapping[str, Any]) -> "ShardColumns":
        """Reads a split's `columns`.

        Raises:
          ManifestError: a folder that leads outside the dataset folder.
          ValueError, TypeError, KeyError: columns that are malformed or disagree.
        """
        runs = []
        for folder, first, of, length, indexed in d["files"]:
            if folder:
                check_inside("shard folder", folder, one_part=True)
            if not all(type(v) is int for v in (first, of, length)) or type(indexed) is not bool:
                raise TypeError(f"a file run of split {split!r} is not [folder, first, of, length, indexed]")
            runs.append((folder, first, of, length, indexed))
        counts, sizes = d["count"], d["num_bytes"]
        if not (isinstance(counts, list) and isinstance(sizes, list) and isinstance(d["sha256"], str)
                and all(isinstance(d.get(k, ""), str) for k in ("index_sha256", "keys_sha256", "ends_crc"))):
            raise TypeError(f"the columns of split {split!r} are not lists and hex strings")
        return cls(dataset, split, counts, sizes, d["sha256"], runs, d.get("index_sha256", ""),
                   d.get("keys_sha256", ""), d.get("ends_crc", ""))

    @classmethod
    def encode(cls, dataset: str, split: str, shards: Sequence["Shard"]) -> Optional["ShardColumns"]:
        """`shards` as columns, or None when one of them does not fit (a file name off the pattern,
        an index out of order): such a split keeps its rows."""
        if isinstance(shards, ShardColumns):
            return shards
        pattern = re.compile(re.escape(shard_prefix(dataset, split) + "-") + r"(\d{5,})-of-(\d{5,})")
        runs: List[List[Any]] = []
        digests, index_digests = [], []
        keys_digests = [s.keys_sha256 or "" for s in shards]
        if any(keys_digests) and not all(len(d) == 64 and _HEX.fullmatch(d) for d in keys_digests):
            return None  # some shards' keys files have digests, others none: rows say which
        ends = [s.ends_crc or "" for s in shards]
        if any(ends) and not all(len(e) == _ENDS and _HEX.fullmatch(e) for e in ends):
            return None  # some shards have end checksums, others (empty, or an older build's) none
        for position, s in enumerate(shards):
            folder, _, plain = s.filename.rpartition("/")
            m = pattern.fullmatch(plain)
            if s.index != position or not m or len(s.sha256) != 64 or not _HEX.fullmatch(s.sha256):
                return None
            first, of = int(m.group(1)), int(m.group(2))
            if shard_file_name(dataset, split, first, of) != plain:
                return None
            indexed = s.index_file is not None
            if indexed and (s.index_file != index_file_name(s.filename) or not s.index_sha256
                            or len(s.index_sha256) != 64 or not _HEX.fullmatch(s.index_sha256)):
                return None
            if not indexed and s.index_sha256:
                return None
            last = runs[-1] if runs else None
            if last and last[0] == folder and last[2] == of and last[4] == indexed and last[1] + last[3] == first:
                last[3] += 1
            else:
                runs.append([folder, first, of, 1, indexed])
            digests.append(s.sha256)
            if indexed:
                index_digests.append(s.index_sha256)
        try:
            return cls(dataset, split, [s.count for s in shards], [s.num_bytes for s in shards], "".join(digests),
                       runs, "".join(index_digests), "".join(keys_digests), "".join(ends))
        except ValueError:
            return None
