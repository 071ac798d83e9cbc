"""imagerecords.grain against real builds and the real `grain` package: values as as_dataset's,
exact resume through Grain's own iterator state in a new process, and the bad inputs of a source."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import build

if importlib.util.find_spec("grain") is None:
    if os.environ.get("IMAGERECORDS_CI") == "1":
        pytest.fail("CI must run tests/test_grain.py, but grain is not installed "
                    "(pip install -c constraints.txt -e '.[test]')", pytrace=False)
    pytest.skip("grain is not installed (pip install -e '.[grain]')", allow_module_level=True)

import grain  # noqa: E402

import imagerecords  # noqa: E402

from imagerecords.format.records import CorruptRecordError, IndexFileError  # noqa: E402
from imagerecords.grain import MissingIndexError, RecordSource  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ("--splits", "train=0.7,validation=0.3", "--num_shards", 3, "--max_reject_fraction", 0.05)


@pytest.fixture(scope="module")
def built(image_tree, tmp_path_factory):
    """The image tree built with index files, and again without them."""
    root, _ = image_tree
    base = tmp_path_factory.mktemp("grain")
    indexed = build(root, base / "indexed", *ARGS, "--write_index")
    plain = build(root, base / "plain", *ARGS)
    return {"indexed": (str(base / "indexed"), indexed), "plain": (str(base / "plain"), plain)}


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    """A declared-features build: boxes of varying count, class lists, a float, a caption, a
    palette PNG mask and a 16-bit depth PNG per row."""
    from tests.support.detection import CONFIG, write_rows

    folder = tmp_path_factory.mktemp("grain-declared")
    rows = write_rows(folder)
    with open(folder / "m.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    (folder / "f.yaml").write_text(CONFIG)
    build(folder / "m.jsonl", folder / "out", "--config", folder / "f.yaml", "--num_shards", 2, "--write_index")
    return str(folder / "out")


def _assert_as_dataset_values(path, split):
    """Every record of `split` through the source equals as_dataset's, key by key, in split order."""
    from imagerecords import reader

    source = RecordSource(path, split)
    expected = list(reader.as_dataset(path, split).as_numpy_iterator())
    assert len(source) == len(expected) > 0
    for i, want in enumerate(expected):
        got = source[i]
        assert sorted(got) == sorted(want), i
        for key, value in want.items():
            if isinstance(value, bytes):  # a string feature: tf.string there, str here
                assert got[key] == value.decode("utf-8"), (i, key)
            else:
                assert got[key].dtype == value.dtype and got[key].shape == value.shape, (i, key)
                assert np.array_equal(got[key], value), (i, key)
    return source


@pytest.mark.slow
def test_values_equal_as_dataset_for_every_record(built, declared):
    path, manifest = built["indexed"]
    source = _assert_as_dataset_values(path, "train")
    assert len(source) == manifest.split("train").num_examples
    _assert_as_dataset_values(path, "validation")
    # Declared features: boxes [n, 4] float32, class-list ids, a 16-bit PNG, a palette mask's ids.
    source = _assert_as_dataset_values(declared, "train")
    depth = [source[i]["depth"] for i in range(len(source))]
    assert all(d.dtype == np.uint16 and d.shape[-1] == 1 for d in depth)


def test_a_subset_of_features_and_an_unknown_one(built):
    path, _ = built["indexed"]
    source = RecordSource(path, "train", features=["label", "image/filename"])
    assert sorted(source[0]) == ["image/filename", "label"]
    assert source[0]["label"].dtype == np.int64
    with pytest.raises(ValueError, match=r"no feature\(s\) ghost; its records hold image, image/filename"):
        RecordSource(path, "train", features=["ghost"])
    with pytest.raises(ValueError, match="no split 'test'"):
        RecordSource(path, "test")
    with pytest.raises(ValueError, match="index must be one of"):
        RecordSource(path, "train", index="maybe")
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        RecordSource(os.path.dirname(path), "train")


