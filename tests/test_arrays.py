"""NumPy input: .npz and .npy-folder builds read back bit for bit by plain tf.data, TFDS and the README's code.

Fixtures are made here with a seeded numpy generator; every array carries a `row` feature (its row
number) so each record read back is matched to the row it came from.
"""

import filecmp
import io
import json
import os
import shlex

import numpy as np
import pytest
from PIL import Image

from conftest import build, shard_files
from support.doc_blocks import blocks
from imagerecords.cli import main as cli

N = 120


def _arrays(seed=0):
    r = np.random.default_rng(seed)
    return {
        "image": r.standard_normal((N, 28, 28)).astype(np.float32),
        "label": r.integers(0, 10, N).astype(np.int64),
        "row": np.arange(N, dtype=np.int64),
        "weights": r.standard_normal((N, 3)),  # float64: raw bytes
        "mask": r.random(N) > 0.5,  # bool: an int64 list
    }


def _rgb(seed=1):
    r = np.random.default_rng(seed)
    return {"image": r.integers(0, 256, (N, 32, 32, 3), dtype=np.uint8), "label": r.integers(0, 4, N),
            "row": np.arange(N, dtype=np.int64)}


@pytest.fixture(scope="module")
def float_build(tmp_path_factory):
    work = tmp_path_factory.mktemp("arrays")
    arrays = _arrays()
    np.savez(work / "data.npz", **arrays)
    out = work / "out"
    manifest = build(work / "data.npz", out, "--splits", "train=0.8,test=0.2", "--num_shards", 2)
    return arrays, out, manifest


@pytest.fixture(scope="module")
def rgb_build(tmp_path_factory):
    work = tmp_path_factory.mktemp("rgb")
    arrays = _rgb()
    np.savez_compressed(work / "rgb.npz", **arrays)
    out = work / "out"
    build(work / "rgb.npz", out, "--num_shards", 2)
    return arrays, out


def _parse_all(out, spec):
    import tensorflow as tf

    files = shard_files(out)
    assert files, f"no shards in {out}"
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
            for r in tf.data.TFRecordDataset(files)]


def test_seed_parse_reads_every_array_bit_for_bit(float_build):
    import tensorflow as tf

    arrays, out, manifest = float_build
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
            "row": tf.io.FixedLenFeature([], tf.int64), "weights": tf.io.FixedLenFeature([], tf.string),
            "mask": tf.io.FixedLenFeature([], tf.int64)}
    records = _parse_all(out, spec)
    assert sorted(r["row"] for r in records) == list(range(N))
    for r in records:
        i = r["row"]
        image = tf.reshape(tf.io.decode_raw(r["image"], tf.float32), (28, 28)).numpy()
        assert image.tobytes() == arrays["image"][i].tobytes()
        assert r["label"] == arrays["label"][i]
        assert tf.io.decode_raw(r["weights"], tf.float64).numpy().tobytes() == arrays["weights"][i].tobytes()
        assert bool(r["mask"]) == arrays["mask"][i]
    assert manifest.features == {
        "image": {"dtype": "float32", "encoding": "bytes", "shape": [28, 28]},
        "label": {"dtype": "int64", "encoding": "list", "shape": []},
        "mask": {"dtype": "bool", "encoding": "list", "shape": []},
        "row": {"dtype": "int64", "encoding": "list", "shape": []},
        "weights": {"dtype": "float64", "encoding": "bytes", "shape": [3]}}
    # No image/filename, height or width: a record holds its arrays only.
    from imagerecords.format import schema

    with open(shard_files(out)[0], "rb") as f:
        from imagerecords.format.records import read_records

        first = next(iter(read_records(f)))
    assert sorted(schema.parse_example(first)) == ["image", "label", "mask", "row", "weights"]


def test_keys_are_stable_and_splits_hash_them(float_build):
    from imagerecords.pipeline import refs

    arrays, out, manifest = float_build
    want = {s: sum(1 for i in range(N) if refs.assign_split([("train", 0.8), ("test", 0.2)], 0,
                                                              f"data.npz:{i:09d}") == s) for s in ("test", "train")}
    assert {s.name: s.num_examples for s in manifest.splits} == want


