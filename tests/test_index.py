"""Index files (--write_index): tfrecord2idx bytes, read by the `tfrecord` package, out of every shard glob,
listed in the manifest and checked by verify; the commit moves them into their folder."""

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import build, read_examples, skip_unless_ci
from imagerecords.cli import inspection
from imagerecords.format import records
from imagerecords.format.manifest import MANIFEST, STAGING, Manifest, Shard
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.write import dataset_files
from imagerecords.pipeline.write.dataset_files import ShardResult

SPLITS = "train=0.7,validation=0.3"
# The shard globs people write; none may ever match an index file.
SHARD_GLOBS = ("images-train*", "images-validation*", "images-*", "*.tfrecord-*", "*-of-*", "*.tfrecord*")


def without_tensorflow(code: str, args):
    """Runs `code` in a fresh Python that never imports TensorFlow and returns what it leaves in `RESULT`.

    The `tfrecord` package (PyTorch's TFRecord reader) and TensorFlow cannot share a process: both
    register `tensorflow.BytesList` in protobuf's one descriptor pool and the second import fails
    (vahidk/tfrecord PR #103, open). A PyTorch trainer's process has no TensorFlow, and neither
    has this one. `code` reads its input from `ARGS` (JSON-able).
    """
    if importlib.util.find_spec("tfrecord") is None:
        skip_unless_ci("the `tfrecord` package is missing (pip install -e .[test])")
    script = ("import json, sys\nARGS = json.loads(sys.stdin.read())\n" + code +
              "\nassert 'tensorflow' not in sys.modules\nprint(json.dumps(RESULT))\n")
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(args), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def indexed(image_tree, tmp_path_factory):
    root, files = image_tree
    out = tmp_path_factory.mktemp("indexed") / "ds"
    manifest = build(root, out, "--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction", 0.05, "--write_index")
    return out, manifest


def _shards(manifest):
    return [s for split in manifest.splits for s in split.shards]


_REFERENCE_INDEX = """
from tfrecord.tools.tfrecord2idx import create_index
RESULT = {}
for shard in ARGS["shards"]:
    create_index(shard, ARGS["tmp"] + "/ref.idx")
    RESULT[shard] = open(ARGS["tmp"] + "/ref.idx").read()
"""


@pytest.mark.slow
def test_index_files_are_tfrecord2idx_byte_for_byte_and_listed_with_their_sha256(indexed, tmp_path):
    out, manifest = indexed
    shards = _shards(manifest)
    assert len(shards) == 6
    reference = without_tensorflow(_REFERENCE_INDEX, {"shards": [str(out / s.filename) for s in shards],
                                                      "tmp": str(tmp_path)})
    for shard in shards:
        name = shard.filename.split("/", 1)[1]
        assert shard.index_file == f"{manifest.version}/index/{name}.idx"
        ours = (out / shard.index_file).read_bytes()
        assert ours == reference[str(out / shard.filename)].encode(), shard.filename
        entries = records.parse_index(ours)
        assert len(entries) == shard.count
        assert entries[0][0] == 0 and sum(length for _, length in entries) == shard.num_bytes
        assert shard.index_sha256 == hashlib.sha256(ours).hexdigest()
    # The manifest as published round-trips the new fields.
    published = Manifest.loads((out / MANIFEST).read_bytes())
    assert published == manifest and published.split("train").shards[0].index_sha256


_WORKER_READS = """
from tfrecord.reader import tfrecord_loader
RESULT = []
for data, index, count in ARGS["shards"]:
    parts = []
    for worker in range(ARGS["workers"]):
        # What tfrecord.torch.TFRecordDataset does in DataLoader worker `worker` of `workers`: it
        # needs the index to seek to its slice of the shard.
        rows = tfrecord_loader(data, index, {"image/filename": "byte", "label": "int"},
                               shard=(worker, ARGS["workers"]))
        parts.append([[r["image/filename"].decode(), int(r["label"][0])] for r in rows])
    RESULT.append(parts)
"""


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 3])
def test_tfrecord_package_reads_every_record_with_our_index_also_split_among_workers(indexed, workers):
    out, manifest = indexed
    want = {key: ex.features.feature["label"].int64_list.value[0] for key, ex in read_examples(out).items()}
    shards = _shards(manifest)
    result = without_tensorflow(_WORKER_READS, {"workers": workers, "shards": [
        [str(out / s.filename), str(out / s.index_file), s.count] for s in shards]})
    got = []
    for shard, parts in zip(shards, result):
        assert sum(map(len, parts)) == shard.count, shard.filename
        if shard.count >= workers:
            assert all(parts), f"a worker read nothing of {shard.filename}"
        got.extend(tuple(row) for part in parts for row in part)
    assert sorted(k for k, _ in got) == sorted(want)  # every record once, none twice
    assert dict(got) == want


