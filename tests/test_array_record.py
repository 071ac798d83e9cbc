"""--record_format array_record end to end: real builds of one image tree in both formats, read back
by Grain's own ArrayRecordDataSource (nothing of ours on the reading side), our Grain source, TFDS,
verify, inspect and the report; --append, --resume and a swapped or truncated shard behave as they
do on TFRecord; tf.data refuses in one line naming the readers that do read ArrayRecord."""

import glob
import json
import os
import re
import shutil
import signal

import pytest

from conftest import build, read_examples
from imagerecords.format.manifest import STAGING
from imagerecords.format.records import CorruptRecordError

grain = pytest.importorskip("grain")

ARGS = ("--splits", "train=0.75,validation=0.25", "--num_shards", 2, "--max_reject_fraction", 0.05)
AR = ("--record_format", "array_record")


@pytest.fixture(scope="module")
def builds(image_tree, tmp_path_factory):
    """The image tree (4 classes x 10, one truncated JPEG) built as TFRecord and as ArrayRecord."""
    root, _ = image_tree
    base = tmp_path_factory.mktemp("ar")
    build(root, base / "tf", *ARGS)
    build(root, base / "ar", *ARGS, *AR)
    return base / "tf", base / "ar"


def _manifest(folder):
    with open(os.path.join(folder, "manifest.json")) as f:
        return json.load(f)


def _files(folder, split="train"):
    return [os.path.join(folder, s["filename"]) for s in _manifest(folder)["splits"][split]["shards"]]


def _grain_records(folder):
    """{key: serialized Example} of every record, read by grain.sources.ArrayRecordDataSource over
    the manifest's files per split (the docs/reader.md recipe: nothing of ours reads them)."""
    from imagerecords.format import schema

    manifest, out = _manifest(folder), {}
    for split, entry in manifest["splits"].items():
        source = grain.sources.ArrayRecordDataSource(_files(folder, split))
        assert len(source) == sum(s["count"] for s in entry["shards"])
        for i in range(len(source)):
            out[schema.parse_example(source[i])["image/filename"][0].decode()] = source[i]
    return out


def _tfrecord_records(folder):
    from imagerecords.format import record_format, schema

    out = {}
    for split in _manifest(folder)["splits"]:
        for path in _files(folder, split):
            with open(path, "rb") as f:
                for record in record_format.read(f, path):
                    out[schema.parse_example(record)["image/filename"][0].decode()] = record
    return out


def test_grain_reads_every_record_byte_for_byte_as_the_tfrecord_build_holds_it(builds):
    tf_out, ar_out = builds
    assert _manifest(ar_out)["record_format"] == "array_record" and "record_format" not in _manifest(tf_out)
    got, want = _grain_records(ar_out), _tfrecord_records(tf_out)
    assert len(got) == 40 and got == want


@pytest.mark.slow
def test_grain_records_parse_as_the_tfrecord_builds_tf_train_examples(builds):
    import tensorflow as tf

    tf_out, ar_out = builds
    want = read_examples(tf_out)  # {key: tf.train.Example} through tf.data
    got = {k: tf.train.Example.FromString(v) for k, v in _grain_records(ar_out).items()}
    assert sorted(got) == sorted(want) and len(got) == 40
    for key, example in want.items():
        f, g = example.features.feature, got[key].features.feature
        assert g["label"].int64_list.value == f["label"].int64_list.value, key
        assert g["image"].bytes_list.value == f["image"].bytes_list.value, key
        assert got[key] == example, key


def test_our_grain_source_reads_both_formats_alike_and_resumes_exactly(builds):
    from imagerecords.grain import RecordSource

    tf_out, ar_out = builds
    plain = RecordSource(str(ar_out), "train")  # no index files: the ArrayRecord footer is the index
    with pytest.raises(Exception, match="--write_index"):
        RecordSource(str(tf_out), "train")
    ar = [plain[i] for i in range(len(plain))]
    names = sorted(r["image/filename"] for r in ar)
    tf_source = RecordSource(str(tf_out), "train", index="scan")
    assert names == sorted(tf_source[i]["image/filename"] for i in range(len(tf_source)))
    for i in (0, len(plain) - 1):
        assert (ar[i]["image"] == tf_source[i]["image"]).all() and ar[i]["label"] == tf_source[i]["label"]
    ds = grain.MapDataset.source(plain).shuffle(seed=3).map(lambda r: r["image/filename"])
    whole = list(ds)
    it = iter(ds)
    first = [next(it) for _ in range(5)]
    state = plain.get_state(it)
    again = iter(ds)
    plain.set_state(again, state)
    assert first + list(again) == whole and sorted(whole) == names


