"""NumPy rows into Example records: one row at a time (`encode_ref`, the reference every path
agrees with), or a block of rows at once (`encode_rows`, `encode_positions`: the columnar fast
path, checked against `encode_ref` on one row of every layout). The input side (opening the
arrays, their columns, listing rows, the row key) is arrays.py."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

from imagerecords.format import codecs, features, schema
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.encode import png as png_writer
from imagerecords.pipeline.encode.encoded import Encoded
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.pipeline.read.array_files import Column, opened, ref_row


def encode_image(pixels, encoding: str, quality: int, png_level: int = codec.PNG_LEVEL) -> bytes:
    """A uint8 (H, W), (H, W, 1) or (H, W, 3) row as PNG (codec.png_bytes, at `png_level`) or JPEG."""
    if encoding != "jpeg":
        return codec.png_bytes(pixels, png_level)  # from the array: no Pillow image in between

    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    img = Image.fromarray(pixels)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def encode_ref(ref: ImageRef, preset: str, labels: LabelMap, options):
    """Row `ref` as an Example of its arrays' features (encoded.Encoded), or the rejected row
    naming the feature whose value does not fit."""
    path, i = ref_row(ref)
    arrays, _, columns = opened(path, preset, options.image_encoding)
    small: Dict[str, bytes] = {}
    large_key: Optional[str] = None
    large = b""
    digest = hashlib.sha256()
    for column in columns:
        value = arrays[column.array][i]
        digest.update(value.tobytes() if hasattr(value, "tobytes") else str(value).encode("utf-8"))
        if column.role in ("class", "names"):
            small[column.key] = schema.int64_list_feature([ref.label_id])
        elif column.role == "image":
            large_key, large = column.key, encode_image(value, column.feature.encoding, options.quality,
                                                         options.png_level)
        else:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "backslashreplace")
            try:
                checked = codecs.check(column.feature, str(value) if column.feature.dtype == "string" else value)
            except features.ValueProblem as e:
                return Rejected(ref.uri, f"row {i}: {e}", ref.key, ref.split, stage="decode", error="ValueProblem")
            small[column.key] = codecs.encode(column.feature, checked)
    return Encoded(schema.example_of(small, large_key, large), ref.label_id, False, digest.digest()[:16])


# Writing in bulk ---------------------------------------------------------------------------------
# Every record of a build whose features are fixed-shape numbers has one layout: the Example's
# entries in key order, each a constant prefix and the row's bytes, and the label's entry, which
# only changes with its varint's width. So a chunk of rows becomes one uint8 matrix of records per
# label width, handed to the format's writer at once (write_many); the per-row encoder checks one row
# of every layout.

# Rows encoded per block: a progress report per block, and memory bounded by BLOCK_BYTES of input
# rows (a block holds a few copies of them: values, records, what the writer makes of them).
BLOCK_ROWS = 2048
BLOCK_BYTES = 8 << 20


@dataclasses.dataclass
class Block:
    """Records of consecutive rows, ready for a format writer's write_many.

    Attributes:
      refs: the rows' refs, in shard order.
      records: their serialized Examples: a list of bytes, or a 2-D uint8 array of one record a row.
      contents: each row's 16-byte content digest (as encode_ref's).
    """

    refs: List[ImageRef]
    records: Any
    contents: List[bytes]


@dataclasses.dataclass(frozen=True)
class _Piece:
    """How one column's entry is made in bulk: 'label' (by the row's label id), 'raw' (a
    constant prefix, then the row's values as `wire` bytes: stored bytes, float32, or int64
    varints of 0..127, which are one byte each) or 'png' (a uint8 image, encoded a block of rows
    at a time by png_writer.encode_many)."""

    column: Column
    kind: str
    wire: str = ""


def _pieces(arrays: Mapping[str, Any], columns: Sequence[Column]) -> Optional[List[_Piece]]:
    """Each column's _Piece in key order, or None when some column needs the per-row encoder (an
    image, class names, strings, a dtype stored other than the array holds it, an empty row)."""
    out = []
    for column in sorted(columns, key=lambda c: c.key):
        a = arrays[column.array]
        f = column.feature
        if column.role == "class":
            out.append(_Piece(column, "label"))
            continue
        if column.role == "image" and f.encoding == "png" and a.dtype == np.uint8 and all(a.shape[1:]):
            out.append(_Piece(column, "png"))
            continue
        if column.role != "tensor" or not f.numeric or a.dtype != np.dtype(features._NUMPY[f.dtype]) \
                or not all(a.shape[1:]):
            return None
        if f.encoding == "bytes":
            wire = "bytes"
        elif f.dtype in ("float16", "float32"):
            wire = "float32"
        else:
            wire = "small_ints"
        out.append(_Piece(column, "raw", wire))
    return out


def _row_values(np, a, idx, wire: str):
    """(rows, regular, raw): the rows' values, which rows the bulk path may write, and the bytes it writes."""
    rows = np.ascontiguousarray(a[idx]).reshape(len(idx), -1)
    regular = np.ones(len(idx), bool)
    if wire == "small_ints":
        regular = ((rows >= 0) & (rows < 0x80)).all(axis=1)
        return rows, regular, np.where(regular[:, None], rows, 0).astype(np.uint8)
    if rows.dtype.kind == "f":
        regular = np.isfinite(rows).all(axis=1)
    if wire == "float32":  # float32 rows already are their wire bytes: no copy
        return rows, regular, rows.astype("<f4", copy=False).view(np.uint8)
    return rows, regular, rows.view(np.uint8)


