"""End to end: real builds on DirectRunner into tmp folders, read back with TensorFlow."""

import filecmp
import glob
import io
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import build, identical_rows, manifest_without_time, read_examples, shard_files
from imagerecords.pipeline.errors import BudgetExceeded, OutputError
from imagerecords.cli import main as cli

SPLITS = "train=0.7,validation=0.3"


@pytest.fixture(scope="module")
def built(image_tree, tmp_path_factory):
    root, files = image_tree
    out = tmp_path_factory.mktemp("built") / "ds"
    manifest = build(root, out, "--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction", 0.05)
    return root, files, out, manifest


def _source_pixels(path):
    img = Image.open(path)
    rotated = img.getexif().get(0x0112, 1) == 6
    rgba = img.convert("RGBA")
    bg = Image.new("RGB", rgba.size, (255, 255, 255))
    bg.paste(rgba, mask=rgba.getchannel("A"))
    if rotated:
        bg = bg.transpose(Image.Transpose.ROTATE_270)
    return np.asarray(bg).astype(int)


def test_every_input_appears_once_with_its_label(built):
    root, files, out, manifest = built
    examples = read_examples(out)
    want = {f"{cls}/{rel}": cls for cls, rels in files.items() for rel in rels}
    assert sorted(examples) == sorted(want)
    names = list(manifest.label_names)
    assert names == ["circle", "square", "stripes", "triangle"]
    for key, ex in examples.items():
        assert names[ex.features.feature["label"].int64_list.value[0]] == want[key]
    assert manifest.num_examples == len(want) and manifest.num_rejected == 1
    rows = [json.loads(line) for line in open(out / "errors.jsonl")]
    assert [r["key"] for r in rows] == ["circle/truncated.jpg"] and "truncated" in rows[0]["reason"].lower()


def test_pixels_within_jpeg_tolerance_and_passthrough_is_exact(built):
    root, files, out, _ = built
    passthrough = 0
    for key, ex in read_examples(out).items():
        f = ex.features.feature
        data = f["image"].bytes_list.value[0]
        source = root / key
        got = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
        want = _source_pixels(source)
        assert got.shape == want.shape, key
        assert (f["image/height"].int64_list.value[0], f["image/width"].int64_list.value[0]) == got.shape[:2]
        assert np.abs(got - want).mean() < 6, key
        if data == source.read_bytes():
            passthrough += 1
    # Plain baseline RGB JPEGs (kinds 0 and 7 of example_images) pass through unchanged.
    plain = sum(1 for rels in files.values() for r in rels if r.endswith(".jpg") and "_" in r and r.count("_") == 1)
    assert passthrough == plain > 0


def test_shards_are_balanced_and_named(built):
    _, _, out, manifest = built
    names = [os.path.basename(p) for p in shard_files(out)]
    assert names == [f"images-{s}.tfrecord-{i:05d}-of-00003" for s in ("train", "validation") for i in range(3)]
    for split in manifest.splits:
        counts = [s.count for s in split.shards]
        assert max(counts) - min(counts) <= 1 + 1  # +1: the rejected image was planned in a shard
    assert cli.verify(str(out)) == []


@pytest.mark.slow
def test_same_seed_same_bytes_and_worker_count_does_not_matter(built, tmp_path):
    root, _, out, _ = built
    again = tmp_path / "again"
    build(root, again, "--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction", 0.05, workers=2)
    for a, b in zip(shard_files(out), shard_files(again)):
        assert filecmp.cmp(a, b, shallow=False), a
    assert len(shard_files(again)) == 6
    assert manifest_without_time(out) == manifest_without_time(again)


@pytest.mark.slow
def test_another_seed_gives_another_order(built, tmp_path):
    root, _, out, _ = built
    other = tmp_path / "other"
    build(root, other, "--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction", 0.05, "--seed", 1)
    assert sorted(read_examples(other)) == sorted(read_examples(out))
    first = open(shard_files(out)[0], "rb").read()
    assert first != open(shard_files(other)[0], "rb").read()


