"""What a dataset's manifest alone answers, without TensorFlow: batch and example counts, class names, features."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

from imagerecords.format import features as features_lib
from imagerecords.format.features import Feature
from imagerecords.reader import config as config_lib
from imagerecords.reader import hosts as hosts_lib
from imagerecords.reader.config import ReadConfig
from imagerecords.reader.info import DatasetInfo, load_info

if TYPE_CHECKING:  # annotations only: importing this module must not start TensorFlow
    import tensorflow as tf


def host_count(input_context, num_hosts, host_index) -> Tuple[int, int]:
    """(hosts, this host) from an input_context, or from num_hosts/host_index (default one host)."""
    if input_context is not None:
        return input_context.num_input_pipelines, input_context.input_pipeline_id
    return (num_hosts or 1), (host_index or 0)


def host_plan(split_info, input_context, num_hosts, host_index, r: config_lib.Resolved) -> hosts_lib.HostPlan:
    """This host's HostPlan; make_dataset and steps_per_epoch both plan through here."""
    n_hosts, host = host_count(input_context, num_hosts, host_index)
    return hosts_lib.plan(split_info.files, split_info.shard_lengths, n_hosts, host, r.host_remainder)


def steps_per_epoch(
    path: Union[str, DatasetInfo],
    split: str,
    batch_size: int,
    *,
    training: bool = False,
    input_context: Optional[tf.distribute.InputContext] = None,
    num_hosts: Optional[int] = None,
    host_index: Optional[int] = None,
    config: Optional[ReadConfig] = None,
    resumable: Optional[bool] = None,
) -> int:
    """Returns the batches per epoch make_dataset yields with the same arguments (the same on every host).

    Computed from the manifest's counts and the host split; nothing is read. The resumable order
    (make_dataset's only order unless config.cache; `resumable` None follows config) gives each
    host num_examples / hosts records per epoch (rounded down for "drop", up for "pad");
    `resumable=False` counts the cached interleave pipeline's per-host shard shares.
    There, batches run on across epoch boundaries, so with drop_remainder an epoch's last
    records start the next epoch's first batch rather than being dropped.
    """
    r = config_lib.resolve(config or ReadConfig(), training, True)
    split_info = load_info(path).split(split)
    if resumable is None:
        resumable = not (config and config.cache)
    if resumable:
        n_hosts, _ = host_count(input_context, num_hosts, host_index)
        n = hosts_lib.per_host_records(split_info.num_examples, 0, n_hosts, r.host_remainder)
    else:
        n = host_plan(split_info, input_context, num_hosts, host_index, r).records_per_epoch
    return n // batch_size if r.drop_remainder else -(-n // batch_size)


def examples_consumed(
    path: Union[str, DatasetInfo],
    split: str,
    steps: int,
    batch_size: int,
    *,
    training: bool = False,
    input_context: Optional[tf.distribute.InputContext] = None,
    num_hosts: Optional[int] = None,
    config: Optional[ReadConfig] = None,
) -> int:
    """The global example count (make_dataset's start_example) after `steps` steps of the resumable order.

    `steps` synchronous steps of `batch_size` per host on `num_hosts` hosts (or the input_context's
    pipelines); epoch e begins at e * num_examples. Pass the result to make_dataset(...,
    start_example=n) on any host count.
    """
    r = config_lib.resolve(config or ReadConfig(), training, True)
    total = load_info(path).split(split).num_examples
    n_hosts, _ = host_count(input_context, num_hosts, 0 if num_hosts is not None else None)
    at = hosts_lib.position_of_step(steps, batch_size, total, n_hosts, r.host_remainder)
    return at.epoch * total + at.consumed


def label_names(path: Union[str, DatasetInfo]) -> List[str]:
    """Returns the class names; name i has stored label id i + the dataset's label offset."""
    return list(load_info(path).label_names)


def stored_features(path: Union[str, DatasetInfo]) -> Dict[str, Feature]:
    """{key: Feature} of everything the dataset's records hold (imagerecords.format.features)."""
    return {f.name: f for f in features_lib.stored(load_info(path).manifest)}


def tfrecord_description(path: Union[str, DatasetInfo]) -> Dict[str, str]:
    """The `description` argument of the `tfrecord` package's TFRecordDataset (PyTorch)."""
    return features_lib.tfrecord_description(stored_features(path).values())
