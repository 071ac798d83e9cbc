"""After --append, the new version folder is whole: every tool that reads a folder or a glob (TFDS,
Model Garden's file patterns, DALI's file lists, tf.data.TFRecordDataset) reads exactly the records
the manifest lists, and the earlier versions' shards are second names of the same files, not copies.

Fixtures: example_images.write_tree makes a class-folder tree of small real images; the delta is
three copies of one of them in a new class folder.
"""

import errno
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from imagerecords.format import records
from test_append import _delta_tree, _keys, _manifest, _run
from test_failures import kill_at

pytestmark = pytest.mark.slow

ARGS = ["--splits", "train=0.7,validation=0.3", "--num_shards", "2", "--max_reject_fraction", "0.5",
        "--write_index"]


def _counts(paths):
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += sum(1 for _ in records.read_records(f, path))
    return total


def _wanted(manifest):
    return {name: split["num_examples"] for name, split in manifest["splits"].items()}


def _inodes(out, manifest):
    return {s["sha256"]: os.stat(os.path.join(out, s["filename"])).st_ino
            for split in manifest["splits"].values() for s in split["shards"]}


def _built(tmp_path):
    root = tmp_path / "in"
    from imagerecords.pipeline import example_images

    files = example_images.write_tree(str(root), per_class=4, broken=False)
    out = str(tmp_path / "out")
    rc, err = _run("--input", root, "--output", out, *ARGS)
    assert rc == 0, err
    first = sorted(files)[0]
    os.makedirs(root / "zebra")
    for i in range(3):
        shutil.copy(root / first / files[first][i], root / "zebra" / f"z{i}.jpg")
    return root, out


