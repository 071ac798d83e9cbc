"""What the report reads from a dataset's shards: thumbnails per class and the first records' sizes."""

from __future__ import annotations

import base64
import collections
import dataclasses
import io
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from imagerecords.format import records, schema
from imagerecords.format.manifest import Manifest, Split
from imagerecords.build.storage import join, open_if_exists

THUMB_SIDE = 96  # px, the longer side of a contact-sheet thumbnail


@dataclasses.dataclass
class Thumb:
    """One contact-sheet image: a record's image made small.

    Attributes:
      label: stored label id.
      filename: the record's filename feature.
      shard: shard file it came from.
      height: the stored image's height in px.
      width: the stored image's width in px.
      data_uri: the thumbnail as a data: URI, or None when the image did not decode.
      size: (width, height) of the thumbnail.
      error: why the image did not decode.
    """

    label: int
    filename: str
    shard: str
    height: int
    width: int
    data_uri: Optional[str] = None
    size: Tuple[int, int] = (0, 0)
    error: Optional[str] = None


@dataclasses.dataclass
class Sample:
    """What was read from one split's shards.

    Attributes:
      split: the split read.
      thumbs: {label id: thumbnails in shard order}.
      sizes: (height, width) of the first `limit` records in shard order.
      image_bytes: image byte sizes of the same records.
      limit: the sample size asked for.
      records_read: records read in all.
      shards_read: names of the shards opened, in order.
      problems: shards that could not be read to the end, with why.
    """

    split: str
    thumbs: Dict[int, List[Thumb]]
    sizes: List[Tuple[int, int]]
    image_bytes: List[int]
    limit: int
    records_read: int = 0
    shards_read: List[str] = dataclasses.field(default_factory=list)
    problems: List[str] = dataclasses.field(default_factory=list)


def label_counts(split: Split) -> Dict[int, int]:
    """{label id: records} of `split`, from the manifest's per-shard label histograms."""
    counts: Dict[int, int] = collections.Counter()
    for shard in split.shards:
        for label, n in shard.labels:
            counts[label] += n
    return counts


def label_ids(manifest: Manifest) -> List[int]:
    """Every label id of the dataset: the named ones and any a shard holds beyond them."""
    ids = {i + manifest.label_offset for i in range(len(manifest.label_names))}
    ids.update(label for split in manifest.splits for shard in split.shards for label, _ in shard.labels)
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
    from PIL import Image

    with Image.open(io.BytesIO(image)) as img:
        img.draft("RGB", (side, side))  # JPEG: decode at a reduced DCT scale, much faster for big images
        img = img.convert("RGB")
        img.thumbnail((side, side), Image.Resampling.LANCZOS)  # keeps the aspect ratio, never enlarges
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=85)
        size = img.size
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii"), size


def sample_split(output: str, manifest: Manifest, split: Split, classes: Sequence[int], per_class: int,
                 limit: int) -> Sample:
    """Reads `split`'s shards in order until each of `classes` has `per_class` thumbnails (or the
    split has no more of it) and the first `limit` records were seen, and stops there.

    Shards whose manifest histogram holds no class still short of thumbnails are skipped once the
    size sample is complete, so rare classes do not cost a read of every shard.
    """
    in_split = label_counts(split)
    want = {c: min(per_class, in_split.get(c, 0)) for c in classes}
    picker = _Picker(Sample(split.name, {c: [] for c in classes}, [], [], limit),
                     schema.keys(manifest.schema), {c: n for c, n in want.items() if n > 0})
    for shard in split.shards:
        if picker.done():
            break
        if picker.sizes_done() and not picker.short().intersection(label for label, _ in shard.labels):
            continue
        picker.read_shard(join(output, shard.filename), shard.filename)
    return picker.sample


class _Picker:
    """Fills one Sample from the records of the shards it is given, in order."""

    def __init__(self, sample: Sample, keys: schema.SchemaKeys, want: Mapping[int, int]):
        self.sample, self.keys, self.want = sample, keys, want
        self.wanted = {keys.image, keys.height, keys.width, keys.label, keys.filename}

    def short(self) -> Set[int]:
        """The classes that still lack thumbnails."""
        return {c for c, n in self.want.items() if len(self.sample.thumbs[c]) < n}

    def sizes_done(self) -> bool:
        return len(self.sample.sizes) >= self.sample.limit

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
                for raw in records.read_records(stream, filename):
                    self.sample.records_read += 1
                    self.take(schema.parse_example(raw, only=self.wanted), filename)
                    if self.done():
                        break
        except records.CorruptRecordError as e:
            self.sample.problems.append(f"{e} (run `imagerecords verify --records`)")

    def take(self, example: Mapping[str, List[Any]], shard: str) -> None:
        """Counts one record's size and keeps its thumbnail if its class is still short."""
        k, sample = self.keys, self.sample
        image = _first(example, k.image, b"")
        height, width = _first(example, k.height, 0), _first(example, k.width, 0)
        if len(sample.sizes) < sample.limit:
            sample.sizes.append((height, width))
            sample.image_bytes.append(len(image))
        label = _first(example, k.label, None)
        if label not in self.want or len(sample.thumbs[label]) >= self.want[label]:
            return
        filename = _first(example, k.filename, b"").decode("utf-8", errors="replace")
        sample.thumbs[label].append(_thumb(Thumb(label, filename, shard, height, width), image))


def _first(example: Mapping[str, List[Any]], key: str, default: Any) -> Any:
    return (example.get(key) or [default])[0]


def _thumb(thumb: Thumb, image: bytes) -> Thumb:
    try:
        thumb.data_uri, thumb.size = thumbnail(image)
    except (OSError, ValueError) as e:  # Pillow's UnidentifiedImageError is an OSError
        thumb.error = f"{type(e).__name__}: {e}"
    return thumb
