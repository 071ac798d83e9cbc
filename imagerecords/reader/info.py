"""What a built dataset holds: the one manifest model (imagerecords.format.manifest) with full paths, for the readers.

A local dataset's manifest is read without TensorFlow; gs:// and other schemes go through tf.io.gfile.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import posixpath
from typing import Dict, List, Mapping, Optional, Sequence, Union

from imagerecords.format import manifest as manifest_lib
from imagerecords.format import files, record_format
from imagerecords.format.paths import has_scheme, join
from imagerecords.format.manifest import Manifest, Shard, ShardColumns, Split
from imagerecords.format.errors import ReadError, FilesMissing


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file of a split.

    Attributes:
      index: shard number within the split.
      path: full path of the file (local or gs://).
      count: records in the shard.
      num_bytes: file size in bytes.
      sha256: hex digest of the file, as written.
      labels: {label id: records with that id}; ids include the label offset. Empty for a split
        whose manifest holds it as columns (format 3: the histograms are in its side file).
      index_path: full path of the shard's tfrecord2idx index file, when the build wrote one.
      index_sha256: hex digest of that index file, as written ('' when not recorded).
      ends_crc: its first and last records' data checksums, as written ('' when not recorded).
    """

    index: int
    path: str
    count: int
    num_bytes: int
    sha256: str
    labels: Mapping[int, int]
    index_path: Optional[str] = None
    index_sha256: str = ""
    ends_crc: str = ""

    @classmethod
    def of(cls, shard: Shard, folder: str) -> "ShardInfo":
        """The manifest's `shard` with its file names joined to the dataset `folder`."""
        return cls(index=shard.index, path=join(folder, shard.filename), count=shard.count,
                   num_bytes=shard.num_bytes, sha256=shard.sha256, labels=dict(shard.labels),
                   index_path=join(folder, shard.index_file) if shard.index_file else None,
                   index_sha256=shard.index_sha256 or "", ends_crc=shard.ends_crc or "")