@pytest.mark.slow
def test_uint8_rgb_is_a_lossless_png(rgb_build):
    import tensorflow as tf

    arrays, out = rgb_build
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
            "row": tf.io.FixedLenFeature([], tf.int64)}
    records = _parse_all(out, spec)
    assert len(records) == N
    for r in records:
        assert r["image"][:8] == b"\x89PNG\r\n\x1a\n"
        pixels = np.asarray(Image.open(io.BytesIO(r["image"])))
        assert np.array_equal(pixels, arrays["image"][r["row"]])
        assert r["label"] == arrays["label"][r["row"]]


def test_tfds_builder_from_directory_decodes_every_feature(float_build, rgb_build):
    import tensorflow_datasets as tfds

    arrays, out, _ = float_build
    seen = 0
    for ex in tfds.as_numpy(tfds.builder_from_directory(str(out)).as_dataset(split="train")):
        i = ex["row"]
        assert ex["image"].dtype == np.float32 and ex["image"].tobytes() == arrays["image"][i].tobytes()
        assert ex["weights"].tobytes() == arrays["weights"][i].tobytes()
        assert ex["label"] == arrays["label"][i] and bool(ex["mask"]) == arrays["mask"][i]
        seen += 1
    assert seen > 0
    rgb, out = rgb_build
    for ex in tfds.as_numpy(tfds.builder_from_directory(str(out)).as_dataset(split="train")):
        assert np.array_equal(ex["image"], rgb["image"][ex["row"]])


@pytest.mark.slow
def test_as_dataset_hands_back_every_array_bit_for_bit(float_build, rgb_build):
    from imagerecords import reader

    arrays, out, manifest = float_build
    rows = []
    for split in ("train", "test"):
        examples = list(reader.as_dataset(str(out), split).as_numpy_iterator())
        assert [e["row"] for e in examples] == [e["row"] for e in reader.as_dataset(str(out), split).as_numpy_iterator()]
        for ex in examples:
            i = ex["row"]
            assert ex["image"].dtype == np.float32 and ex["image"].shape == (28, 28)
            assert ex["image"].tobytes() == arrays["image"][i].tobytes()
            assert ex["weights"].dtype == np.float64 and ex["weights"].tobytes() == arrays["weights"][i].tobytes()
            assert ex["mask"].dtype == np.bool_ and ex["mask"] == arrays["mask"][i]
            assert ex["label"] == arrays["label"][i]
            rows.append(i)
    assert sorted(rows) == list(range(N))
    rgb, out = rgb_build
    examples = list(reader.as_dataset(str(out), "train").as_numpy_iterator())
    assert len(examples) == N
    for ex in examples:
        assert ex["image"].dtype == np.uint8 and np.array_equal(ex["image"], rgb["image"][ex["row"]])


def test_make_dataset_reads_png_arrays_and_refuses_raw_ones_in_one_line(float_build, rgb_build):
    from imagerecords import reader

    rgb, out = rgb_build
    images, labels = next(iter(reader.make_dataset(str(out), "train", batch_size=4, image_size=16)))
    assert images.shape == (4, 16, 16, 3) and labels.shape == (4,)
    _, out, _ = float_build
    with pytest.raises(ValueError, match=r"hold a float32\[28,28\] \(bytes\) tensor \(an arrays build\), not an "
                                         r"encoded image; read them with reader.as_dataset"):
        reader.make_dataset(str(out), "train", batch_size=4, image_size=16)


@pytest.mark.slow
def test_npy_folder_is_memory_mapped_and_builds_the_same_records(float_build, tmp_path):
    from imagerecords.pipeline.read import array_files as arrays_lib

    arrays, out, _ = float_build
    folder = tmp_path / "data"
    folder.mkdir()
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    opened = arrays_lib.open_arrays(str(folder))
    assert all(isinstance(a, np.memmap) for a in opened.values())
    build(folder, tmp_path / "out", "--num_shards", 1)
    import tensorflow as tf

    records = _parse_all(tmp_path / "out", {"image": tf.io.FixedLenFeature([], tf.string),
                                            "row": tf.io.FixedLenFeature([], tf.int64)})
    assert sorted(r["row"] for r in records) == list(range(N))
    for r in records:
        assert r["image"] == arrays["image"][r["row"]].tobytes()


