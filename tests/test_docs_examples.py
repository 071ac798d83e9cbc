"""Every code example of README.md and docs/*.md runs as written: each python block, and each
`imagerecords ...` command of a shell block (tests/support/doc_blocks.py finds them).

PLAN names every example of every file, by a piece of its text, and says what happens to it:
Run (here, in a fresh folder holding the inputs it names), Elsewhere (another test runs it, named),
or Skip (with the one-line reason it cannot run on this machine). A new example fails
test_every_example_is_in_the_plan until it is given a line here. A run asserts that the example
exits cleanly and, where the doc says what it prints or makes, that too.

What a run changes, all listed here: the paths of WHERE (absolute and gs:// paths become folders of
the run's own), a block's EDITS (a deliberate `...`), and the names a deliberately partial block
uses without defining them (its `given` lines: a stand-in `model`, `path`, a `train_step` that ends
a loop the doc writes without end, as training=True repeats the split).
"""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from typing import Callable, NamedTuple, Optional, Tuple

import numpy as np
import pytest

from conftest import build
from support import doc_blocks

ROOT = doc_blocks.ROOT

# The docs' absolute and gs:// paths, and the folders of the run that stand in for them (the gs://
# reads themselves are tests/test_reader_gcs.py's).
WHERE = {
    "gs://bucket/ds": "ds",
    "gs://bucket/run1/": "run1/",
    "/data/oi": "data/oi",
    "/data/pets": "data/pets",
    "/tmp/ds": "tmp/ds",
}


class Run(NamedTuple):
    markers: Tuple[str, ...]  # one piece of text per example, run in this order in one folder
    scene: str = "empty"  # what the folder holds first (SCENES)
    given: str = ""  # lines run before a python block: the names it uses but does not define
    edits: Tuple[Tuple[str, str], ...] = ()  # text replaced in the example, besides WHERE
    check: Optional[Callable] = None  # check(result): what the doc says the example prints or makes
    fresh: bool = False  # a python block in its own interpreter (PyTorch's DataLoader workers fork)
    needs: Tuple[str, ...] = ()  # optional pieces it needs that [test] does not bring (conftest.EXTRAS)


class Elsewhere(NamedTuple):
    marker: str
    test: str  # tests/FILE.py::NAME, which runs it


class Skip(NamedTuple):
    marker: str
    reason: str


class Result(NamedTuple):
    folder: str
    out: str  # what the examples printed (stdout)
    scope: dict  # the last python block's names (for a fresh interpreter: its RESULT)


# ---------------------------------------------------------------- stand-ins named by `given` lines


class Stop(Exception):
    """Raised by Steps to end a training loop the doc writes without end."""


class Steps:
    """A train_step: records each batch's type and shape, and stops the loop at the third."""

    def __init__(self):
        self.batches = []

    def __call__(self, *args):
        state, images, labels = args if len(args) == 3 else (None, *args)
        self.batches.append((type(images).__module__.split(".")[0], tuple(images.shape), tuple(labels.shape)))
        if len(self.batches) == 3:
            raise Stop
        return state


class FitRecorder:
    """A `model` whose fit takes one batch of x and records the arguments (90 epochs are not run)."""

    def __init__(self):
        self.calls = []

    def fit(self, x, **kwargs):
        images, labels = next(iter(x))
        self.calls.append(dict(kwargs, batch=(tuple(images.shape), tuple(labels.shape))))


def tiny_keras_model():
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])


STAND_INS = {"Stop": Stop, "Steps": Steps, "FitRecorder": FitRecorder, "tiny_keras_model": tiny_keras_model}


