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
it as it does a path; its uri is `<path>#row=<i>` and its `row` is i: a ref with a row is what
stream.encode_ref hands to array_encode.encode_ref (never a uri that merely holds "#row=").
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import zipfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from imagerecords.format import features, schema
from imagerecords.pipeline.errors import InputError, UsageError
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline.refs import MAX_INT_LABELS, ImageRef, Rejected, label_problem

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
    """(arrays path, row number) of a row's uri written by row_uri (an errors or contents row of an arrays build)."""
    path, _, row = uri.rpartition(ROW_MARK)
    return path, int(row)


def ref_row(ref: ImageRef) -> Tuple[str, int]:
    """(arrays path, row number) of an arrays row's ref (ref.row >= 0): its uri less the row suffix it was made with."""
    return ref.uri[:len(ref.uri) - len(ROW_MARK) - len(str(ref.row))], ref.row

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


def _headers(path: str) -> Dict[str, Tuple[Tuple[int, ...], Any]]:
    """{array name: (shape, dtype)} read from the .npy headers only (no data)."""
    out = {}
    if not os.path.isdir(path):
        with zipfile.ZipFile(path) as z:
            for member in sorted(z.namelist()):
                if not member.endswith(".npy"):
                    raise InputError(f"{setting('input', path)}: member {member!r} is not a NumPy array (.npy); an .npz input "
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
        opened.cache_clear()
        _OPENED.clear()
        _OPENED[key] = now


@functools.lru_cache(maxsize=4)
def open_arrays(path: str) -> Dict[str, Any]:
    """The input's arrays by name: .npy files and an .npz's stored members memory-mapped, its
    compressed ones read whole. Cached per process: the local engine opens it before it forks, so
    its workers share one copy of an .npz."""
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
        raise InputError(f"{setting('input', path)}: arrays are read from a local file or folder; copy it to this "
                         "machine (or to a disk the workers mount) and rerun with its local path")
    if not os.path.exists(path):
        raise InputError(f"{setting('input', path)}: no such file or folder")
    if os.path.isdir(path):
        _check_only_arrays(path)
    try:
        headers = _headers(path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise InputError(f"{setting('input', path)}: cannot read it as NumPy arrays ({e})") from None
    n, _ = columns_of(headers, preset, image_encoding)
    if n == 0:
        raise InputError(f"{setting('input', path)}: holds 0 rows (every array's first dimension is 0): nothing to build")
    return n


def _check_only_arrays(folder: str) -> None:
    """Refuses a folder holding .npy files beside anything else: a class-folder tree with a stray
    .npy (or arrays with a stray README) must not silently become some other dataset."""
    names = [n for n in sorted(os.listdir(folder)) if not n.startswith(".")]
    npys = [n for n in names if n.endswith(".npy") and os.path.isfile(os.path.join(folder, n))]
    others = [n + ("/" if os.path.isdir(os.path.join(folder, n)) else "") for n in names if n not in npys]
    if others:
        raise InputError(f"{setting('input', folder)}: holds .npy arrays ({_some(npys)}) and other entries ({_some(others)}); "
                         "an arrays input is a folder of .npy files only: move the .npy files into a folder of "
                         "their own, or out of this one to build it as class folders")


def _some(names: List[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def label_type(config) -> str:
    """The label type of a build's vocabulary: an arrays build's string labels are class names even
    when they spell digits (ids 0, 1, ... by sorted name), its integer labels are ids as given."""
    if config.labels.label_type != "auto" or not is_arrays_input(config.input):
        return config.labels.label_type
    _, columns = columns_of(_headers(config.input), config.schema, config.image.image_encoding)
    role = next((c.role for c in columns if c.role in ("class", "names")), None)
    return {"class": "int", "names": "name"}.get(role, config.labels.label_type)


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
    arrays, n, columns = opened(path, preset, image_encoding)
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
        yield ImageRef(key=key, uri=uri, label=sys.intern(text), split="", size=row_bytes, row=i)


# The opened input, shared by listing and writing (array_encode.py) --------------------------------


@functools.lru_cache(maxsize=8)
def opened(path: str, preset: str, image_encoding: str) -> Tuple[Dict[str, Any], int, Tuple[Column, ...]]:
    """The input's arrays, row count and columns (cached per process: listing and every row use them)."""
    arrays = open_arrays(path)
    n, columns = columns_of({k: (a.shape, a.dtype) for k, a in arrays.items()}, preset, image_encoding)
    return arrays, n, tuple(columns)
