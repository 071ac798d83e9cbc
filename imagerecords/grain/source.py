"""RecordSource: what grain.MapDataset.source() and grain.DataLoader read, one record by its index."""

from __future__ import annotations

import numbers
from typing import Any, Dict, Mapping, Optional, Sequence

from imagerecords.format import access, record_format, schema
from imagerecords.format import codecs
from imagerecords.format import features as features_lib
from imagerecords.format.files import Files
from imagerecords.format.paths import has_scheme, join
from imagerecords.format.errors import NoSuchFeature, OutOfRange, ReadError, WrongIndexType


class RecordSource:
    """One split of a built dataset as a Grain random-access data source (`__len__`, `__getitem__`).

    Record `i` is the split's i-th record in shard order, read by its index-file offset (one
    ranged read; local files or gs:// objects), both frame checksums checked, and decoded by
    manifest.json's feature spec exactly as `reader.as_dataset` decodes it: a dict {key: value}
    of every stored feature (or those named in `features`): images as uint8 [H, W, C] (uint16
    for 16-bit images; float32 for an --image_encoding raw build), numeric tensors of their dtype
    and shape, class lists as int64 ids, strings as str.

    Grain does the order, sharding, batching and checkpoints:

      import grain
      from imagerecords.grain import RecordSource
      source = RecordSource("OUT", "train")
      ds = grain.MapDataset.source(source).shuffle(seed=0).map(preprocess).batch(32, drop_remainder=True)
      it = iter(ds)            # a DatasetIterator: it.get_state() / it.set_state(state)

    A saved position means "the k-th element of this split's order"; on a rebuilt dataset it means
    other records. `repr(source)` carries the split's digest, which grain.DataLoader compares when
    it restores a checkpoint; for a MapDataset iterator save `source.get_state(it)` and restore
    with `source.set_state(it, state)`, which refuse a state of another build.

    Args:
      path: the dataset folder (local or gs://; gs:// needs google-cloud-storage).
      split: split name.
      features: the keys to return (default: every stored feature).
      index: "require" (default): a split whose shards have no index files is an error saying
        how to mend it (build with --write_index); "scan": find such a shard's offsets by
        reading it once, here, when the source is made.

    Raises:
      FileNotFoundError: when `path` holds no published dataset.
      ValueError: for an unknown split or feature, or a bad `index`; MissingIndexError (a
        ValueError) for shards without index files under index="require".
    """

    def __init__(self, path: str, split: str = "train", *, features: Optional[Sequence[str]] = None,
                 index: str = "require"):
        if index not in access.INDEX_POLICIES:
            raise ReadError(f"index must be one of {access.INDEX_POLICIES}, got {index!r}")
        if isinstance(features, str):
            raise ReadError(f"features must be a list of feature names, got the string {features!r}")
        self.path = str(path).rstrip("/") if has_scheme(str(path)) else str(path)
        self._files = Files()
        self.manifest = access.load_manifest(self.path, self._files)
        try:
            split_entry = self.manifest.split(split)
        except KeyError as e:
            raise ReadError(f"{self.path}: {e.args[0]}") from None
        self.split = split
        stored = {f.name: f for f in features_lib.stored(self.manifest)}
        wanted = sorted(stored) if features is None else list(features)
        unknown = [name for name in wanted if name not in stored]
        if unknown:
            raise ReadError(f"{self.path}: no feature(s) {', '.join(map(str, unknown))}; its records hold "
                            f"{', '.join(sorted(stored))}")
        self.features = tuple(stored[name] for name in wanted)
        keys = schema.keys(self.manifest.schema)
        # A raw image's shape is in the record's height and width.
        self._size_keys = ((keys.height, keys.width) if any(f.dtype == "image" and f.encoding == "raw"
                                                            for f in self.features) else ())
        self._only = {f.name for f in self.features} | set(self._size_keys)
        self.shard_paths = [join(self.path, s.filename) for s in split_entry.shards]
        self.digest = access.split_digest(split_entry.shards)
        self.record_format = record_format.of(self.manifest)
        self.offsets, self.lengths, self.shard_of = access.load_offsets(self._files, self.path, split,
                                                                        split_entry.shards, index, self.record_format)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, record_key: int) -> Dict[str, Any]:
        i = self._index(record_key)
        return self._decode(i, self.record(i))

    def record(self, i: int) -> bytes:
        """The serialized Example of record `i`, checked by its format (TFRecord: both CRCs of its frame).

        Raises:
          CorruptRecordError: naming the shard and byte offset of a bad frame.
        """
        i = self._index(i)
        shard_path, offset, length = self.shard_paths[self.shard_of[i]], int(self.offsets[i]), int(self.lengths[i])
        return access.read_record(self._files, self.record_format, self.path, shard_path, offset, length)

    def _index(self, key: Any) -> int:
        # bool is an int to Python; a float index (1.0 too) is a caller's bug, never rounded.
        if isinstance(key, bool) or not isinstance(key, numbers.Integral):
            raise WrongIndexType(f"record index must be an int (or a NumPy integer), got {type(key).__name__} {key!r}")
        i = int(key)
        if not 0 <= i < len(self):
            raise OutOfRange(f"record {i} is out of range for split {self.split!r} of {len(self)} records "
                             "(indices are 0 to len - 1; negative ones are not counted from the end)")
        return i

    def _decode(self, i: int, record: bytes) -> Dict[str, Any]:
        example = schema.parse_example(record, only=self._only)
        where = f"{self.shard_paths[self.shard_of[i]]}: record {i}"
        size = [int(example[k][0]) if example.get(k) else 0 for k in self._size_keys] or [0, 0]
        out = {}
        for feature in self.features:
            values = example.get(feature.name)
            if values is None:  # [] is a stored empty list (no boxes, no tags)
                raise NoSuchFeature(f"{where} has no {feature.name!r} feature (manifest.json's spec lists it)")
            try:
                if feature.dtype == "image":
                    if not values:
                        raise ReadError("an image feature with no bytes")
                    out[feature.name] = features_lib.image_to_numpy(feature, values[0], *size)
                else:
                    out[feature.name] = codecs.to_numpy(feature, values)
            except ValueError as e:
                raise ReadError(f"{where}: {e}") from None
        return out

    def get_state(self, iterator) -> Dict[str, Any]:
        """`iterator.get_state()` with this split's digest, so that `set_state` can refuse it elsewhere."""
        return {"dataset": self.digest, "split": self.split, "iterator": iterator.get_state()}

    def set_state(self, iterator, state: Mapping[str, Any]) -> None:
        """Restores a state from `get_state` into a Grain iterator over this source.

        Raises:
          ValueError: a state that is not get_state's, or one saved over another build or split.
        """
        if not isinstance(state, Mapping) or not {"dataset", "split", "iterator"} <= set(state):
            raise ReadError("not a RecordSource.get_state() state: expected a dict with 'dataset', 'split' and "
                            f"'iterator', got {type(state).__name__}")
        if state["dataset"] != self.digest or state["split"] != self.split:
            raise ReadError(
                f"this state was saved over another build (split {state['split']!r}, dataset {state['dataset']!r}; "
                f"this one is split {self.split!r}, dataset {self.digest!r}): its positions would name other "
                "records; start the epoch again, or read the build it was saved on")
        iterator.set_state(state["iterator"])

    def __repr__(self) -> str:
        # Grain's DataLoader checks a restored checkpoint against this text: the digest makes a rebuilt
        # dataset's differ, the path is left out so a copied dataset still matches.
        return f"RecordSource(split={self.split!r}, records={len(self)}, dataset={self.digest!r})"
