"""NumPy input: an .npz file or a folder of .npy files, one record per row, one feature per array.

    data.npz        np.savez's members memory-mapped in place (np.savez_compressed's read whole: it
                    must then fit in memory once)
    data/           a folder of NAME.npy files, np.load(mmap_mode="r"): each worker reads only its rows

Every array's first dimension is the row count N. `image` and `label` go under the schema preset's
image and label keys; every other array is a tensor feature of its own name (features.from_json's
defaults: raw bytes for more than one dimension per row and for float64, a list otherwise).

  image   uint8 (N, H, W), (N, H, W, 1) or (N, H, W, 3): PNG (lossless; --image_encoding jpeg for JPEG,
          --image_encoding raw for the pixels' own bytes: a uint8 tensor of their shape, which
          make_dataset, as_dataset, torch, Grain and TFDS read back exactly, with no codec);
          any other dtype or shape: a raw tensor like any other array.
  label   an integer array (N,): the class label as given (int64); a string array (N,): class
          names (sorted vocabulary, int64 ids); anything else: a tensor.

Row i's key is `<file or folder name>:<i, 9 digits>` (`data.npz:000000123`), so --splits hashes
it as it does a path; its uri is `<path>#row=<i>`, which shard_writer.encode_ref hands to encode_ref here.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import sys
import zipfile
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from imagerecords.pipeline import codec
from imagerecords.pipeline.errors import InputError, UsageError
from imagerecords.pipeline.refs import MAX_INT_LABELS, ImageRef, LabelMap, Rejected, label_problem
from imagerecords.format import codecs, features, schema

# A row's key and uri: "<file or folder name>:<row, 9 digits>" and "<path>#row=<row>". Spelled here
# alone; the columnar writers (array_rows, row_writer) format many rows at once from these prefixes.
ROW_MARK = "#row="
ROW_NUMBER = "%09d"  # the row number in a key


def key_prefix(path: str) -> str:
    return os.path.basename(path.rstrip("/")) + ":"


def uri_prefix(path: str) -> str:
    return path + ROW_MARK


def row_key(path: str, i: int) -> str:
    return key_prefix(path) + ROW_NUMBER % i


def row_uri(path: str, i: int) -> str:
    return f"{path}{ROW_MARK}{i}"


def row_of(uri: str) -> Tuple[str, int]:
    """(arrays path, row number) of a row's uri."""
    path, _, row = uri.rpartition(ROW_MARK)
    return path, int(row)

# The numpy dtypes stored as they are; others must be cast first (the message says to which).
_DTYPES = {"uint8": "uint8", "int32": "int32", "int64": "int64", "float16": "float16", "float32": "float32",
           "float64": "float64", "bool": "bool"}
_WIDER = {"int8": "int32", "int16": "int32", "uint16": "int32", "uint32": "int64"}
# An integer label is a class id, and ids 0..max become the vocabulary: the manifest labels' cap.
MAX_CLASS_ID = MAX_INT_LABELS - 1


def is_arrays_input(path: str) -> bool:
    """Whether --input names NumPy arrays: an .npz file, or a local folder with .npy files in it."""
    if "://" not in path and os.path.isdir(path):
        try:
            return any(name.endswith(".npy") and not name.startswith(".") for name in os.listdir(path))
        except OSError:
            return False
    return path.lower().endswith(".npz")



def input_identity(path: str) -> str:
    """Name, size, inode, modification and change times of the input's files (the .npz, or every
    .npy of the folder): what a resumed build compares, since a row's ref holds no digest of its
    values. A stat, not a hash; the change time is what no copy tool can set back (`cp -p` and
    `rsync -a` restore the mtime), so a same-size rewrite is seen even with its mtime restored."""
    files = [path] if not os.path.isdir(path) else [
        os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".npy") and not n.startswith(".")]
    parts = []
    for name in files:
        try:
            st = os.stat(name)
            parts.append(f"{os.path.basename(name)}:{st.st_size}:{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}")
        except OSError:  # a remote .npz: its listing size is in the refs already
            parts.append(os.path.basename(name))
    return ";".join(parts)


