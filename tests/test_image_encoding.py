"""--image_encoding png / keep: real Pillow images in tmp_path, real builds, read back with TF, TFDS and the reader."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from conftest import build, read_examples, shard_files
from imagerecords.pipeline.encode import image_codec as codec

RNG = np.random.default_rng(7)


def _rgb(h=20, w=28):
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _save(img, path, **kw):
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kw)
    return path


def _records(out):
    """{filename: serialized Example bytes} of every record, read raw (no re-serialization)."""
    import tensorflow as tf

    got = {}
    for path in shard_files(out):
        for raw in tf.data.TFRecordDataset(path):
            ex = tf.train.Example.FromString(raw.numpy())
            got[ex.features.feature["image/filename"].bytes_list.value[0].decode()] = raw.numpy()
    return got


def _image_bytes(out, key="image"):
    return {k: ex.features.feature[key].bytes_list.value[0] for k, ex in read_examples(out).items()}


def _pixels(data):
    return np.asarray(Image.open(io.BytesIO(data)))


@pytest.fixture(scope="module")
def mixed_tree(tmp_path_factory):
    """PNGs of every kind the png encoding keeps, plus JPEGs and other formats; returns (root, arrays)."""
    root = tmp_path_factory.mktemp("mixed") / "images"
    arrays = {}
    rgb = _rgb()
    arrays["colour/rgb.png"] = rgb
    _save(Image.fromarray(rgb), root / "colour/rgb.png")
    rgba = np.dstack([_rgb(), RNG.integers(0, 256, (20, 28), dtype=np.uint8)])
    arrays["colour/rgba.png"] = rgba
    _save(Image.fromarray(rgba, "RGBA"), root / "colour/rgba.png")
    palette = Image.fromarray(_rgb()).quantize(16)
    arrays["colour/palette.png"] = np.asarray(palette.convert("RGB"))
    _save(palette, root / "colour/palette.png")
    keyed = Image.fromarray(_rgb()).quantize(8)
    keyed.info["transparency"] = 3
    arrays["colour/palette_alpha.png"] = np.asarray(keyed.convert("RGBA"))
    _save(keyed, root / "colour/palette_alpha.png", transparency=3)
    arrays["colour/photo.gif"] = np.asarray(Image.fromarray(_rgb()).quantize(32).convert("RGB"))
    _save(Image.fromarray(arrays["colour/photo.gif"]).quantize(32), root / "colour/photo.gif")
    arrays["colour/photo.gif"] = np.asarray(Image.open(root / "colour/photo.gif").convert("RGB"))
    bmp = _rgb()
    arrays["colour/photo.bmp"] = bmp
    _save(Image.fromarray(bmp), root / "colour/photo.bmp")
    _save(Image.fromarray(_rgb(32, 40)), root / "colour/photo.jpg", quality=90)
    arrays["colour/photo.jpg"] = _pixels((root / "colour/photo.jpg").read_bytes())
    grey = RNG.integers(0, 256, (24, 24), dtype=np.uint8)
    arrays["grey/grey.png"] = grey
    _save(Image.fromarray(grey, "L"), root / "grey/grey.png")
    la = np.dstack([RNG.integers(0, 256, (24, 24), dtype=np.uint8), RNG.integers(0, 256, (24, 24), dtype=np.uint8)])
    arrays["grey/grey_alpha.png"] = la
    _save(Image.fromarray(la, "LA"), root / "grey/grey_alpha.png")
    _save(Image.fromarray(RNG.integers(0, 256, (24, 32), dtype=np.uint8), "L"), root / "grey/grey.jpg", quality=90)
    arrays["grey/grey.jpg"] = _pixels((root / "grey/grey.jpg").read_bytes())
    return root, arrays


def test_keep_stores_png_and_jpeg_sources_byte_for_byte(mixed_tree, tmp_path):
    root, arrays = mixed_tree
    out = tmp_path / "keep"
    manifest = build(root, out, "--image_encoding", "keep", "--schema", "tf-models", "--num_shards", 2)
    examples = read_examples(out)
    assert sorted(examples) == sorted(arrays)
    for key, ex in examples.items():
        f = ex.features.feature
        data = f["image/encoded"].bytes_list.value[0]
        source = (root / key).read_bytes()
        if key.endswith((".png", ".jpg")):
            assert data == source, key  # PNG stays PNG, JPEG (RGB or grey) stays JPEG, byte for byte
        else:
            assert data[:8] == b"\x89PNG\r\n\x1a\n", key  # GIF and BMP become PNG
            assert np.array_equal(_pixels(data), arrays[key]), key
        assert f["image/format"].bytes_list.value[0] == (b"JPEG" if key.endswith(".jpg") else b"PNG"), key
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["image_encoding"] == "keep" and raw["parameters"]["image"]["image_encoding"] == "keep"
    assert manifest.image_kinds == {"jpeg:1:uint8": 1, "jpeg:3:uint8": 1, "png:2:uint8": 1, "png:3:uint8": 4,
                                    "png:4:uint8": 2, "png:1:uint8": 1}
    assert sum(sh.passthrough for s in manifest.splits for sh in s.shards) == 8


def test_png_reencodes_every_image_pixel_exactly(mixed_tree, tmp_path):
    root, arrays = mixed_tree
    out = tmp_path / "png"
    manifest = build(root, out, "--image_encoding", "png", "--num_shards", 2)
    stored = _image_bytes(out)
    assert sorted(stored) == sorted(arrays)
    for key, data in stored.items():
        assert data[:8] == b"\x89PNG\r\n\x1a\n", key
        img = Image.open(io.BytesIO(data))
        assert img.info.keys() <= {"transparency"} and "transparency" not in img.info, (key, img.info)
        got = np.asarray(img)
        # Alpha is kept (RGBA, LA, a palette's transparent entry as an alpha channel); greyscale stays 1 channel.
        assert got.shape == arrays[key].shape and np.array_equal(got, arrays[key]), key
    assert _pixels(stored["colour/palette_alpha.png"])[..., 3].min() == 0
    assert sum(sh.passthrough for s in manifest.splits for sh in s.shards) == 0
    # The format key of the tfds preset says PNG too, through TensorFlow's own decoder.
    import tensorflow as tf

    for key in ("colour/rgba.png", "grey/grey.png"):
        assert np.array_equal(tf.io.decode_png(stored[key], channels=0).numpy().squeeze(), arrays[key])


def test_png_bytes_are_deterministic_and_carry_no_metadata(tmp_path):
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "written at some time")
    pixels = _rgb()
    path = _save(Image.fromarray(pixels), tmp_path / "in.png", pnginfo=info, dpi=(300, 300))
    a = codec.prepare_image(path.read_bytes(), codec.ImageOptions(image_encoding="png"))
    b = codec.prepare_image(path.read_bytes(), codec.ImageOptions(image_encoding="png"))
    assert a.data == b.data and a.format == "png" and not a.passthrough
    assert b"tEXt" not in a.data and b"pHYs" not in a.data and b"tIME" not in a.data
    assert np.array_equal(_pixels(a.data), pixels)


@pytest.fixture(scope="module")
def sixteen_bit(tmp_path_factory):
    root = tmp_path_factory.mktemp("sixteen") / "images"
    arrays = {}
    for cls in ("low", "high"):
        for i in range(3):
            arr = RNG.integers(0, 65536, (16, 16), dtype=np.uint16)
            arr[0, 0] = 257 * 3 + 1  # a value 8 bits cannot hold
            key = f"{cls}/{i}.png"
            _save(Image.fromarray(arr), root / key)
            assert Image.open(root / key).mode == "I;16"
            arrays[key] = arr
    return root, arrays


@pytest.mark.parametrize("encoding", ["png", "keep"])
def test_16_bit_greyscale_keeps_its_16_bits(sixteen_bit, tmp_path, encoding):
    import tensorflow as tf

    root, arrays = sixteen_bit
    out = tmp_path / encoding
    manifest = build(root, out, "--image_encoding", encoding, "--num_shards", 1)
    assert manifest.image_kinds == {"png:1:uint16": 6}
    for key, data in _image_bytes(out).items():
        if encoding == "keep":
            assert data == (root / key).read_bytes()
        got = tf.io.decode_png(data, dtype=tf.uint16).numpy()[..., 0]
        assert np.array_equal(got, arrays[key]), key
    features = json.loads((out / "features.json").read_text())["featuresDict"]["features"]["image"]["image"]
    assert features == {"dtype": "uint16", "encodingFormat": "png", "shape": {"dimensions": ["-1", "-1", "1"]}}
    # The reader's classification path scales 16 bits to 0..255 and keeps the precision in float.
    from imagerecords import reader

    ds = reader.make_dataset(str(out), "train", batch_size=6, image_size=16,
                             config=reader.ReadConfig(channels=1, eval_crop_fraction=1.0, normalization="none",
                                                      with_filename=True))
    images, _, names = next(iter(ds))
    for image, name in zip(images.numpy(), names.numpy()):
        want = arrays[name.decode()].astype(np.float64) * 255 / 65535
        assert np.abs(image[..., 0] - want).max() < 1e-3, name


@pytest.mark.slow
def test_tfds_builder_from_directory_loads_png_datasets(mixed_tree, sixteen_bit, tmp_path):
    import tensorflow_datasets as tfds

    root, arrays = sixteen_bit
    out = tmp_path / "sixteen"
    build(root, out, "--image_encoding", "png", "--num_shards", 1)
    builder = tfds.builder_from_directory(str(out))
    seen = 0
    for ex in builder.as_dataset(split="train"):
        assert ex["image"].dtype.name == "uint16" and ex["image"].shape[-1] == 1
        assert np.array_equal(ex["image"].numpy()[..., 0], arrays[ex["image/filename"].numpy().decode()])
        seen += 1
    assert seen == 6
    # Mixed channel counts (grey, RGB, alpha), all PNG: one declared count, 4, that every record decodes to.
    root, arrays = mixed_tree
    out = tmp_path / "mixed"
    build(root, out, "--image_encoding", "png", "--num_shards", 1)
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["image"].shape == (None, None, 4)  # every record is a PNG, some with alpha
    got = {ex["image/filename"].numpy().decode(): ex["image"].numpy() for ex in builder.as_dataset(split="train")}
    assert np.array_equal(got["colour/rgba.png"], arrays["colour/rgba.png"])
    assert np.array_equal(got["colour/rgb.png"][..., :3], arrays["colour/rgb.png"])
    assert len(got) == len(arrays)


@pytest.mark.slow
def test_make_dataset_reads_a_greyscale_png_dataset(tmp_path):
    from imagerecords import reader

    root = tmp_path / "images"
    arrays = {}
    for cls in ("a", "b"):
        for i in range(4):
            arr = RNG.integers(0, 256, (12, 12), dtype=np.uint8)
            arrays[f"{cls}/{i}.png"] = arr
            _save(Image.fromarray(arr, "L"), root / cls / f"{i}.png")
    out = tmp_path / "ds"
    manifest = build(root, out, "--image_encoding", "png", "--num_shards", 2)
    assert manifest.image_kinds == {"png:1:uint8": 8}
    config = reader.ReadConfig(channels=1, dtype="uint8", eval_crop_fraction=1.0, with_filename=True)
    images, labels, names = next(iter(reader.make_dataset(str(out), "train", batch_size=8, image_size=12,
                                                          config=config)))
    assert images.shape == (8, 12, 12, 1) and images.dtype.name == "uint8"
    for image, label, name in zip(images.numpy(), labels.numpy(), names.numpy()):
        key = name.decode()
        assert np.array_equal(image[..., 0], arrays[key]), key
        assert manifest.label_names[label] == key.split("/")[0]
    # The default stays the 3-channel classification input: grey becomes R = G = B.
    images, _ = next(iter(reader.make_dataset(str(out), "train", batch_size=8, image_size=12,
                                              config=reader.ReadConfig(dtype="uint8", eval_crop_fraction=1.0))))
    images = images.numpy()
    assert images.shape == (8, 12, 12, 3) and (images[..., 0] == images[..., 2]).all()
    # Training: random crops of PNG records, repeatable with a seed.
    train = reader.make_dataset(str(out), "train", batch_size=4, image_size=8, training=True, seed=3,
                                config=reader.ReadConfig(channels=1))
    again = reader.make_dataset(str(out), "train", batch_size=4, image_size=8, training=True, seed=3,
                                config=reader.ReadConfig(channels=1))
    a, b = next(iter(train))[0].numpy(), next(iter(again))[0].numpy()
    assert a.shape == (4, 8, 8, 1) and np.array_equal(a, b)


@pytest.mark.slow
def test_make_dataset_reads_a_keep_dataset_of_jpeg_and_png_with_alpha(mixed_tree, tmp_path):
    from imagerecords import reader

    root, arrays = mixed_tree
    out = tmp_path / "keep"
    build(root, out, "--image_encoding", "keep", "--num_shards", 1)
    config = reader.ReadConfig(dtype="float32", normalization="none", eval_crop_fraction=1.0, with_filename=True)
    ds = reader.make_dataset(str(out), "train", batch_size=len(arrays), image_size=8, config=config)
    images, _, names = next(iter(ds))
    assert images.shape == (len(arrays), 8, 8, 3)
    assert np.isfinite(images.numpy()).all() and 0 <= images.numpy().min() and images.numpy().max() <= 255
    # A fully transparent RGBA image reads as white, as JPEG builds composite it.
    clear = tmp_path / "clear"
    _save(Image.fromarray(np.zeros((10, 10, 4), np.uint8), "RGBA"), clear / "x" / "clear.png")
    _save(Image.fromarray(_rgb(10, 10)), clear / "y" / "solid.png")
    build(clear, tmp_path / "clear_ds", "--image_encoding", "png", "--num_shards", 1)
    images, _, names = next(iter(reader.make_dataset(str(tmp_path / "clear_ds"), "train", batch_size=2,
                                                     image_size=10, config=config)))
    by_name = dict(zip([n.decode() for n in names.numpy()], images.numpy()))
    assert (by_name["x/clear.png"] == 255).all()


def test_channels_setting_is_checked():
    from imagerecords import reader

    with pytest.raises(ValueError, match="channels must be 1"):
        reader.ReadConfig(channels=4)
    with pytest.raises(ValueError, match="channels=1 takes normalization"):
        reader.ReadConfig(channels=1, normalization="imagenet")


@pytest.mark.slow
def test_quality_100_is_accepted_and_closer_than_95(tmp_path):
    yy, xx = np.mgrid[0:48, 0:64]
    pixels = np.stack([(xx * 4) % 256, (yy * 5) % 256, ((xx + yy) * 3) % 256], -1).astype(np.uint8)
    source = _save(Image.fromarray(pixels), tmp_path / "images" / "a" / "x.png")
    errors = {}
    for quality in (95, 100):
        out = tmp_path / f"q{quality}"
        build(tmp_path / "images", out, "--quality", quality, "--num_shards", 1)
        data = _image_bytes(out)["a/x.png"]
        assert data[:3] == b"\xff\xd8\xff"
        errors[quality] = np.abs(_pixels(data).astype(int) - pixels.astype(int)).max()
    assert errors[100] < errors[95], errors
    with pytest.raises(ValueError, match="1..100"):
        codec.ImageOptions(quality=101)
    assert source.exists()


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["png", "keep"])
def test_local_engine_and_beam_writer_store_the_same_bytes(mixed_tree, tmp_path, encoding):
    root, _ = mixed_tree
    local = tmp_path / "local"
    beam = tmp_path / "beam"
    ours = build(root, local, "--image_encoding", encoding, "--num_shards", 2)
    theirs = build(root, beam, "--image_encoding", encoding, "--num_shards", 2, "--writer", "beam")
    assert _records(local) == _records(beam)
    assert ours.image_kinds == theirs.image_kinds
    assert (local / "features.json").read_bytes() == (beam / "features.json").read_bytes()


def test_keep_with_resize_reencodes_in_the_source_format(mixed_tree, tmp_path):
    root, arrays = mixed_tree
    out = tmp_path / "small"
    build(root, out, "--image_encoding", "keep", "--max_side", 10, "--num_shards", 1)
    for key, data in _image_bytes(out).items():
        assert data != (root / key).read_bytes(), key
        assert data[:3] == (b"\xff\xd8\xff" if key.endswith(".jpg") else b"\x89PN"), key
        img = Image.open(io.BytesIO(data))
        assert max(img.size) == 10, key
        assert len(img.getbands()) == (arrays[key].shape[-1] if arrays[key].ndim == 3 else 1), key


def test_16_bit_colour_png_is_kept_by_keep_and_refused_by_png(tmp_path):
    import zlib

    # A 48-bit RGB PNG written by hand (Pillow writes none): IHDR depth 16, colour type 2.
    pixels = RNG.integers(0, 65536, (4, 5, 3), dtype=np.uint16)
    rows = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(4))

    def chunk(kind, body):
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", (5).to_bytes(4, "big") + (4).to_bytes(4, "big") + bytes([16, 2, 0, 0, 0]))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    kept = codec.prepare_image(data, codec.ImageOptions(image_encoding="keep"))
    assert kept.passthrough and kept.data == data and codec.stored_kind(data) == "png:3:uint16"
    with pytest.raises(codec.ImageError, match="16-bit-per-channel colour PNG.*--image_encoding keep"):
        codec.prepare_image(data, codec.ImageOptions(image_encoding="png"))


def test_float_images_stay_rejected_under_png(tmp_path):
    out = io.BytesIO()
    Image.fromarray(np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8), "F").save(out, format="TIFF")
    for encoding in ("png", "keep"):
        with pytest.raises(codec.ImageError, match="floating-point image"):
            codec.prepare_image(out.getvalue(), codec.ImageOptions(image_encoding=encoding))


def test_default_build_records_say_jpeg_and_the_manifest_has_no_encoding_field(mixed_tree, tmp_path):
    root, _ = mixed_tree
    out = tmp_path / "default"
    build(root, out, "--schema", "tf-models", "--num_shards", 1)
    raw = json.loads((out / "manifest.json").read_text())
    assert "image_encoding" not in raw and "image_encoding" not in raw["parameters"]["image"]
    assert all("image_kinds" not in sh for s in raw["splits"].values() for sh in s["shards"])
    for ex in read_examples(out).values():
        f = ex.features.feature
        assert f["image/format"].bytes_list.value[0] == b"JPEG"
        assert f["image/encoded"].bytes_list.value[0][:3] == b"\xff\xd8\xff"


@pytest.fixture(scope="module")
def float_tiffs(tmp_path_factory):
    """Float TIFFs with values 0..1 (one with a denormal-sized value), a 16-bit and a 32-bit integer image."""
    root = tmp_path_factory.mktemp("float-tiffs") / "in"
    (root / "scan").mkdir(parents=True)
    r = np.random.default_rng(5)
    pixels = {}
    for i in range(5):
        a = r.random((9 + i, 13)).astype(np.float32)
        a[0, 0] = 1e-7 * i
        Image.fromarray(a, "F").save(root / "scan" / f"f{i}.tiff")
        pixels[f"scan/f{i}.tiff"] = a
    deep = r.integers(0, 65536, (7, 5)).astype(np.uint16)
    Image.fromarray(deep).save(root / "scan" / "deep.png")
    pixels["scan/deep.png"] = deep.astype(np.float32)
    wide = r.integers(-2**23, 2**24, (6, 4)).astype(np.int32)
    Image.fromarray(wide, "I").save(root / "scan" / "wide.tiff")
    pixels["scan/wide.tiff"] = wide.astype(np.float32)
    return root, pixels


def test_float_tiffs_are_rejected_by_default_naming_the_way_to_keep_them(float_tiffs, tmp_path):
    root, _ = float_tiffs
    build(root, tmp_path / "out", "--max_reject_fraction", 1)
    with open(tmp_path / "out" / "errors.jsonl") as f:
        reasons = {r["key"]: r["reason"] for r in map(json.loads, f)}
    assert sorted(k for k in reasons if k.startswith("scan/f")) == [f"scan/f{i}.tiff" for i in range(5)]
    assert reasons["scan/f1.tiff"].startswith("a floating-point image (values ")
    assert "--image_encoding raw" in reasons["scan/f1.tiff"]


def test_raw_stores_float_and_integer_pixels_exactly(float_tiffs, tmp_path):
    from imagerecords import reader

    root, pixels = float_tiffs
    manifest = build(root, tmp_path / "out", "--image_encoding", "raw")
    assert manifest.num_rejected == 0 and manifest.image_encoding == "raw"
    assert manifest.image_kinds == {"raw:1:float32": len(pixels)}
    seen = set()
    for ex in reader.as_dataset(str(tmp_path / "out"), "train").as_numpy_iterator():
        key = ex["image/filename"].decode()
        assert ex["image"].dtype == np.float32 and ex["image"].shape == pixels[key].shape + (1,)
        assert ex["image"][..., 0].tobytes() == pixels[key].tobytes(), key
        seen.add(key)
    assert seen == set(pixels)
    with pytest.raises(ValueError, match="built with --image_encoding raw .* read it with reader.as_dataset"):
        reader.make_dataset(str(tmp_path / "out"), "train", batch_size=2, image_size=8)
    from imagerecords.cli import inspection

    lines, _ = inspection.inspect(str(tmp_path / "out"))
    assert f"  images: --image_encoding raw (raw:1:float32 {len(pixels)})" in lines


def test_raw_datasets_load_in_tfds_as_flat_float32(float_tiffs, tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    root, pixels = float_tiffs
    build(root, tmp_path / "out", "--image_encoding", "raw")
    seen = 0
    for ex in tfds.as_numpy(tfds.builder_from_directory(str(tmp_path / "out")).as_dataset(split="train")):
        image = ex["image"].reshape(ex["image/height"], ex["image/width"])
        assert image.tobytes() == pixels[ex["image/filename"].decode()].tobytes()
        seen += 1
    assert seen == len(pixels)


@pytest.mark.slow
def test_raw_is_the_same_on_direct_runner_and_refused_by_the_beam_writer(float_tiffs, tmp_path):
    import subprocess
    import sys

    root, _ = float_tiffs
    build(root, tmp_path / "local", "--image_encoding", "raw", "--num_shards", 2)
    build(root, tmp_path / "beam", "--image_encoding", "raw", "--num_shards", 2, "--runner=DirectRunner")
    assert [open(p, "rb").read() for p in shard_files(tmp_path / "local")] == \
        [open(p, "rb").read() for p in shard_files(tmp_path / "beam")]
    done = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output",
                           str(tmp_path / "sink"), "--image_encoding", "raw", "--writer", "beam"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--writer beam does not write --image_encoding raw" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