@pytest.mark.slow
def test_every_folder_tool_reads_the_whole_appended_version(tmp_path):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    root, out = _built(tmp_path)
    m1 = _manifest(out)
    before = _inodes(out, m1)
    rc, err = _run("--input", root, "--output", out, *ARGS, "--append", "--version_name", "week2")
    assert rc == 0, err
    m2 = _manifest(out)
    assert m2["version"] == "week2" and sum(_wanted(m2).values()) == sum(_wanted(m1).values()) + 3
    for split, n in _wanted(m2).items():
        # The README's Model Garden recipe: a glob over the version folder.
        pattern = os.path.join(out, "week2", f"images-{split}*")
        assert _counts(sorted(glob.glob(pattern))) == n, pattern
        assert sum(1 for _ in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern))) == n
        # `inspect --glob` prints one glob, and it reads the same.
        proc = subprocess.run([sys.executable, "-m", "imagerecords", "inspect", out, "--glob", split],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert _counts(sorted(glob.glob(proc.stdout.strip()))) == n, proc.stdout
        # TFDS reads dataset_info.json's shard lengths from the folder it names.
        assert sum(1 for _ in tfds.builder_from_directory(out).as_dataset(split=split)) == n
        # DALI's file lists: each shard and its index file side by side, one index line per record.
        shards = sorted(glob.glob(os.path.join(out, "week2", f"images-{split}.tfrecord-*")))
        indexes = sorted(glob.glob(os.path.join(out, "week2", "index", f"images-{split}.tfrecord-*")))
        assert len(shards) == len(indexes) == len(m2["splits"][split]["shards"])
        assert sum(len(open(p).read().splitlines()) for p in indexes) == n
    # The first build's shards are second names of the same files: no byte was copied.
    after = _inodes(out, m2)
    assert all(after[sha] == inode for sha, inode in before.items())
    assert all(s["filename"].startswith("week2/") for split in m2["splits"].values() for s in split["shards"])
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "verify", out, "--records"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_keeping_one_version_leaves_the_kept_folder_whole(tmp_path):
    root, out = _built(tmp_path)
    m1 = _manifest(out)
    keys0 = _keys(out)
    rc, err = _run("--input", root, "--output", out, *ARGS, "--append", "--keep_versions", "1")
    assert rc == 0, err
    m2 = _manifest(out)
    versions = sorted(d for d in os.listdir(out) if os.path.isdir(os.path.join(out, d)) and not d.startswith("."))
    assert versions == [m2["version"]] and not os.path.exists(os.path.join(out, m1["version"]))
    for split, n in _wanted(m2).items():
        assert _counts(sorted(glob.glob(os.path.join(out, m2["version"], f"images-{split}.tfrecord-*")))) == n
    assert len(_keys(out)) == len(keys0) + 3
    # The next append reads no shard of this one: every shard's keys file came along with it.
    for split in m2["splits"].values():
        for shard in split["shards"]:
            folder, _, name = shard["filename"].rpartition("/")
            with open(os.path.join(out, folder, "keys", name + ".jsonl")) as f:
                assert len(f.read().splitlines()) == shard["count"]


def test_without_hard_links_the_earlier_files_are_copied_with_a_warning(tmp_path, monkeypatch, caplog):
    from conftest import build

    root, out = _built(tmp_path)
    m1 = _manifest(out)
    before = _inodes(out, m1)
    calls = []

    def no_links(src, dst, **kwargs):
        calls.append(dst)
        raise OSError(errno.EXDEV, "Invalid cross-device link", src)

    monkeypatch.setattr(os, "link", no_links)
    caplog.set_level("WARNING")
    build(root, out, *ARGS, "--append")
    m2 = _manifest(out)
    assert calls, "the commit never tried to link"
    assert "has no hard links" in caplog.text and m2["version"] in caplog.text
    after = _inodes(out, m2)
    for split, n in _wanted(m2).items():
        assert _counts(sorted(glob.glob(os.path.join(out, m2["version"], f"images-{split}.tfrecord-*")))) == n
    for sha, inode in before.items():
        assert after[sha] != inode  # copied, so the old version's files are untouched
    assert not glob.glob(os.path.join(out, "**", "*.link.tmp"), recursive=True)
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "verify", out, "--records"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_an_append_killed_in_its_commit_is_finished_whole(tmp_path):
    root, out = _built(tmp_path)
    m1 = _manifest(out)
    reference = str(tmp_path / "reference")
    shutil.copytree(out, reference)
    assert _run("--input", root, "--output", reference, *ARGS, "--append")[0] == 0
    m_ref = _manifest(reference)

    markers = tmp_path / "markers"
    markers.mkdir()
    kill_at("in_commit", root, out, str(markers), *ARGS, "--append")
    assert _manifest(out) == m1  # still the old version
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "finish", out], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    m2 = _manifest(out)
    assert _wanted(m2) == _wanted(m_ref)
    assert [[(s["count"], s["sha256"]) for s in split["shards"]] for split in m2["splits"].values()] == \
        [[(s["count"], s["sha256"]) for s in split["shards"]] for split in m_ref["splits"].values()]
    for split, n in _wanted(m2).items():
        assert _counts(sorted(glob.glob(os.path.join(out, m2["version"], f"images-{split}.tfrecord-*")))) == n
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "verify", out, "--records"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_inspect_glob_refuses_a_split_spread_over_folders(tmp_path):
    """A dataset appended by an earlier release lists shards in several folders: no one glob reads it."""
    root, out = _built(tmp_path)
    m = _manifest(out)
    split = next(iter(m["splits"]))
    shard = m["splits"][split]["shards"][0]
    moved = "elsewhere/" + shard["filename"].rpartition("/")[2]
    os.makedirs(os.path.join(out, "elsewhere"))
    os.rename(os.path.join(out, shard["filename"]), os.path.join(out, moved))
    keys = shard["filename"].rpartition("/")[0] + "/keys/" + moved.rpartition("/")[2] + ".jsonl"
    os.makedirs(os.path.join(out, "elsewhere", "keys"))
    os.rename(os.path.join(out, keys), os.path.join(out, "elsewhere", "keys", moved.rpartition("/")[2] + ".jsonl"))
    shard["filename"] = moved
    m["listed_folders"] = {m["version"]: sorted([m["version"], "elsewhere"])}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(m, f)
    from imagerecords.cli import inspection

    problems, notes = inspection.verify(out)
    assert problems == [] and [n for n in notes if "elsewhere" in n] == [
        f"{os.path.join(out, 'elsewhere')}: holds shards of the published version (appended by a release before "
        "whole version folders; the next --append makes one folder whole)"]
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "inspect", out, "--glob", split],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--files" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
