"""docs/recipes.md runs: each `# recipe:` block against a real build, the rest checked as far as this machine allows."""

import collections
import importlib.util
import json
import os
import re

import numpy as np
import pytest

from conftest import build, skip_unless_ci
from support.doc_blocks import python_blocks
from test_index import without_tensorflow

SPLITS = "train=0.7,validation=0.3"


def recipes():
    """{name: code} of every ```python block of docs/recipes.md whose first line is `# recipe: NAME`."""
    out = {}
    for block in python_blocks("docs/recipes.md"):
        first = block.splitlines()[0]
        if first.startswith("# recipe: "):
            out[first[len("# recipe: "):].split(" (")[0]] = block
    return out


@pytest.fixture(scope="module")
def datasets(image_tree, tmp_path_factory):
    """One build per schema preset, with index files."""
    root, _ = image_tree
    base = tmp_path_factory.mktemp("recipes")
    built = {}
    for preset in ("tfds", "tf-models"):
        out = base / preset
        built[preset] = (str(out), build(root, out, "--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction",
                                         0.05, "--write_index", "--schema", preset))
    return built


def _run(name, out):
    scope = {"OUT": out}
    exec(compile(recipes()[name], f"docs/recipes.md[{name}]", "exec"), scope)
    return scope


def test_every_recipe_block_is_found_and_compiles():
    found = recipes()
    assert sorted(found) == ["dali", "features-dali", "features-tfrecord", "grain", "jax", "model-garden", "pytorch",
                             "pytorch-files", "tfds", "torch-reader"]
    for name, code in found.items():
        compile(code, f"docs/recipes.md[{name}]", "exec")


@pytest.mark.slow
def test_tfds_recipe_as_supervised(datasets):
    out, manifest = datasets["tfds"]
    scope = _run("tfds", out)
    builder, train = scope["builder"], scope["train"]
    assert builder.info.supervised_keys == ("image", "label")
    labels = []
    for image, label in train:
        assert image.dtype.name == "uint8" and image.shape[-1] == 3 and image.shape[0] > 0
        labels.append(int(label))
    want = collections.Counter()
    for shard in manifest.split("train").shards:
        want.update(dict(shard.labels))
    assert collections.Counter(labels) == want and len(labels) == manifest.split("train").num_examples
    validation = builder.as_dataset(split="validation", as_supervised=True)
    assert sum(1 for _ in validation) == manifest.split("validation").num_examples


def test_jax_recipe_numpy_batches(datasets):
    import numpy as np

    out, manifest = datasets["tfds"]
    scope = _run("jax", out)
    images, labels = scope["images"], scope["labels"]
    assert isinstance(images, np.ndarray) and images.shape == (8, 64, 64, 3) and images.dtype == np.float32
    assert labels.shape == (8,) and labels.dtype == np.int32 and set(labels) <= set(range(4))
    seen = sum(len(lbl) for _, lbl in scope["validation"])
    assert seen == manifest.split("validation").num_examples


@pytest.mark.parametrize("preset", ["tfds", "tf-models"])  # the recipe takes the keys from the manifest
def test_grain_recipe_restores_the_next_batch(datasets, preset):
    if importlib.util.find_spec("grain") is None:
        skip_unless_ci("grain is not installed (pip install -e '.[grain]')")
    out, manifest = datasets[preset]
    scope = _run("grain", out)
    it, following, state = scope["it"], scope["following"], scope["state"]
    assert state["iterator"] == {"next_index": 3} and json.loads(json.dumps(state)) == state
    expected = next(it)  # the first iterator, carried on past the checkpoint
    assert following["image"].shape == (8, 64, 64, 3) and following["image"].dtype == np.float32
    assert np.array_equal(following["image"], expected["image"])
    assert np.array_equal(following["label"], expected["label"])
    assert set(following["label"].tolist()) <= set(range(len(manifest.label_names) + manifest.label_offset))


