"""Arrays input under bad input: ambiguous folders and .npz files, label hazards, and a dataset
without an `image` array read back by every tool exactly as its manifest says it was stored.

Fixtures are made here: arrays with NumPy (seeded), a few JPEGs with Pillow.
"""

import json
import os
import zipfile

import numpy as np
import pytest
from PIL import Image

from conftest import build, shard_files
from imagerecords.cli import main as cli


def _refused(capsys, argv):
    """(exit code, the one stderr line) of a CLI run that must fail before it writes anything."""
    code = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return code, err[0]


def _errors(out):
    return [json.loads(line) for line in open(os.path.join(out, "errors.jsonl"))]


def _labels_txt(out):
    with open(os.path.join(out, "label.labels.txt"), "rb") as f:
        return f.read()


# Ambiguous input --------------------------------------------------------------------------------


def test_a_stray_npy_beside_class_folders_is_refused_naming_what_was_found(tmp_path, capsys):
    tree = tmp_path / "tree"
    for label in ("cat", "dog"):
        (tree / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tree / label / f"{i}.jpg")
    np.save(tree / "stray.npy", np.arange(3))
    code, line = _refused(capsys, ["build", "--input", str(tree), "--output", str(tmp_path / "out")])
    assert code == 3
    assert line == (f"imagerecords build: error: --input {tree}: holds .npy arrays (stray.npy) and other entries "
                    "(cat/, dog/); an arrays input is a folder of .npy files only: move the .npy files into a folder "
                    "of their own, or out of this one to build it as class folders")
    assert not os.path.exists(tmp_path / "out")
    # Without the stray file the same tree is the class-folder dataset it always was.
    os.remove(tree / "stray.npy")
    manifest = build(tree, tmp_path / "out", "--num_shards", 1)
    assert manifest.num_examples == 6 and manifest.label_names == ("cat", "dog")


