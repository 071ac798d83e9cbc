"""--image_encoding raw on a uint8 image array: the pixels' own bytes with their shape, read back
exactly by every reader (make_dataset, as_dataset, TFDS, Grain, torch); PNG stays the default.

Each row's label is its row number, so every reader's image is compared with its own source row."""

import importlib.util
import json
import os

import numpy as np
import pytest

from conftest import build

N = 12


def _arrays(channels):
    rng = np.random.default_rng(31 + channels)
    shape = (N, 6, 6) if channels == 1 else (N, 6, 6, channels)
    return rng.integers(0, 256, shape, dtype=np.uint8), np.arange(N, dtype=np.int64)


@pytest.fixture(scope="module", params=[3, 1], ids=["rgb", "grey"])
def raw(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"raw{request.param}")
    images, labels = _arrays(request.param)
    np.savez(base / "a.npz", image=images, label=labels)
    build(base / "a.npz", base / "out", "--image_encoding", "raw", "--num_shards", 3, "--write_index")
    pixels = images if images.ndim == 4 else images[..., None]
    return str(base / "out"), pixels


def test_the_manifest_says_uint8_pixels_of_their_shape(raw):
    out, pixels = raw
    with open(os.path.join(out, "manifest.json")) as f:
        m = json.load(f)
    shape = list(pixels.shape[1:]) if pixels.shape[-1] == 3 else list(pixels.shape[1:3])
    assert m["features"]["image"] == {"dtype": "uint8", "encoding": "bytes", "shape": shape}
    assert m["parameters"]["image"]["image_encoding"] == "raw"


def test_as_dataset_and_make_dataset_read_the_exact_pixels(raw):
    from imagerecords import reader
    from imagerecords.reader import ReadConfig

    out, pixels = raw
    got = {int(ex["label"]): ex["image"] for ex in reader.as_dataset(out, "train").as_numpy_iterator()}
    assert sorted(got) == list(range(N))
    for i, image in got.items():
        assert image.dtype == np.uint8 and np.array_equal(image.reshape(pixels.shape[1:]), pixels[i])
    config = ReadConfig(dtype="uint8", eval_crop_fraction=1.0, channels=pixels.shape[-1])
    seen = 0
    for image, label in reader.make_dataset(out, "train", batch_size=1, image_size=6, training=False, seed=0,
                                            config=config):
        assert np.array_equal(image.numpy()[0], pixels[int(label.numpy()[0])])
        seen += 1
    assert seen == N


def test_tfds_reads_the_exact_pixels(raw):
    import tensorflow_datasets as tfds

    out, pixels = raw
    ds = tfds.builder_from_directory(out).as_dataset(split="train")
    got = {int(ex["label"]): ex["image"] for ex in tfds.as_numpy(ds)}
    assert sorted(got) == list(range(N))
    assert all(np.array_equal(image.reshape(pixels.shape[1:]), pixels[i]) for i, image in got.items())


@pytest.mark.skipif(importlib.util.find_spec("grain") is None, reason="grain is not installed")
def test_grain_reads_the_exact_pixels(raw):
    from imagerecords.grain import RecordSource

    out, pixels = raw
    source = RecordSource(out, "train")
    got = {int(source[i]["label"]): source[i]["image"] for i in range(len(source))}
    assert sorted(got) == list(range(N))
    assert all(np.array_equal(image.reshape(pixels.shape[1:]), pixels[i]) for i, image in got.items())


@pytest.mark.needs_extra("torch")
def test_torch_reads_the_exact_pixels(raw):
    from imagerecords import torch as irt

    out, pixels = raw
    dataset = irt.RecordDataset(out, "train", layout="hwc")
    got = {int(label): image.numpy() for image, label in (dataset[i] for i in range(len(dataset)))}
    assert sorted(got) == list(range(N))
    rgb = pixels if pixels.shape[-1] == 3 else np.repeat(pixels, 3, axis=-1)  # decode() gives RGB, as for PNG
    assert all(np.array_equal(image, rgb[i]) for i, image in got.items())


def test_png_stays_the_default_for_uint8_images(tmp_path):
    images, labels = _arrays(3)
    np.savez(tmp_path / "a.npz", image=images, label=labels)
    build(tmp_path / "a.npz", tmp_path / "out", "--num_shards", 1)
    with open(tmp_path / "out" / "manifest.json") as f:
        assert json.load(f)["features"]["image"]["encoding"] == "png"
