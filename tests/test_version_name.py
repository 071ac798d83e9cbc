"""--version_name: a published folder a config can hold, checked names, taken names refused, retention."""

import glob
import json
import os

import pytest

from imagerecords.cli import main as cli
from imagerecords.format.manifest import MANIFEST, STAGING
from imagerecords.pipeline import errors
from imagerecords.pipeline.config import version_name_problem
from imagerecords.pipeline.publish import commit as publish

from test_publish import _results, _stage


def _tree(folder, per_class=6):
    """Two classes of small PNGs, made here: a build of them takes well under a second."""
    from PIL import Image

    for c, colour in (("cat", 0), ("dog", 1)):
        os.makedirs(folder / c, exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (40 * i, 90 * colour, 7)).save(folder / c / f"{i}.png")
    return folder


def _build(root, out, *extra):
    return cli.main(["build", "--input", str(root), "--output", str(out), "--no_progress", "--num_shards", "2",
                     *map(str, extra)])


def _count(pattern):
    import tensorflow as tf

    files = tf.io.gfile.glob(pattern)
    return len(files), sum(1 for _ in tf.data.TFRecordDataset(files))


@pytest.mark.slow
def test_named_version_is_read_by_a_model_garden_glob(tmp_path, capsys):
    root, out = _tree(tmp_path / "in"), tmp_path / "out"
    assert _build(root, out, "--version_name", "2024-06", "--splits", "train=0.5,validation=0.5") == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["version"] == "2024-06"
    assert all(s["filename"].startswith("2024-06/") for sp in manifest["splits"].values() for s in sp["shards"])
    # The config a Model Garden trainer holds (README, "Publishing a dataset"): one split of one version.
    for split in ("train", "validation"):
        files, records = _count(str(out / "2024-06" / f"images-{split}*"))
        assert files == 2 and records == manifest["splits"][split]["num_examples"] > 0
    assert sum(manifest["splits"][s]["num_examples"] for s in manifest["splits"]) == 12


def test_library_build_takes_version_name(tmp_path):
    import imagerecords

    root = _tree(tmp_path / "in")
    manifest = imagerecords.build(str(root), str(tmp_path / "out"), num_shards=2, version_name="first")
    assert manifest.version == "first" and (tmp_path / "out" / "first").is_dir()


def test_a_taken_name_is_refused_before_the_engine_and_nothing_changes(tmp_path, capsys):
    root, out = _tree(tmp_path / "in"), tmp_path / "out"
    assert _build(root, out, "--version_name", "v1") == 0
    before = {p: (os.stat(p).st_ino, open(p, "rb").read()) for p in glob.glob(str(out / "**"), recursive=True)
              if os.path.isfile(p)}
    capsys.readouterr()
    assert _build(root, out, "--version_name", "v1", "--overwrite") == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"imagerecords build: error: version 'v1' already exists in {out} (versions are never "
                   "rewritten); choose another --version_name; nothing was published"]
    after = {p: (os.stat(p).st_ino, open(p, "rb").read()) for p in glob.glob(str(out / "**"), recursive=True)
             if os.path.isfile(p)}
    assert after == before and not (out / STAGING).exists()  # refused before the engine started
    # A file (not a version) of that name is taken too: nothing the tool did not write is replaced.
    (out / "notes").write_text("mine")
    assert _build(root, out, "--version_name", "notes", "--overwrite") == 4
    assert (out / "notes").read_text() == "mine"


@pytest.mark.parametrize("name, why", [
    ("../escape", "climbs out with '..'"),
    ("/abs", "is an absolute path"),
    ("a/b", "holds a '/'"),
    ("line\nbreak", "holds the control character"),
    ("", "is empty"),
    (".hidden", "must be 1-100 letters"),
    ("sp ace", "must be 1-100 letters"),
    ("x" * 101, "must be 1-100 letters"),
    ("v-20260101", "names unnamed builds' folders"),
    ("manifest.json", "the name of a file the dataset folder holds"),
    ("index", "the name of a file the dataset folder holds"),
])
def test_unsafe_names_are_refused_in_one_line(tmp_path, capsys, name, why):
    root, out = _tree(tmp_path / "in", per_class=1), tmp_path / "sub" / "out"
    assert _build(root, out, "--version_name", name) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "version_name" in err[0] and why in err[0]
    assert not (tmp_path / "sub").exists() and not (tmp_path / "escape").exists()
    with pytest.raises(ValueError, match="version_name"):
        import imagerecords

        imagerecords.build(str(root), str(out), version_name=name)


def test_good_names():
    for name in ("2024-06", "v1", "release_3.1", "A"):
        assert version_name_problem(name) is None, name


def test_commit_checks_the_name_again_and_retention_drops_named_versions(tmp_path):
    out = tmp_path / "out"
    first = _results(build_id="20261201T000001Z-aaaaaa")
    first = publish.BuildResults(**{**first.__dict__, "version_name": "one"})
    _stage(out, first, [b"new0", b"new1"])
    assert publish.commit(str(out), first).version == "one"
    # A folder of that name appearing after the pre-flight check: the commit refuses, nothing moves.
    second = publish.BuildResults(**{**_results(build_id="20261201T000002Z-bbbbbb").__dict__, "version_name": "two"})
    _stage(out, second, [b"new0", b"new1"])
    (out / "two").mkdir()
    with pytest.raises(errors.OutputError, match="version 'two' already exists"):
        publish.commit(str(out), second)
    assert json.loads((out / MANIFEST).read_text())["version"] == "one"
    (out / "two").rmdir()
    # `finish` (no results given) publishes the staged build into its named folder.
    assert publish.commit(str(out)).version == "two"
    third = publish.BuildResults(**{**_results(build_id="20261201T000003Z-cccccc").__dict__, "version_name": "three"})
    _stage(out, third, [b"new0", b"new1"])
    m = publish.commit(str(out), third, keep_versions=2)
    assert m.previous_versions == ("two",)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["three", "two"]  # 'one' fell out


@pytest.mark.slow
def test_a_named_and_an_unnamed_version_keep_each_other(tmp_path):
    root, out = _tree(tmp_path / "in", per_class=2), tmp_path / "out"
    assert _build(root, out, "--version_name", "named") == 0
    assert _build(root, out, "--overwrite") == 0
    assert _build(root, out, "--overwrite", "--keep_versions", "3") == 0
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert dirs[0] == "named" and len(dirs) == 3
    assert _build(root, out, "--overwrite", "--keep_versions", "1") == 0
    assert [p.name for p in out.iterdir() if p.is_dir()] == [json.loads((out / MANIFEST).read_text())["version"]]


def test_write_dataset_refuses_a_taken_name(tmp_path):
    from imagerecords.transforms import WriteDataset

    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="version 'taken' already exists"):
        WriteDataset(str(tmp_path), version_name="taken", overwrite=True)
    with pytest.raises(ValueError, match="version_name"):
        WriteDataset(str(tmp_path / "o"), version_name="../up")


@pytest.mark.slow
def test_retention_never_removes_a_folder_that_holds_other_files(tmp_path):
    """A manifest naming a folder of the user's as a version (forged, or a name reused by hand):
    retention leaves that folder alone."""
    root, out = _tree(tmp_path / "in", per_class=1), tmp_path / "out"
    assert _build(root, out, "--version_name", "mine") == 0
    (out / "mine" / "notes.txt").write_text("kept")
    assert _build(root, out, "--overwrite", "--keep_versions", "1") == 0
    assert (out / "mine" / "notes.txt").read_text() == "kept"
    assert _build(root, out, "--overwrite", "--keep_versions", "1", "--version_name", "next") == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["mine", "next"]
