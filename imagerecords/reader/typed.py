"""as_dataset: every stored feature of every record, decoded by the manifest's feature spec.

make_dataset is the classification path (fixed-size images and a label, batched for a model);
as_dataset hands back what was stored, exactly, one example at a time as TFDS does.
"""

from __future__ import annotations

import functools
from typing import Dict, Optional, Sequence, Union

import tensorflow as tf

from imagerecords.format import codecs
from imagerecords.format import schema
from imagerecords.format.features import Feature
from imagerecords.reader import hosts as hosts_lib
from imagerecords.reader.config import CORRUPT_POLICIES
from imagerecords.reader.dataset import slice_files
from imagerecords.reader.info import DatasetInfo, check_tf_readable, load_info
from imagerecords.reader.meta import stored_features, tfrecord_description  # noqa: F401
from imagerecords.reader.shards import ReadStats, shard_records
from imagerecords.format.errors import ReadError

# What padded_batch fills a variable dimension with (as_dataset(batch_size=...)).
PAD_VALUES = {"number": 0, "class_list": -1, "string": b""}


def feature_spec(path: Union[str, DatasetInfo]) -> Dict[str, Union[tf.io.FixedLenFeature, tf.io.VarLenFeature]]:
    """The tf.io.parse_example / parse_single_example spec of the dataset's records.

    Images, strings and raw-bytes tensors are scalar tf.string (decode them with as_dataset, or
    tf.io.decode_image / tf.io.decode_raw); list-encoded tensors are FixedLenFeature of their
    shape, or VarLenFeature when a dimension is variable; class lists are VarLenFeature(int64).
    """
    return {name: _parse_spec(f) for name, f in stored_features(path).items()}


def _parse_spec(f: Feature):
    return codecs.codec(f).parse_spec(f, tf)


def _decode(f: Feature, value: tf.Tensor) -> tf.Tensor:
    return codecs.codec(f).to_tensor(f, value, tf)


def as_dataset(
    path: Union[str, DatasetInfo],
    split: str = "train",
    *,
    features: Optional[Sequence[str]] = None,
    shuffle: bool = False,
    seed: Optional[int] = None,
    shuffle_buffer: int = 1024,
    num_hosts: int = 1,
    host_index: int = 0,
    input_context: Optional[tf.distribute.InputContext] = None,
    host_remainder: str = "uneven",
    corrupt_records: str = "fail",
    batch_size: Optional[int] = None,
    num_parallel_calls: int = tf.data.AUTOTUNE,
    stats: Optional[ReadStats] = None,
) -> tf.data.Dataset:
    """Returns this host's examples of `split` as dicts {key: tensor}, decoded by the manifest's spec.

    Usage:
        ds = reader.as_dataset("OUT", "train")
        for ex in ds.take(1):
            ex["image"]    # uint8 [H, W, 3] (or [H, W, C]; uint16 for 16-bit images)
            ex["boxes"]    # float32 [n, 4]: a variable dimension is the example's own length
            ex["tags"]     # int64 [k]: class ids (names in manifest.json's features.tags.names)

    Values: images decoded (uint8, or uint16 for a 16-bit image feature) with their channels (an
    --image_encoding raw image: float32 [H, W, C], exactly the source's pixels); raw
    tensors decoded and reshaped to their dtype and shape; list tensors cast to their dtype;
    class lists as int64 ids; strings as tf.string. Without shuffling the order is deterministic:
    shards in index order, records in file order.

    Args:
      path: the dataset folder (local or gs://) or its DatasetInfo.
      split: split name.
      features: the keys to return (default: all).
      shuffle: shuffle shard order and records (a buffer of `shuffle_buffer`), seeded by `seed`.
      num_hosts, host_index, input_context: this host's share (imagerecords.reader.hosts: whole
        shards dealt round-robin, the leftover shards split by record).
      host_remainder: 'uneven' (every record exactly once; hosts may differ by one record) or
        'drop' (every host the same count, the smallest).
      corrupt_records: 'fail' or 'skip', as in make_dataset.
      batch_size: if set, padded batches: variable dimensions are padded with 0 (numbers), -1
        (class lists) and b'' (strings); images of different sizes are padded with zeros too.
      stats: a ReadStats to fill with the counts of skipped and extra records.

    Raises:
      ValueError: a bad argument, an unknown split or feature.
      FileNotFoundError: naming every missing shard this host reads.
      imagerecords.format.access.ShardSizeError: (a ValueError; corrupt_records='fail') naming a
        shard file of another size than manifest.json lists, before anything is read.
    """
    if host_remainder not in ("uneven", "drop"):
        raise ReadError(f"as_dataset: host_remainder {host_remainder!r} is not 'uneven' or 'drop'")
    if corrupt_records not in CORRUPT_POLICIES:
        raise ReadError(f"as_dataset: corrupt_records {corrupt_records!r} is not 'fail' or 'skip'")
    if input_context is not None:
        num_hosts, host_index = input_context.num_input_pipelines, input_context.input_pipeline_id
    info = load_info(path)
    check_tf_readable(info, "as_dataset")
    split_info = info.split(split)
    spec = stored_features(info)
    wanted = list(features) if features is not None else sorted(spec)
    unknown = [k for k in wanted if k not in spec]
    if unknown:
        raise ReadError(f"as_dataset: {info.path} has no feature(s) {', '.join(unknown)}; it has {', '.join(sorted(spec))}")
    keys = schema.keys(info.schema)
    plan = hosts_lib.plan(split_info.files, split_info.shard_lengths, num_hosts, host_index, "drop")
    slices = plan.slices
    stats = stats or ReadStats()
    files = slice_files(slices, split_info, policy=corrupt_records, stats=stats, dataset=info.path)
    if shuffle and len(slices) > 1:
        files = files.shuffle(len(slices), seed=seed, reshuffle_each_iteration=True)
    read = functools.partial(shard_records, policy=corrupt_records, stats=stats, dataset=info.path)
    records = files.flat_map(read)
    if host_remainder == "drop":
        records = records.take(plan.records_per_epoch)
    if shuffle:
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    raw = [k for k in wanted if spec[k].dtype == "image" and spec[k].encoding == "raw"]
    size_keys = [k for k in (keys.height, keys.width) if raw]  # a raw image's shape
    parse_spec = {k: _parse_spec(spec[k]) for k in [*wanted, *size_keys]}

    def decode(serialized):
        parsed = tf.io.parse_single_example(serialized, parse_spec)
        out = {k: _decode(spec[k], parsed[k]) for k in wanted if k not in raw}
        for k in raw:
            pixels = tf.io.decode_raw(parsed[k], tf.float32, little_endian=True)
            out[k] = tf.reshape(pixels, [parsed[keys.height], parsed[keys.width], -1])
        return out

    examples = records.map(decode, num_parallel_calls=num_parallel_calls, deterministic=not shuffle or seed is not None)
    if batch_size:
        pads = {k: tf.constant(_pad(spec[k]), dtype=examples.element_spec[k].dtype) for k in wanted}
        examples = examples.padded_batch(batch_size, padding_values=pads)
    return examples.prefetch(tf.data.AUTOTUNE)


def _pad(f: Feature):
    if f.dtype == "string":
        return PAD_VALUES["string"]
    if f.dtype == "class_list":
        return PAD_VALUES["class_list"]
    return PAD_VALUES["number"]
