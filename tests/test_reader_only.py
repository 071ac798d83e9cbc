"""The reader on its own: what a trainer's environment gets from `pip install imagerecords` (TensorFlow
and NumPy of the trainer's choosing, no Beam, Pillow or PyYAML).

.ci/run runs this module twice: with the rest of the suite, and in a second virtualenv holding only
`.` (no extras), pytest and the oldest TensorFlow and NumPy that setup.py claims, with
IMAGERECORDS_READER_ONLY=1 (the builder must then be absent) and IMAGERECORDS_BUILT_DATASET naming
a dataset the main environment's builder wrote (`imagerecords demo`). Nothing here imports Beam: the
small dataset of these tests is written by test code with the builder's own Beam-free modules
(imagerecords.format.schema, records, manifest), its JPEGs encoded by TensorFlow.
"""

import collections
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from imagerecords.format import records, schema
from imagerecords.format.manifest import Manifest, Shard, Split

READER_ONLY = os.environ.get("IMAGERECORDS_READER_ONLY") == "1"
BUILT = os.environ.get("IMAGERECORDS_BUILT_DATASET")

LABELS = ("cyan", "magenta", "yellow")
COLORS = {0: (0, 255, 255), 1: (255, 0, 255), 2: (255, 255, 0)}
SIZE = 8


def _jpeg(rgb, height, width):
    pixels = np.broadcast_to(np.array(rgb, np.uint8), (height, width, 3))
    return tf.io.encode_jpeg(tf.constant(pixels), quality=95).numpy()


def _write_shard(folder, filename, rows, preset):
    buf = io.BytesIO()
    writer = records.RecordWriter(buf)
    counts = collections.Counter()
    for key, label in rows:
        height, width = 12 + label, 20 - label  # a different size per class: decode must resize
        writer.write(schema.make_example(preset, image=_jpeg(COLORS[label], height, width), label=label,
                                         label_text=LABELS[label], filename=key, height=height, width=width))
        counts[label] += 1
    data = buf.getvalue()
    with open(os.path.join(folder, filename), "wb") as f:
        f.write(data)
    assert hashlib.sha256(data).hexdigest() == writer.sha256()
    return dict(filename=filename, count=writer.count, num_bytes=len(data), sha256=writer.sha256(),
                labels=tuple(sorted(counts.items())))


@pytest.fixture(scope="module", params=schema.PRESETS)
def small(request, tmp_path_factory):
    """Two splits, the train split in two shards: 7 + 3 records of 3 solid-colour classes, written
    with imagerecords.format.records framing and imagerecords.format.schema Examples, listed in a Manifest."""
    preset = request.param
    folder = tmp_path_factory.mktemp(f"small-{preset}")
    layout = {
        "train": [[(f"train/{i:02d}.png", i % 3) for i in range(0, 7)], [(f"train/{i:02d}.png", i % 3) for i in range(7, 10)]],
        "validation": [[(f"validation/{i:02d}.png", (i + 1) % 3) for i in range(3)]],
    }
    splits = []
    for split, shards in layout.items():
        written = []
        for index, rows in enumerate(shards):
            name = f"small-{split}.tfrecord-{index:05d}-of-{len(shards):05d}"
            written.append(Shard(index=index, **_write_shard(str(folder), name, rows, preset)))
        splits.append(Split(split, tuple(written)))
    manifest = Manifest(name="small", schema=preset, label_names=LABELS, label_offset=0, integer_labels=False,
                        seed=0, parameters={}, splits=tuple(sorted(splits, key=lambda s: s.name)), num_rejected=0)
    (folder / "manifest.json").write_bytes(manifest.dumps())
    return str(folder), layout


def test_make_dataset_reads_every_record_with_its_label_and_pixels(small):
    from imagerecords import reader
    from imagerecords.reader import ReadConfig

    path, layout = small
    for split, shards in layout.items():
        ds = reader.make_dataset(path, split, batch_size=4, image_size=SIZE,
                                 config=ReadConfig(dtype="uint8", with_filename=True))
        seen = {}
        for images, labels, filenames in ds:
            assert images.dtype == tf.uint8 and images.shape[1:] == (SIZE, SIZE, 3)
            for image, label, filename in zip(images.numpy(), labels.numpy(), filenames.numpy()):
                seen[filename.decode()] = int(label)
                # A solid colour survives JPEG, crop and resize to within a few levels.
                assert np.abs(image.astype(int) - COLORS[int(label)]).max() <= 8, (filename, image[0, 0])
        assert seen == {key: label for rows in shards for key, label in rows}