@pytest.mark.slow
def test_beam_writer_yields_the_same_records(built, tmp_path):
    root, _, out, _ = built
    beam_out = tmp_path / "beam"
    manifest = build(root, beam_out, "--splits", SPLITS, "--num_shards", 2, "--max_reject_fraction", 0.05, "--writer", "beam")
    ours = {k: v.SerializeToString(deterministic=True) for k, v in read_examples(out).items()}
    theirs = {k: v.SerializeToString(deterministic=True) for k, v in read_examples(beam_out).items()}
    assert ours == theirs
    assert manifest.num_rejected == 1 and cli.verify(str(beam_out)) == []


def test_tfds_builder_from_directory_reads_the_output(built):
    import tensorflow_datasets as tfds

    _, files, out, manifest = built
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features["label"].names == ["circle", "square", "stripes", "triangle"]
    for split in ("train", "validation"):
        assert builder.info.splits[split].num_examples == manifest.split(split).num_examples
    seen = 0
    for ex in builder.as_dataset(split="train"):
        assert ex["image"].shape[-1] == 3 and ex["image"].dtype.name == "uint8"
        seen += 1
    assert seen == manifest.split("train").num_examples


def test_manifest_and_folder_builds_agree(built, tmp_path):
    root, files, out, _ = built
    jsonl = tmp_path / "list.jsonl"
    with open(jsonl, "w") as f:
        for cls, rels in sorted(files.items()):
            for rel in rels:
                # Relative paths resolve against the manifest's folder; keys match the folder build's.
                f.write(json.dumps({"path": os.path.relpath(root / cls / rel, tmp_path), "label": cls,
                                    "key": f"{cls}/{rel}"}) + "\n")
        f.write(json.dumps({"path": os.path.relpath(root / "circle/truncated.jpg", tmp_path), "label": "circle",
                            "key": "circle/truncated.jpg"}) + "\n")
    from_manifest = tmp_path / "from_manifest"
    build(jsonl, from_manifest, "--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction", 0.05)
    for a, b in zip(shard_files(out), shard_files(from_manifest)):
        assert filecmp.cmp(a, b, shallow=False), a
    assert manifest_without_time(out)["splits"] == manifest_without_time(from_manifest)["splits"]


def test_refuses_to_overwrite_and_fails_over_reject_budget(built, tmp_path):
    root, _, out, _ = built
    with pytest.raises(OutputError, match="--overwrite"):
        build(root, out, "--splits", SPLITS)
    strict = tmp_path / "strict"
    with pytest.raises(BudgetExceeded, match="over the budget"):
        build(root, strict, "--max_reject_fraction", 0)
    assert not (strict / "manifest.json").exists()
    [errors_file] = glob.glob(str(strict / ".imagerecords-staging" / "*" / "errors.jsonl"))  # the build's own area
    assert json.loads(open(errors_file).read().splitlines()[0])["key"] == "circle/truncated.jpg"


def test_tf_models_schema_with_offset_and_resize(built, tmp_path):
    root, files, _, _ = built
    out = tmp_path / "tfm"
    manifest = build(root, out, "--schema", "tf-models", "--label_offset", 1, "--max_side", 24, "--num_shards", 2,
                     "--max_reject_fraction", 0.05)
    assert manifest.label_offset == 1 and not (out / "dataset_info.json").exists()
    for key, ex in read_examples(out).items():
        f = ex.features.feature
        label = f["image/class/label"].int64_list.value[0]
        assert manifest.label_names[label - 1] == key.split("/")[0] == f["image/class/text"].bytes_list.value[0].decode()
        assert max(f["image/height"].int64_list.value[0], f["image/width"].int64_list.value[0]) == 24
        assert f["image/format"].bytes_list.value[0] == b"JPEG"