@pytest.mark.slow
def test_build_arrays_from_memory(tmp_path):
    import imagerecords
    import tensorflow as tf

    arrays = _rgb(seed=5)
    manifest = imagerecords.build_arrays(arrays, str(tmp_path / "ds"), splits={"train": 0.5, "test": 0.5},
                                         num_shards=1, no_progress=True)
    assert manifest.num_examples == N and set(manifest.split_names) == {"test", "train"}
    records = _parse_all(tmp_path / "ds", {"image": tf.io.FixedLenFeature([], tf.string),
                                           "row": tf.io.FixedLenFeature([], tf.int64)})
    for r in records:
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(r["image"]))), arrays["image"][r["row"]])
    again = imagerecords.build_arrays(arrays, str(tmp_path / "again"), splits={"train": 0.5, "test": 0.5},
                                      num_shards=1, no_progress=True)
    assert [s.num_examples for s in again.splits] == [s.num_examples for s in manifest.splits]
    for a, b in zip(shard_files(tmp_path / "ds"), shard_files(tmp_path / "again")):
        assert filecmp.cmp(a, b, shallow=False)


def test_mismatched_first_dimension_is_one_line_and_exit_2(tmp_path, capsys):
    np.savez(tmp_path / "bad.npz", image=np.zeros((10, 4, 4), np.float32), label=np.zeros(10, np.int64),
             extra=np.zeros((9, 2), np.float32))
    code = cli.main(["build", "--input", str(tmp_path / "bad.npz"), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "extra [9, 2]" in err and "10" in err
    assert not os.path.exists(tmp_path / "o" / "manifest.json")


@pytest.mark.slow
def test_a_nan_row_is_rejected_naming_the_feature(tmp_path):
    arrays = _arrays(seed=3)
    arrays["image"][7, 3, 3] = np.nan
    np.savez(tmp_path / "nan.npz", **arrays)
    manifest = build(tmp_path / "nan.npz", tmp_path / "out", "--num_shards", 1, "--max_reject_fraction", 0.05)
    assert manifest.num_rejected == 1 and manifest.num_examples == N - 1
    rows = [json.loads(line) for line in open(tmp_path / "out" / "errors.jsonl")]
    assert [(r["key"], r["stage"]) for r in rows] == [("nan.npz:000000007", "decode")]
    assert "'image'" in rows[0]["reason"] and "finite" in rows[0]["reason"]
    # Over the budget it is not published.
    code = cli.main(["build", "--input", str(tmp_path / "nan.npz"), "--output", str(tmp_path / "o2"),
                     "--max_reject_fraction", "0", "--no_progress"])
    assert code == 6


def test_string_labels_are_class_names(tmp_path):
    import tensorflow as tf

    names = np.array(["cat", "dog", "emu"])[np.arange(30) % 3]
    np.savez(tmp_path / "s.npz", x=np.arange(30, dtype=np.float32), label=names, row=np.arange(30))
    manifest = build(tmp_path / "s.npz", tmp_path / "out", "--num_shards", 1)
    assert manifest.label_names == ("cat", "dog", "emu") and not manifest.integer_labels
    for r in _parse_all(tmp_path / "out", {"label": tf.io.FixedLenFeature([], tf.int64),
                                           "row": tf.io.FixedLenFeature([], tf.int64),
                                           "x": tf.io.FixedLenFeature([], tf.float32)}):
        assert manifest.label_names[r["label"]] == names[r["row"]] and r["x"] == r["row"]


def _readme_blocks():
    """The NumPy example's three blocks (make arrays, build, read), in docs/building.md."""
    return [(b.lang, b.code) for b in blocks("docs/building.md", after="<!-- arrays-example -->")[:3]]


@pytest.mark.slow
def test_readme_example_runs_against_a_build(tmp_path, monkeypatch):
    (lang1, make), (lang2, command), (lang3, read) = _readme_blocks()
    assert (lang1, lang2, lang3) == ("python", "bash", "python")
    monkeypatch.chdir(tmp_path)
    made = {}
    exec(make, made)
    argv = shlex.split(command.strip())
    assert argv[0] == "imagerecords"
    assert cli.main([*argv[1:], "--no_progress"]) == 0
    got = {}
    exec(read, got)
    pairs = sorted((image.numpy().tobytes(), int(label)) for image, label in got["dataset"])
    want = sorted((made["x"][i].tobytes(), int(made["y"][i])) for i in range(len(made["x"])))
    assert len(pairs) == 1000 and pairs == want


def test_resume_fingerprint_changes_when_the_arrays_are_rewritten(tmp_path):
    """A row's ref holds its key and place, not its values: the input's files stand in for them, so
    a resumed build never reuses a shard staged from arrays since rewritten at the same size."""
    import time as time_lib

    from imagerecords.pipeline import sources
    from imagerecords.pipeline.config import BuildConfig
    from imagerecords.pipeline.write import shard_writer

    np.savez(tmp_path / "d.npz", **_arrays(seed=1))
    config = BuildConfig.of(input=str(tmp_path / "d.npz"), output=str(tmp_path / "out"))
    before = shard_writer.ShardWriter.of(config, "b1", sources.of(config.input)).source
    size = os.path.getsize(tmp_path / "d.npz")
    deadline = time_lib.monotonic() + 10
    while True:  # a rewrite whose mtime the filesystem can tell apart from the first
        np.savez(tmp_path / "d.npz", **_arrays(seed=2))
        after = shard_writer.ShardWriter.of(config, "b2", sources.of(config.input)).source
        if after != before or time_lib.monotonic() > deadline:
            break
    assert os.path.getsize(tmp_path / "d.npz") == size  # same shapes, same size: only the values differ
    assert before and after != before, "the rewritten input's identity never changed"


@pytest.mark.parametrize("how", ["in place (cp -p)", "renamed over (rsync -a)"])
def test_a_same_size_npy_rewrite_with_its_mtime_restored_is_not_resumed_from(tmp_path, how):
    """Copy tools that keep times put the old mtime back on new bytes: the identity a resume compares
    must still change (inode, change time), or half the shards would hold the old rows."""
    from imagerecords.pipeline import sources
    from imagerecords.pipeline.config import BuildConfig
    from imagerecords.pipeline.write import shard_writer

    folder = tmp_path / "data"
    folder.mkdir()
    for name, a in _arrays(seed=1).items():
        np.save(folder / f"{name}.npy", a)
    config = BuildConfig.of(input=str(folder), output=str(tmp_path / "out"))
    before = shard_writer.ShardWriter.of(config, "b1", sources.of(config.input)).source
    target = folder / "image.npy"
    st = os.stat(target)
    new = np.ascontiguousarray(_arrays(seed=2)["image"])
    if how.startswith("in place"):
        np.save(target, new)
    else:
        np.save(folder / ".image.tmp.npy", new)
        os.replace(folder / ".image.tmp.npy", target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    after_st = os.stat(target)
    assert (after_st.st_size, after_st.st_mtime_ns) == (st.st_size, st.st_mtime_ns)  # what a stat of size+mtime saw
    assert shard_writer.ShardWriter.of(config, "b2", sources.of(config.input)).source != before


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["npz", "npy"])
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_rebuild_in_the_same_process_reads_the_rewritten_arrays(tmp_path, monkeypatch, layout, workers):
    """The arrays are cached per process by the path as given: a second build in the same process
    after the input was rewritten in place (or from another folder's input of the same relative
    name) writes the new rows, never the cached old ones."""
    import tensorflow as tf

    def write(folder, seed):
        arrays = dict(_arrays(seed), image=np.full((N, 28, 28), seed, np.float32))
        folder.mkdir(exist_ok=True)
        if layout == "npz":
            np.savez(folder / "data.npz", **arrays)
        else:
            (folder / "data").mkdir(exist_ok=True)
            for name, a in arrays.items():
                np.save(folder / "data" / f"{name}.npy", a)  # in place: the same files truncated and rewritten

    given = "data.npz" if layout == "npz" else "data"
    spec = {"image": tf.io.FixedLenFeature([], tf.string)}
    for step, (folder, seed) in enumerate([(tmp_path / "a", 1), (tmp_path / "a", 2), (tmp_path / "b", 3)]):
        write(folder, seed)
        monkeypatch.chdir(folder)
        extra = ["--overwrite"] if step == 1 else []
        build(given, folder / "out", "--num_shards", 1, "--local_workers", workers, *extra)
        values = {np.frombuffer(r["image"], np.float32)[0] for r in _parse_all(folder / "out", spec)}
        assert values == {seed}, f"build {step + 1} wrote the rows of another input: {values}"