def test_training_pipeline_is_seeded_and_numpy_batches_work(small):
    from imagerecords import reader
    from imagerecords.reader import ReadConfig

    path, _ = small
    config = ReadConfig(dtype="float32", repeat=2)

    def labels(seed):
        ds = reader.make_dataset(path, "train", batch_size=3, image_size=SIZE, training=True, seed=seed, config=config)
        return [b[1].tolist() for b in reader.as_numpy(ds)]

    first = labels(7)
    assert first == labels(7)
    # Training drops the last short batch: 2 epochs x 10 records -> 6 full batches of 3.
    assert len(first) == 6 and collections.Counter(sum(first, [])) - collections.Counter({0: 8, 1: 6, 2: 6}) == {}
    batches = list(reader.numpy_batches(path, "validation", batch_size=2, image_size=SIZE))
    assert [type(x) for x in batches[0]] == [np.ndarray, np.ndarray]
    assert batches[0][0].dtype == np.float32 and 0.0 <= batches[0][0].min() and batches[0][0].max() <= 1.0
    assert sorted(sum((b[1].tolist() for b in batches), [])) == [0, 1, 2]


@pytest.mark.slow
def test_reader_import_loads_only_the_format_and_the_reader(tmp_path):
    """The install boundary: `import imagerecords.reader` loads imagerecords.format and
    imagerecords.reader only (nothing of imagerecords.pipeline or imagerecords.cli), and no Beam or YAML."""
    code = textwrap.dedent("""
        import sys
        import imagerecords.reader
        imagerecords.reader.make_dataset  # the readers load lazily: ask for one
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("imagerecords", "apache_beam", "yaml")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = eval(out.stdout.strip().splitlines()[-1])
    allowed = {"imagerecords", "imagerecords.format", "imagerecords.reader"}
    strays = [m for m in loaded if m not in allowed and not m.startswith(("imagerecords.format.", "imagerecords.reader."))]
    assert not strays, f"importing the reader loaded {strays}"
    assert "imagerecords.format.manifest" in loaded and "imagerecords.reader.dataset" in loaded


@pytest.mark.parametrize("command", ["build", "demo", "verify", "finish"])
def test_builder_command_without_builder_extra_says_so_in_one_line(command, tmp_path):
    # In the reader-only environment Beam is really absent; elsewhere it is hidden from this process.
    hide = "" if READER_ONLY else "import sys; sys.modules['apache_beam'] = None; "
    code = hide + "import sys; from imagerecords.cli.main import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-c", code, command, str(tmp_path / "x")], capture_output=True,
                         text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 1, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"imagerecords {command} needs the builder extra (apache-beam"), lines
    assert "pip install -e '.[build]'" in lines[0]
    assert not (tmp_path / "x").exists()


def test_environment_is_what_the_stage_claims():
    """In the reader-only stage the builder's dependencies must really be missing, and the dataset
    the main environment built must be handed over, or the stage would prove nothing."""
    if not READER_ONLY:
        pytest.skip("IMAGERECORDS_READER_ONLY is not set (this is the reader-only stage's check)")
    assert [m for m in ("apache_beam", "PIL", "yaml") if importlib.util.find_spec(m) is not None] == []
    assert BUILT and os.path.exists(os.path.join(BUILT, "manifest.json")), BUILT
    import imagerecords

    assert "site-packages" in imagerecords.__file__, imagerecords.__file__  # pip's install, not the checkout
    print(f"reader-only: TensorFlow {tf.__version__}, NumPy {np.__version__}, Python {sys.version.split()[0]}")


def test_reads_the_dataset_the_builder_wrote():
    """Reads every split of a dataset the builder wrote (in CI: `imagerecords demo` in the main
    environment) and checks it against its manifest: counts, label histogram, image shapes."""
    if not BUILT:
        pytest.skip("IMAGERECORDS_BUILT_DATASET is not set (.ci/run sets it for the reader-only stage)")
    from imagerecords import reader
    from imagerecords.reader import ReadConfig

    info = reader.load_info(BUILT)
    assert info.splits and info.label_names
    for name, split in sorted(info.splits.items()):
        expected = collections.Counter()
        for shard in split.shards:
            expected.update(shard.labels)
        got = collections.Counter()
        for images, labels in reader.make_dataset(BUILT, name, batch_size=8, image_size=16,
                                                  config=ReadConfig(dtype="uint8")):
            assert images.shape[1:] == (16, 16, 3)
            assert int(tf.reduce_max(images)) > int(tf.reduce_min(images))  # decoded pixels, not padding
            got.update(labels.numpy().tolist())
        assert got == expected, name
        assert sum(got.values()) == split.num_examples > 0
