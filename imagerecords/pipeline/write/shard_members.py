"""What ShardWriter.write writes, behind one interface: a shard's refs (every input kind, each image
read and written by write_stream.write_shard) or an arrays build's RowShard (the columnar fast path,
row_writer). The writer around them (staging, the lock check, the rename, the index, the keys file
and the staged record) is one; only how records, keys lines and contents are made differs, and each
is spelled once in the modules these call.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from imagerecords.format import side_files

from imagerecords.pipeline.plan import array_rows, near
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.pipeline.read import array_files as arrays
from imagerecords.pipeline.write import row_writer
from imagerecords.pipeline.write import stream as write_stream


def _label_name(labels: LabelMap) -> Callable[[ImageRef], str]:
    names, offset = labels.names, labels.offset
    # The label map's name, not the input's text: "03" and "3" are one integer class, not a conflict.
    return lambda r: names[r.label_id - offset] if 0 <= r.label_id - offset < len(names) else ""


class RefMembers:
    """A shard given as refs in hash order; repeated keys are dropped (each a rejected row) before writing."""

    def __init__(self, refs: Sequence[ImageRef]):
        self.refs = refs
        self.duplicates: List[Rejected] = []
        self._kept: Sequence[ImageRef] = refs
        self._stats: Optional[write_stream.ShardStats] = None

    def __len__(self) -> int:
        return len(self.refs)

    def arrays_path(self) -> Optional[str]:
        """The arrays input these refs are rows of, or None when they are files, URLs or a registered
        source's (the refs say so: ref.row, set by the source that listed them)."""
        return arrays.ref_row(self.refs[0])[0] if self.refs and self.refs[0].row >= 0 else None

    def fingerprint(self) -> Tuple[Sequence[ImageRef], Optional[str]]:
        """(refs, lines) for fingerprint.shard_fingerprint."""
        return self.refs, None

    def to_write(self) -> int:
        """Drops the repeated keys; returns how many records are left to write."""
        self._kept, self.duplicates = write_stream.dedupe_sorted(self.refs)
        return len(self._kept)

    def write(self, writer, *, read_bytes: Callable[[str], bytes], preset: str, labels: LabelMap,
              options, features, executor, window: int, on_progress,
              perceptual: bool = False) -> Tuple[write_stream.ShardStats, List[Rejected]]:
        self._stats, rejected = write_stream.write_shard(
            self._kept, writer, read_bytes=read_bytes, preset=preset, labels=labels, options=options,
            executor=executor, window=window, on_progress=on_progress, features=features, perceptual=perceptual)
        return self._stats, rejected

    def hashes(self, labels: LabelMap) -> Tuple[List[Optional[int]], List[near.Item]]:
        """(every record's perceptual hash in shard order, the near-duplicate check's items of those
        that have one); both empty when none was taken."""
        stats = self._stats
        if all(h is None for h in stats.hashes):  # arrays rows (not hashed): no hashes file either
            return [], []
        name = _label_name(labels)
        return stats.hashes, [(h, digest.hex(), (r.key, r.split, r.uri, name(r)), False)
                              for h, (digest, r) in zip(stats.hashes, stats.contents) if h is not None]

    def staged(self, labels: LabelMap, contents: bool) -> Tuple[bytes, Any, int, Optional[str]]:
        """(keys file, staged contents, passthrough records, contents entries already spelled or None)."""
        stats = self._stats
        name = _label_name(labels)
        keys = side_files.format_keys([(r.key, name(r), r.size, digest) for digest, r in stats.contents])
        written = [(digest, (r.key, r.split, r.uri, name(r))) for digest, r in stats.contents] if contents else []
        return keys, written, stats.passthrough, None


class RowMembers:
    """An arrays build's shard as columns (array_rows.RowShard): no ref per row, rows never repeat."""

    def __init__(self, shard: array_rows.RowShard):
        self.shard = shard
        self.duplicates: List[Rejected] = []
        self._positions = self._digests = None

    def __len__(self) -> int:
        return len(self.shard)

    def arrays_path(self) -> Optional[str]:
        return self.shard.path

    def fingerprint(self) -> Tuple[Sequence[ImageRef], Optional[str]]:
        return (), row_writer.fingerprint_text(self.shard)

    def to_write(self) -> int:
        return len(self.shard)

    def write(self, writer, *, read_bytes, preset: str, labels: LabelMap, options, features, executor,
              window: int, on_progress, perceptual: bool = False) -> Tuple[write_stream.ShardStats, List[Rejected]]:
        written, rejected, self._positions, self._digests = row_writer.write_shard(
            self.shard, writer, preset=preset, labels=labels, options=options, on_progress=on_progress)
        return write_stream.ShardStats(written.count, written.num_bytes, written.sha256(),
                                       row_writer.histogram(self.shard, self._positions), 0, written.offsets,
                                       crc32c=written.crc32c(), ends_crc=written.ends_crc()), rejected

    def hashes(self, labels: LabelMap) -> Tuple[List[Optional[int]], List[near.Item]]:
        return [], []  # arrays rows are not hashed (docs/building.md, "Near-duplicates")

    def staged(self, labels: LabelMap, contents: bool) -> Tuple[bytes, Any, int, Optional[str]]:
        keys, spelled = row_writer.written_lines(self.shard, self._positions, self._digests, labels, contents)
        rows = self.shard.rows
        return (keys, array_rows.RowContents(self._digests if contents else b"",
                                             rows[self._positions] if contents else rows[:0]), 0, spelled)


def of(members: Union[Sequence[ImageRef], array_rows.RowShard]) -> Union[RefMembers, RowMembers]:
    return RowMembers(members) if isinstance(members, array_rows.RowShard) else RefMembers(members)