_MULTI_SHARD = """
from tfrecord.reader import multi_tfrecord_loader
RESULT = []
for worker in range(2):
    RESULT += [r["image/filename"].decode() for r in multi_tfrecord_loader(
        data_pattern=ARGS["out"] + "/{}", index_pattern=ARGS["out"] + "/index/{}.idx", splits=ARGS["splits"],
        description=["image/filename"], infinite=False, shard=(worker, 2))]
"""


@pytest.mark.slow
def test_multi_shard_loader_finds_each_index_from_the_shard_name(indexed):
    out, manifest = indexed
    train = manifest.split("train")
    # The version folder is the patterns' root; the splits are the shards' own names.
    names = without_tensorflow(_MULTI_SHARD, {"out": str(out / manifest.version),
                                              "splits": {os.path.basename(s.filename): s.count for s in train.shards}})
    assert len(names) == len(set(names)) == train.num_examples


_OLD_FORMAT = """
from tfrecord.reader import tfrecord_loader
try:
    list(tfrecord_loader(ARGS["data"], ARGS["index"], shard=(0, 2)))
    RESULT = "read"
except IndexError as e:
    RESULT = "IndexError"
"""


@pytest.mark.slow
def test_the_old_offsets_only_index_is_what_broke_the_tfrecord_package(indexed, tmp_path):
    # The format before this one (one offset per line) fails in the same loader that reads ours:
    # the comparisons above could not pass with a loader that takes anything.
    out, manifest = indexed
    shard = manifest.split("train").shards[0]
    old = tmp_path / "old.index"
    old.write_text("".join(f"{o}\n" for o, _ in records.parse_index((out / shard.index_file).read_bytes())))
    assert without_tensorflow(_OLD_FORMAT, {"data": str(out / shard.filename), "index": str(old)}) == "IndexError"


def test_no_shard_glob_matches_an_index_file(indexed):
    import tensorflow as tf

    out, manifest = indexed
    shard_names = {os.path.basename(s.filename) for s in _shards(manifest)}
    root = str(out / manifest.version)  # globs are written inside the published version's folder
    for pattern in SHARD_GLOBS:
        for matcher in (glob.glob, tf.io.gfile.glob):
            found = {os.path.basename(p) for p in matcher(os.path.join(root, pattern))}
            assert found and found <= shard_names, (pattern, matcher, found - shard_names)
    train = sorted(tf.io.gfile.glob(os.path.join(root, "images-train*")))
    assert sum(1 for _ in tf.data.TFRecordDataset(train)) == manifest.split("train").num_examples
    # The index folder's own glob pairs one index with each shard, in the same sorted order.
    idx = sorted(glob.glob(os.path.join(root, "index", "*.idx")))
    assert [os.path.basename(p)[:-len(".idx")] for p in idx] == sorted(shard_names)


