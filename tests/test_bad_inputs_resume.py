"""Bad inputs meet resume: files rewritten between a kill and --resume, damaged staged shards, reader
states and start positions from another build or out of range.

Builds are real CLI runs into tmp_path, killed at a fixed phase by the test hooks of
tests/support/phases.py (the build's phase observer); images are made here with PIL (uncompressed PNGs, so a rewrite with
other pixels keeps the file's size).
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from conftest import build, published_version, shard_files
from imagerecords.format.manifest import STAGING

ARGS = ["--num_shards", "4", "--max_reject_fraction", "0.05", "--no_progress", "--local_workers", "0"]
CONFIG = """features:
  mask: {dtype: image, encoding: png}
"""


def _png(path, seed):
    """A 16x16 image of seeded pixels, stored uncompressed: every seed gives a file of one size."""
    pixels = np.random.default_rng(seed).integers(0, 256, (16, 16), dtype=np.uint8)
    Image.fromarray(pixels, "L").save(path, format="PNG", compress_level=0)


@pytest.fixture
def masked(tmp_path):
    """A manifest of 16 rows, each an image and a mask; returns (folder, manifest, config)."""
    folder = tmp_path / "in"
    folder.mkdir()
    with open(folder / "m.jsonl", "w") as f:
        for i in range(16):
            _png(folder / f"img{i}.png", i)
            _png(folder / f"mask{i}.png", 100 + i)
            f.write(json.dumps({"path": f"img{i}.png", "label": ["cat", "dog"][i % 2], "mask": f"mask{i}.png"}) + "\n")
    (folder / "f.yaml").write_text(CONFIG)
    return folder, folder / "m.jsonl", folder / "f.yaml"


def _start(*args, **env):
    return subprocess.Popen([sys.executable, "-m", "imagerecords", *map(str, args)],
                            env={**os.environ, **{k: str(v) for k, v in env.items()}},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(condition, proc, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < deadline, f"{what} never happened within {timeout} s"
        time.sleep(0.02)


def _kill_after_two_shards(out, tmp_path, *args):
    """Starts a build of 4 shards that holds after staging a shard, waits until 2 are staged, kills
    its process group; returns {shard name: staged path}."""
    marker = tmp_path / "mid_shards"
    proc = _start("build", "--output", out, *ARGS, *args,
                  IMAGERECORDS_TEST_PAUSE="mid_shards", IMAGERECORDS_TEST_PAUSE_DIR=tmp_path)
    staged = lambda: glob.glob(str(out / STAGING / "*" / "*.staged.json"))
    _wait_for(marker.exists, proc, "a shard being staged")
    _wait_for(lambda: len(staged()) >= 2, proc, "two shards being staged")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return {json.load(open(p))["staged"]["result"]["filename"]: p[:-len(".staged.json")] for p in staged()}


def _resume(out, *args):
    return subprocess.run([sys.executable, "-m", "imagerecords", "build", "--output", str(out), *ARGS, *map(str, args),
                           "--resume"], capture_output=True, text=True)


def _same_shards(a, b):
    files_a, files_b = shard_files(a), shard_files(b)
    assert [os.path.basename(f) for f in files_a] == [os.path.basename(f) for f in files_b]
    for x, y in zip(files_a, files_b):
        assert open(x, "rb").read() == open(y, "rb").read(), x


# 4. Every file a row reads is in its shard's fingerprint ------------------------------------------


def _two_staged(masked, tmp_path):
    """A masked build killed after two shards: (folder, manifest, config, out, staged, (first, second))."""
    folder, manifest, config = masked
    out = tmp_path / "out"
    staged = _kill_after_two_shards(out, tmp_path, "--input", manifest, "--config", config)
    assert len(staged) == 2, staged
    return folder, manifest, config, out, staged, sorted(staged)


@pytest.mark.slow
@pytest.mark.parametrize("column", ["mask", "path"])
def test_resume_rewrites_a_shard_whose_image_or_mask_was_rewritten_at_the_same_size(masked, tmp_path, column):
    folder, manifest, config, out, staged, (changed, kept) = _two_staged(masked, tmp_path)
    key = json.load(open(staged[changed] + ".staged.json"))["staged"]["contents"][0][1][0]
    row = next(json.loads(line) for line in open(manifest) if json.loads(line)["path"] == key)
    victim = folder / row[column]
    size = victim.stat().st_size
    _png(victim, 999)  # other pixels, same length
    assert victim.stat().st_size == size
    inode = os.stat(staged[kept]).st_ino
    code = _resume(out, "--input", manifest, "--config", config)
    assert code.returncode == 0, code.stderr
    assert "resumed: 1 of 4 shards reused" in code.stderr, code.stderr
    assert os.stat(out / published_version(out) / kept).st_ino == inode  # the untouched shard was moved
    fresh = tmp_path / "fresh"
    build(manifest, fresh, *ARGS, "--config", config)
    _same_shards(out, fresh)


# 15. A staged shard is checked against its record before reuse -----------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_resume_rewrites_a_damaged_staged_shard_and_publishes(masked, tmp_path, damage):
    folder, manifest, config, out, staged, (damaged, kept) = _two_staged(masked, tmp_path)
    data = bytearray(open(staged[damaged], "rb").read())
    if damage == "truncate":
        data = data[:-7]
    else:
        data[len(data) // 2] ^= 0x01
    open(staged[damaged], "wb").write(bytes(data))
    code = _resume(out, "--input", manifest, "--config", config)
    assert code.returncode == 0, code.stderr
    assert "resumed: 1 of 4 shards reused" in code.stderr, code.stderr
    assert "another process" not in code.stderr
    fresh = tmp_path / "fresh"
    build(manifest, fresh, *ARGS, "--config", config)
    _same_shards(out, fresh)
    assert not (out / STAGING).exists()


# Readers: a start position or a saved state from elsewhere, or out of range --------------------

TREE_ARGS = ["--num_shards", "2", "--write_index"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """4 classes x 6 images (example_images), no broken file."""
    from imagerecords.pipeline import example_images

    root = tmp_path_factory.mktemp("resume-tree") / "images"
    example_images.write_tree(str(root), per_class=6)
    return root


@pytest.fixture(scope="module")
def dataset(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("resume-ds") / "ds"
    build(tree, out, *TREE_ARGS, "--seed", 1)
    return out


def _first_batch(path, **kwargs):
    from imagerecords import reader

    ds = reader.make_dataset(str(path), "train", batch_size=4, image_size=8, training=True, seed=7, **kwargs)
    images, labels = next(iter(ds))
    return images.numpy(), labels.numpy()


# 16. Argument errors are ValueErrors at make_dataset --------------------------------------------


@pytest.mark.parametrize("name", ["start_step", "start_example"])
@pytest.mark.parametrize("value", [-1, 2.0, True, np.float64(3), "3"])
def test_a_start_that_is_not_a_count_is_a_value_error_at_the_call(dataset, name, value):
    with pytest.raises(ValueError, match=rf"^make_dataset: {name} must be an int >= 0, got {re.escape(repr(value))}$"):
        _first_batch(dataset, **{name: value})


@pytest.mark.parametrize("name", ["start_step", "start_example"])
def test_a_numpy_int_start_counts_like_a_python_int(dataset, name):
    want = _first_batch(dataset, **{name: 3})
    got = _first_batch(dataset, **{name: np.int64(3)})
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.parametrize("name,value", [("start_step", 2**62), ("start_example", 2**63 - 1), ("start_step", 10**30)])
def test_a_start_past_the_int64_range_is_a_value_error_at_the_call(dataset, name, value):
    from imagerecords import reader

    total = reader.load_info(str(dataset)).split("train").num_examples
    with pytest.raises(ValueError, match=rf"^make_dataset: {name}={value} is epoch \d+ of split 'train' \({total} "
                                         r"examples\), past the int64 range"):
        _first_batch(dataset, **{name: value})


# 16. Runtime faults of the resumable reader name the file and what to do ------------------------


@pytest.mark.slow
def test_the_resumable_reader_over_a_removed_version_names_the_rebuild(tree, tmp_path):
    import tensorflow as tf

    from imagerecords import reader

    out = tmp_path / "ds"
    build(tree, out, *TREE_ARGS)
    ds = reader.make_dataset(str(out), "train", batch_size=4, image_size=8, training=True, seed=7, start_step=0)
    first = published_version(out)
    for seed in (5, 6):  # --keep_versions 2: the second rebuild removes the version ds reads
        build(tree, out, *TREE_ARGS, "--overwrite", "--seed", seed)
    assert not (out / first).exists()
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        next(iter(ds))
    message = caught.value.message
    assert re.search(rf"shard {re.escape(str(out / first))}/images-train\.tfrecord-0000\d-of-00002 no longer exists: "
                     rf"the dataset in {re.escape(str(out))} was rebuilt after this reader loaded its manifest\.json, "
                     r"and the version that manifest lists was removed \(--keep_versions\); load the dataset again",
                     message), message
    assert "Traceback" not in message


@pytest.mark.slow
def test_an_index_file_of_another_build_is_named_not_its_shard(tree, tmp_path):
    from imagerecords import reader

    mine, other = tmp_path / "mine", tmp_path / "other"
    build(tree, mine, "--num_shards", 1, "--write_index", "--seed", 1)
    build(tree, other, "--num_shards", 1, "--write_index", "--seed", 2)  # same records, another order
    [shard] = reader.load_info(str(mine)).split("train").shards
    [stale] = reader.load_info(str(other)).split("train").shards
    data = open(shard.path, "rb").read()
    with open(stale.index_path, "rb") as f, open(shard.index_path, "wb") as g:
        g.write(f.read())
    with pytest.raises(ValueError, match=rf"^index file {re.escape(shard.index_path)}: its sha256 differs from "
                                         r"manifest\.json's; it is not the index this manifest lists \(rebuild the "
                                         r"dataset with --overwrite --write_index\)$"):
        _first_batch(mine, start_step=0)
    assert open(shard.path, "rb").read() == data


# 9. A torch Loader state carries the dataset it was taken on -------------------------------------


def _loader(path, seed=3):
    import imagerecords.torch as irt

    return irt.Loader(irt.RecordDataset(str(path), "train", image_size=8, training=True), 4, seed=seed)


@pytest.mark.needs_extra("torch")
def test_a_loader_state_from_a_rebuilt_dataset_is_refused(tree, tmp_path):
    out = tmp_path / "ds"
    build(tree, out, *TREE_ARGS, "--seed", 1)
    loader = _loader(out)
    batches = iter(loader)
    for _ in range(2):
        next(batches)
    state = loader.state_dict()
    assert state["consumed"] == 8
    build(tree, out, *TREE_ARGS, "--overwrite", "--seed", 1)  # the same records: the state still holds
    again = _loader(out)
    again.load_state_dict(state)
    assert again.state_dict() == state
    build(tree, out, *TREE_ARGS, "--overwrite", "--seed", 2)  # the same split size, another order
    rebuilt = _loader(out)
    assert len(rebuilt.dataset) == state["num_examples"]
    with pytest.raises(ValueError, match=rf"^the state was taken on another build of this split \(dataset "
                                         rf"'{state['dataset']}', this one '{rebuilt.dataset.digest}'\): its positions "
                                         r"name other records; load the dataset it was taken on, or start an epoch "
                                         r"over with set_epoch$"):
        rebuilt.load_state_dict(state)
    assert rebuilt.state_dict()["consumed"] == 0  # nothing was taken from the refused state


@pytest.mark.parametrize("key,value", [("consumed", -4), ("consumed", 4.0), ("consumed", True), ("epoch", -1),
                                       ("epoch", 1.5), ("seed", -3), ("num_examples", "24")])
@pytest.mark.needs_extra("torch")
def test_a_loader_state_value_that_is_not_a_count_is_refused(dataset, key, value):
    loader = _loader(dataset)
    state = loader.state_dict()
    with pytest.raises(ValueError, match=rf"^{key} must be an int >= 0, got {re.escape(repr(value))}$"):
        loader.load_state_dict({**state, key: value})


@pytest.mark.needs_extra("torch")
def test_loader_counts_take_numpy_ints_and_refuse_the_rest(dataset):
    loader = _loader(dataset)
    state = loader.state_dict()
    loader.load_state_dict({**state, "consumed": np.int64(8), "epoch": np.int64(2)})
    assert (loader.order.epoch, loader.order.consumed) == (2, 8)
    loader.load_state_dict({**state, "epoch": 2**62})  # a far epoch has its own order: it works
    assert len(next(iter(loader))[1]) == 4
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=rf"^epoch must be an int >= 0, got {re.escape(repr(bad))}$"):
            loader.set_epoch(bad)
    with pytest.raises(ValueError, match=r"^seed must be an int >= 0, got -1$"):
        _loader(dataset, seed=-1)