def test_tfds_reads_the_array_record_build_by_its_dataset_info(builds):
    tfds = pytest.importorskip("tensorflow_datasets")
    _, ar_out = builds
    info = json.load(open(ar_out / "dataset_info.json"))
    assert info["fileFormat"] == "array_record"
    source = tfds.builder_from_directory(str(ar_out)).as_data_source(split="train")
    from imagerecords.grain import RecordSource

    ours = RecordSource(str(ar_out), "train")
    assert len(source) == len(ours)
    assert [source[i]["label"] for i in range(len(source))] == [ours[i]["label"] for i in range(len(ours))]


def test_tf_data_refuses_in_one_line_naming_the_readers_that_read_it(builds):
    from imagerecords import reader
    from imagerecords.format.errors import ReadError

    _, ar_out = builds
    for call in (lambda: reader.make_dataset(str(ar_out), "train", batch_size=2, image_size=8),
                 lambda: reader.as_dataset(str(ar_out), "train")):
        with pytest.raises(ReadError) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message and "array_record files, which tf.data does not read" in message
        assert "imagerecords.grain.RecordSource" in message and "grain.sources.ArrayRecordDataSource" in message


def test_verify_inspect_and_the_report_read_array_record(builds, tmp_path, monkeypatch, capsys):
    from imagerecords.cli import inspection
    from imagerecords.cli import main as cli

    _, ar_out = builds
    assert inspection.verify(str(ar_out), records=True) == ([], [])
    lines, problems = inspection.inspect(str(ar_out))
    assert "  record format: array_record" in lines and problems == []
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(ar_out), "--per_class", "2", "--html", "page.html"]) == 0
    page = (tmp_path / "page.html").read_text()
    assert page.count("<img") >= 8 and "records read" in page and "run `imagerecords verify --records`" not in page


