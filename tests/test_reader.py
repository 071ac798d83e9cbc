"""Reader end to end: datasets built by the real builder (DirectRunner), read back with imagerecords.reader.

Fixtures: imagerecords.pipeline.example_images draws 4 classes x 6 images of mixed formats (JPEG, PNG, GIF,
greyscale, CMYK, EXIF-rotated); the builder writes them with --num_shards 4, in both schema presets.
"""

import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from conftest import build, shard_files
from imagerecords import reader
from imagerecords.pipeline import example_images
from imagerecords.format import records
from imagerecords.format.access import ShardSizeError, ShardSwappedError
from imagerecords.reader import ReadConfig, ReadStats
from imagerecords.reader.hosts import per_host_records

PER_CLASS = 6
SIZE = 32


def _build(images, output, *extra):
    """A 4-shard build with a validation split, on DirectRunner (one worker)."""
    return build(images, output, "--splits", "train=0.75,validation=0.25", "--num_shards", "4", *extra, workers=1)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader_tree") / "images"
    files = example_images.write_tree(str(root), per_class=PER_CLASS)
    return root, sorted(f"{cls}/{rel}" for cls, rels in files.items() for rel in rels)


@pytest.fixture(scope="module")
def ds_path(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("reader_ds") / "ds"
    _build(tree[0], out)
    return str(out)


@pytest.fixture(scope="module")
def models_path(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("reader_models") / "ds"
    _build(tree[0], out, "--schema", "tf-models", "--label_offset", "1")
    return str(out)


def _shard_filenames(path, split):
    """Filenames of every record of `split`, read straight from its shard files (not through the reader)."""
    out = []
    for shard in shard_files(path):
        if f"-{split}.tfrecord-" in os.path.basename(shard):
            for raw in tf.data.TFRecordDataset(shard):
                feature = tf.train.Example.FromString(raw.numpy()).features.feature
                out.append(feature["image/filename"].bytes_list.value[0].decode())
    return out


def _collect(ds):
    """(filenames, labels, number of batches) of a dataset made with with_filename=True."""
    names, labels, batches = [], [], 0
    for _, lab, fn in ds:
        names += [f.decode() for f in fn.numpy()]
        labels += lab.numpy().tolist()
        batches += 1
    return names, labels, batches


@pytest.mark.slow
def test_load_info_matches_manifest(ds_path, tree):
    info = reader.load_info(ds_path)
    with open(os.path.join(ds_path, "manifest.json")) as f:
        manifest = json.load(f)
    assert info.name == "images" and info.schema == "tfds" and info.label_offset == 0
    assert info.label_names == list(example_images.CLASSES)
    assert sorted(info.splits) == ["train", "validation"]
    assert sum(s.num_examples for s in info.splits.values()) == len(tree[1])
    for split, s in info.splits.items():
        shards = manifest["splits"][split]["shards"]
        assert s.files == [os.path.join(ds_path, x["filename"]) for x in shards]
        assert s.shard_lengths == [x["count"] for x in shards]
        assert s.num_examples == sum(s.shard_lengths) == manifest["splits"][split]["num_examples"]
    assert reader.label_names(ds_path) == list(example_images.CLASSES)
    assert "train" in str(info)
    with pytest.raises(ValueError, match="no split 'test'.*train, validation"):
        info.split("test")
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        reader.load_info(os.path.dirname(ds_path))


@pytest.mark.parametrize("dtype", ["uint8", "float32", "bfloat16"])
def test_round_trip_every_record_once(ds_path, tree, dtype):
    classes = list(example_images.CLASSES)
    seen = []
    for split in ("train", "validation"):
        ds = reader.make_dataset(ds_path, split, batch_size=5, image_size=SIZE,
                                 config=ReadConfig(with_filename=True, dtype=dtype))
        names = []
        for images, labels, filenames in ds:
            assert images.dtype == tf.as_dtype(dtype) and images.shape[1:] == (SIZE, SIZE, 3)
            for label, name in zip(labels.numpy(), filenames.numpy()):
                name = name.decode()
                assert label == classes.index(name.split("/")[0]), name
                names.append(name)
        assert len(names) == len(set(names)) == reader.load_info(ds_path).splits[split].num_examples
        seen += names
    assert sorted(seen) == tree[1]
    if dtype == "uint8":
        assert images.numpy().max() > 100  # pixels, not zeros
    else:
        assert 0.0 <= float(tf.reduce_min(tf.cast(images, tf.float32))) and float(tf.reduce_max(tf.cast(images, tf.float32))) <= 1.0


def test_eval_images_are_the_center_crop(ds_path):
    """The reader's eval image equals decoding the whole JPEG, center-cropping and resizing by hand."""
    ds = reader.make_dataset(ds_path, "train", batch_size=1, image_size=SIZE,
                             config=ReadConfig(with_filename=True, eval_crop_fraction=0.5, dtype="float32",
                                               normalization="none"))
    images, _, _ = next(iter(ds))
    raw = next(iter(tf.data.TFRecordDataset(reader.load_info(ds_path).splits["train"].files[0])))
    jpeg = tf.train.Example.FromString(raw.numpy()).features.feature["image"].bytes_list.value[0]
    full = tf.io.decode_jpeg(jpeg, channels=3)
    h, w = full.shape[:2]
    side = int(0.5 * min(h, w))
    crop = full[(h - side + 1) // 2:(h - side + 1) // 2 + side, (w - side + 1) // 2:(w - side + 1) // 2 + side]
    expected = tf.image.resize(crop, [SIZE, SIZE])
    np.testing.assert_allclose(images[0].numpy(), expected.numpy(), atol=1e-3)


def _train_order(path, seed, **config):
    ds = reader.make_dataset(path, "train", batch_size=4, image_size=SIZE, training=True, seed=seed,
                             config=ReadConfig(with_filename=True, repeat=2, shuffle_buffer=8, **config))
    return [(f.numpy().tolist(), i.numpy().tobytes(), l.numpy().tolist()) for i, l, f in ds]


@pytest.mark.slow
def test_same_seed_same_batches_other_seed_other_order(ds_path):
    first, again, other = _train_order(ds_path, 7), _train_order(ds_path, 7), _train_order(ds_path, 8)
    assert first == again  # names, labels and the augmented pixels, two epochs
    assert [b[0] for b in first] != [b[0] for b in other]
    n = reader.load_info(ds_path).splits["train"].num_examples
    assert len(first) == (2 * n) // 4  # two epochs run into one stream, last partial batch dropped
    # Each epoch reshuffles: the two epochs of one run differ in order.
    names = [name for b in first for name in b[0]]
    assert names[:n // 2] != names[n:n + n // 2]


def test_eval_is_deterministic_and_in_file_order(ds_path):
    """Two evaluation reads give the same pixels, labels and order: the shards' own record order."""
    def read():
        ds = reader.make_dataset(ds_path, "train", batch_size=4, image_size=SIZE,
                                 config=ReadConfig(with_filename=True, dtype="uint8"))
        return [(i.numpy(), l.numpy().tolist(), [x.decode() for x in f.numpy()]) for i, l, f in ds]

    first, again = read(), read()
    assert len(first) == len(again) > 1
    for (ia, la, fa), (ib, lb, fb) in zip(first, again):
        np.testing.assert_array_equal(ia, ib)
        assert la == lb and fa == fb
    assert reader.make_dataset(ds_path, "train", batch_size=4, image_size=SIZE).options().deterministic is True
    names = [n for _, _, f in first for n in f]
    # One host, evaluation: the split's own order, shard after shard, each in its file order.
    per_shard = [_shard_filenames_of(path) for path in reader.load_info(ds_path).splits["train"].files]
    expected = [name for s in per_shard for name in s]
    assert names == expected


def _shard_filenames_of(path):
    return [tf.train.Example.FromString(raw.numpy()).features.feature["image/filename"].bytes_list.value[0].decode()
            for raw in tf.data.TFRecordDataset(path)]


def test_uint8_rounding_of_in_range_images():
    """The one-pass uint8 conversion of built-in images rounds half up, like round() but at .5."""
    from imagerecords.reader import preprocess

    values = tf.constant([0.0, 0.49, 0.5, 1.5, 127.51, 254.6, 255.0])
    assert preprocess.finish(values, "uint8", "none", in_range=True).numpy().tolist() == [0, 0, 1, 2, 128, 255, 255]
    # Images of a user function may leave the range: clipped, rounded half to even.
    outside = tf.constant([-3.0, 0.5, 1.5, 300.0])
    assert preprocess.finish(outside, "uint8", "none").numpy().tolist() == [0, 0, 2, 255]


def test_training_crops_are_random_and_decoded_from_the_crop(ds_path):
    cfg = dict(batch_size=8, image_size=SIZE, training=True, seed=3)
    a = next(iter(reader.make_dataset(ds_path, "train", config=ReadConfig(shuffle_buffer=0, shuffle_files=False), **cfg)))
    b = next(iter(reader.make_dataset(ds_path, "train", config=ReadConfig(shuffle_buffer=0, shuffle_files=False, preprocess="eval"), **cfg)))
    assert a[0].shape == b[0].shape == (8, SIZE, SIZE, 3)
    assert a[1].numpy().tolist() == b[1].numpy().tolist()  # same records in the same order ...
    assert not np.allclose(a[0].numpy(), b[0].numpy())  # ... but cropped differently


def test_user_preprocess_function(ds_path):
    def solid(encoded, image_size, seed):
        return tf.fill([image_size, image_size, 3], tf.cast(tf.strings.length(encoded) % 200, tf.float32))

    images, _ = next(iter(reader.make_dataset(ds_path, "train", batch_size=3, image_size=8,
                                              config=ReadConfig(preprocess=solid, normalization="none"))))
    assert images.shape == (3, 8, 8, 3)
    assert all(len(np.unique(img)) == 1 for img in images.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("num_hosts", [1, 2, 3, 5])
def test_hosts_eval_pad_disjoint_complete_equal(ds_path, num_hosts):
    info = reader.load_info(ds_path)
    n = info.splits["train"].num_examples
    assert num_hosts != 5 or num_hosts > len(info.splits["train"].files)
    per_host = []
    for h in range(num_hosts):
        stats = ReadStats()
        ds = reader.make_dataset(ds_path, "train", batch_size=2, image_size=8, num_hosts=num_hosts, host_index=h,
                                 config=ReadConfig(with_filename=True), stats=stats)
        names, labels, batches = _collect(ds)
        real = [x for x in names if x]
        # The global order's position p goes to host p % hosts; positions past the split are padding.
        per = per_host_records(n, 0, num_hosts, "pad")
        padded = sum(1 for j in range(per) if h + num_hosts * j >= n)
        assert labels.count(reader.PAD_LABEL) == names.count("") == padded
        assert batches == reader.steps_per_epoch(ds_path, "train", 2, num_hosts=num_hosts, host_index=h)
        per_host.append((real, batches, len(names)))
    all_real = [x for real, _, _ in per_host for x in real]
    assert len(all_real) == len(set(all_real)) == n  # disjoint ...
    assert set(all_real) == set(_shard_filenames(ds_path, "train"))  # ... and complete
    assert len({b for _, b, _ in per_host}) == 1  # equal batch counts
    assert len({e for _, _, e in per_host}) == 1  # equal element counts


@pytest.mark.slow
@pytest.mark.parametrize("num_hosts", [1, 2, 3, 5])
def test_hosts_train_drop_disjoint_equal(ds_path, num_hosts):
    n = reader.load_info(ds_path).splits["train"].num_examples
    per_host, dropped = [], None
    for h in range(num_hosts):
        stats = ReadStats()
        ds = reader.make_dataset(ds_path, "train", batch_size=2, image_size=8, training=True, seed=1,
                                 num_hosts=num_hosts, host_index=h, stats=stats,
                                 config=ReadConfig(with_filename=True, repeat=1, drop_remainder=False))
        names, labels, batches = _collect(ds)
        assert reader.PAD_LABEL not in labels
        assert batches == reader.steps_per_epoch(ds_path, "train", 2, training=True, num_hosts=num_hosts,
                                                 host_index=h, config=ReadConfig(drop_remainder=False))
        per_host.append((names, batches))
        dropped = stats.plan.dropped_total
    union = [x for names, _ in per_host for x in names]
    assert len(union) == len(set(union))  # disjoint
    assert len(union) == n - dropped and dropped <= 2 * (num_hosts - 1)
    assert len({b for _, b in per_host}) == 1


def test_input_context_selects_the_host(ds_path):
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    a = _collect(reader.make_dataset(ds_path, "validation", batch_size=2, image_size=8, input_context=ctx,
                                     config=ReadConfig(with_filename=True)))
    b = _collect(reader.make_dataset(ds_path, "validation", batch_size=2, image_size=8, num_hosts=2, host_index=1,
                                     config=ReadConfig(with_filename=True)))
    assert a == b and a[0]


@pytest.mark.slow
def test_tf_models_preset_and_label_offset(models_path, tree):
    info = reader.load_info(models_path)
    assert info.schema == "tf-models" and info.label_offset == 1 and info.num_classes == 5
    classes = list(example_images.CLASSES)
    for zero_based in (False, True):
        names, labels, _ = _collect(reader.make_dataset(
            models_path, "train", batch_size=4, image_size=SIZE,
            config=ReadConfig(with_filename=True, zero_based_labels=zero_based)))
        assert len(names) == info.splits["train"].num_examples
        assert labels == [classes.index(x.split("/")[0]) + (0 if zero_based else 1) for x in names]


def test_conflicting_settings_reported_together(ds_path):
    with pytest.raises(ValueError) as e:
        ReadConfig(dtype="uint8", normalization="imagenet", cycle_length=0, corrupt_records="ignore")
    for part in ("normalization='imagenet'", "cycle_length", "corrupt_records"):
        assert part in str(e.value)
    with pytest.raises(ValueError) as e:
        reader.make_dataset(ds_path, "train", batch_size=0, image_size=SIZE, num_hosts=2,
                            input_context=tf.distribute.InputContext(2, 0, 2),
                            config=ReadConfig(deterministic=True), training=True)
    for part in ("batch_size", "input_context or num_hosts", "host_index go together", "pass a seed"):
        assert part in str(e.value)


def test_missing_shards_are_named(ds_path, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(ds_path, copy)
    gone = reader.load_info(str(copy)).splits["train"].files[1:3]
    for path in gone:
        os.remove(path)
    with pytest.raises(FileNotFoundError) as e:
        reader.make_dataset(str(copy), "train", batch_size=2, image_size=SIZE)
    assert all(path in str(e.value) for path in gone) and "2 of 4" in str(e.value)


def _frames(data):
    """[(offset, length)] of the frames of a TFRecord file."""
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        out.append((pos, length))
        pos += 12 + length + 4
    return out


@pytest.fixture()
def corrupt(ds_path, tmp_path):
    """A copy of the dataset with one byte flipped inside the JPEG of record 1 of train shard 0."""
    copy = tmp_path / "ds"
    shutil.copytree(ds_path, copy)
    shard = reader.load_info(str(copy)).splits["train"].files[0]
    data = bytearray(open(shard, "rb").read())
    frames = _frames(data)
    assert len(frames) >= 3
    pos, length = frames[1]
    record = bytes(data[pos + 12:pos + 12 + length])
    jpeg = tf.train.Example.FromString(record).features.feature["image"].bytes_list.value[0]
    victim = tf.train.Example.FromString(record).features.feature["image/filename"].bytes_list.value[0].decode()
    at = pos + 12 + record.index(jpeg) + len(jpeg) // 2
    data[at] ^= 0x10
    with open(shard, "wb") as f:
        f.write(data)
    return str(copy), shard, victim, frames, _shard_filenames(ds_path, "train")


def test_corrupt_record_fails_naming_the_shard(corrupt):
    path, shard, _, frames, _ = corrupt
    ds = reader.make_dataset(path, "train", batch_size=2, image_size=SIZE, config=ReadConfig(cache=True))
    # Record 1 fails its data checksum, so one record was read of the manifest's count.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"{os.path.basename(shard)}.* is corrupt.*: 1 records read .*says {len(frames)} "):
        for _ in ds:
            pass


def _filename(record):
    return tf.train.Example.FromString(record).features.feature["image/filename"].bytes_list.value[0].decode()


@pytest.fixture()
def resized(ds_path, tmp_path):
    """A copy of the dataset and a way to rewrite train shard 0 with other records than the manifest lists.

    Returns (path, shard 0, its records, shard 1's records, every train filename, rewrite); rewrite(records)
    writes the records to shard 0, framed by imagerecords.format.records.frame.
    """
    copy = tmp_path / "ds"
    shutil.copytree(ds_path, copy)
    files = reader.load_info(str(copy)).splits["train"].files
    own, other = ([*records.read_records(open(f, "rb"), f)] for f in files[:2])
    assert len(own) >= 3 and len(other) >= 2

    def rewrite(kept):
        with open(files[0], "wb") as f:
            f.write(b"".join(map(records.frame, kept)))

    return str(copy), files[0], own, other, _shard_filenames(ds_path, "train"), rewrite


# The streaming shard reader's damage checks (counts read against the manifest's): make_dataset
# reads through it with cache; the default resumable order's are in test_reader_resume.py.
STREAMING = dict(cache=True)


def _read_train(path, policy, stats=None):
    config = ReadConfig(corrupt_records=policy, with_filename=True, **STREAMING)
    return _collect(reader.make_dataset(path, "train", batch_size=2, image_size=SIZE, config=config, stats=stats))[0]


@pytest.mark.parametrize("cut", ["boundary", "inside"])
def test_a_shorter_shard_is_refused_naming_the_shard_and_both_sizes(resized, cut):
    path, shard, own, _, _, rewrite = resized
    listed = os.path.getsize(shard)
    rewrite(own[:-2])  # two records short, the file ends at a frame boundary
    if cut == "inside":  # ... or inside the frame after the kept ones
        with open(shard, "ab") as f:
            f.write(records.frame(own[-2])[:20])
    # At the call, before anything is read: a plain exception, not a TensorFlow op error mid-epoch.
    with pytest.raises(ShardSizeError, match=rf"^shard {re.escape(shard)} is {os.path.getsize(shard)} bytes, "
                                             rf"manifest.json lists {listed}: the file is smaller"):
        _read_train(path, "fail")


def test_a_shard_of_the_listed_size_with_fewer_records_is_refused_before_a_record_is_read(resized):
    """The size check passes a file padded to the listed size; its last record is not the one its
    build recorded (the manifest's ends_crc), so the shard is refused when the reader is made."""
    path, shard, own, _, _, rewrite = resized
    listed = os.path.getsize(shard)
    rewrite(own[:-2])
    with open(shard, "ab") as f:
        f.write(b"\0" * (listed - os.path.getsize(shard)))
    with pytest.raises(ShardSwappedError, match=rf"^shard {re.escape(shard)} is not the file manifest.json lists: "
                                                r"its first or last record's checksum differs"):
        _read_train(path, "fail")


def test_a_longer_shard_is_refused_naming_the_shard_and_both_sizes(resized):
    path, shard, own, other, _, rewrite = resized
    listed = os.path.getsize(shard)
    rewrite(own + other[:2])
    with pytest.raises(ShardSizeError, match=rf"^shard {re.escape(shard)} is {os.path.getsize(shard)} bytes, "
                                             rf"manifest.json lists {listed}: the file is larger than the one the "
                                             r"manifest describes .*; `imagerecords verify .*` names every such file; "
                                             r"restore the dataset's own file, or rebuild the dataset with --overwrite$"):
        _read_train(path, "fail")


def test_skip_cuts_a_longer_shard_to_its_count_and_counts_the_rest(resized, caplog):
    path, shard, own, other, original, rewrite = resized
    rewrite(own + other)  # shard 1's records a second time, after shard 0's own
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="imagerecords.reader"):
        names = _read_train(path, "skip", stats)
    assert sorted(names) == sorted(original)  # each record once: the appended copies are not read
    assert dict(stats.extra) == {shard: len(other)} and stats.total_extra == len(other) and stats.total_skipped == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"shard {shard} holds {len(own) + len(other)} records, manifest.json says {len(own)}: read its "
                        f"first {len(own)}, {len(other)} left out (counted in ReadStats.extra)"]


def test_skip_reads_what_a_shorter_shard_holds_and_counts_the_missing(resized, caplog):
    path, shard, own, _, original, rewrite = resized
    rewrite(own[:-2])
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="imagerecords.reader"):
        names = _read_train(path, "skip", stats)
    missing = {_filename(r) for r in own[-2:]}
    assert sorted(names) == sorted(x for x in original if x not in missing)
    assert dict(stats.skipped) == {shard: 2} and stats.total_skipped == 2 and stats.total_extra == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"shard {shard} holds {len(own) - 2} records, manifest.json says {len(own)}: 2 record(s) "
                        f"missing (counted in ReadStats.skipped)"]


def test_healthy_shards_count_nothing_under_skip(ds_path, caplog):
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="imagerecords.reader"):
        names = _read_train(ds_path, "skip", stats)
    assert sorted(names) == sorted(_shard_filenames(ds_path, "train"))
    assert (stats.total_skipped, stats.total_extra) == (0, 0) and "shard" not in caplog.text


def test_corrupt_record_skip_yields_the_others(corrupt, caplog):
    path, shard, victim, _, original = corrupt
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="imagerecords.reader"):
        names, _, _ = _collect(reader.make_dataset(path, "train", batch_size=2, image_size=SIZE, stats=stats,
                                                   config=ReadConfig(corrupt_records="skip", with_filename=True, **STREAMING)))
    assert sorted(names) == sorted(x for x in original if x != victim)
    assert stats.total_skipped == 1 and dict(stats.skipped) == {shard: 1}
    assert shard in caplog.text


