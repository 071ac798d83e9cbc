"""Random access to one split's records through its index files: offsets, checked frames, the split's digest."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from imagerecords.format import manifest as manifest_lib
from imagerecords.format.errors import Error, FilesMissing
from imagerecords.format import record_format, records
from imagerecords.format.files import Files
from imagerecords.format.manifest import Manifest
from imagerecords.format.paths import has_scheme, join
from imagerecords.format.records import CorruptRecordError

INDEX_POLICIES = ("require", "scan")


class MissingIndexError(Error, ValueError):
    """The split's shards have no index files and index='require'; the message says how to mend it."""


class ShardSizeError(CorruptRecordError):
    """A shard file of another size than manifest.json lists: not the file the manifest describes."""


class ShardSwappedError(CorruptRecordError):
    """A shard file of the listed size whose first and last records are not the ones its build
    wrote (Shard.ends_crc): another build's shard of the same size copied over it."""


# What the owner of a shard that is not the listed file can do; every reader and `verify` say it.
SHARD_MEND = "restore the dataset's own file, or rebuild the dataset with --overwrite"

# Concurrent size requests for gs:// shards (each is one round trip); local stats need none.
_STAT_THREADS = 16


def size_mismatch(path: str, size: int, listed: int) -> str:
    """What is wrong with shard `path` whose file holds `size` bytes where manifest.json lists `listed`."""
    what = "larger" if size > listed else "smaller"
    return (f"shard {path} is {size} bytes, manifest.json lists {listed}: the file is {what} than the one the "
            "manifest describes (another build's shard copied over it, or a partial copy)")


def check_shards(dataset: str, shards: Sequence[Tuple[str, int, Optional[str]]], size_of: Callable[[str], int],
                 read_range: Callable[[str, int, int], bytes], *, policy: str = "fail",
                 fmt: Optional[record_format.RecordFormat] = None) -> List[Tuple[str, int, int]]:
    """Compares the size of every shard file a reader is about to open with manifest.json's, and
    then, for a file of the listed size, its first and last records' data checksums (Shard.ends_crc),
    before any record is read: the one check that keeps every reader from reading a file the
    manifest does not describe (a longer file would otherwise be read up to the manifest's count,
    and another build's shard of the same size read whole, silently).

    A file of the listed size whose records differ in count is caught by the frame checks when it
    is read. This check costs one stat (one metadata request on gs://) and three reads of at most
    12 bytes (three ranged requests) per shard; no shard is hashed whole.

    Args:
      dataset: the dataset folder (for the messages).
      shards: (full path, num_bytes, ends_crc from manifest.json) of each shard to open; ends_crc
        None (a manifest that records none) skips that comparison.
      size_of: the reader's own file size function (raises FileNotFoundError for a missing file).
      read_range: the reader's own (path, offset, length) -> bytes.
      policy: "fail" raises for a shard of another size; "skip" returns them to the caller,
        which reads what it can and reports the rest (make_dataset's corrupt_records="skip").
        A shard of the listed size with other end checksums is refused under both.
      fmt: the shards' record format, which compares a file's ends (None: TFRecord).

    Returns:
      (path, size on disk, size listed) of each shard of another size ("skip" only; [] otherwise).

    Raises:
      FileNotFoundError: naming every shard that is not there.
      ShardSizeError: (policy "fail") naming the first shard of another size, both sizes, how many
        other shards differ, and what to do.
      ShardSwappedError: naming the first shard of the listed size whose end checksums differ.
    """
    shards = list(shards)
    fmt = fmt or record_format.TFRECORD

    def size(path: str) -> Optional[int]:
        try:
            return size_of(path)
        except FileNotFoundError:
            return None

    paths = [path for path, _, _ in shards]
    if len(paths) > 1 and any(has_scheme(p) for p in paths):
        with ThreadPoolExecutor(min(_STAT_THREADS, len(paths))) as pool:
            sizes = list(pool.map(size, paths))
    else:
        sizes = [size(p) for p in paths]
    missing = [path for path, got in zip(paths, sizes) if got is None]
    if missing:
        raise FilesMissing(f"{len(missing)} of {len(shards)} shard(s) of {dataset} listed in manifest.json are "
                           f"missing: {', '.join(missing)}")
    differ = [(path, got, listed) for (path, listed, _), got in zip(shards, sizes) if got != listed]
    if differ and policy == "fail":
        others = f" ({len(differ) - 1} more shard(s) differ too)" if len(differ) > 1 else ""
        raise ShardSizeError(f"{size_mismatch(*differ[0])}{others}; `imagerecords verify {dataset}` names every "
                             f"such file; {SHARD_MEND}")
    listed_size = [(path, listed, ends) for (path, listed, ends), got in zip(shards, sizes) if got == listed and ends]

    def swapped(shard: Tuple[str, int, str]) -> bool:
        path, listed, ends = shard
        return fmt.ends_differ(lambda offset, length: read_range(path, offset, length), listed, ends)

    if len(listed_size) > 1 and any(has_scheme(p) for p, _, _ in listed_size):
        with ThreadPoolExecutor(min(_STAT_THREADS, len(listed_size))) as pool:
            found = list(pool.map(swapped, listed_size))
    else:
        found = [swapped(s) for s in listed_size]
    foreign = [path for (path, _, _), bad in zip(listed_size, found) if bad]
    if foreign:
        others = f" ({len(foreign) - 1} more shard(s) differ too)" if len(foreign) > 1 else ""
        raise ShardSwappedError(f"{swap_mismatch(foreign[0])}{others}; `imagerecords verify {dataset}` names every "
                                f"such file; {SHARD_MEND}")
    return differ


