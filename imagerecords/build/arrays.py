"""NumPy input: an .npz file or a folder of .npy files, one record per row, one feature per array.

    data.npz        np.load whole (zip members cannot be memory-mapped): it must fit in memory once
    data/           a folder of NAME.npy files, np.load(mmap_mode="r"): each worker reads only its rows

Every array's first dimension is the row count N. `image` and `label` go under the schema preset's
image and label keys; every other array is a tensor feature of its own name (features.from_json's
defaults: raw bytes for more than one dimension per row and for float64, a list otherwise).

  image   uint8 (N, H, W), (N, H, W, 1) or (N, H, W, 3): PNG (lossless; --image_encoding jpeg for JPEG);
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
import re
import sys
import zipfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from imagerecords.build import codec
from imagerecords.build.errors import InputError, UsageError
from imagerecords.build.refs import ImageRef, LabelMap, Rejected
from imagerecords.format import features, schema

ROW_MARK = "#row="
# The numpy dtypes stored as they are; others must be cast first (the message says to which).
_DTYPES = {"uint8": "uint8", "int32": "int32", "int64": "int64", "float16": "float16", "float32": "float32",
           "float64": "float64", "bool": "bool"}
_WIDER = {"int8": "int32", "int16": "int32", "uint16": "int32", "uint32": "int64"}


def is_arrays_input(path: str) -> bool:
    """Whether --input names NumPy arrays: an .npz file, or a local folder with .npy files in it."""
    if "://" not in path and os.path.isdir(path):
        try:
            return any(name.endswith(".npy") and not name.startswith(".") for name in os.listdir(path))
        except OSError:
            return False
    return path.lower().endswith(".npz")



def input_identity(path: str) -> str:
    """Name, size and modification time of the input's files (the .npz, or every .npy of the folder):
    what a resumed build compares, since a row's ref holds no digest of its values. A stat, not a
    hash: an input rewritten in place within its mtime's resolution, at the same size, is missed."""
    files = [path] if not os.path.isdir(path) else [
        os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".npy") and not n.startswith(".")]
    parts = []
    for name in files:
        try:
            st = os.stat(name)
            parts.append(f"{os.path.basename(name)}:{st.st_size}:{st.st_mtime_ns}")
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
                    continue
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