def is_row(uri: str) -> bool:
    return ROW_MARK in uri


def _headers(path: str) -> Dict[str, Tuple[Tuple[int, ...], Any]]:
    """{array name: (shape, dtype)} read from the .npy headers only (no data)."""
    import numpy as np

    out = {}
    if not os.path.isdir(path):
        with zipfile.ZipFile(path) as z:
            for member in sorted(z.namelist()):
                if not member.endswith(".npy"):
                    raise InputError(f"--input {path}: member {member!r} is not a NumPy array (.npy); an .npz input "
                                     "holds arrays only: save it again without that member (np.savez)")
                with z.open(member) as f:
                    shape, dtype = _member_header(np, z, member, f)
                out[member[:-4]] = (tuple(shape), dtype)
        return out
    for name in sorted(os.listdir(path)):
        if name.endswith(".npy") and not name.startswith("."):
            a = np.load(os.path.join(path, name), mmap_mode="r", allow_pickle=False)
            out[name[:-4]] = (a.shape, a.dtype)
    return out


def _member_header(np, z: zipfile.ZipFile, member: str, f) -> Tuple[Tuple[int, ...], Any]:
    """(shape, dtype) of one .npy member of an .npz from its header (numpy's public readers; the
    rare format 3.0 header, for non-Latin-1 field names, by loading the member)."""
    version = np.lib.format.read_magic(f)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        with z.open(member) as whole:
            a = np.lib.format.read_array(whole, allow_pickle=False)
        return tuple(a.shape), a.dtype
    shape, _, dtype = read(f)
    return tuple(shape), dtype


# The input each process's array caches were opened from: absolute path -> input_identity then.
_OPENED: Dict[str, str] = {}


def forget_if_changed(path: str, identity: Optional[str] = None) -> None:
    """Drops this process's cached arrays when `path` (resolved against today's working directory)
    is not the input they were opened from, or its files changed since: the caches are keyed by the
    path as given, and a rebuild in the same process after the .npz was rewritten, or from another
    folder's data.npz, must never write the old rows."""
    key, now = os.path.abspath(path), identity if identity is not None else input_identity(path)
    if _OPENED.get(key) != now or len(_OPENED) != 1:
        open_arrays.cache_clear()
        _source.cache_clear()
        _OPENED.clear()
        _OPENED[key] = now


@functools.lru_cache(maxsize=4)
def open_arrays(path: str) -> Dict[str, Any]:
    """The input's arrays by name: .npy files and an .npz's stored members memory-mapped, its
    compressed ones read whole. Cached per process: the local engine opens it before it forks, so
    its workers share one copy of an .npz."""
    import numpy as np

    if not os.path.isdir(path):
        with zipfile.ZipFile(path) as zf:
            mapped = {info.filename[:-4]: _map_member(np, path, zf, info) for info in zf.infolist()
                      if info.filename.endswith(".npy")}
        with np.load(path, allow_pickle=False) as z:
            # Reading 600 MB through zipfile (and its CRC) was the launcher's longest step.
            return {name: mapped[name] if mapped.get(name) is not None else z[name] for name in sorted(z.files)}
    return {name[:-4]: np.load(os.path.join(path, name), mmap_mode="r", allow_pickle=False)
            for name in sorted(os.listdir(path)) if name.endswith(".npy") and not name.startswith(".")}


@dataclasses.dataclass(frozen=True)
class Column:
    """How one array is stored.

    Attributes:
      array: the array's name in the input.
      key: the feature key in the Example.
      role: 'image' (PNG or JPEG of a uint8 row), 'class' (the label id), 'names' (the label id of
        a class name), or 'tensor' (features.encode of the row).
      feature: the declared feature the manifest records (and a tensor is checked against).
    """

    array: str
    key: str
    role: str
    feature: features.Feature


