"""What the report reads from a dataset's shards: thumbnails per class (with their boxes and image features)
and the first records' sizes and feature values."""

from __future__ import annotations

import base64
import collections
import dataclasses
import io
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from imagerecords.format import side_files

from imagerecords.format import features as feature_spec
from imagerecords.format import record_format, schema
from imagerecords.format.features import Feature
from imagerecords.format.manifest import Manifest, Split
from imagerecords.pipeline.storage import join, open_if_exists
from imagerecords.cli.report import values as feature_values
from imagerecords.cli.report.extras import valid_features

THUMB_SIDE = 96  # px, the longer side of a contact-sheet thumbnail

Box = Tuple[float, float, float, float]  # (ymin, xmin, ymax, xmax) as stored


@dataclasses.dataclass
class Layer:
    """An image feature of a record (a mask, a depth map), made the size of the record's thumbnail.

    Attributes:
      name: the feature key.
      data_uri: a PNG data: URI, or None when the value did not decode.
      size: (width, height) of the picture.
      error: why it did not decode.
    """

    name: str
    data_uri: Optional[str] = None
    size: Tuple[int, int] = (0, 0)
    error: Optional[str] = None


@dataclasses.dataclass
class Thumb:
    """One contact-sheet image: a record's image made small.

    Attributes:
      label: stored label id (None: the records hold no label).
      filename: the record's filename feature ('' when the records hold none).
      shard: shard file it came from.
      height: the stored image's height in px (its filename-free records' decoded height).
      width: the stored image's width in px.
      data_uri: the thumbnail as a data: URI, or None when the image did not decode.
      size: (width, height) of the thumbnail.
      error: why the image did not decode.
      index: the record's position in its shard, from 0.
      boxes: {box feature key: the record's boxes}.
      layers: the record's image features, in name order.
    """

    label: Optional[int]
    filename: str
    shard: str
    height: int
    width: int
    data_uri: Optional[str] = None
    size: Tuple[int, int] = (0, 0)
    error: Optional[str] = None
    index: int = 0
    boxes: Dict[str, List[Box]] = dataclasses.field(default_factory=dict)
    layers: List[Layer] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Sample:
    """What was read from one split's shards.

    Attributes:
      split: the split read.
      thumbs: {label id: thumbnails in shard order}; {None: ...} when the dataset has no classes or its
        records no label; {} when its records hold no image.
      sizes: (height, width) of the first `limit` records in shard order (none when the records hold
        no height and width features).
      image_bytes: image byte sizes of the same records.
      limit: the sample size asked for.
      records_read: records read in all.
      shards_read: names of the shards opened, in order.
      problems: shards that could not be read to the end, with why.
      sampled: records in the size sample (the first `limit`).
      values: {declared feature key: what the sampled records hold of it}.
      boxes: the declared features drawn as boxes (values.is_boxes), by name.
    """

    split: str
    thumbs: Dict[Optional[int], List[Thumb]]
    sizes: List[Tuple[int, int]]
    image_bytes: List[int]
    limit: int
    records_read: int = 0
    shards_read: List[str] = dataclasses.field(default_factory=list)
    problems: List[str] = dataclasses.field(default_factory=list)
    sampled: int = 0
    values: Dict[str, feature_values.FeatureValues] = dataclasses.field(default_factory=dict)
    boxes: Tuple[str, ...] = ()


def label_counts(split: Split) -> Dict[int, int]:
    """{label id: records} of `split`, from the manifest's label histograms (summed per shard, or the
    sums a columnar split keeps)."""
    counts: Dict[int, int] = collections.Counter()
    for label, n in split.label_counts:
        counts[label] += n
    return counts


def label_ids(manifest: Manifest) -> List[int]:
    """Every label id of the dataset: the named ones and any a shard holds beyond them."""
    ids = {i + manifest.label_offset for i in range(len(manifest.label_names))}
    ids.update(label for split in manifest.splits for label, _ in split.label_counts)
    return sorted(ids)