# ---------------------------------------------------------------- what the examples are run against


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Built once for every example: `photos` (4 classes x 10 generated images), `ds` (an image
    dataset of 320, with index files: a batch of 256 fills, as the reader's examples ask) and
    `features` (a declared-features dataset: boxes, class lists, captions, ...)."""
    from imagerecords.pipeline import example_images
    from support.detection import CONFIG, write_rows

    base = tmp_path_factory.mktemp("docs")
    example_images.write_tree(str(base / "photos"), per_class=10, broken=False)
    example_images.write_tree(str(base / "many"), per_class=80, broken=False)
    images = build(base / "many", base / "ds", "--splits", "train=0.9,validation=0.1", "--write_index")
    feats = base / "features"
    feats.mkdir()
    with open(feats / "m.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in write_rows(feats))
    (feats / "f.yaml").write_text(CONFIG)
    build(feats / "m.jsonl", feats / "out", "--config", feats / "f.yaml", "--num_shards", 2)
    return {"photos": str(base / "photos"), "ds": str(base / "ds"), "features": str(feats / "out"),
            "images": images}


def _photos_and_a_dataset_of_them(folder, data, stack):
    """photos/, `ds` built from it, then two new images in photos/ (what an append adds)."""
    from PIL import Image

    from imagerecords.pipeline import example_images

    shutil.copytree(data["photos"], os.path.join(folder, "photos"))
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        build("photos/", "ds")
    finally:
        os.chdir(cwd)
    for i in (90, 91):
        Image.fromarray(example_images.draw("circle", i)).save(os.path.join(folder, "photos", "circle", f"new_{i}.jpg"))


def _urls(folder, data, stack):
    """urls.csv: `url,label` rows of images served by a local HTTP server."""
    from support.web import Server, jpeg

    server = stack.enter_context(Server({f"p{i}.jpg": jpeg(i) for i in range(6)}))
    with open(os.path.join(folder, "urls.csv"), "w") as f:
        f.write("url,label\n" + "".join(f"{server.url(f'/img/p{i}.jpg')},{['cat', 'dog'][i % 2]}\n"
                                        for i in range(6)))


def _open_images(folder, data, stack):
    """open-images.csv: docs/building.md's own CSV block, its URLs served by a local HTTP server."""
    from support.web import Server, jpeg

    (csv,) = [b.code for b in doc_blocks.blocks("docs/building.md") if b.lang == "csv"]
    names = [line.split(",")[0].rsplit("/", 1)[-1] for line in csv.splitlines()[1:]]
    server = stack.enter_context(Server({name: jpeg(i) for i, name in enumerate(names)}))
    with open(os.path.join(folder, "open-images.csv"), "w") as f:
        f.write(csv.replace("https://images.example.org/", server.url("/img/")))


def _digits(folder, data, stack):
    """digits.npz: 60 28x28 uint8 images and their labels."""
    rng = np.random.default_rng(0)
    np.savez(os.path.join(folder, "digits.npz"), image=rng.integers(0, 256, (60, 28, 28), dtype=np.uint8),
             label=rng.integers(0, 10, 60))


def _link(name, what):
    def scene(folder, data, stack):
        os.symlink(data[what], os.path.join(folder, name))
    scene.__doc__ = f"{name}: the {what} dataset"
    return scene


SCENES = {
    "empty": lambda folder, data, stack: None,
    "photos": lambda folder, data, stack: shutil.copytree(data["photos"], os.path.join(folder, "photos")),
    "photos, ds of them, two new": _photos_and_a_dataset_of_them,
    "urls.csv": _urls,
    "open-images.csv": _open_images,
    "digits.npz": _digits,
    "ds": _link("ds", "ds"),
    "OUT": _link("OUT", "ds"),
    "OUT features, ds": lambda folder, data, stack: (_link("OUT", "features")(folder, data, stack),
                                                     _link("ds", "ds")(folder, data, stack)),
}


# ---------------------------------------------------------------- checks of what the docs say


def _manifest(folder, out="ds"):
    from imagerecords.format.manifest import Manifest

    with open(os.path.join(folder, out, "manifest.json"), "rb") as f:
        return Manifest.loads(f.read())


def _help(r):
    assert r.out.startswith("usage: imagerecords build") and "--output" in r.out, r.out[:300]


def _photos_split(r):
    m = _manifest(r.folder)
    assert [s.name for s in m.splits] == ["train", "validation"] and m.num_examples == 40


def _urls_built(r):
    m = _manifest(r.folder)
    assert m.num_examples == 6 and m.label_names == ("cat", "dog")


def _png_records(r):  # "NumPy arrays, PNG records"
    import tensorflow as tf

    from imagerecords.format import schema

    m = _manifest(r.folder)
    assert m.num_examples == 60
    path = os.path.join(r.folder, "ds", m.split("train").shards[0].filename)
    ex = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(path))).numpy())
    assert ex.features.feature[schema.keys(m.schema).image].bytes_list.value[0][:8] == b"\x89PNG\r\n\x1a\n"


