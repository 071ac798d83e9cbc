"""Reads what the builder wrote as tf.data batches, guided by manifest.json; never imports apache_beam.

What the manifest alone answers (load_info, steps_per_epoch, examples_consumed, label_names,
stored_features, tfrecord_description, ReadConfig, HostPlan) imports no TensorFlow; the readers
themselves import it on first use.
"""

import importlib

from imagerecords.reader.config import ReadConfig, normalization_constants
from imagerecords.reader.hosts import HostPlan
from imagerecords.reader.info import DatasetInfo, ShardInfo, SplitInfo, load_info
from imagerecords.reader.meta import (examples_consumed, label_names, steps_per_epoch, stored_features,
                                      tfrecord_description)

# Names that need TensorFlow, and the module that defines each: imported when first asked for.
_NEEDS_TENSORFLOW = {
    "PAD_LABEL": "dataset",
    "ReadStats": "shards",
    "as_dataset": "typed",
    "as_numpy": "dataset",
    "feature_spec": "typed",
    "hide_gpus_from_tensorflow": "dataset",
    "make_dataset": "dataset",
    "numpy_batches": "dataset",
}

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


def __getattr__(name: str):
    module = _NEEDS_TENSORFLOW.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import tensorflow  # noqa: F401  (not in install_requires: the trainer brings its own distribution)
    except ImportError as e:
        raise ImportError(f"imagerecords.reader.{name} needs TensorFlow >= 2.16 (tensorflow, tensorflow-cpu, "
                          "tf-nightly, ...): pip install tensorflow, or pip install -e '.[tensorflow]' in "
                          "the imagerecords checkout") from e
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
