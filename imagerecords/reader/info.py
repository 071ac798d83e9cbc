"""What a built dataset holds, read from its manifest.json: splits, shards, counts, labels, schema."""

from __future__ import annotations

import dataclasses
import os
import posixpath
from typing import Dict, List, Mapping, Optional, Tuple, Union

import tensorflow as tf

from imagerecords.format import schema
from imagerecords.format.paths import has_scheme, join
from imagerecords.format.manifest import MANIFEST, STAGING, Manifest, no_manifest_hint, unfinished_hint


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file of a split.

    Attributes:
      index: shard number within the split.
      path: full path of the file (local or gs://).
      count: records in the shard.
      num_bytes: file size in bytes.
      sha256: hex digest of the file, as written.
      labels: {label id: records with that id}; ids include the label offset.
      index_path: full path of the shard's tfrecord2idx index file, when the build wrote one.
    """

    index: int
    path: str
    count: int
    num_bytes: int
    sha256: str
    labels: Mapping[int, int]
    index_path: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its shards in shard order.

    Attributes:
      name: split name.
      num_examples: records in the split (the sum of the shard counts).
      num_bytes: bytes in the split's shard files.
      shards: the shards, in shard order.
    """

    name: str
    num_examples: int
    num_bytes: int
    shards: Tuple[ShardInfo, ...]

    @property
    def files(self) -> List[str]:
        """Full paths of the shard files, in shard order."""
        return [s.path for s in self.shards]

    @property
    def shard_lengths(self) -> List[int]:
        """Records per shard, in shard order."""
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
            raise ValueError(f"{self.path} has no split {name!r}; its splits are "
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
    manifest_path = join(path, MANIFEST)
    if not tf.io.gfile.exists(manifest_path):
        if tf.io.gfile.exists(join(path, STAGING)):
            raise FileNotFoundError(unfinished_hint(path))
        raise FileNotFoundError(no_manifest_hint(path))
    with tf.io.gfile.GFile(manifest_path, "rb") as f:
        manifest = Manifest.loads(f.read(), manifest_path)
    schema.keys(manifest.schema)  # fails early, naming the preset, if this reader does not know it
    splits = {}
    for split in manifest.splits:
        shards = tuple(
            ShardInfo(index=s.index, path=join(path, s.filename), count=s.count, num_bytes=s.num_bytes,
                      sha256=s.sha256, labels=dict(s.labels),
                      index_path=join(path, s.index_file) if s.index_file else None)
            for s in split.shards
        )
        splits[split.name] = SplitInfo(split.name, split.num_examples, split.num_bytes, shards)
    return DatasetInfo(
        path=path,
        name=manifest.name,
        schema=manifest.schema,
        label_names=list(manifest.label_names),
        label_offset=manifest.label_offset,
        integer_labels=manifest.integer_labels,
        seed=manifest.seed,
        splits=splits,
        num_rejected=manifest.num_rejected,
        manifest=manifest,
    )


def missing_files(split: SplitInfo) -> List[str]:
    """Returns the split's shard files that are not there (one folder listing, so cheap on gs://)."""
    if not split.shards:
        return []
    folders: Dict[str, set] = {}
    missing = []
    for path in split.files:
        folder, name = posixpath.split(path) if has_scheme(path) else os.path.split(path)
        if folder not in folders:
            try:
                folders[folder] = {n.rstrip("/") for n in tf.io.gfile.listdir(folder)}
            except tf.errors.NotFoundError:
                folders[folder] = set()
        if name not in folders[folder]:
            missing.append(path)
    return missing