def histogram(values: Sequence[int], max_bins: int = 20) -> List[Tuple[int, int, int]]:
    """Returns equal-width integer bins (low, high, count) covering min..max of `values` (none if empty)."""
    if not values:
        return []
    low, high = min(values), max(values)
    width = max(1, math.ceil((high - low + 1) / max_bins))
    counts = collections.Counter((v - low) // width for v in values)
    return [(low + i * width, low + (i + 1) * width - 1, counts.get(i, 0))
            for i in range((high - low) // width + 1)]


def thumbnail(image: bytes, side: int = THUMB_SIDE) -> Tuple[str, Tuple[int, int]]:
    """Returns (JPEG data URI, (width, height)) of `image` shrunk to fit `side` x `side`.

    Raises:
      OSError, ValueError: if Pillow cannot decode the image.
    """
    uri, size, _ = _thumbnail(image, side)
    return uri, size


def _thumbnail(image: bytes, side: int = THUMB_SIDE) -> Tuple[str, Tuple[int, int], Tuple[int, int]]:
    """thumbnail(), and the (width, height) of the image it was made from."""
    # Pillow: 9.8 ms, and the reader-only install has none; only a page with images draws them
    from PIL import Image

    with Image.open(io.BytesIO(image)) as img:
        source = img.size
        img.draft("RGB", (side, side))  # JPEG: decode at a reduced DCT scale, much faster for big images
        img = img.convert("RGB")
        img.thumbnail((side, side), Image.Resampling.LANCZOS)  # keeps the aspect ratio, never enlarges
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=85)
        size = img.size
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii"), size, source


def picture_thumbnail(img: "Image.Image", size: Optional[Tuple[int, int]] = None, smooth: bool = False,
                      side: int = THUMB_SIDE) -> Tuple[str, Tuple[int, int]]:
    """(PNG data URI, (width, height)) of a values.picture: `size` when given (a layer matches its image's
    thumbnail), else fit to `side`, pixels enlarged whole when the picture is under half of it (a 28 x 28
    array shown at 84 x 84). Nearest-neighbour, so mask values stay unblended and array cells square;
    `smooth`: Lanczos where the picture shrinks (a photo)."""
    # Pillow: as in _thumbnail
    from PIL import Image

    if size is None:
        w, h = img.size
        longest = max(w, h)
        if longest * 2 <= side:
            size = (w * (side // longest), h * (side // longest))
        else:
            scale = min(1.0, side / longest)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
    shrinks = size[0] < img.size[0]
    img = img.resize(size, Image.Resampling.LANCZOS if smooth and shrinks else Image.Resampling.NEAREST)
    out = io.BytesIO()
    img.save(out, format="PNG", compress_level=6)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii"), img.size


def sample_split(output: str, manifest: Manifest, split: Split, classes: Sequence[int], per_class: int,
                 limit: int) -> Sample:
    """Reads `split`'s shards in order until each of `classes` has `per_class` thumbnails (or the
    split has no more of it) and the first `limit` records were seen, and stops there.

    Shards whose manifest histogram holds no class still short of thumbnails are skipped once the
    size sample is complete, so rare classes do not cost a read of every shard. A dataset without
    classes (`classes` empty, or records that hold no label: an arrays build without one) shows its
    first `per_class` records.
    """
    in_split = label_counts(split)
    stored = {f.name: f for f in feature_spec.stored(dataclasses.replace(manifest, features=valid_features(manifest)))}
    keys = schema.keys(manifest.schema)
    if keys.image not in stored:  # nothing to draw a thumbnail (or boxes) from: values only
        want: Dict[Optional[int], int] = {}
    elif classes and keys.label in stored:
        want = {c: min(per_class, in_split.get(c, 0)) for c in classes}
    else:
        want = {None: min(per_class, split.num_examples)}
    declared = [stored[name] for name in sorted(valid_features(manifest))]
    sample = Sample(split.name, {c: [] for c in want}, [], [], limit,
                    values=feature_values.collect(declared),
                    boxes=tuple(f.name for f in declared if want and feature_values.is_boxes(f)))
    picker = _Picker(sample, schema.keys(manifest.schema), {c: n for c, n in want.items() if n > 0}, stored,
                     record_format.of(manifest))
    for shard in split.shards:
        if picker.done():
            break
        short = picker.short()
        if picker.sizes_done() and None not in short and not short.intersection(label for label, _ in shard.labels):
            continue
        picker.read_shard(join(output, shard.filename), shard.filename)
    return picker.sample


class _Picker:
    """Fills one Sample from the records of the shards it is given, in order."""

    def __init__(self, sample: Sample, keys: schema.SchemaKeys, want: Mapping[Optional[int], int],
                 stored: Mapping[str, Feature], fmt: record_format.RecordFormat = record_format.TFRECORD):
        self.sample, self.keys, self.want, self.record_format = sample, keys, want, fmt
        self.image = stored.get(keys.image)
        self.layers = [f for name, f in sorted(stored.items()) if f.dtype == "image" and name != keys.image]
        self.wanted = {keys.image, keys.height, keys.width, keys.label, keys.filename, *sample.values}

    def short(self) -> Set[Optional[int]]:
        """The classes that still lack thumbnails."""
        return {c for c, n in self.want.items() if len(self.sample.thumbs[c]) < n}

    def sizes_done(self) -> bool:
        return self.sample.sampled >= self.sample.limit

    def done(self) -> bool:
        return self.sizes_done() and not self.short()

    def read_shard(self, path: str, filename: str) -> None:
        stream = open_if_exists(path)
        if stream is None:
            self.sample.problems.append(f"{filename}: missing")
            return
        self.sample.shards_read.append(filename)
        try:
            with stream:
                for index, raw in enumerate(self.record_format.read(stream, filename)):
                    self.sample.records_read += 1
                    self.take(schema.parse_example(raw, only=self.wanted), filename, index)
                    if self.done():
                        break
        except record_format.CorruptRecordError as e:
            self.sample.problems.append(f"{e} (run `imagerecords verify --records`)")

    def take(self, example: Mapping[str, List[Any]], shard: str, index: int) -> None:
        """Counts one record's size and feature values and keeps its thumbnail if its class is still short."""
        k, sample = self.keys, self.sample
        image = _first(example, k.image, b"")
        height, width = _first(example, k.height, None), _first(example, k.width, None)
        if sample.sampled < sample.limit:
            sample.sampled += 1
            if height is not None and width is not None:
                sample.sizes.append((height, width))
            if k.image in example:
                sample.image_bytes.append(len(image) if isinstance(image, bytes) else 0)
            feature_values.add_record(sample.values, example)
        label = _first(example, k.label, None)
        group = label if label in self.want else None if None in self.want else label
        if group not in self.want or len(sample.thumbs[group]) >= self.want[group]:
            return
        filename = _first(example, k.filename, b"").decode("utf-8", errors="replace")
        thumb = self._thumb(Thumb(label, filename, shard, height or 0, width or 0, index=index), example)
        thumb.boxes = {name: feature_values.boxes_of(sample.values[name].feature, example.get(name))
                       for name in sample.boxes}
        sample.thumbs[group].append(thumb)

    def _thumb(self, thumb: Thumb, example: Mapping[str, List[Any]]) -> Thumb:
        """Makes the record's thumbnail and its layers; a size the records do not hold is the decoded one."""
        values = example.get(self.keys.image)
        try:
            if values is None:
                raise feature_values.Undecodable(f"the record has no {self.keys.image!r} feature")
            if self.image is None or self.keys.image not in self.sample.values:
                thumb.data_uri, thumb.size, source = _thumbnail(values[0] if values else b"")
            else:  # declared by an arrays build: a raw array, or a PNG of one (small: enlarged)
                img = feature_values.picture(self.image, values)
                source = img.size
                thumb.data_uri, thumb.size = picture_thumbnail(img, smooth=self.image.dtype == "image")
            thumb.width, thumb.height = thumb.width or source[0], thumb.height or source[1]
        except (OSError, ValueError) as e:  # Pillow's UnidentifiedImageError is an OSError; Undecodable a ValueError
            thumb.error = f"{type(e).__name__}: {e}"
        for feature in self.layers:
            thumb.layers.append(self._layer(feature, example.get(feature.name), thumb))
        return thumb

    @staticmethod
    def _layer(feature: Feature, values: Optional[List[Any]], thumb: Thumb) -> Layer:
        layer = Layer(feature.name)
        try:
            if values is None:
                raise feature_values.Undecodable("the record has none")
            img = feature_values.picture(feature, values)
            layer.data_uri, layer.size = picture_thumbnail(img, thumb.size if thumb.data_uri else None)
        except feature_values.Undecodable as e:
            layer.error = str(e)
        return layer


def _first(example: Mapping[str, List[Any]], key: str, default: Any) -> Any:
    return (example.get(key) or [default])[0]


def thumbs_by_key(output: str, manifest: Manifest, keys: Set[str]) -> Dict[str, Thumb]:
    """{key: its record's thumbnail} for the records of `keys`, found through each shard's keys file
    (record order) and read from the shards that hold them, each only up to its last wanted record;
    a key no keys file names has none."""

    wanted: Dict[str, Dict[int, str]] = {}
    for split in manifest.splits:
        for shard in split.shards:
            path = side_files.keys_path(output, shard.filename)
            stream = open_if_exists(path) if path else None
            if stream is None:
                continue
            with stream:
                try:
                    rows = side_files.parse_keys(stream.read())
                except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                    continue
            at = {i: key for i, (key, _, _, _) in enumerate(rows) if key in keys}
            if at:
                wanted[shard.filename] = at
    out: Dict[str, Thumb] = {}
    for filename, at in sorted(wanted.items()):
        stream = open_if_exists(join(output, filename))
        if stream is None:
            continue
        last = max(at)
        try:
            with stream:
                for index, raw in enumerate(record_format.read(stream, filename)):
                    if index in at:
                        image = _first(schema.parse_example(raw), schema.keys(manifest.schema).image, b"")
                        thumb = Thumb(None, at[index], filename, 0, 0, index=index)
                        try:
                            thumb.data_uri, thumb.size = thumbnail(image)
                        except (OSError, ValueError) as e:  # Pillow's UnidentifiedImageError is an OSError
                            thumb.error = f"{type(e).__name__}: {e}"
                        out[at[index]] = thumb
                    if index >= last:
                        break
        except record_format.CorruptRecordError:
            continue  # the thumbnails it holds are missing from the page; `verify` says why
    return out
