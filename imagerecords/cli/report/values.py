"""Declared features as the report shows them: decoding stored values, pictures of images and arrays, box
geometry, and what the first records' values add up to.

Boxes: a float feature of shape [null, 4] (or [k, 4]) is drawn as boxes, whatever its name, in TFDS's
BBoxFeature order (ymin, xmin, ymax, xmax). Its coordinates are read as fractions of the image
(TFDS's convention) when every value of the records read lies in 0..1, and as pixels of the stored
image otherwise.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import math
from typing import Any, Counter, Dict, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format import codecs
from imagerecords.format.features import Feature

STRING_EXAMPLES = 5
# Integer images whose largest value is below this are class-index masks: shown in false colours,
# as 0..3 on a 0..255 scale would be black.
INDEX_LEVELS = 32
# Distinct, high-contrast colours for index values 1.. (0, the usual background, is black).
_INDEX_COLOURS = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
                  (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (220, 190, 255),
                  (170, 110, 40), (255, 250, 200), (128, 0, 0), (170, 255, 195)]


class Undecodable(ValueError):
    """A stored value that does not read as its feature's spec says (the message says why)."""


def is_boxes(feature: Feature) -> bool:
    """Whether the report draws `feature` as boxes: a float tensor of shape [null, 4] or [k, 4]."""
    return feature.dtype.startswith("float") and len(feature.shape) == 2 and feature.shape[1] == 4


def is_scalar(feature: Feature) -> bool:
    return feature.numeric and feature.shape == ()


def tensor(feature: Feature, values: Sequence[Any]) -> "np.ndarray":
    """The stored values of a numeric feature as an array of its dtype and shape.

    Raises:
      Undecodable: the values do not fill the declared shape.
    """
    try:
        return codecs.to_numpy(feature, values)
    except ValueError as e:
        raise Undecodable(str(e).split(": ", 1)[-1]) from None


def picture(feature: Feature, values: Sequence[Any]) -> "Image.Image":
    """A viewable Pillow image of an image feature's bytes or a numeric tensor of 2 dimensions (or 3, the
    last 1 or 3): 8-bit RGB/greyscale as stored, index masks in false colours, anything else
    (16-bit depth, float arrays) min-max scaled to greyscale.

    Raises:
      Undecodable: the bytes are not an image Pillow reads, or the tensor is no picture.
    """
    # NumPy (42 ms) and Pillow (none in the reader-only install): only pictures and tensors need them
    import numpy as np
    from PIL import Image

    if feature.dtype == "image":
        if len(values) != 1 or not isinstance(values[0], bytes):
            raise Undecodable(f"expected one image bytes value, got {len(values)} values")
        try:
            img = Image.open(io.BytesIO(values[0]))
            img.load()
        except Exception as e:  # Pillow raises many types for broken bytes
            raise Undecodable(f"{type(e).__name__}: {e}") from None
        if img.mode in ("RGB", "L"):
            return _false_colours(np.asarray(img)) if img.mode == "L" and _is_index(np.asarray(img)) else img
        if img.mode in ("RGBA", "LA", "P", "1", "CMYK", "YCbCr"):
            return img.convert("RGB")
        array = np.asarray(img)  # 16-bit and 32-bit greyscale
    elif feature.numeric:
        array = tensor(feature, values)
    else:
        raise Undecodable(f"a {feature.dtype} feature is no picture")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3) or 0 in array.shape:
        raise Undecodable(f"shape {list(array.shape)} is not an image (height, width[, 1 or 3])")
    if array.dtype == np.uint8:
        return Image.fromarray(array)
    if array.ndim == 2 and array.dtype.kind in "iub" and _is_index(array):
        return _false_colours(array)
    return Image.fromarray(_stretch(array))


def _is_index(array: "np.ndarray") -> bool:
    return array.size > 0 and 0 <= int(array.min()) and int(array.max()) < INDEX_LEVELS


def _false_colours(array: "np.ndarray") -> "Image.Image":
    # NumPy and Pillow: as in picture
    import numpy as np
    from PIL import Image

    lut = np.array([(0, 0, 0)] + [_INDEX_COLOURS[i % len(_INDEX_COLOURS)] for i in range(INDEX_LEVELS - 1)],
                   dtype=np.uint8)
    return Image.fromarray(lut[array.astype(np.intp)], "RGB")