def test_a_readme_beside_npy_files_is_refused(tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    np.save(folder / "x.npy", np.arange(4, dtype=np.float32))
    (folder / "README.txt").write_text("what these arrays are\n")
    (folder / ".hidden").write_text("")  # hidden entries are not listed, as in class folders
    code, line = _refused(capsys, ["build", "--input", str(folder), "--output", str(tmp_path / "out")])
    assert code == 3
    assert line.endswith(f"--input {folder}: holds .npy arrays (x.npy) and other entries (README.txt); an arrays "
                         "input is a folder of .npy files only: move the .npy files into a folder of their own, or "
                         "out of this one to build it as class folders")


def test_the_list_rows_transform_refuses_a_mixed_folder_at_construction(tmp_path):
    from imagerecords.transforms.array_rows import ReadArrays

    (tmp_path / "cat").mkdir()
    np.save(tmp_path / "stray.npy", np.arange(3))
    with pytest.raises(ValueError) as e:
        ReadArrays(str(tmp_path), "tfds", "png")
    assert str(e.value) == (f"ReadArrays: input={str(tmp_path)!r}: holds .npy arrays (stray.npy) and other entries (cat/); "
                            "an arrays input is a folder of .npy files only: move the .npy files into a folder of "
                            "their own, or out of this one to build it as class folders")


def test_an_npz_member_that_is_not_an_array_is_refused_in_one_line(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", x=np.arange(4, dtype=np.float32))
    with zipfile.ZipFile(tmp_path / "d.npz", "a") as z:
        z.writestr("README.txt", "notes")
    code, line = _refused(capsys, ["build", "--input", str(tmp_path / "d.npz"), "--output", str(tmp_path / "out")])
    assert code == 3
    assert line == (f"imagerecords build: error: --input {tmp_path / 'd.npz'}: member 'README.txt' is not a NumPy "
                    "array (.npy); an .npz input holds arrays only: save it again without that member (np.savez)")
    assert not os.path.exists(tmp_path / "out")


def test_every_array_0d_is_refused_in_one_line(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", a=np.float32(1.5), b=np.int64(2))
    code, line = _refused(capsys, ["build", "--input", str(tmp_path / "d.npz"), "--output", str(tmp_path / "out")])
    assert code == 2
    assert line == ("imagerecords build: error: array(s) a, b: 0-d (shape []), one value for the whole input; every "
                    "array needs one row per record (np.full(n, value) for a constant)")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("arrays,says", [
    ({"image": np.zeros((4, 0, 5, 3), np.uint8), "label": np.arange(4)},
     "array 'image' of shape [4, 0, 5, 3]: each row holds no values (a 0 past the row count); drop the array, or "
     "give its rows a size"),
    ({"image": np.zeros((4, 4, 5, 3), np.uint8), "label": np.arange(4).astype(np.float32)},
     "array 'label' is float32: a class label is an integer id or a class name (cast with .astype('int64')); to "
     "store float targets, save them under another name"),
], ids=["zero-width-images", "float-labels"])
def test_arrays_no_row_can_be_stored_from_are_refused_in_one_line(tmp_path, capsys, arrays, says):
    # A (N, 0, 5, 3) image array was a TypeError from a memoryview mid-build; float labels built, and
    # make_dataset failed later on a TensorFlow dtype error.
    np.savez(tmp_path / "d.npz", **arrays)
    code, line = _refused(capsys, ["build", "--input", str(tmp_path / "d.npz"), "--output", str(tmp_path / "out")])
    assert (code, line) == (2, f"imagerecords build: error: {says}")
    assert not os.path.exists(tmp_path / "out")


# Labels -------------------------------------------------------------------------------------------


def test_a_control_character_in_a_string_label_is_a_rejected_row(tmp_path):
    names = np.array(["cat", "dog"], dtype="U16")[np.arange(200) % 2]
    names[5] = "dog\ncat"  # would shift every name after it in label.labels.txt
    np.savez(tmp_path / "d.npz", x=np.arange(200, dtype=np.float32), label=names)
    manifest = build(tmp_path / "d.npz", tmp_path / "out", "--num_shards", 1)
    assert manifest.num_rejected == 1 and manifest.num_examples == 199
    assert manifest.label_names == ("cat", "dog")
    assert _labels_txt(tmp_path / "out") == b"cat\ndog\n"
    assert _errors(tmp_path / "out") == [{
        "error": "", "key": "d.npz:000000005", "skipped": False, "split": "", "stage": "label",
        "uri": f"{tmp_path / 'd.npz'}#row=5",
        "reason": "label 'dog\\ncat' holds control character U+000A: class names go one per line into "
                  "label.labels.txt, which it would break or shift; rename the class"}]


@pytest.mark.slow
@pytest.mark.parametrize("engine", [[], ["--runner=DirectRunner"]], ids=["local", "beam"])
def test_digit_string_labels_are_names_with_ids_0_1(tmp_path, engine):
    import tensorflow as tf

    names = np.array(["7", "3"])[np.arange(20) % 2]
    np.savez(tmp_path / "d.npz", row=np.arange(20), label=names)
    manifest = build(tmp_path / "d.npz", tmp_path / "out", "--num_shards", 1, *engine)
    assert manifest.label_names == ("3", "7") and not manifest.integer_labels
    spec = {"label": tf.io.FixedLenFeature([], tf.int64), "row": tf.io.FixedLenFeature([], tf.int64)}
    got = {}
    for record in tf.data.TFRecordDataset(shard_files(tmp_path / "out")):
        ex = tf.io.parse_single_example(record, spec)
        got[int(ex["row"])] = int(ex["label"])
    assert got == {i: {"3": 0, "7": 1}[names[i]] for i in range(20)}
    # An integer array is the label as given, as before.
    np.savez(tmp_path / "i.npz", row=np.arange(20), label=np.array([7, 3])[np.arange(20) % 2])
    manifest = build(tmp_path / "i.npz", tmp_path / "int", "--num_shards", 1, *engine)
    assert manifest.integer_labels and manifest.label_names == tuple(str(i) for i in range(8))


def test_a_huge_integer_label_is_a_rejected_row_not_a_huge_vocabulary(tmp_path):
    labels = np.arange(200, dtype=np.int64) % 2
    labels[3] = 10**12
    np.savez(tmp_path / "d.npz", x=np.arange(200, dtype=np.float32), label=labels)
    manifest = build(tmp_path / "d.npz", tmp_path / "out", "--num_shards", 1)
    assert manifest.label_names == ("0", "1") and manifest.num_examples == 199
    assert _labels_txt(tmp_path / "out") == b"0\n1\n"
    assert _errors(tmp_path / "out") == [{
        "error": "", "key": "d.npz:000000003", "skipped": False, "split": "", "stage": "label",
        "uri": f"{tmp_path / 'd.npz'}#row=3",
        "reason": "label 1000000000000 is above the largest class id 999999: integer labels are ids 0, 1, ... (the "
                  "vocabulary holds one name per id); give class names as a string array instead"}]


# A dataset without an image ---------------------------------------------------------------------

N = 24


@pytest.fixture(scope="module")
def no_image(tmp_path_factory):
    """The second tutorial's shape: a feature matrix, a float list, a string and a label, no image."""
    work = tmp_path_factory.mktemp("noimage")
    r = np.random.default_rng(7)
    arrays = {"matrix": r.standard_normal((N, 5, 4)).astype(np.float32),
              "coords": r.standard_normal((N, 4)).astype(np.float32),
              "boxes": r.random((N, 3, 4)).astype(np.float32),  # a float [k, 4] matrix, not boxes on a picture
              "note": np.array([f"row {i}" for i in range(N)]),
              "label": r.integers(0, 3, N), "row": np.arange(N)}
    np.savez(work / "d.npz", **arrays)
    out = work / "out"
    manifest = build(work / "d.npz", out, "--num_shards", 2)
    return arrays, out, manifest


@pytest.mark.slow
def test_without_an_image_the_manifest_says_what_the_records_hold(no_image):
    from imagerecords import reader

    _, out, manifest = no_image
    assert manifest.features_only
    assert sorted(reader.feature_spec(str(out))) == ["boxes", "coords", "label", "matrix", "note", "row"]
    assert reader.tfrecord_description(str(out)) == {"boxes": "byte", "coords": "float", "label": "int",
                                                     "matrix": "byte", "note": "byte", "row": "int"}


def test_without_an_image_as_dataset_reads_every_array_exactly(no_image):
    from imagerecords import reader

    arrays, out, _ = no_image
    seen = []
    for ex in reader.as_dataset(str(out), "train").as_numpy_iterator():
        i = int(ex["row"])
        seen.append(i)
        assert sorted(ex) == ["boxes", "coords", "label", "matrix", "note", "row"]
        assert ex["matrix"].tobytes() == arrays["matrix"][i].tobytes()
        assert ex["boxes"].tobytes() == arrays["boxes"][i].tobytes()
        assert ex["coords"].tobytes() == arrays["coords"][i].tobytes()
        assert ex["note"] == f"row {i}".encode() and ex["label"] == arrays["label"][i]
    assert sorted(seen) == list(range(N))


def test_without_an_image_make_dataset_points_at_as_dataset(no_image):
    from imagerecords import reader

    _, out, _ = no_image
    with pytest.raises(ValueError) as e:
        reader.make_dataset(str(out), "train", batch_size=4, image_size=16)
    assert str(e.value) == (f"make_dataset: {out}'s records hold no image feature (an arrays build), not an encoded "
                            "image; read them with reader.as_dataset")


def test_without_an_image_verify_and_inspect_read_the_manifest_spec(no_image, capsys):
    _, out, _ = no_image
    assert cli.main(["verify", str(out), "--records"]) == 0
    assert capsys.readouterr().out.strip() == "ok"
    assert cli.main(["inspect", str(out), "--spec", "tf"]) == 0
    assert capsys.readouterr().out.strip() == "\n".join([
        "{",
        "    'boxes': tf.io.FixedLenFeature([], tf.string),",
        "    'coords': tf.io.FixedLenFeature([4], tf.float32),",
        "    'label': tf.io.FixedLenFeature([], tf.int64),",
        "    'matrix': tf.io.FixedLenFeature([], tf.string),",
        "    'note': tf.io.FixedLenFeature([], tf.string),",
        "    'row': tf.io.FixedLenFeature([], tf.int64),",
        "}"])
    assert cli.main(["inspect", str(out), "--spec", "tfrecord"]) == 0
    assert json.loads(capsys.readouterr().out) == {"boxes": "byte", "coords": "float", "label": "int",
                                                   "matrix": "byte", "note": "byte", "row": "int"}
    assert cli.main(["inspect", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  images: none (the records hold the features below only)" in lines
    assert [line for line in lines if line.startswith("  feature ")] == [
        "  feature boxes: float32[3,4] (bytes)", "  feature coords: float32[4] (list)",
        "  feature label: int64[] (list)", "  feature matrix: float32[5,4] (bytes)", "  feature note: string",
        "  feature row: int64[] (list)"]


def test_without_an_image_tfds_reads_it_and_has_no_supervised_keys(no_image):
    import tensorflow_datasets as tfds

    arrays, out, _ = no_image
    with open(out / "dataset_info.json") as f:
        assert "supervisedKeys" not in json.load(f)
    for ex in tfds.as_numpy(tfds.builder_from_directory(str(out)).as_dataset(split="train")):
        assert ex["matrix"].tobytes() == arrays["matrix"][ex["row"]].tobytes()


def test_without_an_image_the_report_shows_values_not_broken_thumbnails(no_image, tmp_path):
    _, out, _ = no_image
    html = tmp_path / "r.html"
    assert cli.main(["report", str(out), "--html", str(html)]) == 0
    page = html.read_text()
    assert "cannot decode" not in page and "Boxes drawn" not in page and "Drawn as boxes" not in page
    assert "<p class=src data-no-image>The records hold no image" in page