# One script, three roles, each in its own process: the whole run, the first k batches and a
# saved state, the rest from that state. Grain's order (seeded shuffle, two epochs, batches of 4).
_RUN = """
import json, sys
import grain
import numpy as np
from imagerecords.grain import RecordSource

path, role, k, state_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
source = RecordSource(path, "train")

def summary(ex):
    return {"label": ex["label"], "name": ex["image/filename"], "pixels": int(ex["image"].sum())}

def collate(xs):
    return {"label": [int(x["label"]) for x in xs], "name": [x["name"] for x in xs],
            "pixels": [x["pixels"] for x in xs]}

ds = grain.MapDataset.source(source).shuffle(seed=7).repeat(2).map(summary).batch(4, batch_fn=collate)
it = iter(ds)
if role == "restore":
    with open(state_file) as f:
        source.set_state(it, json.load(f))
batches = []
for step, batch in enumerate(it):
    batches.append(batch)  # a train step on it
    if role == "save" and step + 1 == k:  # a checkpoint after k steps
        with open(state_file, "w") as f:
            json.dump(source.get_state(it), f)
        break
assert not {"tensorflow", "torch", "apache_beam"} & set(sys.modules), sorted(sys.modules)
print(json.dumps(batches))
"""


def _run(path, role, k, state_file, env=None):
    proc = subprocess.run([sys.executable, "-c", _RUN, path, role, str(k), str(state_file)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**os.environ, **(env or {}), "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("k", [3, 9])  # 9: in the second epoch
def test_a_checkpoint_restored_in_a_new_process_gives_the_rest_of_the_run(built, tmp_path, k):
    path, manifest = built["indexed"]
    whole = _run(path, "whole", -1, tmp_path / "unused")
    n = manifest.split("train").num_examples
    assert len(whole) == -(-2 * n // 4) and len(whole) > 9
    names = [name for batch in whole for name in batch["name"]]
    assert sorted(names[:n]) == sorted(names[n:]) and len(set(names[:n])) == n  # each epoch: every record once
    assert names[:n] != names[n:]  # Grain reshuffles per epoch
    first = _run(path, "save", k, tmp_path / "state.json")
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["iterator"] == {"next_index": k}  # Grain's own state, the digest beside it
    rest = _run(path, "restore", k, tmp_path / "state.json")
    assert first == whole[:k]
    assert rest == whole[k:]


def test_the_package_never_imports_tensorflow_torch_or_beam(built, tmp_path):
    """The _RUN script asserts it; run here without a state, it reads the whole order once more."""
    path, _ = built["indexed"]
    assert _run(path, "whole", -1, tmp_path / "unused")


def test_grain_dataloader_checkpoint_is_refused_on_a_rebuilt_dataset(built, image_tree, tmp_path):
    """grain.DataLoader compares repr(source) with its checkpoint's: the digest makes a rebuild's differ."""
    path, _ = built["indexed"]

    def loader(src):
        sampler = grain.samplers.IndexSampler(len(src), shard_options=grain.sharding.NoSharding(), shuffle=True,
                                              num_epochs=1, seed=5)
        return grain.DataLoader(data_source=src, sampler=sampler, worker_count=0,
                                operations=[grain.transforms.Batch(2, drop_remainder=True)])

    it = iter(loader(RecordSource(path, "train", features=["image/filename"])))
    head = [list(next(it)["image/filename"]) for _ in range(3)]
    state = it.get_state()
    again = iter(loader(RecordSource(path, "train", features=["image/filename"])))
    again.set_state(state)
    assert [list(b["image/filename"]) for b in again] == [list(b["image/filename"]) for b in it]
    assert head
    root, _ = image_tree
    rebuilt = build(root, tmp_path / "rebuilt", *ARGS, "--write_index", "--num_shards", 2)
    assert rebuilt.split("train").num_examples > 0
    other = iter(loader(RecordSource(str(tmp_path / "rebuilt"), "train", features=["image/filename"])))
    with pytest.raises(ValueError, match="DataSource in checkpoint does not match"):
        other.set_state(state)


def test_a_state_from_another_build_is_refused(built, image_tree, tmp_path):
    path, _ = built["indexed"]
    source = RecordSource(path, "train")
    it = iter(grain.MapDataset.source(source).shuffle(seed=1))
    next(it)
    state = source.get_state(it)
    root, _ = image_tree
    build(root, tmp_path / "rebuilt", *ARGS, "--write_index", "--seed", 99)
    rebuilt = RecordSource(str(tmp_path / "rebuilt"), "train")
    other = iter(grain.MapDataset.source(rebuilt).shuffle(seed=1))
    with pytest.raises(ValueError, match=rf"saved over another build \(split 'train', dataset '{source.digest}'; "
                                         rf"this one is split 'train', dataset '{rebuilt.digest}'\)"):
        rebuilt.set_state(other, state)
    validation = RecordSource(path, "validation")
    with pytest.raises(ValueError, match="saved over another build"):
        validation.set_state(iter(grain.MapDataset.source(validation)), state)
    with pytest.raises(ValueError, match="not a RecordSource.get_state"):
        source.set_state(it, it.get_state())  # Grain's bare state: no digest to check
    same = iter(grain.MapDataset.source(RecordSource(path, "train")).shuffle(seed=1))
    source.set_state(same, state)  # the same build: accepted, and it goes on where `it` is
    assert [next(same)["image/filename"] for _ in range(3)] == [next(it)["image/filename"] for _ in range(3)]


def test_index_arguments(built):
    path, _ = built["indexed"]
    source = RecordSource(path, "train")
    n = len(source)
    assert source[np.int64(3)]["image/filename"] == source[3]["image/filename"]  # Grain's samplers give NumPy ints
    assert source[np.uint32(n - 1)]["image/filename"] == source[n - 1]["image/filename"]
    for bad in (n, 2**62, -1, -n):
        with pytest.raises(IndexError, match=f"record {bad} is out of range for split 'train' of {n} records") as e:
            source[bad]
        assert isinstance(e.value, imagerecords.Error)
    for bad in (1.0, np.float32(2), "3", True, None):
        with pytest.raises(TypeError, match="record index must be an int") as e:
            source[bad]
        assert isinstance(e.value, imagerecords.Error)


def test_without_index_files_one_clear_error_or_one_scan(built):
    path, _ = built["plain"]
    with pytest.raises(MissingIndexError) as error:
        RecordSource(path, "train")
    message = str(error.value)
    assert "3 of the 3 shards of split 'train' have no index file" in message
    assert "--write_index" in message and "index='scan'" in message and "\n" not in message
    scanned = RecordSource(path, "train", index="scan")
    indexed = RecordSource(built["indexed"][0], "train")
    assert len(scanned) == len(indexed)
    for i in range(len(scanned)):
        assert scanned[i]["image/filename"] == indexed[i]["image/filename"]


def test_a_damaged_shard_or_index_is_named(built, tmp_path):
    path, manifest = built["indexed"]
    copy = tmp_path / "ds"
    shutil.copytree(path, copy)
    source = RecordSource(str(copy), "train")
    first = manifest.split("train").shards[0]
    shard = copy / first.filename
    data = bytearray(shard.read_bytes())
    offset, length = int(source.offsets[1]), int(source.lengths[1])
    data[offset + length // 2] ^= 0xFF  # a byte inside record 1's data
    shard.write_bytes(bytes(data))
    assert source[0]["image/filename"]  # the record before it still reads
    with pytest.raises(CorruptRecordError, match=f"{shard}: record at byte {offset}: bad data checksum"):
        source[1]
    shard.write_bytes(bytes(data[:offset + 5]))  # truncated inside record 1's header
    with pytest.raises(CorruptRecordError, match=f"{shard}: record at byte {offset}: read 5 of its {length} bytes"):
        source[1]
    # Back to the listed size: a new source checks each shard's size first, and the index is what is tested here.
    shard.write_bytes(bytes(data))
    index = copy / first.index_file
    index.write_bytes(index.read_bytes().replace(b"\n", b"\n\n", 1))
    with pytest.raises(IndexFileError, match=f"index file {index}: its sha256 differs from manifest.json's"):
        RecordSource(str(copy), "train")


@pytest.mark.slow
@pytest.mark.gcs
def test_gs_records_equal_the_local_ones(built, fake_gcs_server, tmp_path):
    from support import gcs

    path, _ = built["indexed"]
    local = _run(path, "whole", -1, tmp_path / "unused")
    emulator = gcs.GcsEmulator(binary=fake_gcs_server, tensorflow=False).start()
    try:
        emulator.create_bucket("grainbucket")
        emulator.upload_tree(path, "gs://grainbucket/ds")
        remote = _run("gs://grainbucket/ds", "whole", -1, tmp_path / "unused", env=emulator.env())
    finally:
        emulator.stop()
    assert remote == local
