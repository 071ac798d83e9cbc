"""Each feature kind's check, encode and decode side by side: one table that the builder and every reader use.

A kind (imagerecords.format.features: image, class_list, string, or a numeric tensor) has one
Codec here. The builder checks a row's value and encodes it (deterministic bytes, no TensorFlow);
the readers decode what the record holds: to NumPy (PyTorch, the report, `verify`) or to tensors
(tf.data's as_dataset, which passes its TensorFlow module in, so nothing here imports it).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from imagerecords.format import features as F
from imagerecords.format import schema
from imagerecords.format.features import Feature, ValueProblem


class Codec:
    """One kind's four faces; subclasses fill in the ones their kind has."""

    def check(self, feature: Feature, value: Any) -> Any:
        """The row's value as the feature stores it, or ValueProblem naming the feature."""
        raise NotImplementedError

    def encode(self, feature: Feature, value: Any, vocabulary: Optional[Mapping[str, int]]) -> bytes:
        """The serialized tf.train.Feature of a value `check` accepted."""
        raise NotImplementedError

    def to_numpy(self, feature: Feature, values: Sequence[Any]) -> Any:
        """One record's stored values (schema.parse_example's list) as NumPy or str."""
        raise NotImplementedError

    def parse_spec(self, feature: Feature, tf) -> Any:
        """The tf.io.parse_example spec of the feature."""
        raise NotImplementedError

    def to_tensor(self, feature: Feature, value, tf) -> Any:
        """The parsed value (parse_spec's) decoded to the tensor as_dataset returns."""
        raise NotImplementedError


def _one_bytes(feature: Feature, values: Sequence[Any]) -> bytes:
    if len(values) != 1 or not isinstance(values[0], bytes):
        raise ValueError(f"feature {feature.name!r}: expected one bytes value, got {len(values)} values")
    return values[0]


class _Image(Codec):
    # Encoding an image (read, sniff, resize, re-encode) is the builder's codec's work; its bytes
    # are stored as one BytesList value.

    def check(self, feature, value):
        if not isinstance(value, str):
            raise ValueProblem(f"feature {feature.name!r}: expected a path to an image file, got {F._short(value)}")
        return value

    def encode(self, feature, value, vocabulary):
        return schema.bytes_feature(value)

    def to_numpy(self, feature, values):
        return F.image_to_numpy(feature, _one_bytes(feature, values))

    def parse_spec(self, feature, tf):
        return tf.io.FixedLenFeature([], tf.string)

    def to_tensor(self, feature, value, tf):
        if feature.encoding == "jpeg":
            # The accurate IDCT: the pixels Pillow gives the torch and Grain readers, not TF's faster default.
            return tf.io.decode_jpeg(value, channels=feature.channels, dct_method="INTEGER_ACCURATE")
        # png and keep: decode_image reads PNG and JPEG alike (keep stores either)
        out = tf.uint16 if feature.bits == 16 else tf.uint8
        return tf.io.decode_image(value, channels=feature.channels, dtype=out, expand_animations=False)


class _String(Codec):
    def check(self, feature, value):
        if not isinstance(value, str):
            raise ValueProblem(f"feature {feature.name!r}: expected text, got {F._short(value)}")
        problem = F.surrogate_problem(value)
        if problem:
            raise ValueProblem(f"feature {feature.name!r}: {F._short(value)} {problem}")
        return value

    def encode(self, feature, value, vocabulary):
        return schema.bytes_feature(value.encode("utf-8"))

    def to_numpy(self, feature, values):
        return _one_bytes(feature, values).decode("utf-8")

    def parse_spec(self, feature, tf):
        return tf.io.FixedLenFeature([], tf.string)

    def to_tensor(self, feature, value, tf):
        return value