def _appended_two(r):  # "add only the new images"
    assert _manifest(r.folder).num_examples == 42


def _open_images_read(r):  # uint8 [H, W, 3], int64, float32 [n, 4]
    ex = r.scope["ex"]
    assert ex["image"].dtype.name == "uint8" and ex["image"].shape[-1] == 3 and len(ex["image"].shape) == 3
    assert ex["label"].dtype.name == "int64"
    assert ex["boxes"].dtype.name == "float32" and ex["boxes"].shape[-1] == 4


def _progress(r):  # "N/M done, R rejected", a final one marked "(end)", then the train count
    lines = r.out.splitlines()
    assert lines[-2].endswith("(end)") and lines[-2].startswith("40/40 done, 0 rejected"), lines
    assert int(lines[-1]) == _manifest(r.folder, "tmp/ds").split("train").num_examples


def _pets(r):
    m = _manifest(r.folder, "data/pets")
    assert m.num_examples == 1 and m.label_names == ("cat",) and "boxes" in m.features


def _info_and_fit(r):
    m = _manifest(r.folder)
    train = m.split("train").num_examples
    assert r.out.splitlines() == [f"{train} {list(m.label_names)[:5]} {len(m.label_names)}"], r.out
    (call,) = r.scope["model"].calls
    assert call["epochs"] == 90 and call["steps_per_epoch"] == train // 256
    assert call["batch"] == ((256, 224, 224, 3), (256,)) and call["validation_data"] is r.scope["val"]


def _distributed(r):
    import tensorflow as tf

    assert isinstance(r.scope["dist"], tf.distribute.DistributedDataset)
    images, labels = r.scope["dist"].element_spec
    assert images.shape == (1024, 224, 224, 3) and labels.shape == (1024,)  # the global batch, one replica


def _every_feature(r):  # the comments' dtypes and shapes; batches padded
    ex = r.scope["ex"]
    assert ex["image"].dtype.name == "uint8" and len(ex["image"].shape) == 3
    assert ex["boxes"].dtype.name == "float32" and ex["boxes"].shape[-1] == 4
    assert ex["tags"].dtype.name == "int64" and len(ex["tags"].shape) == 1
    assert ex["caption"].dtype.name == "string"
    batch = next(iter(r.scope["batches"]))
    assert batch["image"].shape[0] == 12 and batch["boxes"].shape[1:] == (3, 4)  # 12 rows; at most 3 boxes


def _keras_model(r):
    assert tuple(r.scope["model"].output.shape) == (None, 1000)
    images, _ = next(iter(r.scope["train"]))
    assert images.dtype.name == "uint8" and tuple(images.shape) == (256, 224, 224, 3)


def _backup(r):
    import tensorflow as tf

    assert r.scope["epoch"] == 0 and r.scope["steps"] == _manifest(r.folder).split("train").num_examples // 256
    (call,) = r.scope["model"].calls
    assert [type(c) for c in call["callbacks"]] == [tf.keras.callbacks.BackupAndRestore]
    assert call["epochs"] == 90 and call["batch"] == ((256, 224, 224, 3), (256,))


def _three_steps(kind, batch):
    def check(r):
        assert r.scope["train_step"].batches == [(kind, (batch, 224, 224, 3), (batch,))] * 3
    return check


def _torch_state(r):  # saved after the epoch's one batch of 256: the next epoch, none of it consumed
    train = _manifest(r.folder).split("train").num_examples
    assert sorted(r.scope) == ["consumed", "dataset", "epoch", "num_examples", "seed"]  # the comment's five
    assert (r.scope["seed"], r.scope["epoch"], r.scope["consumed"], r.scope["num_examples"]) == (0, 1, 0, train)
    assert 256 <= train < 512