def test_model_garden_recipe_glob_picks_exactly_the_shards(datasets):
    import tensorflow as tf

    out, manifest = datasets["tf-models"]
    scope = _run("model-garden", out)
    for split, pattern in (("train", scope["train_input_path"]), ("validation", scope["validation_input_path"])):
        matched = sorted(tf.io.gfile.glob(pattern))
        assert matched == sorted(os.path.join(out, s.filename) for s in manifest.split(split).shards)
        assert os.path.isdir(os.path.join(out, manifest.version, "index"))  # index files exist, are not matched
        # Model Garden's classification Decoder: image/encoded (string) and image/class/label (int64).
        spec = {"image/encoded": tf.io.FixedLenFeature((), tf.string),
                "image/class/label": tf.io.FixedLenFeature((), tf.int64)}
        count = 0
        for raw in tf.data.TFRecordDataset(matched):
            ex = tf.io.parse_single_example(raw, spec)
            assert tf.io.decode_jpeg(ex["image/encoded"], channels=3).shape[-1] == 3
            count += 1
        assert count == manifest.split(split).num_examples


@pytest.mark.parametrize("preset", ["tfds", "tf-models"])
def test_dali_feature_spec_reads_each_preset(datasets, preset):
    """DALI itself needs a GPU; its FixedLenFeature specs are TensorFlow's, so the same spec with the
    preset's keys must parse every record of the recipe's shard list (and its index list pairs up)."""
    import tensorflow as tf

    from imagerecords.format import schema

    out, manifest = datasets[preset]
    keys = schema.keys(manifest.schema)
    train = manifest.split("train")
    paths = [f"{out}/{s.filename}" for s in train.shards]
    indexes = [f"{out}/{s.index_file}" for s in train.shards]
    assert all(os.path.isfile(p) for p in paths + indexes)
    assert [os.path.basename(i)[:-len(".idx")] for i in indexes] == [os.path.basename(p) for p in paths]
    spec = {keys.image: tf.io.FixedLenFeature((), tf.string, ""), keys.label: tf.io.FixedLenFeature([1], tf.int64, -1)}
    labels = [int(tf.io.parse_single_example(raw, spec)[keys.label][0]) for raw in tf.data.TFRecordDataset(paths)]
    assert len(labels) == train.num_examples and min(labels) >= manifest.label_offset