class _ClassList(Codec):
    def check(self, feature, value):
        name = feature.name
        if not isinstance(value, list) or not all(isinstance(v, str) or F._is_int(v) for v in value):
            raise ValueProblem(f"feature {name!r}: expected a list of class names or ids, got {F._short(value)}")
        if value and len({type(v) for v in value}) > 1:
            raise ValueProblem(f"feature {name!r}: mixes class names and ids: {F._short(value)}")
        for v in value:
            if F._is_int(v) and v < 0:
                raise ValueProblem(f"feature {name!r}: class id {v} is negative")
            if isinstance(v, str) and feature.names and v not in feature.names:
                raise ValueProblem(f"feature {name!r}: class {v!r} is not one of its declared names")
            if isinstance(v, str):
                F._check_class_name(feature, v)
        if feature.names:
            F.past_names(feature, value, len(feature.names))
        return list(value)

    def encode(self, feature, value, vocabulary):
        if value and isinstance(value[0], str):
            if vocabulary is None:
                raise ValueError(f"feature {feature.name!r}: no vocabulary to map class names to ids")
            value = [vocabulary[v] for v in value]
        elif vocabulary:  # ids beside names seen in other rows: within those names, as verify checks
            F.past_names(feature, value, len(vocabulary))
        return schema.int64_list_feature(value)

    def to_numpy(self, feature, values):
        # NumPy: 42 ms to import; reading a manifest (inspect, load_info) never decodes a value
        import numpy as np

        return np.asarray(values, dtype=np.int64)

    def parse_spec(self, feature, tf):
        return tf.io.VarLenFeature(tf.int64)

    def to_tensor(self, feature, value, tf):
        return tf.sparse.to_dense(value)


# The integer kinds' ranges; a value outside is refused, never wrapped.
INT_RANGE = {"uint8": (0, 255), "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1), "bool": (0, 1)}


def check_tensor(feature: Feature, value: Any) -> "np.ndarray":
    """The value as an array of the feature's dtype and shape, or ValueProblem naming the feature."""
    # NumPy: only decoding values needs it (as in _ClassList.to_numpy)
    import numpy as np

    name, dtype = feature.name, feature.dtype
    if isinstance(value, np.ndarray) and value.dtype == F._NUMPY[dtype] and len(value.shape) == len(feature.shape) \
            and all(d is None or d == n for d, n in zip(feature.shape, value.shape)):
        # A NumPy row of the declared dtype and shape (an arrays build): only finiteness to check.
        if dtype.startswith("float") and not feature.allow_nan and not np.isfinite(value).all():
            raise ValueProblem(f"feature {name!r}: a value is not finite (NaN or infinity); declare allow_nan: true to store it")
        return value
    if dtype != "bool" and holds_bool(value):
        what = "is a bool" if isinstance(value, bool) else "holds a bool (true/false)"
        raise ValueProblem(f"feature {name!r}: {F._short(value)} {what}, not a number ({dtype})")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):  # numpy refuses ragged nesting
        raise ValueProblem(f"feature {name!r}: {F._short(value)} is a ragged list, not a tensor") from None
    if arr.size == 0 and feature.shape and feature.shape[0] is None and arr.ndim == 1:
        if all(d is not None for d in feature.shape[1:]):
            arr = arr.reshape((0, *feature.shape[1:]))  # [] for [null, 4]: no boxes
    if arr.dtype.kind not in "biuf" and arr.size:
        raise ValueProblem(f"feature {name!r}: {F._short(value)} is not a number or a list of numbers ({dtype})")
    dims = arr.shape
    if len(dims) != len(feature.shape) or any(d is not None and d != n for d, n in zip(feature.shape, dims)):
        want = "[" + ", ".join("?" if d is None else str(d) for d in feature.shape) + "]"
        raise ValueProblem(f"feature {name!r}: shape [{', '.join(map(str, dims))}] does not fit the declared {want}")
    if arr.size == 0:
        return np.zeros(dims, dtype=F._NUMPY[dtype])
    if dtype == "bool":
        if arr.dtype.kind != "b" and not np.isin(arr, (0, 1)).all():
            raise ValueProblem(f"feature {name!r}: {F._short(value)} holds values other than true/false or 0/1")
    elif dtype in INT_RANGE:
        if arr.dtype.kind == "f":
            raise ValueProblem(f"feature {name!r}: {F._short(value)} holds non-integers; {dtype} takes integers")
        low, high = INT_RANGE[dtype]
        if int(arr.min()) < low or int(arr.max()) > high:
            raise ValueProblem(f"feature {name!r}: {F._short(value)} is outside {dtype}'s range {low}..{high}")
    else:
        if arr.dtype.kind == "b":
            raise ValueProblem(f"feature {name!r}: {F._short(value)} is a bool, not a number ({dtype})")
        if not feature.allow_nan and not np.isfinite(arr.astype(np.float64)).all():
            raise ValueProblem(f"feature {name!r}: {F._short(value)} is not finite; declare allow_nan: true to store it")
        with np.errstate(over="ignore"):  # the overflow is the finding, said in the reason, not a warning
            narrowed = arr.astype(F._NUMPY[dtype])
        if not feature.allow_nan and not np.isfinite(narrowed).all():
            raise ValueProblem(f"feature {name!r}: {F._short(value)} is outside {dtype}'s range")
    return arr.astype(F._NUMPY[dtype])


