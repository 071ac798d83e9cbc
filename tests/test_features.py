"""Declared features: a detection-style manifest (boxes, class lists, a float, a caption, a PNG mask)
built for real, read back exactly through reader.as_dataset and TFDS; bad values are rejected rows
naming the feature; unused columns are named; both engines write the same bytes."""

import csv
import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from conftest import build, shard_files
from tests.support.detection import CONFIG, write_rows as _rows
from imagerecords.format import codecs
from imagerecords.format import features as F

@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    folder = tmp_path_factory.mktemp("detection")
    rows = _rows(folder)
    bad = [
        dict(rows[0], key="short-box", boxes=[[1, 2, 3]]),
        dict(rows[1], key="text-score", score="high"),
        dict(rows[2], key="nan-score", score=float("nan")),
        dict(rows[3], key="no-mask", mask="missing.png"),
        dict(rows[4], key="rgb-mask", mask="img4.png"),
        dict(rows[5], key="tags-not-list", tags={"sky": 1}),
        dict(rows[6], key="caption-number", caption=7),
    ]
    with open(folder / "m.jsonl", "w", encoding="utf-8") as f:
        for row in rows + bad:
            f.write(json.dumps(row) + "\n")
    (folder / "f.yaml").write_text(CONFIG)
    return folder, rows


@pytest.fixture(scope="module")
def built(detection, tmp_path_factory):
    folder, rows = detection
    out = tmp_path_factory.mktemp("out") / "ds"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        manifest = build(folder / "m.jsonl", out, "--config", folder / "f.yaml", "--num_shards", 3)
    return out, rows, manifest, printed.getvalue()


def _by_key(rows):
    return {r.get("key", r["path"]): r for r in rows}


def test_as_dataset_round_trips_every_value(built, detection):
    from imagerecords import reader

    out, rows, manifest, _ = built
    folder = detection[0]
    names = manifest.features["tags"]["names"]
    assert names == ["car", "sky", "tree"]  # sorted names the rows hold
    seen = 0
    for ex in reader.as_dataset(str(out), "train").as_numpy_iterator():
        row = _by_key(rows)[ex["image/filename"].decode()]
        assert ex["boxes"].dtype == np.float32 and ex["boxes"].shape == (len(row["boxes"]), 4)
        assert np.array_equal(ex["boxes"], np.array(row["boxes"], np.float32).reshape(-1, 4))
        assert [names[i] for i in ex["tags"]] == row["tags"]
        assert ex["score"] == np.float32(row["score"])
        assert ex["caption"].decode("utf-8") == row["caption"]
        assert ex["mask"].shape[-1] == 1
        assert np.array_equal(ex["mask"][..., 0], np.asarray(Image.open(folder / row["mask"])))
        assert ex["depth"].dtype == np.uint16
        assert np.array_equal(ex["depth"][..., 0], np.asarray(Image.open(folder / row["depth"])))
        assert ex["label"] == ["cat", "dog"].index(row["label"])
        seen += 1
    assert seen == len(rows)


def test_keep_stores_the_source_png_bytes(built, detection):
    import tensorflow as tf

    out, rows, _, _ = built
    folder = detection[0]
    spec = {"depth": tf.io.FixedLenFeature([], tf.string), "image/filename": tf.io.FixedLenFeature([], tf.string)}
    for raw in tf.data.TFRecordDataset(shard_files(out)):
        ex = tf.io.parse_single_example(raw, spec)
        row = _by_key(rows)[ex["image/filename"].numpy().decode()]
        assert ex["depth"].numpy() == (folder / row["depth"]).read_bytes()


def test_tfds_loads_the_features(built, detection):
    tfds = pytest.importorskip("tensorflow_datasets")
    out, rows, _, _ = built
    folder = detection[0]
    builder = tfds.builder_from_directory(str(out))
    tags = builder.info.features["tags"].feature
    seen = 0
    for ex in tfds.as_numpy(builder.as_dataset(split="train")):
        row = _by_key(rows)[ex["image/filename"].decode()]
        assert np.array_equal(ex["boxes"], np.array(row["boxes"], np.float32).reshape(-1, 4))
        assert [tags.int2str(i) for i in ex["tags"]] == row["tags"]
        assert ex["score"] == np.float32(row["score"])
        assert ex["caption"].decode("utf-8") == row["caption"]
        assert np.array_equal(ex["mask"][..., 0], np.asarray(Image.open(folder / row["mask"])))
        assert np.array_equal(ex["depth"][..., 0], np.asarray(Image.open(folder / row["depth"])))
        seen += 1
    assert seen == len(rows)


