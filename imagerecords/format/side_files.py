"""The per-record side files beside each shard of a version folder, in folders no shard glob reaches:

    keys/<shard>.jsonl    one JSON line per record in shard order (key, class name, source size and
                          digest): what --append learns the stored records from without reading shards
    hashes/<shard>.txt    each record's perceptual hash (pipeline.plan.near.hashes_text): what an
                          append compares its images with

Their names, the keys file's format and the digest the manifest records (Shard.keys_sha256).
"""

from __future__ import annotations

import hashlib
import json
from typing import List, Optional, Sequence, Tuple

from imagerecords.format.manifest import Shard
from imagerecords.format.paths import join

KEYS_DIR = "keys"
KEYS_SUFFIX = ".jsonl"
# Beside the keys file: each record's perceptual hash (near.hashes_text), so that an append compares
# its images with the whole dataset's without reading a shard.
HASHES_DIR = "hashes"
HASHES_SUFFIX = ".txt"


def keys_name(shard_filename: str) -> str:
    """The keys file of a shard, relative to its version folder ('/' separated on every filesystem)."""
    return f"{KEYS_DIR}/{shard_filename}{KEYS_SUFFIX}"


def hashes_name(shard_filename: str) -> str:
    """The hashes file of a shard, relative to its version folder."""
    return f"{HASHES_DIR}/{shard_filename}{HASHES_SUFFIX}"


def side_names(shard_filename: str) -> Tuple[str, str]:
    """The per-record side files a shard may have (keys, hashes), relative to its version folder."""
    return keys_name(shard_filename), hashes_name(shard_filename)


def hashes_path(output: str, shard_filename: str) -> Optional[str]:
    """The hashes file of the shard a manifest names `shard_filename` (None: a shard without a folder)."""
    folder, _, plain = shard_filename.rpartition("/")
    return join(output, folder, hashes_name(plain)) if folder else None


def keys_path(output: str, shard_filename: str) -> Optional[str]:
    """The keys file of the shard a manifest names `shard_filename`, or None for a shard in the
    dataset folder itself (written before keys files: it has none)."""
    folder, _, plain = shard_filename.rpartition("/")
    return join(output, folder, keys_name(plain)) if folder else None


def keys_digest(data: bytes) -> str:
    """A keys file's digest, as the manifest records it (Shard.keys_sha256)."""
    return hashlib.sha256(data).hexdigest()


def keys_file_is_the_builds(data: bytes, shard: Shard) -> bool:
    """Whether `data` is the keys file `shard`'s build wrote: its digest is the manifest's. A shard
    whose build recorded none passes here (its row count is then all that can be checked)."""
    return not shard.keys_sha256 or keys_digest(data) == shard.keys_sha256


def keys_line(digest: str, key: str, label: str, size: str) -> str:
    """One keys-file line from its values already spelled as JSON (key and label quoted); the
    columnar writer (row_writer) passes %-format slots instead, to spell many rows at once."""
    return f'{{"digest": "{digest}", "key": {key}, "label": {label}, "size": {size}}}'


def format_keys(rows: Sequence[Tuple[str, str, int, bytes]]) -> bytes:
    """The keys file of a shard: one line per record in shard order, {key, label, size, digest}
    (digest: stream.content_digest of the source file's bytes, hex; size: -1 when not listed)."""
    # json.dumps(sort_keys=True, ensure_ascii=False) of each row, spelled out: the encoder's set-up per
    # call cost more than the line (a shard of 25,000 array rows).
    text = json.encoder.encode_basestring
    lines = []
    for k, label, size, digest in rows:
        if type(k) is not str or type(label) is not str or type(size) is not int:
            lines.append(json.dumps({"key": k, "label": label, "size": size, "digest": digest.hex()}, sort_keys=True,
                                    ensure_ascii=False))
            continue
        lines.append(keys_line(digest.hex(), text(k), text(label), repr(size)))
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def parse_keys(data: bytes) -> List[Tuple[str, str, int, bytes]]:
    """The rows of a keys file (format_keys).

    Raises:
      ValueError: a line that is not a keys row.
    """
    rows = []
    # Split at "\n" only: str.splitlines also splits at U+2028, U+0085 and others, which a key may hold raw.
    for line in data.decode("utf-8").split("\n"):
        if not line:
            continue
        d = json.loads(line)
        key, label, size, digest = d["key"], d["label"], d["size"], bytes.fromhex(d["digest"])
        if not (isinstance(key, str) and isinstance(label, str) and isinstance(size, int) and len(digest) == 16):
            raise ValueError(f"not a keys row: {line[:200]!r}")
        rows.append((key, label, size, digest))
    return rows