@pytest.mark.parametrize("damage", ["swapped", "truncated"])
def test_a_swapped_or_truncated_shard_is_refused_by_every_reader(builds, tmp_path, damage):
    from imagerecords.cli import inspection
    from imagerecords.grain import RecordSource

    _, ar_out = builds
    copy = tmp_path / "ds"
    shutil.copytree(ar_out, copy)
    first, second = _files(copy)
    if damage == "swapped":  # the split's other shard: the same 64 KiB-block size, other records
        assert os.path.getsize(first) == os.path.getsize(second)
        shutil.copyfile(second, first)
        message = f"shard {first} is not the file manifest.json lists"
    else:
        with open(first, "r+b") as f:
            f.truncate(os.path.getsize(first) // 2)
        message = f"shard {first} is {os.path.getsize(first)} bytes, manifest.json lists"
    with pytest.raises(CorruptRecordError, match=re.escape(message)):
        RecordSource(str(copy), "train")
    try:
        import imagerecords.torch as irt
    except ImportError:
        irt = None
    if irt is not None:
        with pytest.raises(CorruptRecordError, match=re.escape(message)):
            irt.RecordDataset(str(copy), "train")
    problems, _ = inspection.verify(str(copy))
    assert problems and all(str(first) in p for p in problems), problems


@pytest.mark.slow
def test_append_adds_a_whole_array_record_version_and_refuses_another_format(tmp_path, capsys):
    from imagerecords.cli import main as cli
    from imagerecords.grain import RecordSource
    from imagerecords.pipeline import example_images

    fewer, more = tmp_path / "fewer", tmp_path / "more"
    example_images.write_tree(str(fewer), per_class=5)
    example_images.write_tree(str(more), per_class=8)  # the same 5 per class and 3 more
    out = tmp_path / "out"
    first = build(fewer, out, *ARGS, *AR)
    appended = build(more, out, "--append")  # the format, as every setting, comes from the dataset
    assert appended.record_format == "array_record"
    names = [os.path.basename(s.filename) for s in appended.split("train").shards]
    assert all(".array_record-" in n for n in names) and len(names) > len(first.split("train").shards)
    assert all(s.filename.startswith(appended.version + "/") for s in appended.split("train").shards)
    source = RecordSource(str(out), "train")
    assert len(source) == appended.split("train").num_examples > first.split("train").num_examples
    assert len({source[i]["image/filename"] for i in range(len(source))}) == len(source)
    code = cli.main(["build", "--input", str(more), "--output", str(out), "--append", "--record_format", "tfrecord",
                     "--no_progress"])
    err = capsys.readouterr().err
    assert code != 0 and 'record_format "tfrecord" differs from the dataset\'s "array_record"' in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
def test_resume_reuses_the_staged_array_record_shards_and_writes_the_same_bytes(tmp_path):
    """A build killed after staging two of four shards, resumed: the result is a fresh build's bytes."""
    from test_bad_inputs_resume import _start, _wait_for
    from imagerecords.pipeline import example_images

    tree = tmp_path / "tree"
    example_images.write_tree(str(tree), per_class=4)
    args = ("--input", tree, "--num_shards", 4, "--no_progress", "--local_workers", 0, *AR)
    out = tmp_path / "out"
    proc = _start("build", "--output", out, *args, IMAGERECORDS_TEST_PAUSE="mid_shards",
                  IMAGERECORDS_TEST_PAUSE_DIR=tmp_path)
    staged = lambda: glob.glob(str(out / STAGING / "*" / "*.array_record-*.staged.json"))  # noqa: E731
    _wait_for(lambda: len(staged()) >= 2, proc, "two shards being staged")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    import subprocess
    import sys

    resumed = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--output", str(out),
                              *map(str, args), "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(r"resumed: [2-4] of 4 shards reused", resumed.stderr), resumed.stderr
    fresh = tmp_path / "fresh"
    build(tree, fresh, *args[2:])
    a, b = _files(out), _files(fresh)
    assert [os.path.basename(x) for x in a] == [os.path.basename(y) for y in b] and len(a) == 4
    for x, y in zip(a, b):
        assert open(x, "rb").read() == open(y, "rb").read(), x


def test_write_index_is_refused_with_array_record_in_one_line(image_tree, tmp_path, capsys):
    from imagerecords.cli import main as cli

    root, _ = image_tree
    code = cli.main(["build", "--input", str(root), "--output", str(tmp_path / "o"), "--write_index", *AR])
    err = capsys.readouterr().err
    assert code != 0 and "--write_index writes index files, and array_record files carry their own index" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o" / "manifest.json").exists()


@pytest.mark.slow
def test_write_dataset_writes_array_record_that_the_grain_source_reads(tmp_path):
    import io

    import apache_beam as beam
    import numpy as np
    from PIL import Image

    from imagerecords.grain import RecordSource
    from imagerecords.transforms import WriteDataset

    rows = []
    for i in range(12):
        buf = io.BytesIO()
        Image.fromarray(np.full((8 + i, 10, 3), 20 * i, np.uint8)).save(buf, "JPEG", quality=90)
        rows.append({"key": f"img{i:02d}", "image": buf.getvalue(), "label": ["cat", "dog"][i % 2]})
    out = tmp_path / "ds"
    with beam.Pipeline() as p:
        _ = p | beam.Create(rows, reshuffle=False) | WriteDataset(str(out), name="pets", num_shards=2,
                                                                   record_format="array_record")
    manifest = _manifest(out)
    assert manifest["record_format"] == "array_record"
    assert all(".array_record-" in s["filename"] for s in manifest["splits"]["train"]["shards"])
    source = RecordSource(str(out), "train")
    assert sorted(source[i]["image/filename"] for i in range(len(source))) == [r["key"] for r in rows]


@pytest.mark.slow
def test_the_reader_md_recipe_reads_every_record_with_grain_alone(builds):
    from support.doc_blocks import python_blocks

    (recipe,) = [b for b in python_blocks("docs/reader.md") if b.startswith("# recipe: array-record")]
    tf_out, ar_out = builds
    scope = {"OUT": str(ar_out)}
    exec(compile(recipe, "docs/reader.md[array-record]", "exec"), scope)
    dataset, want = scope["dataset"], _tfrecord_records(tf_out)
    assert len(dataset) == len(scope["source"]) == 34  # the train split
    from imagerecords.format import schema

    by_image = {schema.parse_example(r)["image"][0]: schema.parse_example(r)["label"][0] for r in want.values()}
    got = [dataset[i] for i in range(len(dataset))]
    assert len({g["image"] for g in got}) == 34 and all(by_image[g["image"]] == g["label"] for g in got)


@pytest.mark.slow
def test_duplicates_and_retention_work_on_array_record_as_on_tfrecord(image_tree, tmp_path):
    from conftest import tree_with_twins

    tree, _ = tree_with_twins(image_tree, tmp_path)
    out = tmp_path / "out"
    outs = {}
    for fmt in ("tfrecord", "array_record"):
        outs[fmt] = build(tree, tmp_path / fmt, *ARGS, "--record_format", fmt)
    duplicates = {fmt: (tmp_path / fmt / "duplicates.jsonl").read_text() for fmt in outs}
    assert duplicates["array_record"] == duplicates["tfrecord"] and len(duplicates["tfrecord"].splitlines()) == 2
    assert outs["array_record"].num_duplicate_groups == 2 and outs["array_record"].num_label_conflicts == 1
    first = build(tree, out, *ARGS, *AR)
    second = build(tree, out, *ARGS, *AR, "--overwrite", "--keep_versions", 1)
    assert first.version != second.version and sorted(os.listdir(out)).count(second.version) == 1
    assert not (out / first.version).exists()  # retention removed the earlier version's folder


@pytest.mark.gcs
def test_a_gs_output_gets_the_local_builds_array_record_bytes(fake_gcs_server, builds, image_tree, tmp_path):
    """ArrayRecord's writer writes local paths: a gs:// shard is written locally, then copied up."""
    import uuid

    from tests.support.gcs import GcsEmulator

    root, _ = image_tree
    _, ar_out = builds
    with GcsEmulator(binary=fake_gcs_server) as emulator:
        bucket = f"ar-{uuid.uuid4().hex[:8]}"
        emulator.create_bucket(bucket)
        with emulator.activated():
            manifest = build(root, f"gs://{bucket}/ds", *ARGS, *AR)
        assert manifest.record_format == "array_record"
        local = _manifest(ar_out)
        for split in ("train", "validation"):
            for shard, mine in zip(manifest.split(split).shards, local["splits"][split]["shards"]):
                data = emulator.download(f"gs://{bucket}/ds/{shard.filename}")
                assert data == open(os.path.join(ar_out, mine["filename"]), "rb").read(), shard.filename
        from imagerecords.format.errors import ReadError
        from imagerecords.grain import RecordSource

        with emulator.activated(), pytest.raises(ReadError, match="ArrayRecord shards are read from local files"):
            RecordSource(f"gs://{bucket}/ds", "train")


def test_the_open_readers_are_bounded_and_reopened_on_demand(builds, monkeypatch):
    from imagerecords.format import array_record_format
    from imagerecords.grain import RecordSource

    _, ar_out = builds
    want = [r["image/filename"] for r in map(RecordSource(str(ar_out), "train").__getitem__, range(34))]
    monkeypatch.setattr(array_record_format, "_OPEN_READERS", 1)
    monkeypatch.setattr(array_record_format.ARRAY_RECORD, "_readers", array_record_format._Readers())  # none open
    source = RecordSource(str(ar_out), "train")
    order = [i for pair in zip(range(17), range(17, 34)) for i in pair]  # alternating between the two shards
    assert [source[i]["image/filename"] for i in order] == [want[i] for i in order]
    assert len(array_record_format.ARRAY_RECORD._readers.open) == 1
