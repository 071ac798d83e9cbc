"""Writes a shard of array rows (array_rows.RowShard) from its columns, with no ref per row.

Its records, keys file, resume fingerprint and staged contents are byte for byte those that
ShardWriter.write gives the shard's refs (tests/test_row_writer.py): every per-row line of a row
shard differs from the next only by the row's number, its label and its digest, so each line is one
%-format of a template made per label. The local engine's arrays builds take this path.
"""

from __future__ import annotations

import json
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from imagerecords.format import side_files

from imagerecords.format.record_format import RecordWriter
from imagerecords.pipeline.encode import arrays as array_encode
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.plan import array_rows
from imagerecords.pipeline.refs import LabelMap, Rejected
from imagerecords.pipeline.read import array_files as arrays
from imagerecords.pipeline.write import dataset_files, fingerprint

_ascii = json.encoder.encode_basestring_ascii  # json.dumps' spelling of a str (the fingerprint's)
_utf8 = json.encoder.encode_basestring  # json.dumps(ensure_ascii=False)'s (keys files, staged records)


def _open(quoted: str) -> str:
    """A quoted JSON string without its closing quote, as a %-format's constant part."""
    return quoted[:-1].replace("%", "%%")


def _whole(quoted: str) -> str:
    return quoted.replace("%", "%%")


def _spell(formats: List[str], codes: List[int], sep: str, *columns: List[Any]) -> str:
    """sep.join(formats[c] % (row's values) for each row): one % over the joined formats, as a %
    per row cost twice as much (a row's values are the k-th item of each of `columns`)."""
    args: List[Any] = [None] * (len(codes) * len(columns))
    for k, column in enumerate(columns):
        args[k::len(columns)] = column
    return sep.join(map(formats.__getitem__, codes)) % tuple(args)


def fingerprint_text(shard: array_rows.RowShard) -> str:
    """fingerprint._fingerprint_line of each of the shard's refs, in shard order, joined."""
    key = _open(_ascii(arrays.key_prefix(shard.path))) + arrays.ROW_NUMBER + '"'
    uri = _open(_ascii(arrays.uri_prefix(shard.path))) + '%d"'
    split = _whole(_ascii(shard.split))
    formats = [fingerprint.ref_line(key, uri, _whole(_ascii(text)), label_id, split, shard.size)
               for text, label_id in shard.labels]
    rows = shard.rows.tolist()
    return _spell(formats, shard.codes.tolist(), "", rows, rows)


def _names(shard: array_rows.RowShard, labels: LabelMap) -> List[Optional[str]]:
    """The label map's name of each of the shard's label codes (None: an id the map does not name)."""
    out = []
    for _, label_id in shard.labels:
        k = label_id - labels.offset
        out.append(labels.names[k] if 0 <= k < len(labels.names) else None)
    return out


def written_lines(shard: array_rows.RowShard, positions, digests: bytes, labels: LabelMap, contents: bool = True
                  ) -> Tuple[bytes, str]:
    """The keys file (side_files.format_keys) of the written rows and, with `contents`, the staged
    record's `contents` entries as shard_writer._staged_record_bytes spells a ref shard's
    (["digest hex",[key, split, uri, label name]] joined by commas; else ""). The rows are given by
    their `positions` in the shard and their 16-byte `digests`, back to back, in shard order."""
    if not len(positions):
        return b"", ""
    names = [_whole(_utf8(name or "")) for name in _names(shard, labels)]
    hexed = digests.hex()
    digest_of = [hexed[k:k + 32] for k in range(0, len(hexed), 32)]
    rows, codes = shard.rows[positions].tolist(), shard.codes[positions].tolist()
    key = _open(_utf8(arrays.key_prefix(shard.path))) + arrays.ROW_NUMBER
    formats = [side_files.keys_line("%s", key + '"', name, str(shard.size)) for name in names]
    keys = (_spell(formats, codes, "\n", digest_of, rows) + "\n").encode("utf-8")
    if not contents:
        return keys, ""
    uri, split = _open(_utf8(arrays.uri_prefix(shard.path))), _whole(_utf8(shard.split))
    formats = [dataset_files.contents_entry("%s", key + '"', split, uri + '%d"', name) for name in names]
    return keys, _spell(formats, codes, ",", digest_of, rows, rows)


def histogram(shard: array_rows.RowShard, positions) -> Tuple[Tuple[int, int], ...]:
    """((label id, records), ...) of the written rows, sorted by id (two texts may share an id)."""
    counts = np.bincount(shard.codes[positions], minlength=len(shard.labels)).tolist()
    by_id: dict = {}
    for (_, label_id), n in zip(shard.labels, counts):
        if n:
            by_id[label_id] = by_id.get(label_id, 0) + n
    return tuple(sorted(by_id.items()))


def write_shard(shard: array_rows.RowShard, writer: RecordWriter, *, preset: str, labels: LabelMap,
                options: codec.ImageOptions, on_progress: Optional[Callable[[int, int], None]] = None
                ) -> Tuple[RecordWriter, List[Rejected], Any, bytes]:
    """Writes the shard's rows as records through `writer` (closed at the end), as
    stream.write_shard writes its refs.

    Returns:
      The record writer (counts, offsets, checksums), the rejected rows, the written rows'
      positions in the shard (int64) and their 16-byte content digests back to back.
    """
    ids = np.array([label_id for _, label_id in shard.labels] or [0], np.int64)
    label_ids = ids[shard.codes] if len(shard) else np.zeros(0, np.int64)
    rejected: List[Rejected] = []
    positions: List[Any] = []
    digests: List[bytes] = []
    done = 0
    for item in array_encode.encode_positions(shard.path, shard.rows, label_ids, shard.ref, preset, labels, options):
        if isinstance(item, array_encode.Run):
            writer.write_many(item.records)
            positions.append(item.positions)
            digests.extend(item.contents)
            done += len(item.positions)
        else:
            k, result = item
            done += 1
            if isinstance(result, Rejected):
                rejected.append(result)
            else:
                writer.write(result.record)
                positions.append(np.array([k], np.int64))
                digests.append(result.content)
        if on_progress is not None:
            on_progress(done, len(rejected))
    writer.close()
    written = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    return writer, rejected, written, b"".join(digests)