@pytest.fixture(scope="module")
def features_dataset(tmp_path_factory):
    """A declared-features build (tests/support/detection.py) with index files."""
    from tests.support.detection import CONFIG, write_rows

    folder = tmp_path_factory.mktemp("features")
    rows = write_rows(folder)
    with open(folder / "m.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    (folder / "f.yaml").write_text(CONFIG)
    out = folder / "out"
    build(folder / "m.jsonl", out, "--config", folder / "f.yaml", "--num_shards", 2, "--write_index")
    return str(out), rows


_FEATURES_TFRECORD = """
scope = {"OUT": ARGS["out"]}
exec(ARGS["code"], scope)
RESULT = [{"boxes": e["boxes"].tolist(), "tags": e["tags"], "score": e["score"], "caption": e["caption"],
           "mask": e["mask"].tolist()} for e in scope["examples"]]
"""


@pytest.mark.slow
def test_features_recipe_with_the_tfrecord_package(features_dataset):
    import numpy as np
    from PIL import Image

    out, rows = features_dataset
    got = without_tensorflow(_FEATURES_TFRECORD, {"out": out, "code": recipes()["features-tfrecord"]})
    assert len(got) == len(rows)
    by_caption = {r["caption"]: r for r in rows}
    folder = os.path.dirname(out)
    for ex in got:
        row = by_caption[ex["caption"]]
        assert ex["boxes"] == np.array(row["boxes"], np.float32).reshape(-1, 4).tolist()
        assert ex["tags"] == row["tags"] and np.float32(ex["score"]) == np.float32(row["score"])
        assert ex["mask"] == np.asarray(Image.open(os.path.join(folder, row["mask"]))).tolist()


def test_dali_features_parse_every_record_as_tensorflow_would(features_dataset):
    """DALI needs a GPU; its tfrec specs mirror TensorFlow's, so the spec dali_features builds (with
    TensorFlow's classes standing in for tfrec's) must parse every record."""
    import types

    import tensorflow as tf

    from imagerecords.format import features
    from imagerecords.format.manifest import Manifest

    out, rows = features_dataset
    with open(f"{out}/manifest.json", "rb") as f:
        manifest = Manifest.loads(f.read())
    stand_in = types.SimpleNamespace(
        string=tf.string, float32=tf.float32, int64=tf.int64,
        FixedLenFeature=lambda shape, dtype, default: tf.io.FixedLenFeature(shape, dtype, default),
        VarLenFeature=lambda dtype, default: tf.io.VarLenFeature(dtype))
    spec = features.dali_features(features.stored(manifest), stand_in)
    train = manifest.split("train")
    parsed = [tf.io.parse_single_example(raw, spec) for raw in tf.data.TFRecordDataset(
        [f"{out}/{s.filename}" for s in train.shards])]
    assert len(parsed) == len(rows)
    assert sorted(float(p["score"]) for p in parsed) == sorted(float(np.float32(r["score"])) for r in rows)
    assert all(os.path.isfile(f"{out}/{s.index_file}") for s in train.shards)


_PYTORCH_FILES = """
import io
from PIL import Image
from tfrecord.reader import multi_tfrecord_loader
scope = {"OUT": ARGS["out"]}
exec(ARGS["files"], scope)
RESULT = []
# What MultiTFRecordDataset.__iter__ does in DataLoader worker w of 2 (it passes shard=(w, 2)).
for worker in range(2):
    for example in multi_tfrecord_loader(scope["data_pattern"], scope["index_pattern"], scope["weights"],
                                         scope["description"], infinite=False, shard=(worker, 2)):
        image = Image.open(io.BytesIO(example[scope["keys"].image]))
        image.load()
        RESULT.append([worker, int(example[scope["keys"].label][0]), image.size[0] > 0])
"""

_PYTORCH = """
scope = {"OUT": ARGS["out"]}
exec(ARGS["files"], scope)
exec(ARGS["torch"], scope)
RESULT = []
for images, labels in scope["loader"]:
    assert images.shape[1:] == (3, 64, 64), images.shape
    RESULT += [int(x) for x in labels]
"""


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tfds", "tf-models"])
def test_pytorch_recipe_with_the_tfrecord_package(datasets, preset):
    out, manifest = datasets[preset]
    code = recipes()
    train = manifest.split("train")
    want = sorted(label for s in train.shards for label, n in s.labels for _ in range(n))
    rows = without_tensorflow(_PYTORCH_FILES, {"out": out, "files": code["pytorch-files"]})
    assert sorted(label for _, label, _ in rows) == want and all(ok for _, _, ok in rows)
    assert {worker for worker, _, _ in rows} == {0, 1}  # both workers read, from their own slices


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tfds", "tf-models"])
@pytest.mark.needs_extra("torch")  # the loader the block wraps runs without it, above
def test_pytorch_dataloader_recipe(datasets, preset):
    out, manifest = datasets[preset]
    code = recipes()
    want = sorted(label for s in manifest.split("train").shards for label, n in s.labels for _ in range(n))
    labels = without_tensorflow(_PYTORCH, {"out": out, "files": code["pytorch-files"], "torch": code["pytorch"]})
    assert sorted(labels) == want


def test_version_flag_prints_the_package_version_in_a_subprocess():
    """`imagerecords --version` (what a recipe's bug report starts with); it must not need Beam or TF."""
    import subprocess
    import sys

    import imagerecords

    code = ("import sys\nfrom imagerecords.cli.main import main\nrc = main(sys.argv[1:])\n"
            "assert 'tensorflow' not in sys.modules and 'apache_beam' not in sys.modules, 'heavy import'\n"
            "sys.exit(rc)")
    for flag in ("--version", "-V"):
        proc = subprocess.run([sys.executable, "-c", code, flag], capture_output=True, text=True, timeout=120)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"imagerecords {imagerecords.__version__}\n", "")
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stdout) == (0, f"imagerecords {imagerecords.__version__}\n")
    assert re.fullmatch(r"\d+\.\d+\.\d+", imagerecords.__version__)