def test_a_bad_value_is_a_rejected_row_naming_its_feature(built):
    out, _, manifest, _ = built
    with open(out / "errors.jsonl", encoding="utf-8") as f:
        reasons = {r["key"]: r["reason"] for r in map(json.loads, f)}
    assert manifest.num_rejected == 7
    assert reasons["short-box"] == "feature 'boxes': shape [1, 3] does not fit the declared [?, 4]"
    assert reasons["text-score"].startswith("feature 'score': \"high\" is not a number")
    assert reasons["nan-score"].startswith("feature 'score': ") and "allow_nan" in reasons["nan-score"]
    assert reasons["no-mask"].startswith("feature 'mask': cannot read ") and "missing.png" in reasons["no-mask"]
    assert reasons["rgb-mask"].endswith("has mode RGB (3 channels); the feature declares 1")
    assert reasons["tags-not-list"].startswith("feature 'tags': expected a list of class names")
    assert reasons["caption-number"] == "feature 'caption': expected text, got 7"


def test_unused_columns_are_named_in_the_summary(built):
    printed = built[3]
    assert "ignored columns: unused, note (no setting or feature reads them" in printed


def test_manifest_records_the_spec(built):
    out = built[0]
    with open(out / "manifest.json") as f:
        spec = json.load(f)["features"]
    assert spec["boxes"] == {"dtype": "float32", "shape": [None, 4], "encoding": "bytes"}
    assert spec["score"] == {"dtype": "float32", "shape": [], "encoding": "list"}
    assert spec["mask"] == {"dtype": "image", "encoding": "png", "channels": 1, "bits": 8}
    assert spec["tags"] == {"dtype": "class_list", "names": ["car", "sky", "tree"]}
    assert (out / "tags.labels.txt").read_text() == "car\nsky\ntree\n"


@pytest.mark.slow
def test_csv_manifest_and_flags_give_the_same_bytes_as_jsonl_and_config(detection, tmp_path):
    """The same values through CSV cells (JSON text) and --feature flags write the same records."""
    folder, rows = detection
    columns = ["path", "label", "boxes", "tags", "score", "caption"]
    with open(folder / "m.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([r["path"], r["label"], json.dumps(r["boxes"]), json.dumps(r["tags"]), repr(r["score"]),
                        r["caption"]])
    with open(folder / "m2.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in columns}) + "\n")
    flags = ["--feature", "boxes=float32[?,4]", "--feature", "tags=class_list", "--feature", "score=float32",
             "--feature", "caption=string", "--num_shards", 2]
    build(folder / "m.csv", tmp_path / "csv", *flags)
    build(folder / "m2.jsonl", tmp_path / "jsonl", *flags)
    digests = [[hashlib.sha256(open(p, "rb").read()).hexdigest() for p in shard_files(tmp_path / d)]
               for d in ("csv", "jsonl")]
    assert digests[0] == digests[1] and len(digests[0]) == 2


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_direct_runner_writes_the_local_engines_bytes(detection, tmp_path):
    folder, _ = detection
    build(folder / "m.jsonl", tmp_path / "local", "--config", folder / "f.yaml", "--num_shards", 2)
    build(folder / "m.jsonl", tmp_path / "beam", "--config", folder / "f.yaml", "--num_shards", 2,
          "--runner=DirectRunner")
    local, beam = ([open(p, "rb").read() for p in shard_files(tmp_path / d)] for d in ("local", "beam"))
    assert local == beam and len(local) == 2
    for name in ("errors.jsonl", "features.json", "tags.labels.txt"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "beam" / name).read_bytes()


@pytest.mark.parametrize("flag, message", [
    ("boxes=float32[?,?]", "at most one dimension may be variable"),
    ("boxes=float99", "dtype 'float99' is not one of"),
    ("x=float64[3]:list", "float64 as a list would be rounded to float32"),
    ("mask=image:gif", "image encoding 'gif' is not one of"),
    ("label=float32", "the tfds schema stores this key itself"),
    ("nonsense", "expected NAME=DTYPE[DIMS][:ENCODING]"),
])
def test_a_bad_declaration_is_one_line_and_exit_2(tmp_path, flag, message):
    import subprocess
    import sys

    (tmp_path / "m.jsonl").write_text('{"path": "a.png", "label": "x"}\n')
    done = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(tmp_path / "m.jsonl"),
                           "--output", str(tmp_path / "out"), "--feature", flag],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_features_encode_as_tensorflow_does():
    tf = pytest.importorskip("tensorflow")
    from imagerecords.format import schema

    fs = {"v": F.parse_flag("v=int64[?]"), "f": F.parse_flag("f=float32[2]"), "b": F.parse_flag("b=bool"),
          "e": F.parse_flag("e=int32[?]"), "r": F.parse_flag("r=float16[2,2]")}
    values = {"v": [-1, 2**40, 0], "f": [0.1, -3.5], "b": True, "e": [], "r": [[1, 2], [3.5, -0.25]]}
    entries = {k: codecs.encode(fs[k], codecs.check(fs[k], v)) for k, v in values.items()}
    theirs = tf.train.Example(features=tf.train.Features(feature={
        "v": tf.train.Feature(int64_list=tf.train.Int64List(value=[-1, 2**40, 0])),
        "f": tf.train.Feature(float_list=tf.train.FloatList(value=[0.1, -3.5])),
        "b": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
        "e": tf.train.Feature(int64_list=tf.train.Int64List(value=[])),
        "r": tf.train.Feature(bytes_list=tf.train.BytesList(value=[np.array([[1, 2], [3.5, -0.25]], "<f2").tobytes()])),
    }))
    assert schema.example_of(entries) == theirs.SerializeToString(deterministic=True)