def holds_bool(value: Any) -> bool:
    """Whether a JSON value holds true or false anywhere in its lists (numpy would make them 1 and 0)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, bool):
            return True
        if isinstance(v, list):
            stack.extend(v)
    return False


class _Tensor(Codec):
    def check(self, feature, value):
        return check_tensor(feature, value)

    def encode(self, feature, value, vocabulary):
        if feature.encoding == "bytes":
            return schema.bytes_feature(value.tobytes())
        if feature.dtype in ("float16", "float32"):
            return schema.float_list_feature(value.astype("<f4").ravel().tobytes())
        return schema.int64_list_feature([int(v) for v in value.ravel().tolist()])

    def to_numpy(self, feature, values):
        # NumPy: only decoding values needs it (as in _ClassList.to_numpy)
        import numpy as np

        dtype = np.dtype(F._NUMPY[feature.dtype])
        if feature.encoding == "bytes":
            data = _one_bytes(feature, values)
            if len(data) % dtype.itemsize:
                raise ValueError(f"feature {feature.name!r}: {len(data)} bytes are not a whole number of "
                                 f"{feature.dtype} values")
            flat = np.frombuffer(data, dtype)
        else:
            flat = np.asarray(values, dtype=dtype)
        try:
            return flat.reshape(tuple(-1 if d is None else d for d in feature.shape))
        except ValueError:
            raise ValueError(f"feature {feature.name!r}: {flat.size} values do not fill {F.describe(feature)}") from None

    def parse_spec(self, feature, tf):
        if feature.encoding == "bytes":
            return tf.io.FixedLenFeature([], tf.string)
        wire = tf.float32 if feature.dtype in ("float16", "float32") else tf.int64
        if None in feature.shape:
            return tf.io.VarLenFeature(wire)
        return tf.io.FixedLenFeature(list(feature.shape), wire)

    def to_tensor(self, feature, value, tf):
        dtype = tf.dtypes.as_dtype(feature.dtype)
        shape = [-1 if d is None else d for d in feature.shape]
        if feature.encoding == "bytes":
            return tf.reshape(tf.io.decode_raw(value, dtype, little_endian=True), shape)
        if isinstance(value, tf.SparseTensor):
            value = tf.reshape(tf.sparse.to_dense(value), shape)
        return tf.cast(value, dtype)


CODECS = {"image": _Image(), "string": _String(), "class_list": _ClassList(),
          **{dtype: _Tensor() for dtype in F.NUMERIC}}


def codec(feature: Feature) -> Codec:
    """The Codec of `feature`'s kind."""
    try:
        return CODECS[feature.dtype]
    except KeyError:
        raise ValueError(f"feature {feature.name!r}: no codec for kind {feature.dtype!r}") from None


# The one entry to every kind: check a row's value, encode it, decode it (features.py holds the spec) ---


def check(feature: Feature, value: Any) -> Any:
    """Returns the value of one row as the feature stores it (a nested list of numbers, a string,
    a list of class names or ids, an image path), or raises ValueProblem naming the feature.

    CSV cells are text: a numeric or class_list feature reads them as JSON (`[[0, 0, 4, 4]]`, `1.5`).
    """
    name = feature.name
    if value is None or (isinstance(value, str) and value == ""):  # an array row is never ''
        if feature.numeric and None in feature.shape and feature.shape[0] is None and value == "":
            value = []
        else:
            raise ValueProblem(f"feature {name!r}: the row has no value in column {feature.source!r}")
    if isinstance(value, str) and (feature.numeric or feature.dtype == "class_list"):
        value = F.from_text(feature, value)
    return codec(feature).check(feature, value)


def encode(feature: Feature, value: Any, vocabulary: Optional[Mapping[str, int]] = None) -> bytes:
    """Returns the serialized tf.train.Feature of a value `check` accepted, by its kind's codec; for an image feature, the image bytes the builder prepared.

    Args:
      vocabulary: class name -> id of a class_list feature whose values are names.
    """
    return codec(feature).encode(feature, value, vocabulary)


def to_numpy(feature: Feature, values: Sequence[Any]) -> Any:
    """One record's stored values of a non-image feature (schema.parse_example's list) as NumPy: a
    tensor of its dtype and shape, a class list as int64 ids, a string as str.

    Raises:
      ValueError: the values do not fit the feature (wrong kind, or not filling its shape).
    """
    if feature.dtype == "image":
        raise ValueError(f"feature {feature.name!r}: a {feature.dtype} feature is decoded by its image codec")
    return codec(feature).to_numpy(feature, values)
