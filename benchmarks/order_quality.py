"""Shuffle quality of make_dataset's one order against the former default: label autocorrelation and digits accuracy.

Usage:
    python -m benchmarks.order_quality --work /tmp/order [--epochs 30] [--json out.json]

Builds scikit-learn's digits (examples/train_digits.py) once into WORK, then for each order
(default: the former default, shard interleave + shuffle buffer, now kept only under cache;
resumable: make_dataset's one order) reads three epochs of labels and reports the
lag-1 same-label rate of consecutive examples next to 1/num_classes (an order with no label
correlation has it at 1/num_classes), and trains the example's CNN for --epochs epochs with each
order, side by side in the same run (validation accuracy; same seed, same model).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example():
    spec = importlib.util.spec_from_file_location("train_digits", os.path.join(REPO, "examples", "train_digits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lag1_same_label(labels) -> float:
    """Share of consecutive pairs with equal labels."""
    pairs = list(zip(labels, labels[1:]))
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


def _in_order(name: str, make):
    from benchmarks.workloads import _former_default

    return _former_default(make) if name == "default" else make()


def labels_of(dataset: str, name: str, epochs: int = 3, batch_size: int = 64):
    from imagerecords import reader

    steps = reader.steps_per_epoch(dataset, "train", batch_size, training=True, resumable=name != "default")
    ds = _in_order(name, lambda: reader.make_dataset(dataset, "train", batch_size=batch_size, image_size=8,
                                                     training=True, seed=0, config=reader.ReadConfig(dtype="uint8")))
    out = []
    for _, labels in ds.take(steps * epochs):
        out += labels.numpy().tolist()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="folder for the digit images and dataset")
    p.add_argument("--epochs", type=int, default=30, help="training epochs per order (0: labels only)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    example = _example()
    images, dataset = os.path.join(a.work, "images"), os.path.join(a.work, "dataset")
    if not os.path.exists(os.path.join(dataset, "manifest.json")):
        example.write_digits(images)
        example.build(images, dataset, ["--direct_num_workers=1"])
    from imagerecords import reader

    classes = reader.load_info(dataset).num_classes
    out = {"chance_same_label": 1 / classes}
    orders = (("default", None), ("resumable", 0))  # "default": the former default order
    for name, _ in orders:
        out[f"{name}_lag1_same_label"] = lag1_same_label(labels_of(dataset, name))
    if a.epochs:
        for name, start in orders:
            out[f"{name}_accuracy"] = _in_order(name, lambda: example.train(dataset, a.epochs, start_step=start))[
                "accuracy"]
    print(f"lag-1 same-label rate (chance {out['chance_same_label']:.4f}): "
          + ", ".join(f"{n} {out[f'{n}_lag1_same_label']:.4f} ({out[f'{n}_lag1_same_label'] * classes:.2f} x chance)"
                      for n, _ in orders))
    if a.epochs:
        print(f"digits validation accuracy after {a.epochs} epochs: default {out['default_accuracy']:.4f}, "
              f"resumable {out['resumable_accuracy']:.4f} (ratio {out['resumable_accuracy'] / out['default_accuracy']:.3f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
