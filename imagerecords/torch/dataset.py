"""A map-style PyTorch dataset over one split: any record by its index-file offset, decoded with Pillow."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from imagerecords.format import access, record_format, schema
from imagerecords.format import codecs
from imagerecords.format import features as features_lib
from imagerecords.format.access import INDEX_POLICIES, MissingIndexError, load_manifest  # noqa: F401
from imagerecords.format.files import Files
from imagerecords.format.paths import has_scheme, join
from imagerecords.torch import transforms as T
from imagerecords.torch.order import PAD_LABEL, Ticket
from imagerecords.format.errors import NoSuchFeature, OutOfRange, ReadError, RecordUndecodable

LAYOUTS = ("chw", "hwc")


class RecordDataset(torch.utils.data.Dataset):
    """One split of a built dataset, indexable by record (shard order) or by the sampler's Tickets.

    `dataset[i]` is record `i` of the split; `imagerecords.torch.Loader` asks for Tickets instead,
    which also carry the epoch and global position that seed the element's augmentation, so a
    resumed run crops and flips every example as the first run would have.

    Each element is `(image, label)` (`(image, label, record index)` with with_index): image a
    uint8 tensor, [3, H, W] ("chw") or [H, W, 3] ("hwc"); label an int. A padding element (see
    imagerecords.torch.order) has label PAD_LABEL (-1), an all-zero image and record index -1.
    With `features`, a last item is added: {name: value} of those stored features, decoded by
    manifest.json's spec (a tensor of its dtype and shape, a class list as int64 ids, a string as
    str, an image feature as a uint8/uint16 [H, W, C] tensor); a padding element's are a real
    record's, so mask them by its label. Variable shapes (boxes) need a collate_fn that keeps lists.

    Usage:
      from imagerecords import torch as irt
      train = irt.RecordDataset("OUT", "train", image_size=224, training=True)
      loader = irt.Loader(train, batch_size=256, seed=0, num_workers=8)
      for images, labels in loader: ...
      state = loader.state_dict()  # {seed, epoch, consumed, num_examples, dataset}: resume with load_state_dict

    Args:
      path: the dataset folder (local or gs://).
      split: split name.
      image_size: output side; with training=True a RandomResizedCrop + flip, else a CenterCrop
        (resize the shorter side to image_size / 0.875, crop the center). None: the whole image.
      training: which of the two crops image_size picks.
      transform: instead of image_size: a RandomResizedCrop or CenterCrop of
        imagerecords.torch.transforms, or any callable of an RGB PIL image (torchvision
        transforms, say) that returns an image, array or tensor; it runs with torch's random
        generator seeded by (seed, epoch, position), restored afterwards.
      layout: "chw" or "hwc" (images from a plain callable returning a tensor are left as they are).
      index: "require" (default): fail, saying how to mend it, when a shard has no index file;
        "scan": find such a shard's offsets by reading it once, here, when the dataset is made.
      with_index: also return each element's record index.
      read_threads: concurrent ranged reads per batch for gs:// shards (hides request latency).
      features: declared (or arrays) features to return besides the image and label, by name.

    Raises:
      FileNotFoundError: when `path` holds no published dataset.
      ValueError: for an unknown split or conflicting arguments (all named together);
        MissingIndexError (a ValueError) for shards without index files under index="require".
    """

    def __init__(self, path: str, split: str, *, image_size: Optional[int] = None, training: bool = False,
                 transform: Optional[Callable] = None, layout: str = "chw", index: str = "require",
                 with_index: bool = False, read_threads: int = 16, features: Sequence[str] = ()):
        problems = []
        if layout not in LAYOUTS:
            problems.append(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if index not in INDEX_POLICIES:
            problems.append(f"index must be one of {INDEX_POLICIES}, got {index!r}")
        if image_size is not None and transform is not None:
            problems.append("pass image_size or transform, not both")
        if read_threads < 1:
            problems.append(f"read_threads must be >= 1, got {read_threads}")
        if problems:
            raise ReadError("; ".join(problems))
        self.path = str(path).rstrip("/") if has_scheme(str(path)) else str(path)
        self._files = Files()
        self.manifest = load_manifest(self.path, self._files)
        try:
            split_entry = self.manifest.split(split)
        except KeyError as e:
            raise ReadError(f"{self.path}: {e.args[0]}") from None
        self.split = split
        self.keys = schema.keys(self.manifest.schema)
        stored = {f.name: f for f in features_lib.stored(self.manifest)}
        unknown = [name for name in features if name not in stored]
        if unknown:
            raise ReadError(f"{self.path}: no feature(s) {', '.join(unknown)}; its records hold "
                            f"{', '.join(sorted(stored))}")
        self.features = tuple(stored[name] for name in features)
        self._raw_shape = features_lib.raw_pixels_shape(stored.get(self.keys.image))  # pixels, not an encoding
        if transform is None and image_size is not None:
            transform = T.RandomResizedCrop(image_size) if training else T.CenterCrop(image_size)
        self.transform, self.layout, self.with_index, self.read_threads = transform, layout, with_index, read_threads
        self.shard_paths = [join(self.path, s.filename) for s in split_entry.shards]
        # The records in split order, whatever folder they sit in: what a Loader state's positions mean.
        self.digest = access.split_digest(split_entry.shards)
        self.record_format = record_format.of(self.manifest)
        self.offsets, self.lengths, self.shard_of = self._load_offsets(split_entry.shards, index)
        self._pool: Optional[Tuple[int, ThreadPoolExecutor]] = None

    @property
    def label_names(self) -> Tuple[str, ...]:
        return self.manifest.label_names

    @property
    def num_classes(self) -> int:
        """Logits a classifier needs for the stored ids: classes + the build's label offset."""
        return len(self.manifest.label_names) + self.manifest.label_offset

    def __len__(self) -> int:
        return len(self.offsets)

    def _load_offsets(self, shards: Sequence, index: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        return access.load_offsets(self._files, self.path, self.split, shards, index, self.record_format)

    def record(self, i: int) -> bytes:
        """The serialized Example of record `i`, checked by its format (TFRecord: both CRCs of its frame).

        Raises:
          CorruptRecordError: naming the shard and byte offset of a bad frame.
        """
        shard_path, offset, length = self.shard_paths[self.shard_of[i]], int(self.offsets[i]), int(self.lengths[i])
        return access.read_record(self._files, self.record_format, self.path, shard_path, offset, length)

    def __getitem__(self, key: Union[int, Ticket]):
        ticket = self._ticket(key)
        return self._element(ticket, self.record(ticket.record))

    def __getitems__(self, keys: Sequence[Union[int, Ticket]]) -> List[Any]:
        """A batch (what DataLoader's fetcher asks for): gs:// records are read concurrently."""
        tickets = [self._ticket(k) for k in keys]
        if len(tickets) > 1 and self.read_threads > 1 and has_scheme(self.path):
            records = list(self._reader_pool().map(lambda t: self.record(t.record), tickets))
        else:
            records = [self.record(t.record) for t in tickets]
        return [self._element(t, r) for t, r in zip(tickets, records)]

    def _reader_pool(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool[0] != os.getpid():
            self._pool = (os.getpid(), ThreadPoolExecutor(self.read_threads, thread_name_prefix="imagerecords-read"))
        return self._pool[1]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pool"] = None  # threads do not cross processes
        return state

    def _ticket(self, key: Union[int, Ticket]) -> Ticket:
        if isinstance(key, Ticket):
            return key
        i = int(key)
        if not 0 <= i < len(self):
            raise OutOfRange(f"record {key} is out of range for split {self.split!r} of {len(self)} records")
        return Ticket(i, 0, 0, i)

    def _element(self, ticket: Ticket, record: bytes):
        example = schema.parse_example(record, only=(self.keys.image, self.keys.label,
                                                     *(f.name for f in self.features)))
        encoded, labels = example.get(self.keys.image), example.get(self.keys.label)
        if not encoded or not labels:
            raise NoSuchFeature(f"{self.shard_paths[self.shard_of[ticket.record]]}: record {ticket.record} has no "
                           f"{self.keys.image!r} or {self.keys.label!r} feature (schema {self.manifest.schema})")
        image = self._image(encoded[0], ticket)
        label, index = int(labels[0]), ticket.record
        if ticket.pad:
            image, label, index = torch.zeros_like(image), PAD_LABEL, -1
        element = (image, label, index) if self.with_index else (image, label)
        if self.features:
            element += (self._features(example, ticket),)
        return element

    def _features(self, example, ticket: Ticket) -> dict:
        out = {}
        for feature in self.features:
            values = example.get(feature.name)
            if values is None:
                raise NoSuchFeature(f"{self.shard_paths[self.shard_of[ticket.record]]}: record {ticket.record} has no "
                               f"{feature.name!r} feature")
            if feature.dtype == "image":
                out[feature.name] = torch.from_numpy(features_lib.image_to_numpy(feature, values[0]))
                continue
            try:
                value = codecs.to_numpy(feature, values)
            except ValueError as e:
                raise RecordUndecodable(f"{self.shard_paths[self.shard_of[ticket.record]]}: record {ticket.record}: {e}") from None
            out[feature.name] = value if isinstance(value, str) else torch.from_numpy(np.array(value))
        return out

    def _image(self, data: bytes, ticket: Ticket) -> torch.Tensor:
        transform = self.transform
        if self._raw_shape is not None:
            data = T.from_pixels(data, self._raw_shape)
        if transform is None:
            image = T.decode(data)
        elif isinstance(transform, (T.RandomResizedCrop, T.CenterCrop)):
            image = transform(data, np.random.default_rng([ticket.seed, ticket.epoch, ticket.position]))
        else:
            # torch's generator, seeded per element (torchvision draws from it), then put back.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(np.random.SeedSequence([ticket.seed, ticket.epoch, ticket.position])
                                      .generate_state(1, np.uint64)[0] >> np.uint64(1)))
                image = transform(T.decode(data))
            if isinstance(image, torch.Tensor):
                return image
        array = torch.from_numpy(np.array(image, dtype=np.uint8, copy=True))
        if array.ndim == 2:
            array = array[:, :, None]
        return array.permute(2, 0, 1).contiguous() if self.layout == "chw" else array

    def __repr__(self) -> str:
        return (f"RecordDataset({self.path!r}, {self.split!r}, {len(self)} records, transform={self.transform!r}, "
                f"layout={self.layout!r})")