def swap_mismatch(path: str) -> str:
    """What is wrong with shard `path`, of the listed size, whose first or last record is not its build's."""
    return (f"shard {path} is not the file manifest.json lists: its first or last record's checksum differs from "
            "the one its build recorded (another build's shard of the same size copied over it)")


frames_problem = records.frames_problem  # spelled with the frames it describes


def load_manifest(path: str, files: Optional[Files] = None) -> Manifest:
    """Reads `path`/manifest.json (local or gs://) without TensorFlow (imagerecords.format.manifest.load).

    Raises:
      FileNotFoundError: when no build is published there (the message says whether an unfinished
        one is, and how to finish it).
      imagerecords.format.manifest.ManifestError: when the manifest is unreadable.
    """
    files = files or Files()
    return manifest_lib.load(path, files.read, lambda p: not has_scheme(p) and os.path.exists(p), size=files.size)


def split_digest(shards: Sequence) -> str:
    """What a saved reader position means: the split's records in order, whatever folder they sit in."""
    return hashlib.sha256(json.dumps([[s.count, s.sha256] for s in shards]).encode()).hexdigest()[:16]


def load_offsets(files: Files, path: str, split: str, shards: Sequence, index: str,
                 fmt: Optional[record_format.RecordFormat] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(record locator, length, shard number) of every record of a split, in split order: for
    TFRecord each frame's byte offset and length, for another format what its `entries` give.

    Args:
      files: the reader's Files.
      path: the dataset folder.
      split: its name (for messages).
      shards: the split's manifest Shards.
      index: "require" (a shard without an index file is an error saying how to mend it) or
        "scan" (such a shard's offsets are found by reading it once); a format whose files carry
        their own index needs none.
      fmt: the manifest's record format (record_format.of(manifest)); None: TFRecord.

    Raises:
      MissingIndexError: under index="require" when a shard has no index file.
      FileNotFoundError, ShardSizeError: a shard missing, or of another size than manifest.json
        lists (check_shards), before any index or shard is read.
      records.IndexFileError: an index file that differs from manifest.json (sha256, count, end).
      CorruptRecordError: a shard whose records disagree with manifest.json.
    """
    fmt = fmt or record_format.TFRECORD
    unindexed = [s for s in shards if not s.index_file] if fmt.index_files else []
    if unindexed and index == "require":
        raise MissingIndexError(
            f"{path}: {len(unindexed)} of the {len(shards)} shards of split {split!r} have no index file "
            "(the build ran without --write_index), and random access needs one; rebuild with "
            f"`imagerecords build --input ... --output {path} --write_index --overwrite`, or pass "
            "index='scan' to find the offsets by reading every unindexed shard once")
    check_shards(path, [(join(path, s.filename), s.num_bytes, s.ends_crc) for s in shards], files.size,
                 files.read_range, fmt=fmt)
    offsets, lengths, shard_of = [], [], []
    for number, shard in enumerate(shards):
        entries = fmt.entries(files, path, join(path, shard.filename), shard,
                              join(path, shard.index_file) if shard.index_file else None)
        offsets += [o for o, _ in entries]
        lengths += [n for _, n in entries]
        shard_of += [number] * len(entries)
    return np.asarray(offsets, np.int64), np.asarray(lengths, np.int64), np.asarray(shard_of, np.int32)


def read_record(files: Files, fmt: record_format.RecordFormat, dataset: str, shard_path: str, offset: int,
                length: int) -> bytes:
    """The record at a load_offsets entry of `shard_path`, checked by its format (TFRecord: one
    ranged read, both checksums).

    Raises:
      CorruptRecordError: naming the shard and where in it a short or damaged record is.
    """
    return fmt.record_at(files.read_range, dataset, shard_path, offset, length)