@functools.lru_cache(maxsize=4)
def open_arrays(path: str) -> Dict[str, Any]:
    """The input's arrays by name: an .npz read whole, .npy files memory-mapped. Cached per process:
    the local engine opens it before it forks, so its workers share one copy of an .npz."""
    import numpy as np

    if not os.path.isdir(path):
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in sorted(z.files)}
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
    counts = {name: (shape[0] if shape else None) for name, (shape, _) in headers.items()}
    n = counts.get("image", counts.get("label"))
    if n is None:
        n = max(counts.values(), key=lambda c: (list(counts.values()).count(c), c or 0))
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
    try:
        headers = _headers(path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise InputError(f"--input {path}: cannot read it as NumPy arrays ({e})") from None
    n, _ = columns_of(headers, preset, image_encoding)
    return n


def manifest_features(config) -> Dict[str, Any]:
    """manifest.json's "features" of a build (a BuildConfig): {} unless its input is arrays."""
    if not is_arrays_input(config.input):
        return {}
    _, columns = columns_of(_headers(config.input), config.schema, config.image.image_encoding)
    return features.specs_to_json([c.feature for c in columns])


# Listing -----------------------------------------------------------------------------------------


def list_refs(path: str, preset: str, image_encoding: str) -> Iterator[Union[ImageRef, Rejected]]:
    """One ref per row, in row order; a row whose class label cannot be one is a rejected row."""
    arrays, n, columns = _source(path, preset, image_encoding)
    label = next((c for c in columns if c.role in ("class", "names")), None)
    values = arrays[label.array] if label is not None else None
    base = os.path.basename(path.rstrip("/"))
    row_bytes = sum(a.itemsize * (int(a.size // a.shape[0]) if a.shape[0] else 0) for a in arrays.values())
    for i in range(n):
        key, uri = f"{base}:{i:09d}", f"{path}{ROW_MARK}{i}"
        text = ""
        if values is not None:
            v = values[i]
            if label.role == "class":
                if int(v) < 0:
                    yield Rejected(uri, f"label {int(v)} is negative: class labels are ids 0, 1, ...", key,
                                   stage="label")
                    continue
                text = str(int(v))
            else:
                text = v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)
                if not text:
                    yield Rejected(uri, "label is an empty string: give every row a class name", key, stage="label")
                    continue
        yield ImageRef(key=key, uri=uri, label=sys.intern(text), split="", size=row_bytes)


# Writing ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _source(path: str, preset: str, image_encoding: str) -> Tuple[Dict[str, Any], int, Tuple[Column, ...]]:
    """The input's arrays, row count and columns (cached per process: listing and every row use them)."""
    arrays = open_arrays(path)
    n, columns = columns_of({k: (a.shape, a.dtype) for k, a in arrays.items()}, preset, image_encoding)
    return arrays, n, tuple(columns)


def encode_image(pixels, encoding: str, quality: int) -> bytes:
    """A uint8 (H, W), (H, W, 1) or (H, W, 3) row as PNG (Pillow, fixed level, no metadata) or JPEG."""
    from PIL import Image

    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    img = Image.fromarray(pixels)
    if encoding != "jpeg":
        return codec.png_bytes(img)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def encode_ref(ref: ImageRef, preset: str, labels: LabelMap, options):
    """Row `ref` as an Example of its arrays' features (shard_writer.Encoded), or the rejected row
    naming the feature whose value does not fit."""
    from imagerecords.build.shard_writer import Encoded

    path, _, row = ref.uri.rpartition(ROW_MARK)
    i = int(row)
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
            large_key, large = column.key, encode_image(value, column.feature.encoding, options.quality)
        else:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "backslashreplace")
            try:
                checked = features.check(column.feature, str(value) if column.feature.dtype == "string" else value)
            except features.ValueProblem as e:
                return Rejected(ref.uri, f"row {i}: {e}", ref.key, ref.split, stage="decode", error="ValueProblem")
            small[column.key] = features.encode(column.feature, checked)
    return Encoded(schema.example_of(small, large_key, large), ref.label_id, False, digest.digest()[:16])


# Arrays already in memory ------------------------------------------------------------------------


def build_arrays(arrays: Mapping[str, Any], output: str, *, splits: Optional[Mapping[str, float]] = None,
                 seed: int = 0, num_shards: Optional[int] = None, **settings: Any):
    """Builds a dataset from arrays in memory, as `imagerecords build --input FOLDER` does from a
    folder of .npy files (which this writes to a temporary folder named `arrays`, so row i's key
    is `arrays:<i, 9 digits>` and --splits assigns the same rows on every call).

    Example:
        import numpy as np, imagerecords
        manifest = imagerecords.build_arrays({"image": x, "label": y}, "/tmp/ds", splits={"train": 0.9, "test": 0.1})

    Limits: the arrays are written to the temporary folder once (disk space for one copy; memory
    stays the caller's), and the build runs on the local engine (local output only).

    Args:
      arrays: {name: array}; every first dimension is the row count.
      output: a local output folder.
      splits: {split name: fraction}; None puts every row in `train`.
      seed, num_shards: as the flags --seed and --num_shards.
      settings: any other build flag by name (`overwrite=True`, `image_encoding="jpeg"`).

    Returns:
      The published manifest (imagerecords.format.manifest.Manifest).

    Raises:
      imagerecords.build.errors.BuildError: an expected failure, with the command-line message.
    """
    import tempfile

    import numpy as np

    from imagerecords.cli import launcher

    if "://" in output:
        raise UsageError(f"build_arrays writes a local folder; got {output} (use `imagerecords build` with a "
                         "Beam runner for remote output)")
    argv = ["--output", output, "--seed", str(seed)]
    if splits:
        argv += ["--splits", ",".join(f"{name}={fraction}" for name, fraction in splits.items())]
    if num_shards is not None:
        argv += ["--num_shards", str(num_shards)]
    for name, value in sorted(settings.items()):
        if value is True:
            argv.append(f"--{name}")
        elif value is not False and value is not None:
            argv += [f"--{name}", str(value)]
    with tempfile.TemporaryDirectory(prefix="imagerecords-arrays-") as tmp:
        folder = os.path.join(tmp, "arrays")
        os.mkdir(folder)
        for name, value in arrays.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
                raise UsageError(f"array name {name!r}: letters, digits, '_', '.', '-' (it becomes a file name)")
            np.save(os.path.join(folder, f"{name}.npy"), np.asarray(value), allow_pickle=False)
        try:
            return launcher.run(["--input", folder, *argv])
        finally:
            open_arrays.cache_clear()  # its memory maps point into the folder about to go
            _source.cache_clear()