def columns_of(headers: Mapping[str, Tuple[Tuple[int, ...], Any]], preset: str, image_encoding: str
               ) -> Tuple[int, List[Column]]:
    """The row count and each array's Column, from the arrays' shapes and dtypes.

    Raises:
      UsageError: no arrays, first dimensions that differ, a name or dtype that cannot be stored.
    """
    if not headers:
        raise InputError("no arrays found: an .npz holds them, or a folder holds NAME.npy files")
    scalars = sorted(name for name, (shape, _) in headers.items() if not shape)
    if scalars:
        raise UsageError(f"array(s) {', '.join(scalars)}: 0-d (shape []), one value for the whole input; every "
                         "array needs one row per record (np.full(n, value) for a constant)")
    counts = {name: shape[0] for name, (shape, _) in headers.items()}
    n = counts.get("image", counts.get("label"))
    if n is None:
        n = max(counts.values(), key=lambda c: (list(counts.values()).count(c), c))
    odd = sorted(name for name, c in counts.items() if c != n)
    if odd:
        shown = ", ".join(f"{name} {list(headers[name][0])}" for name in odd)
        raise UsageError(f"arrays {shown}: first dimension is not the row count {n} of the others; every array "
                         "needs one row per record (slice or drop those arrays and rerun)")
    keys = schema.keys(preset)
    out = []
    for name, (shape, dtype) in sorted(headers.items()):
        rows = tuple(shape[1:])
        kind = dtype.kind
        if 0 in rows:
            raise UsageError(f"array {name!r} of shape {list(shape)}: each row holds no values (a 0 past the row "
                             "count); drop the array, or give its rows a size")
        if name == "label" and kind == "f":
            raise UsageError(f"array 'label' is {dtype.name}: a class label is an integer id or a class name "
                             "(cast with .astype('int64')); to store float targets, save them under another name")
        if name == "image" and dtype == "uint8" and image_encoding == "raw":
            # --image_encoding raw: the pixels' own bytes with their shape, read back exactly (no codec)
            feature = features.from_json(keys.image, {"dtype": "uint8", "shape": list(rows), "encoding": "bytes"})
            out.append(Column(name, keys.image, "tensor", feature))
            continue
        if name == "image" and dtype == "uint8" and (len(rows) == 2 or (len(rows) == 3 and rows[2] in (1, 3))):
            channels = 1 if len(rows) == 2 else rows[2]
            feature = features.from_json(keys.image, {"dtype": "image", "encoding": image_encoding
                                                      if image_encoding == "jpeg" else "png", "channels": channels})
            out.append(Column(name, keys.image, "image", feature))
            continue
        if name == "label" and not rows and kind in "iub":
            out.append(Column(name, keys.label, "class", features.from_json(keys.label, {"dtype": "int64"})))
            continue
        if name == "label" and not rows and kind in "US":
            out.append(Column(name, keys.label, "names", features.from_json(keys.label, {"dtype": "int64"})))
            continue
        key = {"image": keys.image, "label": keys.label}.get(name, name)
        if kind in "US":
            if rows:
                raise UsageError(f"array {name!r}: strings of shape {list(shape)}; a string feature holds one "
                                 "string per row (N,)")
            out.append(Column(name, key, "tensor", features.from_json(key, {"dtype": "string"})))
            continue
        stored = _DTYPES.get(dtype.name)
        if stored is None:
            wider = _WIDER.get(dtype.name)
            hint = f"cast it first (np.save with a.astype({wider!r}))" if wider else \
                f"cast it to one of {', '.join(_DTYPES)}"
            raise UsageError(f"array {name!r}: dtype {dtype.name} cannot be stored; {hint}")
        try:
            feature = features.from_json(key, {"dtype": stored, "shape": list(rows)})
        except features.SpecError as e:
            raise UsageError(f"array {name!r}: {e}") from None
        out.append(Column(name, key, "tensor", feature))
    return n, out