def _same_printout(r):
    (line,) = r.out.splitlines()
    assert line.startswith("(256, 224, 224, 3) tf.Tensor([") and line.endswith("shape=(8,), dtype=int32)"), line


def _resume_epoch(r):
    steps = _manifest(r.folder, "OUT").split("train").num_examples // 256
    assert (r.scope["steps"], r.scope["epoch"]) == (steps, 5 // steps)


# ---------------------------------------------------------------- the plan: every example, by file

_BUILD_HELP = Run(("imagerecords build --help",), check=_help)
_SYNOPSIS = Skip("--input DIR_OR_MANIFEST --output OUT [", "a synopsis: DIR_OR_MANIFEST, OUT and the [options] are placeholders")
_FLINK = "needs a Flink cluster and gs:// buckets (tests/test_flink_*.py run builds on a local cluster)"
_DATAFLOW = "needs Google Cloud Dataflow, a project and gs:// buckets"
_RECIPES = "tests/test_recipes.py::"

PLAN = {
    "README.md": [
        _SYNOPSIS,
        _BUILD_HELP,
        Run(("--input photos/ --output ds --splits",), "photos", check=_photos_split),
        Run(("--input urls.csv",), "urls.csv", check=_urls_built),
        Run(("--input digits.npz",), "digits.npz", check=_png_records),
        Run(("--input photos/ --output ds --append",), "photos, ds of them, two new", check=_appended_two),
        Elsewhere('imagerecords.build("photos/", "OUT"', "tests/test_readme_examples.py::"
                  "test_the_readmes_python_examples_run_as_written"),
        Elsewhere('reader.load_info("OUT")', "tests/test_readme_examples.py::"
                  "test_the_readmes_python_examples_run_as_written"),
        Skip("--runner=DataflowRunner", _DATAFLOW),
        Skip("--runner=FlinkRunner", "needs a Flink cluster at HOST:8081 and its worker pool at HOST:50000 "
                                     "(tests/test_flink_*.py run builds on a local cluster)"),
    ],
    "docs/bad-inputs.md": [],
    "docs/benchmarks.md": [],
    "docs/building.md": [
        _SYNOPSIS,
        Skip("python -m imagerecords build ...", "`...` stands for the line above's arguments "
                                                 "(tests/test_recipes.py runs `python -m imagerecords --version`)"),
        _BUILD_HELP,
        Run(("--input open-images.csv", 'reader.as_dataset("/data/oi"'), "open-images.csv", check=_open_images_read),
        Run(("progress=show",), "photos", check=_progress),
        Elsewhere('np.savez("data.npz"', "tests/test_arrays.py::test_readme_example_runs_against_a_build"),
        Elsewhere("--input data.npz --output ds", "tests/test_arrays.py::test_readme_example_runs_against_a_build"),
        Elsewhere("tf.io.decode_raw", "tests/test_arrays.py::test_readme_example_runs_against_a_build"),
        Run(("--output ds/ --append",), "photos, ds of them, two new", check=_appended_two),
    ],
    "docs/clusters.md": [
        Run(("WriteDataset(",), given="jpeg_bytes = open(\"photos/circle/circle_000.jpg\", \"rb\").read()",
            scene="photos", edits=((', ...]', ']'),), check=_pets),
        # Run on apache-beam >= 2.68 with the binary .ci/get_prism.sh builds (CI's newest-Beam stage).
        Elsewhere("--runner PrismRunner", "tests/test_golden.py::test_local_engine_and_prism_runner_write_the_same_bytes"),
        Skip("--flink_master=JOBMANAGER:8081", _FLINK),
        # The same gs:// to gs:// build against an emulator the test starts (at a port of its own).
        Elsewhere("--input gs://bucket/images", "tests/test_gcs_build.py::test_build_from_gcs_to_gcs_matches_local_build"),
        Skip("configs/dataflow.yaml", _DATAFLOW),
        Skip("--sdk_container_image", _DATAFLOW + "; `...` stands for a build's arguments"),
    ],
    "docs/flink.md": [
        Skip("--parallelism=16", _FLINK),
        Skip("--detached", _FLINK),
    ],
    "docs/formats.md": [],
    "docs/reader.md": [
        Run(('reader.load_info("gs://bucket/ds")',), "ds", given="model = FitRecorder()", check=_info_and_fit),
        Run(("def dataset_fn(ctx)",), "ds", check=_distributed,
            given="from imagerecords import reader\nimport tensorflow as tf\npath = 'ds'\n"
                  "strategy = tf.distribute.OneDeviceStrategy('/cpu:0')"),
        Run(('reader.as_dataset("OUT", "train")',), "OUT features, ds", given="from imagerecords import reader",
            check=_every_feature),
        Run(("tf.keras.applications.ResNet50",), "ds", check=_keras_model,
            given="from imagerecords import reader\nimport tensorflow as tf\npath = 'ds'"),
        Skip("jnp.asarray", "needs JAX, which no extra installs (reader.md's other loops run)"),
        Run(("BackupAndRestore",), "ds", check=_backup,
            given="from imagerecords import reader\nimport tensorflow as tf\npath = 'ds'\nmodel = FitRecorder()"),
        Run(("tf.train.CheckpointManager",), "ds", check=_three_steps("tensorflow", 256),
            given="from imagerecords import reader\nimport tensorflow as tf\npath = 'ds'\n"
                  "model = tiny_keras_model()\noptimizer = tf.keras.optimizers.SGD()\n"
                  "ctx = tf.distribute.InputContext()\ntrain_step = Steps()"),
        Run(("irt.RecordDataset(",), "ds", check=_torch_state, given="checkpoint = {}", fresh=True, needs=("torch",)),
        Run(("hide_gpus_from_tensorflow()",), "ds", check=_three_steps("numpy", 128),
            given="path = 'ds'\nstate = None\ntrain_step = Steps()"),
        Elsewhere("# recipe: array-record", "tests/test_array_record.py::"
                  "test_the_reader_md_recipe_reads_every_record_with_grain_alone"),
    ],
    "docs/reading.md": [
        Run(('reader.load_info("OUT")',), "OUT", check=_same_printout),
        Run(("counts the one order",), "OUT", given="from imagerecords import reader\nk = 5", check=_resume_epoch),
    ],
    "docs/recipes.md": [
        Elsewhere("# recipe: tfds", _RECIPES + "test_tfds_recipe_as_supervised"),
        Elsewhere("# recipe: jax", _RECIPES + "test_jax_recipe_numpy_batches"),
        Elsewhere("# recipe: grain", _RECIPES + "test_grain_recipe_restores_the_next_batch"),
        Elsewhere("# recipe: torch-reader", "tests/test_torch_reader.py::test_torch_reader_recipe_resumes_where_it_stopped"),
        Elsewhere("# recipe: pytorch-files", _RECIPES + "test_pytorch_recipe_with_the_tfrecord_package"),
        Elsewhere("# recipe: pytorch (", _RECIPES + "test_pytorch_dataloader_recipe"),
        Skip("# recipe: dali", "needs NVIDIA DALI and a GPU (test_recipes.py parses every record with its feature spec)"),
        Elsewhere("# recipe: features-tfrecord", _RECIPES + "test_features_recipe_with_the_tfrecord_package"),
        Skip("# recipe: features-dali", "needs NVIDIA DALI and a GPU (test_recipes.py parses every record "
                                        "with the spec dali_features builds)"),
        Elsewhere("# recipe: model-garden", _RECIPES + "test_model_garden_recipe_glob_picks_exactly_the_shards"),
    ],
    "docs/scale.md": [],
    "docs/sources.md": [],
    "docs/testing.md": [],
}

# What a fresh interpreter hands back (RESULT) for the block it ran.
FRESH_RESULT = {
    "irt.RecordDataset(": "checkpoint['data']",
}


def _markers(entry):
    return entry.markers if isinstance(entry, Run) else (entry.marker,)


def _matches(doc):
    """{marker: [examples whose text holds it]} for every marker of doc's plan."""
    found = doc_blocks.examples(doc)
    return {m: [e for e in found if m in e.code] for entry in PLAN[doc] for m in _markers(entry)}


def _entries(kind):
    return [pytest.param(doc, entry, id=f"{doc}:{_markers(entry)[0][:40]}",
                         marks=[pytest.mark.needs_extra(*entry.needs)] if getattr(entry, "needs", ()) else [])
            for doc in PLAN for entry in PLAN[doc] if isinstance(entry, kind)]


def test_every_example_is_in_the_plan():
    """Every file has a plan, every example one line of it, and every line one example."""
    assert sorted(PLAN) == doc_blocks.DOCS
    problems = []
    for doc in PLAN:
        found = doc_blocks.examples(doc)
        matches = _matches(doc)
        for marker, hits in matches.items():
            if len(hits) != 1:
                problems.append(f"{doc}: {marker!r} names {len(hits)} examples")
        for e in found:
            n = sum(m in e.code for m in matches)
            if n != 1:
                problems.append(f"{doc}:{e.line}: a {e.kind} example named by {n} lines of PLAN: {e.code[:60]!r}")
    assert not problems, "\n".join(problems)


def test_elsewhere_names_a_test_that_exists():
    for doc, entry in [(d, e) for d in PLAN for e in PLAN[d] if isinstance(e, Elsewhere)]:
        path, name = entry.test.split("::")
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            assert f"def {name}(" in f.read(), f"{doc}: {entry.test} is not a test"


def test_every_fence_names_its_language():
    """An untagged fence would hide a command from the extractor."""
    untagged = [f"{b.doc}:{b.line}" for doc in doc_blocks.DOCS for b in doc_blocks.blocks(doc) if not b.lang]
    assert not untagged, untagged


def test_the_extractor_reads_commands_as_a_shell_would(tmp_path):
    block = doc_blocks.Block("x.md", 1, "bash", "make\nimagerecords build --a \\\n    --b  # c\n$ python -m imagerecords -V\n"
                                                "pip install imagerecords\n")
    assert [(e.line, e.code) for e in doc_blocks.commands(block)] == [
        (3, "imagerecords build --a \\\n    --b  # c"), (5, "python -m imagerecords -V")]
    assert doc_blocks.commands(block._replace(lang="text")) == []


@pytest.mark.parametrize("doc, entry", _entries(Skip))
def test_skipped(doc, entry):
    pytest.skip(f"{doc}: {entry.reason}")


def _text(code, entry):
    for old, new in (*WHERE.items(), *entry.edits):
        code = code.replace(old, new)
    return code


def _env():
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def _python_here(code, entry, label):
    scope = dict(STAND_INS)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(entry.given, f"{label} (given)", "exec"), scope)
        try:
            exec(compile(code, label, "exec"), scope)
        except Stop:
            pass
    return printed.getvalue(), scope


