"""What encoding one input gives the shard writer: the record and what the manifest counts of it."""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Encoded:
    """One image ready to write: the serialized Example and what the manifest counts.

    Attributes:
      record: the serialized Example.
      label_id: its label id.
      passthrough: whether the stored JPEG is the source file unchanged.
      content: a 16-byte digest of the source file's bytes (finds identical files under two keys).
      kind: codec.stored_kind of the stored image, when the encoding is not 'jpeg' (else "").
      phash: the image's perceptual hash (perceptual.phash), when asked for and taken.
    """

    record: bytes
    label_id: int
    passthrough: bool
    content: bytes = b""
    kind: str = ""
    phash: Optional[int] = None