def encode_rows(refs: Sequence[ImageRef], preset: str, labels: LabelMap, options
                ) -> Iterator[Union[Block, Tuple[ImageRef, Any]]]:
    """The rows of one shard (refs in shard order), as Blocks of records and, for rows the
    bulk path does not take (a NaN, an int list value past 127, a column it cannot write), as
    (ref, encode_ref's result): the same records in the same order as encode_ref row by row.
    Blocks end at the shard's middle row too, where progress is reported."""
    if not refs:
        return
    path = ref_row(refs[0])[0]
    idx = np.fromiter((r.row for r in refs), np.int64, len(refs))
    label_ids = np.fromiter((r.label_id for r in refs), np.int64, len(refs))
    for item in encode_positions(path, idx, label_ids, refs.__getitem__, preset, labels, options):
        if isinstance(item, Run):
            yield Block([refs[k] for k in item.positions.tolist()], item.records, item.contents)
        else:
            yield refs[item[0]], item[1]


@dataclasses.dataclass
class Run:
    """Records of consecutive written rows, by their positions in the shard (encode_positions).

    Attributes:
      positions: the rows' positions in the shard (int64), ascending.
      records, contents: as Block's.
    """

    positions: Any
    records: Any
    contents: List[bytes]


def encode_positions(path: str, idx, label_ids, ref_of: Callable[[int], ImageRef], preset: str, labels: LabelMap,
                     options) -> Iterator[Union[Run, Tuple[int, Any]]]:
    """encode_rows without a ref per row: a shard's input rows `idx` and their `label_ids` (int64,
    shard order) as Runs, and (position, encode_ref's result) for each row the bulk path does not
    take; `ref_of(position)` makes the ref of one row, for those and for the layout check."""
    if not len(idx):
        return
    arrays, _, columns = opened(path, preset, options.image_encoding)
    pieces = _pieces(arrays, columns)
    n = len(idx)
    middle = n // 2
    row_bytes = sum(a.itemsize * (a.size // a.shape[0]) for a in arrays.values()) or 1
    for start, stop in _blocks(n, middle, max(1, min(BLOCK_ROWS, BLOCK_BYTES // row_bytes))):
        if pieces is None:
            yield from ((k, encode_ref(ref_of(k), preset, labels, options)) for k in range(start, stop))
        else:
            yield from _encode_block(start, idx[start:stop], label_ids[start:stop], ref_of, arrays, columns, pieces,
                                     preset, labels, options)


def _blocks(n: int, middle: int, rows: int) -> Iterator[Tuple[int, int]]:
    for lo, hi in ((0, middle), (middle, n)):
        for start in range(lo, hi, rows):
            yield start, min(hi, start + rows)


def _encode_block(start: int, idx, label_ids, ref_of: Callable[[int], ImageRef], arrays, columns,
                  pieces: Sequence[_Piece], preset: str, labels: LabelMap, options
                  ) -> Iterator[Union[Run, Tuple[int, Any]]]:
    """One block: rows at positions start, start + 1, ... of their shard (input rows `idx`)."""
    if any(p.kind == "png" for p in pieces):
        yield from _encode_png_block(start, idx, label_ids, ref_of, arrays, columns, pieces, preset, labels, options)
        return
    m = len(idx)
    regular = np.ones(m, bool)
    raw: Dict[str, Any] = {}
    gathered: Dict[str, Any] = {}  # array name -> its rows, read from the input once
    for piece in pieces:
        if piece.kind == "raw":
            f = piece.column.feature
            gathered[piece.column.array], ok, raw[piece.column.array] = _row_values(
                np, arrays[piece.column.array], idx, piece.wire)
            if not (f.allow_nan and piece.wire != "small_ints"):
                regular &= ok
    # The content digest hashes each column's row bytes in column order, as encode_ref does.
    hashed = np.concatenate([(gathered[c.array] if c.array in gathered else np.ascontiguousarray(
        arrays[c.array][idx]).reshape(m, -1)).view(np.uint8) for c in columns], axis=1)
    label_piece = next((p for p in pieces if p.kind == "label"), None)
    entries = {}  # label id -> its entry
    if label_piece is not None:
        for i in np.unique(label_ids).tolist():
            entries[i] = schema.example_entry(label_piece.column.key, schema.int64_list_feature([i]))
    if entries:
        ids = np.array(sorted(entries), np.int64)
        widths = np.array([len(entries[i]) for i in ids.tolist()], np.int64)[np.searchsorted(ids, label_ids)]
    else:
        widths = np.zeros(m, np.int64)
    framed: Dict[int, Tuple[Any, Any]] = {}  # label entry width -> (records, the rows they hold)
    for width in np.unique(widths[regular]).tolist():
        rows = np.flatnonzero(regular & (widths == width))
        made = _records(np, rows, pieces, raw, label_ids, entries, width)
        if made is None or not _same_as_encoder(ref_of(start + int(rows[0])), made[0], hashed[rows[0]], preset,
                                                labels, options):
            regular[rows] = False  # a layout the per-row encoder disagrees with: those rows go row by row
            continue
        framed[width] = (made, rows)
    if regular.all() and len(framed) == 1:
        (made, _), = framed.values()
        yield Run(np.arange(start, start + m, dtype=np.int64), made, _digests(hashed))
        return
    framed = {w: (made, {int(r): k for k, r in enumerate(rows)}) for w, (made, rows) in framed.items()}
    yield from _in_runs(start, regular, lambda run: _run_of(start, run, framed, widths, hashed), ref_of, preset,
                        labels, options)


def _in_runs(start: int, regular, run_of: Callable[[List[int]], Run], ref_of: Callable[[int], ImageRef], preset: str,
             labels: LabelMap, options) -> Iterator[Union[Run, Tuple[int, Any]]]:
    """A block's rows in order: each run of consecutive `regular` rows as run_of(their places in the
    block), and every other row through the per-row encoder."""
    run: List[int] = []
    for i, ok in enumerate(regular.tolist()):
        if ok:
            run.append(i)
            continue
        if run:
            yield run_of(run)
            run = []
        yield start + i, encode_ref(ref_of(start + i), preset, labels, options)
    if run:
        yield run_of(run)


def _encode_png_block(start: int, idx, label_ids, ref_of: Callable[[int], ImageRef], arrays, columns,
                      pieces: Sequence[_Piece], preset: str, labels: LabelMap, options
                      ) -> Iterator[Union[Run, Tuple[int, Any]]]:
    """_encode_block for rows holding a PNG image: the images encoded together (encode_many), each
    record then joined from its entries (their lengths vary with the image's)."""
    m = len(idx)
    regular = np.ones(m, bool)
    gathered: Dict[str, Any] = {}
    raw: Dict[str, Any] = {}
    for piece in pieces:
        name = piece.column.array
        if piece.kind == "png":
            gathered[name] = np.ascontiguousarray(arrays[name][idx])
        elif piece.kind == "raw":
            gathered[name], ok, raw[name] = _row_values(np, arrays[name], idx, piece.wire)
            if not (piece.column.feature.allow_nan and piece.wire != "small_ints"):
                regular &= ok
    hashed = np.concatenate([(gathered[c.array] if c.array in gathered else np.ascontiguousarray(
        arrays[c.array][idx])).reshape(m, -1).view(np.uint8) for c in columns], axis=1)
    entries = {}  # label id -> its entry
    label_piece = next((p for p in pieces if p.kind == "label"), None)
    if label_piece is not None:
        for i in np.unique(label_ids).tolist():
            entries[i] = schema.example_entry(label_piece.column.key, schema.int64_list_feature([i]))
    # Per piece: ("label", None), ("raw", (constant prefix, the rows' value bytes)) or ("png", (key, images)).
    made = []
    for piece in pieces:
        name = piece.column.array
        if piece.kind == "label":
            made.append(("label", None))
        elif piece.kind == "png":
            made.append(("png", (piece.column.key, png_writer.encode_many(gathered[name], options.png_level))))
        else:
            values = raw[name]
            first = values[0].tobytes()
            feature = {"bytes": schema.bytes_feature, "float32": schema.float_list_feature}.get(piece.wire)
            feature = feature(first) if feature else schema.int64_list_feature(values[0].tolist())
            entry = schema.example_entry(piece.column.key, feature)
            if not entry.endswith(first):  # a layout the per-row encoder knows better: every row goes there
                regular[:] = False
                break
            made.append(("raw", (entry[:len(entry) - len(first)], values)))
    # The bytes before an image's entry, and before the record's entries, depend only on their
    # lengths: made once per length, not per row.
    image_prefixes: Dict[Tuple[str, int], bytes] = {}
    headers: Dict[int, bytes] = {}

    def image_prefix(key: str, size: int) -> bytes:
        prefix = image_prefixes.get((key, size))
        if prefix is None:
            prefix = image_prefixes[(key, size)] = schema.example_entry(key, schema.bytes_feature(bytes(size)))[:-size]
        return prefix

    frames: List[Optional[bytes]] = [None] * m
    ids = label_ids.tolist()
    for k in np.flatnonzero(regular).tolist():
        parts = []
        for kind, data in made:
            if kind == "label":
                parts.append(entries[ids[k]])
            elif kind == "png":
                image = data[1][k]
                parts += [image_prefix(data[0], len(image)), image]
            else:
                parts += [data[0], data[1][k].tobytes()]
        body = b"".join(parts)
        header = headers.get(len(body))
        if header is None:
            header = headers[len(body)] = schema.example_header(len(body))
        frames[k] = header + body
    first = next((k for k in range(m) if regular[k]), None)
    if first is not None and not _same_as_encoder(ref_of(start + first), np.frombuffer(frames[first], np.uint8),
                                                  hashed[first], preset, labels, options):
        regular[:] = False  # the per-row encoder disagrees: every row goes there
    yield from _in_runs(start, regular, lambda run: Run(
        np.array(run, np.int64) + start, [frames[i] for i in run], _digests(hashed[run])),
        ref_of, preset, labels, options)


def _records(np, rows, pieces, raw, label_ids, entries, width: int):
    """The records of `rows` (all of one label entry width) as a uint8 matrix, one a row, or None."""
    parts = []  # (constant bytes or None, the rows' bytes or None) in record order
    for piece in pieces:
        if piece.kind == "label":
            ids, where = np.unique(label_ids[rows], return_inverse=True)
            table = np.stack([np.frombuffer(entries[i], np.uint8) for i in ids.tolist()])
            parts.append((None, table[where.reshape(-1)]))
            continue
        values = raw[piece.column.array]
        values = values if len(rows) == len(values) else values[rows]  # all rows (sorted): no copy
        if piece.wire == "bytes":
            feature = schema.bytes_feature(values[0].tobytes())
        elif piece.wire == "float32":
            feature = schema.float_list_feature(values[0].tobytes())
        else:
            feature = schema.int64_list_feature(values[0].tolist())
        entry = schema.example_entry(piece.column.key, feature)
        prefix = len(entry) - values.shape[1]
        if prefix < 0 or entry[prefix:] != values[0].tobytes():
            return None
        parts.append((entry[:prefix], values))
    body = sum(len(c or b"") + (v.shape[1] if v is not None else 0) for c, v in parts)
    header = schema.example_header(body)
    frames = np.empty((len(rows), len(header) + body), np.uint8)
    at = 0
    for constant, values in [(header, None), *parts]:
        if constant:
            frames[:, at:at + len(constant)] = np.frombuffer(constant, np.uint8)
            at += len(constant)
        if values is not None:
            frames[:, at:at + values.shape[1]] = values
            at += values.shape[1]
    return frames


def _same_as_encoder(ref: ImageRef, record, hashed, preset: str, labels: LabelMap, options) -> bool:
    """Whether the per-row encoder gives this record and content digest for `ref`."""
    expected = encode_ref(ref, preset, labels, options)
    return not isinstance(expected, Rejected) and expected.record == bytes(record) \
        and expected.content == hashlib.sha256(hashed.tobytes()).digest()[:16]


def _digests(hashed) -> List[bytes]:
    data, size = memoryview(hashed.reshape(-1)), hashed.shape[1]
    sha = hashlib.sha256
    return [sha(data[i:i + size]).digest()[:16] for i in range(0, len(data), size)]


def _run_of(start: int, run: List[int], framed, widths, hashed) -> Run:
    made = []
    for i in run:
        rows, where = framed[int(widths[i])]
        made.append(rows[where[i]].tobytes())
    return Run(np.array(run, np.int64) + start, made, _digests(hashed[run]))