@pytest.mark.parametrize("feature, value, message", [
    ("n=uint8", 256, "outside uint8's range 0..255"),
    ("n=int32", 1.5, "holds non-integers"),
    ("n=float16", 1e6, "outside float16's range"),
    ("n=bool", 2, "values other than true/false"),
    ("n=float32[3]", [[1, 2, 3]], "shape [1, 3] does not fit the declared [3]"),
    ("n=float32[?,2]", [[1, 2], [3]], "ragged list"),
    ("n=float32", True, "is a bool, not a number"),
    ("n=string", ["a"], "expected text"),
])
def test_value_checks_name_the_feature(feature, value, message):
    with pytest.raises(F.ValueProblem) as e:
        codecs.check(F.parse_flag(feature), value)
    assert str(e.value).startswith("feature 'n': ") and message in str(e.value)


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "imagerecords", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_inspect_lists_the_features(built):
    done = _cli("inspect", built[0])
    assert done.returncode == 0, done.stderr
    assert "  feature boxes: float32[?,4] (bytes)" in done.stdout.splitlines()
    assert "  feature tags: class_list (3 names)" in done.stdout.splitlines()
    assert "  feature depth: image keep, 1 channel(s), 16-bit" in done.stdout.splitlines()


def test_inspect_spec_tf_is_the_readers_spec(built):
    import tensorflow as tf
    from imagerecords import reader

    done = _cli("inspect", built[0], "--spec", "tf")
    assert done.returncode == 0, done.stderr
    assert eval(done.stdout, {"tf": tf}) == reader.feature_spec(str(built[0]))


@pytest.mark.slow
def test_inspect_spec_tfrecord_reads_with_the_tfrecord_package(built):
    """The description `inspect --spec tfrecord` prints reads every shard with the `tfrecord`
    package (in its own process: its protobuf module clashes with TensorFlow's in one process)."""
    import subprocess
    import sys

    out, rows = built[0], built[1]
    done = _cli("inspect", out, "--spec", "tfrecord")
    assert done.returncode == 0, done.stderr
    script = (
        "import json, sys\n"
        "from tfrecord.reader import tfrecord_loader\n"
        "description = json.loads(sys.stdin.read())\n"
        "for path in sys.argv[1:]:\n"
        "    for ex in tfrecord_loader(path, None, description):\n"
        "        print(json.dumps({'key': bytes(ex['image/filename']).decode(), 'boxes': bytes(ex['boxes']).hex(),\n"
        "                          'score': float(ex['score'][0]), 'tags': [int(t) for t in ex['tags']]}))\n")
    read = subprocess.run([sys.executable, "-c", script, *shard_files(out)], input=done.stdout, capture_output=True,
                          text=True, timeout=300)
    assert read.returncode == 0, read.stderr
    names = built[2].features["tags"]["names"]
    seen = 0
    for line in read.stdout.splitlines():
        ex = json.loads(line)
        row = _by_key(rows)[ex["key"]]
        boxes = np.frombuffer(bytes.fromhex(ex["boxes"]), "<f4").reshape(-1, 4)
        assert np.array_equal(boxes, np.array(row["boxes"], np.float32).reshape(-1, 4))
        assert np.float32(ex["score"]) == np.float32(row["score"])
        assert [names[i] for i in ex["tags"]] == row["tags"]
        seen += 1
    assert seen == len(rows)


def test_verify_records_checks_each_record_against_the_spec(built, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(built[0], copy)
    assert _cli("verify", copy, "--records").stdout.strip() == "ok"
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["features"]["ghost"] = {"dtype": "float32", "shape": [3]}
    manifest["features"]["score"] = {"dtype": "float32", "shape": [2]}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    done = _cli("verify", copy, "--records")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len([x for x in lines if x.endswith("record 0: feature 'ghost' is missing")]) == 3  # one per shard
