"""Builds a dataset from scikit-learn's handwritten digits, reads it with imagerecords.reader, trains a small CNN.

The digits (1,797 greyscale 8x8 scans that ship inside scikit-learn, UCI "optdigits") are written
out as PNG files in class folders, upscaled to 32x32 so the builder's JPEG encoding keeps the
strokes, then built into sharded TFRecords like any other folder of images:

    python examples/train_digits.py --output /tmp/digits            # full run, prints accuracy
    python examples/train_digits.py --output /tmp/digits --quick    # a few epochs, for tests
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Optional, Sequence

IMAGE_SIZE = 32


def write_digits(root: str) -> int:
    """Writes root/<digit>/<n>.png for every sklearn digit and returns how many it wrote."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for n, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        folder = os.path.join(root, str(label))
        os.makedirs(folder, exist_ok=True)
        grey = (pixels * (255.0 / 16.0)).round().astype(np.uint8)  # sklearn stores 0..16 ink levels
        Image.fromarray(grey, "L").resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC).save(
            os.path.join(folder, f"{n:04d}.png"))
    return len(digits.images)


def build(images: str, dataset: str, beam_args: Sequence[str] = ()) -> None:
    """Builds `images` into `dataset` with the imagerecords builder (train 80%, validation 20%)."""
    from imagerecords.cli.launcher import run

    run(["--input", images, "--output", dataset, "--splits", "train=0.8,validation=0.2", "--num_shards", "4",
         "--overwrite", "--no_progress", *beam_args])


def model(num_classes: int):
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(num_classes),
    ])


def train(dataset: str, epochs: int, batch_size: int = 32, seed: int = 0,
          start_step: Optional[int] = None) -> Dict[str, float]:
    """Trains on the 'train' split and returns {'accuracy': validation accuracy, ...}.

    start_step: None reads the default order; an int reads the resumable order from that step.
    """
    import tensorflow as tf

    from imagerecords import reader

    tf.keras.utils.set_random_seed(seed)
    info = reader.load_info(dataset)
    # Digits are centred and not mirror-symmetric: mild crops, no flips. The builder's images are
    # already the size the model wants, so evaluation keeps the whole image.
    config = reader.ReadConfig(random_flip=False, crop_area_range=(0.7, 1.0), crop_aspect_ratio_range=(0.85, 1.15),
                               eval_crop_fraction=1.0)
    train_ds = reader.make_dataset(dataset, "train", batch_size=batch_size, image_size=IMAGE_SIZE, training=True,
                                   seed=seed, config=config, start_step=start_step)
    val_ds = reader.make_dataset(dataset, "validation", batch_size=256, image_size=IMAGE_SIZE, config=config)
    net = model(info.num_classes)
    net.compile(optimizer=tf.keras.optimizers.Adam(3e-3),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    steps = reader.steps_per_epoch(dataset, "train", batch_size, training=True, resumable=start_step is not None)
    net.fit(train_ds, epochs=epochs, steps_per_epoch=steps, shuffle=False, verbose=2)  # the reader shuffles
    loss, accuracy = net.evaluate(val_ds, steps=reader.steps_per_epoch(dataset, "validation", 256), verbose=0)
    return {"accuracy": float(accuracy), "loss": float(loss),
            "train_examples": info.splits["train"].num_examples,
            "validation_examples": info.splits["validation"].num_examples}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True, help="folder for images/ and dataset/")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default 30, or 6 with --quick)")
    p.add_argument("--quick", action="store_true", help="a short run, for tests")
    args, beam_args = p.parse_known_args(argv)
    images, dataset = os.path.join(args.output, "images"), os.path.join(args.output, "dataset")
    if not os.path.exists(os.path.join(dataset, "manifest.json")):
        print(f"wrote {write_digits(images)} digit images to {images}")
        build(images, dataset, beam_args)
    epochs = args.epochs or (6 if args.quick else 30)
    result = train(dataset, epochs)
    print(f"validation accuracy after {epochs} epochs: {result['accuracy']:.4f} "
          f"({result['validation_examples']} images, {result['train_examples']} trained on)")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