class _ShardInfos(collections.abc.Sequence):
    """A columnar split's ShardInfos, made one at a time when asked for: loading a 1B-image
    manifest (572,917 shards) makes no per-shard object."""

    __slots__ = ("columns", "folder")

    def __init__(self, columns: ShardColumns, folder: str):
        self.columns, self.folder = columns, folder

    def __len__(self) -> int:
        return len(self.columns)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return ShardInfo.of(self.columns[i], self.folder)

    def __eq__(self, other) -> bool:
        if not isinstance(other, collections.abc.Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self)} shards of {self.columns.split!r}>"


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its shards in shard order.

    Attributes:
      name: split name.
      num_examples: records in the split (the sum of the shard counts).
      num_bytes: bytes in the split's shard files.
      shards: the shards, in shard order (a tuple; a sequence that makes each when asked for, for
        a split the manifest holds as columns).
    """

    name: str
    num_examples: int
    num_bytes: int
    shards: Sequence[ShardInfo]

    @classmethod
    def of(cls, split: Split, folder: str) -> "SplitInfo":
        """The manifest's `split`, its shards' paths joined to the dataset `folder`."""
        if isinstance(split.shards, ShardColumns):
            return cls(split.name, split.num_examples, split.num_bytes, _ShardInfos(split.shards, folder))
        return cls(split.name, split.num_examples, split.num_bytes, tuple(ShardInfo.of(s, folder) for s in split.shards))

    @property
    def files(self) -> List[str]:
        """Full paths of the shard files, in shard order."""
        return [s.path for s in self.shards]

    @property
    def shard_lengths(self) -> List[int]:
        """Records per shard, in shard order."""
        if isinstance(self.shards, _ShardInfos):
            return self.shards.columns.counts.tolist()
        return [s.count for s in self.shards]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """A built dataset, as its manifest describes it.

    Attributes:
      path: the dataset folder.
      name: dataset name (the shard file prefix).
      schema: example schema preset (see imagerecords.format.schema.PRESETS).
      label_names: class names; name `label_names[i]` has stored label id `i + label_offset`.
      label_offset: added to every label id by the builder (1 for ImageNet-style "0 = background").
      integer_labels: whether the source labels were integers rather than names.
      seed: the build's shuffle seed.
      splits: {split name: SplitInfo}.
      num_rejected: inputs the build rejected (listed in errors.jsonl).
      manifest: the typed manifest (imagerecords.format.manifest.Manifest), for fields this class does not lift out.
    """

    path: str
    name: str
    schema: str
    label_names: List[str]
    label_offset: int
    integer_labels: bool
    seed: int
    splits: Dict[str, SplitInfo]
    num_rejected: int
    manifest: Manifest = dataclasses.field(repr=False, compare=False)

    @classmethod
    def of(cls, manifest: Manifest, folder: str) -> "DatasetInfo":
        """The dataset `folder` as its (already loaded) `manifest` describes it."""
        return cls(path=folder, name=manifest.name, schema=manifest.schema, label_names=list(manifest.label_names),
                   label_offset=manifest.label_offset, integer_labels=manifest.integer_labels, seed=manifest.seed,
                   splits={split.name: SplitInfo.of(split, folder) for split in manifest.splits},
                   num_rejected=manifest.num_rejected, manifest=manifest)

    @property
    def num_classes(self) -> int:
        """Logits a classifier needs for the stored ids: len(label_names) + label_offset."""
        return len(self.label_names) + self.label_offset

    def split(self, name: str) -> SplitInfo:
        """Returns split `name`.

        Raises:
          ValueError: naming the split and the dataset's splits when it has no such split.
        """
        try:
            return self.splits[name]
        except KeyError:
            raise ReadError(f"{self.path} has no split {name!r}; its splits are "
                            f"{', '.join(sorted(self.splits)) or '(none)'}") from None

    def __str__(self) -> str:
        lines = [f"{self.name} at {self.path}: schema {self.schema}, {len(self.label_names)} labels "
                 f"(offset {self.label_offset})"]
        for name, s in sorted(self.splits.items()):
            lines.append(f"  {name}: {s.num_examples} records in {len(s.shards)} shards")
        return "\n".join(lines)


def load_info(path: Union[str, "DatasetInfo"]) -> DatasetInfo:
    """Reads `path`/manifest.json (local or gs://) into a DatasetInfo.

    Args:
      path: the dataset folder the builder wrote, or a DatasetInfo (returned unchanged).

    Returns:
      The dataset's DatasetInfo.

    Raises:
      FileNotFoundError: when the folder holds no manifest.json (no published build is there; the
        message says whether an unfinished build is, and how to finish or clear it).
      ValueError: when the manifest is unreadable (imagerecords.format.manifest.ManifestError) or of an
        unknown schema.
    """
    if isinstance(path, DatasetInfo):
        return path
    path = str(path)
    manifest = manifest_lib.load(path, _read, _exists, size=_size)
    return DatasetInfo.of(manifest, path)


def _size(path: str) -> int:
    if not has_scheme(path):
        return files.local_size(path)
    # TensorFlow: 3.4 s to import; load_info reads local files without it
    import tensorflow as tf

    if not tf.io.gfile.exists(path):
        raise FilesMissing(path)
    return tf.io.gfile.stat(path).length


def _read(path: str) -> bytes:
    if not has_scheme(path):
        with files.open_local(path) as f:
            return f.read()
    # TensorFlow: only for a path local files cannot read (as in _size)
    import tensorflow as tf

    if not tf.io.gfile.exists(path):
        raise FilesMissing(path)
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def _exists(path: str) -> bool:
    if not has_scheme(path):
        return os.path.exists(path)
    # TensorFlow: only for a path local files cannot read (as in _size)
    import tensorflow as tf

    return tf.io.gfile.exists(path)


def read_range(path: str, offset: int, length: int) -> bytes:
    """`length` bytes of the file at `path` from byte `offset` (fewer at its end): a local pread, or
    tf.io.gfile's ranged read elsewhere."""
    if not has_scheme(path):
        with files.open_local(path, buffering=0) as f:
            return os.pread(f.fileno(), length, offset)
    # TensorFlow: only for a path local files cannot read (as in _size)
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def file_size(path: str) -> int:
    """Bytes in the file at `path` (local: a stat; gs:// and other schemes: tf.io.gfile's stat).

    Raises:
      FileNotFoundError: naming `path` when it does not exist.
    """
    if not has_scheme(path):
        return files.local_size(path)
    # TensorFlow: only for a path local files cannot read (as in _size)
    import tensorflow as tf

    try:
        return tf.io.gfile.stat(path).length
    except tf.errors.NotFoundError:
        raise FilesMissing(f"{path} does not exist") from None


def _listdir(folder: str) -> List[str]:
    if not has_scheme(folder):
        try:
            return os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
    # TensorFlow: only for a path local files cannot read (as in _size)
    import tensorflow as tf

    try:
        return tf.io.gfile.listdir(folder)
    except tf.errors.NotFoundError:
        return []


def missing_files(split: SplitInfo) -> List[str]:
    """Returns the split's shard files that are not there (one folder listing, so cheap on gs://)."""
    if not split.shards:
        return []
    folders: Dict[str, set] = {}
    missing = []
    for path in split.files:
        folder, name = posixpath.split(path) if has_scheme(path) else os.path.split(path)
        if folder not in folders:
            folders[folder] = {n.rstrip("/") for n in _listdir(folder)}
        if name not in folders[folder]:
            missing.append(path)
    return missing



def check_tf_readable(info: DatasetInfo, caller: str) -> None:
    """Refuses, in one line naming the readers that do read them, a dataset whose record files are
    not TFRecord: tf.data's readers here walk TFRecord frames (their shard checks, the resumable order).

    Raises:
      ReadError: for a dataset of another record format.
    """
    fmt = record_format.of(info.manifest)
    if fmt is not record_format.TFRECORD:
        raise ReadError(f"{caller}: {info.path} holds {fmt.name} files, which tf.data does not read; read them with "
                        "imagerecords.grain.RecordSource, imagerecords.torch.RecordDataset"
                        + (", grain.sources.ArrayRecordDataSource or tfds.data_sources" if fmt.tfds_name ==
                           "array_record" else "") + " (docs/reader.md)")