def test_verify_checks_index_files(indexed, tmp_path):
    out, manifest = indexed
    ds = tmp_path / "ds"
    shutil.copytree(out, ds)
    assert inspection.verify(str(ds), records=True)[0] == []
    shard = manifest.split("train").shards[1]
    index = ds / shard.index_file
    good = index.read_bytes()
    entries = records.parse_index(good)

    # A changed length: the sha256 catches it, and the next line's offset no longer follows it;
    # --records also names the line and the true frame.
    off, length = entries[2]
    index.write_bytes(records.format_index(entries[:2] + [(off, length + 1)] + entries[3:]))
    gap = (f"{index}: line 4 says offset {entries[3][0]}, where the record before it ends at byte "
           f"{off + length + 1} (an index's frames follow each other from byte 0)")
    assert inspection.verify(str(ds))[0] == [f"{index}: its sha256 differs from manifest.json's", gap]
    problems = inspection.verify(str(ds), records=True)[0]
    assert problems[:2] == [f"{index}: its sha256 differs from manifest.json's", gap]
    assert problems[2] == (f"{index}: line 3 says offset {off} length {length + 1}; record 3 of {shard.filename} "
                           f"is at {off} with {length} bytes")

    # A line short: the count and the end offset are checked against the manifest, with or without --records.
    index.write_bytes(records.format_index(entries[:-1]))
    end = entries[-1][0]
    short = [f"{index}: its sha256 differs from manifest.json's",
             f"{index}: it lists {shard.count - 1} records, manifest.json says {shard.count} for its shard",
             f"{index}: its records end at byte {end}, manifest.json says its shard is {shard.num_bytes} bytes"]
    assert inspection.verify(str(ds))[0] == short
    assert inspection.verify(str(ds), records=True)[0] == short

    index.unlink()
    assert inspection.verify(str(ds))[0] == [f"{index}: missing"]
    index.write_bytes(good)
    stray = ds / manifest.version / "index" / "stray.tfrecord-00000-of-00001.idx"
    stray.write_bytes(b"0 20\n")
    assert inspection.verify(str(ds))[0] == [f"{stray}: not listed in "
                                          f"{MANIFEST} (an index of no published shard)"]


def _results(index: bool, build_id: str):
    shards = []
    for i, data in enumerate((b"shard0" * 3, b"shard1" * 3)):  # a record's frame takes 16 bytes at least
        name = f"images-train.tfrecord-{i:05d}-of-00002"
        idx = f"0 {len(data)}\n".encode()
        shards.append(ShardResult("train", Shard(i, name, 1, len(data), hashlib.sha256(data).hexdigest(), ((0, 1),), 0,
                                                 dataset_files.index_name(name) if index else None,
                                                 hashlib.sha256(idx).hexdigest() if index else None)))
    return publish.BuildResults(build_id=build_id, name="images", schema="tfds", seed=0, parameters={}, versions={},
                                max_reject_fraction=0.0, labels={"names": ["a"], "offset": 0, "integer": False},
                                shards=tuple(shards), num_rejected=0, num_skipped=0)


def _stage(out, results):
    staging = out / STAGING / results.build_id
    for r in results.shards:
        data = b"shard%d" % r.index * 3
        (staging / r.filename).parent.mkdir(parents=True, exist_ok=True)
        (staging / r.filename).write_bytes(data)
        if r.index_file:
            (staging / r.index_file).parent.mkdir(parents=True, exist_ok=True)
            (staging / r.index_file).write_bytes(f"0 {len(data)}\n".encode())


def test_commit_moves_index_files_into_the_version_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with_index = _results(index=True, build_id="20261201T000001Z-aaaaaa")
    _stage(out, with_index)
    manifest = publish.commit(str(out), with_index)
    assert sorted(os.listdir(out / manifest.version / "index")) == ["images-train.tfrecord-00000-of-00002.idx",
                                                                    "images-train.tfrecord-00001-of-00002.idx"]
    assert not (out / STAGING).exists()
    assert manifest.shard_files()[1] == f"{manifest.version}/index/images-train.tfrecord-00000-of-00002.idx"
    assert inspection.verify(str(out))[0] == []

    without = _results(index=False, build_id="20261201T000002Z-bbbbbb")
    _stage(out, without)
    newer = publish.commit(str(out), without, keep_versions=1)
    assert sorted(os.listdir(out / newer.version)) == ["images-train.tfrecord-00000-of-00002",
                                                       "images-train.tfrecord-00001-of-00002"]
    assert not (out / manifest.version).exists()  # the previous version went, index files and all
    assert inspection.verify(str(out))[0] == []


def test_shard_and_shard_result_round_trip_the_index_fields():
    shard = Shard(0, "f", 2, 40, "ab", ((0, 2),), 1, "index/f.idx", "cd")
    assert Shard.from_json(shard.to_json()) == shard
    assert shard.to_json()["index_sha256"] == "cd"
    assert "index_sha256" not in Shard(0, "f", 2, 40, "ab").to_json()
    result = ShardResult("train", shard)
    assert ShardResult.from_json(result.to_json()) == result and result.to_json()["split"] == "train"
