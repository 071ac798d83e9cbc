"""ImageRefCoder: the compact, deterministic encoding of the references that cross stages.

Without it Beam pickles each ImageRef dataclass (module and class names included, ~220 bytes for an
ImageNet-style path); the coder writes only the fields (~120 bytes) and is deterministic, so it
may key a GroupByKey. It is registered for ImageRef when this package is imported; the steps that
emit refs declare ImageRef as their output type so the runner picks it.
"""

from __future__ import annotations

from typing import Any, List, Tuple

from apache_beam import coders

from imagerecords.pipeline.refs import ImageRef

__all__ = ["ImageRefCoder", "RefList", "ShardGroup", "KeyedRef"]

_FIELDS = coders.TupleCoder([coders.StrUtf8Coder(), coders.StrUtf8Coder(), coders.NullableCoder(coders.StrUtf8Coder()),
                             coders.StrUtf8Coder(), coders.VarIntCoder(), coders.VarIntCoder(),
                             coders.VarIntCoder(), coders.StrUtf8Coder()])


class ImageRefCoder(coders.Coder):
    """Encodes an ImageRef as (key, uri, label or None, split, size, label_id, row + 1, extras)."""

    def encode(self, ref: ImageRef) -> bytes:
        # row + 1: a file's -1 is one varint byte as 0, not ten as a negative; extras last: unprefixed.
        return _FIELDS.encode((ref.key, ref.uri, ref.label, ref.split, ref.size, ref.label_id, ref.row + 1, ref.extras))

    def decode(self, data: bytes) -> ImageRef:
        key, uri, label, split, size, label_id, row, extras = _FIELDS.decode(data)
        return ImageRef(key, uri, label, split, size, label_id, extras, row - 1)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return ImageRef

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


coders.registry.register_coder(ImageRef, ImageRefCoder)

# Element types of the shuffle, declared so that every ref in them uses ImageRefCoder.
ShardKey = Tuple[str, int, int]  # (split, shard index, number of shards of the split)
# (shard key, (shuffle hash, ref)); the hash is an unsigned 64-bit int, past VarIntCoder's range.
KeyedRef = Tuple[ShardKey, Tuple[Any, ImageRef]]
RefList = List[ImageRef]
ShardGroup = Tuple[ShardKey, RefList]