def test_corrupt_length_field_skip_resyncs(corrupt):
    """A bad length checksum hides where the next frame starts; skip finds it and reads on."""
    path, shard, victim, frames, original = corrupt
    data = bytearray(open(shard, "rb").read())
    data[frames[2][0] + 3] ^= 0x01  # record 2's length field (record 1's JPEG is already broken)
    with open(shard, "wb") as f:
        f.write(data)
    stats = ReadStats()
    names, _, _ = _collect(reader.make_dataset(path, "train", batch_size=2, image_size=SIZE, stats=stats,
                                               config=ReadConfig(corrupt_records="skip", with_filename=True, **STREAMING)))
    second = [tf.train.Example.FromString(bytes(data[p + 12:p + 12 + n])).features.feature["image/filename"]
                .bytes_list.value[0].decode() for p, n in frames[2:3]]
    assert sorted(names) == sorted(x for x in original if x not in (victim, *second))
    assert stats.total_skipped == 2 and dict(stats.skipped) == {shard: 2}


def test_numpy_batches(ds_path):
    batches = list(reader.numpy_batches(ds_path, "validation", batch_size=3, image_size=SIZE, config=ReadConfig(dtype="uint8")))
    assert all(isinstance(x, np.ndarray) for b in batches for x in b)
    assert batches[0][0].dtype == np.uint8 and batches[0][0].shape == (3, SIZE, SIZE, 3)
    assert sum(len(b[1]) for b in batches) == reader.load_info(ds_path).splits["validation"].num_examples