def _python_fresh(code, entry, label, folder):
    result = FRESH_RESULT[entry.markers[0]]
    script = f"{entry.given}\nexec(compile({code!r}, {label!r}, 'exec'))\nimport json\nprint(json.dumps({result}))\n"
    proc = subprocess.run([sys.executable, "-c", script], cwd=folder, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return "\n".join(proc.stdout.splitlines()[:-1]), json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("doc, entry", _entries(Run))
def test_example_runs_as_written(doc, entry, data, tmp_path, monkeypatch):
    folder = str(tmp_path)
    matches = _matches(doc)
    with contextlib.ExitStack() as stack:
        SCENES[entry.scene](folder, data, stack)
        monkeypatch.chdir(folder)
        out, scope = [], {}
        for marker in entry.markers:
            (example,) = matches[marker]
            code, label = _text(example.code, entry), f"{doc}:{example.line}"
            if example.kind == "command":
                proc = subprocess.run(["bash", "-c", code], cwd=folder, env=_env(), capture_output=True, text=True,
                                      timeout=300)
                assert proc.returncode == 0, f"{label}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
                out.append(proc.stdout)
            elif entry.fresh:
                printed, scope = _python_fresh(code, entry, label, folder)
                out.append(printed)
            else:
                printed, scope = _python_here(code, entry, label)
                out.append(printed)
        if entry.check:
            entry.check(Result(folder, "".join(out), scope))
