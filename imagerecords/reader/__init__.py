"""Reads what the builder wrote as tf.data batches, guided by manifest.json; never imports apache_beam."""

try:
    import tensorflow  # noqa: F401  (not in install_requires: the trainer brings its own distribution)
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("imagerecords.reader needs TensorFlow >= 2.16 (tensorflow, tensorflow-cpu, tf-nightly, ...): "
                      "pip install 'imagerecords[tensorflow]'") from e

from imagerecords.reader.config import ReadConfig, normalization_constants
from imagerecords.reader.dataset import (PAD_LABEL, as_numpy, examples_consumed, hide_gpus_from_tensorflow,
                                         label_names, make_dataset, numpy_batches, steps_per_epoch)
from imagerecords.reader.hosts import HostPlan
from imagerecords.reader.info import DatasetInfo, ShardInfo, SplitInfo, load_info
from imagerecords.reader.shards import ReadStats
from imagerecords.reader.typed import as_dataset, feature_spec, stored_features, tfrecord_description

__all__ = [
    "DatasetInfo",
    "HostPlan",
    "PAD_LABEL",
    "ReadConfig",
    "ReadStats",
    "ShardInfo",
    "SplitInfo",
    "as_dataset",
    "as_numpy",
    "examples_consumed",
    "feature_spec",
    "hide_gpus_from_tensorflow",
    "label_names",
    "load_info",
    "make_dataset",
    "normalization_constants",
    "numpy_batches",
    "steps_per_epoch",
    "stored_features",
    "tfrecord_description",
]