@pytest.mark.slow
def test_reader_imports_without_beam(ds_path):
    """In a fresh interpreter where apache_beam cannot be imported, the reader imports and reads."""
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "apache_beam" or name.startswith("apache_beam."):
                    raise ImportError("apache_beam is blocked in this test")
        sys.meta_path.insert(0, Block())
        import imagerecords.reader as reader
        ds = reader.make_dataset({ds_path!r}, "validation", batch_size=4, image_size=8)
        print(sum(int(l.shape[0]) for _, l in ds), "apache_beam" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    n = reader.load_info(ds_path).splits["validation"].num_examples
    assert out.stdout.split()[-2:] == [str(n), "False"]


# --- uint8 output, accelerator-side normalisation, scaled decode, tf.data options, shuffle-buffer cap


@pytest.mark.parametrize("training", [False, True])
def test_uint8_output_normalised_later_equals_float_output(ds_path, training):
    """uint8 batches normalised with normalization_constants match the reader's own float output."""
    cfg = dict(batch_size=6, image_size=SIZE, training=training, seed=5)
    u8, lab_u8 = next(iter(reader.make_dataset(ds_path, "train", config=ReadConfig(dtype="uint8"), **cfg)))
    f32, lab_f32 = next(iter(reader.make_dataset(ds_path, "train", config=ReadConfig(normalization="imagenet"), **cfg)))
    assert u8.dtype == tf.uint8 and u8.shape == (6, SIZE, SIZE, 3)
    assert lab_u8.numpy().tolist() == lab_f32.numpy().tolist()
    values = u8.numpy()
    assert values.min() >= 0 and values.max() <= 255 and values.max() > 100 and len(np.unique(values)) > 50
    mean, std = reader.normalization_constants("imagenet")
    on_device = (values.astype(np.float32) - np.array(mean, np.float32)) / np.array(std, np.float32)
    # uint8 is the float image rounded to whole pixels: at most half a pixel apart before scaling.
    np.testing.assert_allclose(on_device, f32.numpy(), atol=0.5 / min(std) + 1e-4)


def test_normalization_constants():
    assert reader.normalization_constants("unit") == ((0.0,) * 3, (255.0,) * 3)
    assert reader.normalization_constants("symmetric") == ((127.5,) * 3, (127.5,) * 3)
    assert reader.normalization_constants("none") == ((0.0,) * 3, (1.0,) * 3)
    mean, std = reader.normalization_constants("imagenet")
    assert mean == pytest.approx((123.675, 116.28, 103.53)) and std == pytest.approx((58.395, 57.12, 57.375))
    assert reader.normalization_constants(([1, 2, 3], [4, 5, 6])) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
    with pytest.raises(ValueError, match="normalization must be one of"):
        reader.normalization_constants("bogus")


def _jpeg(height, width, seed=0):
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, width)[None, :, None] + np.linspace(0, 40, height)[:, None, None]
    pixels = np.clip(ramp + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return tf.constant(buf.getvalue())


@pytest.mark.parametrize("image_size, ratio", [(101, 1), (100, 2), (30, 4), (12, 8)])
def test_scaled_decode_picks_the_largest_ratio_that_keeps_the_crop_above_size(image_size, ratio):
    """decode_window decodes at 1/ratio exactly as libjpeg's scaled full decode, cropped afterwards."""
    from imagerecords.reader import preprocess

    jpeg = _jpeg(240, 320)
    oy, ox, h, w = 16, 40, 200, 240  # short side 200: ratio r when 200 >= r * image_size
    got = preprocess.decode_window(jpeg, tf.constant(oy), tf.constant(ox), tf.constant(h), tf.constant(w),
                                   image_size, True).numpy()
    full = tf.io.decode_jpeg(jpeg, channels=3, ratio=ratio).numpy()
    want = full[oy // ratio:oy // ratio + h // ratio, ox // ratio:ox // ratio + w // ratio].astype(int)
    assert got.shape == want.shape == (h // ratio, w // ratio, 3)
    # Equal but for chroma upsampling at the window's edge (libjpeg sees no pixels beyond it).
    diff = np.abs(got.astype(int) - want)
    assert diff.max() <= 8 and (diff > 0).mean() < 0.01


def test_scaled_decode_stays_close_to_full_decode():
    """At 4x reduction the scaled path changes a photo-like image by a few levels on average, not more."""
    from imagerecords.reader import preprocess

    jpeg = _jpeg(480, 640)
    scaled = preprocess.eval_image(jpeg, 64, 0.875, scaled_decode=True).numpy()
    full = preprocess.eval_image(jpeg, 64, 0.875, scaled_decode=False).numpy()
    assert scaled.shape == full.shape == (64, 64, 3)
    assert 0 < np.abs(scaled - full).mean() < 6.0
    np.testing.assert_allclose(scaled.mean(axis=(0, 1)), full.mean(axis=(0, 1)), atol=1.0)


def test_scaled_decode_off_matches_on_when_crops_are_small(ds_path):
    """With crops under 2 x image_size (here 28-32 px crops, 32 px output) both paths give the same pixels."""
    def read(scaled):
        ds = reader.make_dataset(ds_path, "train", batch_size=6, image_size=SIZE, training=True, seed=2,
                                 config=ReadConfig(scaled_decode=scaled, dtype="uint8", repeat=1))
        return np.concatenate([images.numpy() for images, _ in ds])

    np.testing.assert_array_equal(read(True), read(False))


def test_tf_data_options_are_applied(ds_path):
    config = ReadConfig(private_threadpool_size=2, autotune_ram_budget_mb=64, dtype="uint8")
    ds = reader.make_dataset(ds_path, "validation", batch_size=4, image_size=8, config=config)
    options = ds.options()
    assert options.threading.private_threadpool_size == 2
    assert options.autotune.ram_budget == 64 * 2**20
    assert options.deterministic is True  # evaluation keeps file order
    plain = reader.make_dataset(ds_path, "validation", batch_size=4, image_size=8, config=ReadConfig(dtype="uint8"))
    for (a, la), (b, lb) in zip(ds, plain):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert la.numpy().tolist() == lb.numpy().tolist()
    train = reader.make_dataset(ds_path, "train", batch_size=4, image_size=8, training=True)
    assert train.options().deterministic is True  # one order, a function of the seed: never thread timing
    with pytest.raises(ValueError, match="private_threadpool_size must be >= 0.*autotune_ram_budget_mb must be >= 0"):
        ReadConfig(private_threadpool_size=-1, autotune_ram_budget_mb=-5)


@pytest.mark.slow
def test_shuffle_buffer_is_capped_at_one_epoch(ds_path):
    """A buffer larger than the host's epoch gives the same order as one of exactly an epoch (it is capped)."""
    n = reader.load_info(ds_path).splits["train"].num_examples

    def names(buffer):
        ds = reader.make_dataset(ds_path, "train", batch_size=1, image_size=8, training=True, seed=11,
                                 config=ReadConfig(shuffle_buffer=buffer, with_filename=True, repeat=2, cache=True))
        return [f.numpy()[0] for _, _, f in ds]

    big = names(10_000)
    assert len(big) == 2 * n and big == names(n)
    assert big != names(1) and sorted(big) == sorted(names(1))


def test_every_expected_reader_failure_is_an_imagerecords_error_and_keeps_its_builtin_base(ds_path, tmp_path):
    import imagerecords
    from imagerecords.format.manifest import ManifestError

    SIZE = {"batch_size": 1, "image_size": 8}
    cases = [
        (lambda: reader.make_dataset(str(tmp_path / "nowhere"), "train", **SIZE), FileNotFoundError),
        (lambda: reader.make_dataset(ds_path, "train", start_step=-1, **SIZE), ValueError),
        (lambda: reader.make_dataset(ds_path, "no-such-split", **SIZE), ValueError),
    ]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    cases.append((lambda: reader.make_dataset(str(tmp_path / "bad"), "train", **SIZE), ValueError))
    for call, builtin in cases:
        with pytest.raises(imagerecords.Error) as caught:
            call()
        assert isinstance(caught.value, builtin), repr(caught.value)
    swapped = str(tmp_path / "swapped")
    shutil.copytree(ds_path, swapped)
    first = next(p for p in shard_files(swapped) if "-train.tfrecord-" in os.path.basename(p))
    with open(first, "ab") as f:
        f.write(records.frame(b"one more record"))
    with pytest.raises(imagerecords.Error, match=re.escape(os.path.basename(first))):
        list(reader.make_dataset(swapped, "train", **SIZE))
    assert issubclass(ManifestError, imagerecords.Error) and issubclass(ShardSizeError, ValueError)