def _stretch(array: "np.ndarray") -> "np.ndarray":
    """uint8 of `array` min-max scaled to 0..255 (NaN and infinities black; a flat array mid-grey)."""
    # NumPy: 42 ms to import; only pictures and tensors need it
    import numpy as np

    a = array.astype(np.float64)
    finite = np.isfinite(a)
    if not finite.any():
        return np.zeros(a.shape, np.uint8)
    low, high = float(a[finite].min()), float(a[finite].max())
    if high == low:
        return np.where(finite, 128, 0).astype(np.uint8)
    return np.where(finite, np.round((np.where(finite, a, low) - low) * (255 / (high - low))), 0).astype(np.uint8)


def value_histogram(values: Sequence[float], max_bins: int = 20) -> List[Tuple[float, float, int]]:
    """Equal-width bins (low, high, count) covering min..max of real `values`; the last bin includes max."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return []
    low, high = min(values), max(values)
    if low == high:
        return [(low, high, len(values))]
    width = (high - low) / max_bins
    counts = collections.Counter(min(int((v - low) / width), max_bins - 1) for v in values)
    return [(low + i * width, low + (i + 1) * width, counts.get(i, 0)) for i in range(max_bins)]


@dataclasses.dataclass
class FeatureValues:
    """What the records read hold of one declared feature.

    Attributes:
      feature: the spec.
      records: records read that hold the feature.
      missing: records read without it.
      problems: values that did not decode (count), and the first reason.
      scalars: a scalar's values, in record order.
      classes: a class_list's {class id: occurrences}.
      examples: a string's first distinct values.
      distinct: a string's distinct values seen.
      count: a tensor's values seen (its elements, all records).
      low: a tensor's smallest finite value seen (None before any).
      high: a tensor's largest finite value seen.
      non_finite: a tensor's NaN and infinite values seen.
    """

    feature: Feature
    records: int = 0
    missing: int = 0
    problems: int = 0
    first_problem: str = ""
    scalars: List[float] = dataclasses.field(default_factory=list)
    classes: Counter[int] = dataclasses.field(default_factory=collections.Counter)
    examples: List[str] = dataclasses.field(default_factory=list)
    distinct: set = dataclasses.field(default_factory=set)
    count: int = 0
    low: Optional[float] = None
    high: Optional[float] = None
    non_finite: int = 0

    @property
    def normalized(self) -> bool:
        """Boxes: every coordinate read lies in 0..1 (fractions of the image, TFDS's convention)."""
        return self.low is None or (self.low >= 0.0 and self.high <= 1.0)

    def add(self, values: Optional[Sequence[Any]]) -> None:
        """Counts one record's stored values of the feature (None: the record lacks it)."""
        if values is None:
            self.missing += 1
            return
        self.records += 1
        f = self.feature
        try:
            if f.dtype == "class_list":
                self.classes.update(int(v) for v in values)
            elif f.dtype == "string":
                text = values[0].decode("utf-8", errors="replace") if values else ""
                if text not in self.distinct:
                    self.distinct.add(text)
                    if len(self.examples) < STRING_EXAMPLES:
                        self.examples.append(text)
            elif f.numeric:
                self._add_tensor(tensor(f, values))
        except Undecodable as e:
            self.problems += 1
            self.first_problem = self.first_problem or str(e)

    def _add_tensor(self, array: "np.ndarray") -> None:
        # NumPy: as in _stretch
        import numpy as np

        if is_scalar(self.feature):
            self.scalars.append(float(array))
        a = array.astype(np.float64).ravel()
        finite = a[np.isfinite(a)]
        self.count += a.size
        self.non_finite += a.size - finite.size
        if finite.size:
            low, high = float(finite.min()), float(finite.max())
            self.low = low if self.low is None else min(self.low, low)
            self.high = high if self.high is None else max(self.high, high)


def boxes_of(feature: Feature, values: Optional[Sequence[Any]]) -> List[Tuple[float, float, float, float]]:
    """A record's boxes as stored, (ymin, xmin, ymax, xmax) each; [] when it has none or they do not decode."""
    if not values:
        return []
    try:
        array = tensor(feature, values)
    except Undecodable:
        return []
    return [tuple(float(c) for c in row) for row in array.reshape(-1, 4)]


def collect(features: Sequence[Feature]) -> Dict[str, FeatureValues]:
    """An empty FeatureValues per feature, by name."""
    return {f.name: FeatureValues(f) for f in features}


def add_record(values: Mapping[str, FeatureValues], example: Mapping[str, List[Any]]) -> None:
    for name, fv in values.items():
        fv.add(example.get(name))
