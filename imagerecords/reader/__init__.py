"""Reads what the builder wrote as tf.data batches, guided by manifest.json; never imports apache_beam."""

from imagerecords.reader.config import ReadConfig, normalization_constants
from imagerecords.reader.dataset import (PAD_LABEL, as_numpy, hide_gpus_from_tensorflow, label_names, make_dataset,
                                         numpy_batches, steps_per_epoch)
from imagerecords.reader.hosts import HostPlan
from imagerecords.reader.info import DatasetInfo, ShardInfo, SplitInfo, load_info
from imagerecords.reader.shards import ReadStats

__all__ = [
    "DatasetInfo",
    "HostPlan",
    "PAD_LABEL",
    "ReadConfig",
    "ReadStats",
    "ShardInfo",
    "SplitInfo",
    "as_numpy",
    "hide_gpus_from_tensorflow",
    "label_names",
    "load_info",
    "make_dataset",
    "normalization_constants",
    "numpy_batches",
    "steps_per_epoch",
]