@pytest.mark.slow
def test_cli_exit_status_and_messages(built, tmp_path, capsys):
    root, _, out, _ = built
    common = ["--no_progress", "--direct_num_workers=1"]
    assert cli.main(["build", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o"), *common]) == 3
    assert "no such file" in capsys.readouterr().err
    assert cli.main(["build", "--input", str(root), "--output", str(tmp_path / "o2"), "--max_reject_fraction", "0", *common]) == 6
    err = capsys.readouterr().err
    assert "imagerecords build: error: 1 of 41 inputs rejected" in err and "not published" in err
    assert cli.main(["verify", str(out)]) == 0
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    victim = shard_files(damaged)[1]
    data = bytearray(open(victim, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(victim, "wb").write(bytes(data))
    assert cli.verify(str(damaged)) == [f"{victim}: sha256 differs from the manifest"]


@pytest.mark.slow
def test_rerun_of_a_killed_build_gives_the_same_bytes(built, tmp_path):
    root, _, out, _ = built
    killed = tmp_path / "killed"
    build(root, killed, "--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction", 0.05)
    # What a kill leaves: no manifest (never published), a truncated shard in a version folder no
    # manifest names, and (from a build of the flat layout) a half-written temporary file and a
    # stray shard name from an earlier build with more shards.
    first = shard_files(killed)[0]
    (killed / "manifest.json").unlink()
    with open(first, "r+b") as f:
        f.truncate(100)
    (killed / ".images-train.tfrecord-00001-of-00003.0123.tmp").write_bytes(b"partial")
    (killed / "images-train.tfrecord-00007-of-00009").write_bytes(b"old")
    (killed / "notes.txt").write_text("not ours")
    build(root, killed, "--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction", 0.05, "--overwrite")
    assert [os.path.basename(p) for p in shard_files(killed)] == [os.path.basename(p) for p in shard_files(out)]
    for a, b in zip(shard_files(killed), shard_files(out)):
        assert filecmp.cmp(a, b, shallow=False), a
    assert manifest_without_time(killed) == manifest_without_time(out)
    assert (killed / "notes.txt").read_text() == "not ours"
    assert not (killed / ".images-train.tfrecord-00001-of-00003.0123.tmp").exists()
    assert not (killed / "images-train.tfrecord-00007-of-00009").exists()


@pytest.mark.slow
def test_identical_files_under_two_keys_are_reported_and_leaks_flagged(image_tree, tmp_path):
    root, files = image_tree
    tree = tmp_path / "tree"
    shutil.copytree(root, tree)
    shutil.copy(tree / "circle" / files["circle"][0], tree / "square" / "copy_of_a_circle.jpg")
    out = tmp_path / "ds"
    manifest = build(tree, out, "--num_shards", 2, "--max_reject_fraction", 0.05, "--splits", SPLITS)
    rows = identical_rows(out)
    assert [[m["key"] for m in r["members"]] for r in rows] == [[f"circle/{files['circle'][0]}", "square/copy_of_a_circle.jpg"]]
    splits = sorted(m["split"] for m in rows[0]["members"])
    assert rows[0]["leak"] == (len(set(splits)) > 1) and rows[0]["splits"] == sorted(set(splits))
    assert manifest.num_duplicate_groups == 1 and manifest.num_leaking_groups == int(rows[0]["leak"])
    assert rows[0]["conflict"] and rows[0]["labels"] == ["circle", "square"] and manifest.num_label_conflicts == 1
    unchecked = tmp_path / "unchecked"
    manifest = build(tree, unchecked, "--num_shards", 2, "--max_reject_fraction", 0.05, "--skip_duplicate_check",
                     "--near_duplicates", "off")
    assert manifest.num_duplicate_groups == -1 and not (unchecked / "duplicates.jsonl").exists()
    assert manifest.num_label_conflicts == 0


@pytest.mark.slow
def test_directrunner_default_mode_survives_a_100k_row_manifest(image_tree, tmp_path):
    """DirectRunner's multi_threading mode corrupted bundles this large ("Error decoding input
    stream with coder ...", Beam issue 22321); the mode the launcher picks must build it whole."""
    root, files = image_tree
    rows = [(root / cls / rel, cls) for cls, rels in sorted(files.items()) for rel in rels]
    manifest_path = tmp_path / "rows.csv"
    with open(manifest_path, "w") as f:
        f.write("path,label,key\n")
        for i in range(100_000):
            path, cls = rows[i % len(rows)]
            f.write(f"{path},{cls},row{i:06d}\n")
    extra = os.environ.get("IMAGERECORDS_TEST_DIRECT_MODE")  # to see this test fail: multi_threading
    manifest = build(manifest_path, tmp_path / "ds", "--runner=DirectRunner", "--num_shards", 4, "--max_side", 16,
                     *([f"--direct_running_mode={extra}"] if extra else []))
    assert manifest.num_examples == 100_000 and manifest.num_rejected == 0
    assert manifest.num_duplicate_groups == len(rows)