def check_input(path: str, preset: str, image_encoding: str) -> int:
    """The launcher's check of an arrays input: readable, one row count; returns it.

    Raises:
      InputError: the file or folder cannot be read as arrays.
      UsageError: the arrays do not fit together (columns_of).
    """
    if "://" in path:
        raise InputError(f"--input {path}: arrays are read from a local file or folder; copy it to this "
                         "machine (or to a disk the workers mount) and rerun with its local path")
    if not os.path.exists(path):
        raise InputError(f"--input {path}: no such file or folder")
    if os.path.isdir(path):
        _check_only_arrays(path)
    try:
        headers = _headers(path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise InputError(f"--input {path}: cannot read it as NumPy arrays ({e})") from None
    n, _ = columns_of(headers, preset, image_encoding)
    if n == 0:
        raise InputError(f"--input {path}: holds 0 rows (every array's first dimension is 0): nothing to build")
    return n


def _check_only_arrays(folder: str) -> None:
    """Refuses a folder holding .npy files beside anything else: a class-folder tree with a stray
    .npy (or arrays with a stray README) must not silently become some other dataset."""
    names = [n for n in sorted(os.listdir(folder)) if not n.startswith(".")]
    npys = [n for n in names if n.endswith(".npy") and os.path.isfile(os.path.join(folder, n))]
    others = [n + ("/" if os.path.isdir(os.path.join(folder, n)) else "") for n in names if n not in npys]
    if others:
        raise InputError(f"--input {folder}: holds .npy arrays ({_some(npys)}) and other entries ({_some(others)}); "
                         "an arrays input is a folder of .npy files only: move the .npy files into a folder of "
                         "their own, or out of this one to build it as class folders")


def _some(names: List[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def label_type(config) -> str:
    """The label type of a build's vocabulary: an arrays build's string labels are class names even
    when they spell digits (ids 0, 1, ... by sorted name), its integer labels are ids as given."""
    if config.label_type != "auto" or not is_arrays_input(config.input):
        return config.label_type
    _, columns = columns_of(_headers(config.input), config.schema, config.image.image_encoding)
    role = next((c.role for c in columns if c.role in ("class", "names")), None)
    return {"class": "int", "names": "name"}.get(role, config.label_type)


def manifest_features(config) -> Dict[str, Any]:
    """manifest.json's "features" of a build (a BuildConfig): {} unless its input is arrays."""
    if not is_arrays_input(config.input):
        return {}
    _, columns = columns_of(_headers(config.input), config.schema, config.image.image_encoding)
    return features.specs_to_json([c.feature for c in columns])


def _map_member(np, path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo):
    """A read-only memory map of an uncompressed .npz member's array, or None (compressed,
    encrypted, an object array, or a header np.lib.format reads another way: np.load reads it)."""
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        return None
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            return None
        # The local header's name and extra field lengths (they may differ from the central directory's).
        start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
        f.seek(start)
        try:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read is None:
                return None
            shape, fortran, dtype = read(f)
        except ValueError:
            return None
        offset = f.tell()
    size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if dtype.hasobject or offset + size > start + info.file_size or size == 0:
        return None
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=tuple(shape), order="F" if fortran else "C")


# Listing -----------------------------------------------------------------------------------------


def class_id_problem(v: int) -> Optional[str]:
    """Why integer label `v` cannot be a class id, or None."""
    if v < 0:
        return f"label {v} is negative: class labels are ids 0, 1, ..."
    if v > MAX_CLASS_ID:
        return (f"label {v} is above the largest class id {MAX_CLASS_ID}: integer labels are ids 0, 1, ... (the "
                "vocabulary holds one name per id); give class names as a string array instead")
    return None


def class_name_problem(text: str) -> Optional[str]:
    """Why a string label (decoded) cannot be a class name, or None."""
    return "label is an empty string: give every row a class name" if not text else label_problem(text)


def label_text(v) -> str:
    """A string array's label as text (bytes decoded, an undecodable byte as its escape)."""
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)


def list_refs(path: str, preset: str, image_encoding: str) -> Iterator[Union[ImageRef, Rejected]]:
    """One ref per row, in row order; a row whose class label cannot be one is a rejected row."""
    forget_if_changed(path)
    arrays, n, columns = _source(path, preset, image_encoding)
    label = next((c for c in columns if c.role in ("class", "names")), None)
    values = arrays[label.array] if label is not None else None
    row_bytes = sum(a.itemsize * (int(a.size // a.shape[0]) if a.shape[0] else 0) for a in arrays.values())
    for i in range(n):
        key, uri = row_key(path, i), row_uri(path, i)
        text = ""
        if values is not None:
            v = values[i]
            if label.role == "class":
                problem, text = class_id_problem(int(v)), str(int(v))
            else:
                text = label_text(v)
                problem = class_name_problem(text)
            if problem is not None:
                yield Rejected(uri, problem, key, stage="label")
                continue
        yield ImageRef(key=key, uri=uri, label=sys.intern(text), split="", size=row_bytes)


# Writing ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _source(path: str, preset: str, image_encoding: str) -> Tuple[Dict[str, Any], int, Tuple[Column, ...]]:
    """The input's arrays, row count and columns (cached per process: listing and every row use them)."""
    arrays = open_arrays(path)
    n, columns = columns_of({k: (a.shape, a.dtype) for k, a in arrays.items()}, preset, image_encoding)
    return arrays, n, tuple(columns)


def encode_image(pixels, encoding: str, quality: int, png_level: int = codec.PNG_LEVEL) -> bytes:
    """A uint8 (H, W), (H, W, 1) or (H, W, 3) row as PNG (codec.png_bytes, at `png_level`) or JPEG."""
    if encoding != "jpeg":
        return codec.png_bytes(pixels, png_level)  # from the array: no Pillow image in between
    from PIL import Image

    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    img = Image.fromarray(pixels)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def encode_ref(ref: ImageRef, preset: str, labels: LabelMap, options):
    """Row `ref` as an Example of its arrays' features (shard_writer.Encoded), or the rejected row
    naming the feature whose value does not fit."""
    from imagerecords.pipeline.encoded import Encoded

    path, i = row_of(ref.uri)
    arrays, _, columns = _source(path, preset, options.image_encoding)
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
# only changes with its varint's width. So a chunk of rows becomes one uint8 matrix per label width,
# framed at once (records.frame_equal); the per-row encoder checks one row of every layout.

# Rows encoded per block: a progress report per block, and memory bounded by BLOCK_BYTES of input
# rows (a block holds a few copies of them: values, frames, the bytes the CRC reads).
BLOCK_ROWS = 2048
BLOCK_BYTES = 8 << 20


@dataclasses.dataclass
class Block:
    """Framed records of consecutive rows, ready for RecordWriter.write_framed.

    Attributes:
      refs: the rows' refs, in shard order.
      data: their frames back to back (bytes, a contiguous uint8 array, or a view of them).
      lengths: each frame's size.
      contents: each row's 16-byte content digest (as encode_ref's).
    """

    refs: List[ImageRef]
    data: Any
    lengths: List[int]
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
    import numpy as np

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
    """The rows of one shard (refs in shard order), as Blocks of framed records and, for rows the
    bulk path does not take (a NaN, an int list value past 127, a column it cannot write), as
    (ref, encode_ref's result): the same records in the same order as encode_ref row by row.
    Blocks end at the shard's middle row too, where progress is reported."""
    import numpy as np

    if not refs:
        return
    path = row_of(refs[0].uri)[0]
    idx = np.fromiter((row_of(r.uri)[1] for r in refs), np.int64, len(refs))
    label_ids = np.fromiter((r.label_id for r in refs), np.int64, len(refs))
    for item in encode_positions(path, idx, label_ids, refs.__getitem__, preset, labels, options):
        if isinstance(item, Run):
            yield Block([refs[k] for k in item.positions.tolist()], item.data, item.lengths, item.contents)
        else:
            yield refs[item[0]], item[1]


@dataclasses.dataclass
class Run:
    """Framed records of consecutive written rows, by their positions in the shard (encode_positions).

    Attributes:
      positions: the rows' positions in the shard (int64), ascending.
      data, lengths, contents: as Block's.
    """

    positions: Any
    data: Any
    lengths: List[int]
    contents: List[bytes]


def encode_positions(path: str, idx, label_ids, ref_of: Callable[[int], ImageRef], preset: str, labels: LabelMap,
                     options) -> Iterator[Union[Run, Tuple[int, Any]]]:
    """encode_rows without a ref per row: a shard's input rows `idx` and their `label_ids` (int64,
    shard order) as Runs, and (position, encode_ref's result) for each row the bulk path does not
    take; `ref_of(position)` makes the ref of one row, for those and for the layout check."""
    if not len(idx):
        return
    arrays, _, columns = _source(path, preset, options.image_encoding)
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
    import numpy as np

    from imagerecords.format import records

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
    framed: Dict[int, Tuple[Any, Any]] = {}  # label entry width -> (frames, the rows they hold)
    for width in np.unique(widths[regular]).tolist():
        rows = np.flatnonzero(regular & (widths == width))
        frames = _frames(np, records, rows, pieces, raw, label_ids, entries, width)
        if frames is None or not _same_as_encoder(ref_of(start + int(rows[0])), frames[0], hashed[rows[0]], preset,
                                                  labels, options):
            regular[rows] = False  # a layout the per-row encoder disagrees with: those rows go row by row
            continue
        framed[width] = (frames, rows)
    if regular.all() and len(framed) == 1:
        (frames, _), = framed.values()
        yield Run(np.arange(start, start + m, dtype=np.int64), frames.reshape(-1), [frames.shape[1]] * m,
                  _digests(hashed))
        return
    framed = {w: (frames, {int(r): k for k, r in enumerate(rows)}) for w, (frames, rows) in framed.items()}
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
    import numpy as np

    from imagerecords.format import records
    from imagerecords.pipeline import png_writer

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

    frame = records.frame
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
        frames[k] = frame(header + body)
    first = next((k for k in range(m) if regular[k]), None)
    if first is not None and not _same_as_encoder(ref_of(start + first), np.frombuffer(frames[first], np.uint8),
                                                  hashed[first], preset, labels, options):
        regular[:] = False  # the per-row encoder disagrees: every row goes there
    yield from _in_runs(start, regular, lambda run: Run(
        np.array(run, np.int64) + start, b"".join([frames[i] for i in run]), [len(frames[i]) for i in run],
        _digests(hashed[run])), ref_of, preset, labels, options)


def _frames(np, records, rows, pieces, raw, label_ids, entries, width: int):
    """The framed records of `rows` (all of one label entry width) as a uint8 matrix, or None."""
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
    frames = np.empty((len(rows), records.FRAME_OVERHEAD + len(header) + body), np.uint8)
    at = records.FRAME_HEADER
    for constant, values in [(header, None), *parts]:
        if constant:
            frames[:, at:at + len(constant)] = np.frombuffer(constant, np.uint8)
            at += len(constant)
        if values is not None:
            frames[:, at:at + values.shape[1]] = values
            at += values.shape[1]
    records.frame_equal(frames)
    return frames


def _same_as_encoder(ref: ImageRef, frame, hashed, preset: str, labels: LabelMap, options) -> bool:
    """Whether the per-row encoder gives this frame and content digest for `ref`."""
    from imagerecords.format import records

    expected = encode_ref(ref, preset, labels, options)
    return not isinstance(expected, Rejected) and records.frame(expected.record) == frame.tobytes() \
        and expected.content == hashlib.sha256(hashed.tobytes()).digest()[:16]


def _digests(hashed) -> List[bytes]:
    data, size = memoryview(hashed.reshape(-1)), hashed.shape[1]
    sha = hashlib.sha256
    return [sha(data[i:i + size]).digest()[:16] for i in range(0, len(data), size)]


def _run_of(start: int, run: List[int], framed, widths, hashed) -> Run:
    import numpy as np

    views, lengths = [], []
    for i in run:
        frames, where = framed[int(widths[i])]
        views.append(frames[where[i]].tobytes())
        lengths.append(frames.shape[1])
    return Run(np.array(run, np.int64) + start, b"".join(views), lengths, _digests(hashed[run]))
