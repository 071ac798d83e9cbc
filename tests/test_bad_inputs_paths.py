"""Names that become paths: a manifest's file, version and split names, a staged record's, a lock's, a
declared feature's and a split's are kept inside OUT, or refused in one line; nothing outside OUT is
read, written or deleted.

Real builds of a small image tree made by code (example_images.write_tree); each test tampers the
file it is about (manifest.json, commit.json, a staged record, the lock) or passes the bad name.
"""

import json
import os
import shutil

import pytest

from conftest import build, published_version
from imagerecords.cli import main as cli
from imagerecords.format.manifest import LOCK, MANIFEST, STAGING

VICTIM = b"not imagerecords' to touch\n"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    from imagerecords.pipeline import example_images

    root = tmp_path_factory.mktemp("paths") / "images"
    example_images.write_tree(str(root), per_class=3)
    return root


@pytest.fixture(scope="module")
def dataset(tree, tmp_path_factory):
    """A published dataset (2 shards, versioned layout), copied by each test that tampers it."""
    out = tmp_path_factory.mktemp("paths-ds") / "out"
    build(tree, out, "--num_shards", "2")
    return out


def _copy(dataset, folder):
    out = folder / "out"
    shutil.copytree(dataset, out)
    return out


def _edit_manifest(out, edit):
    path = out / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    return manifest


def _shards(manifest):
    return [s for split in manifest["splits"].values() for s in split["shards"]]


def _cli(capsys, *argv):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _refusal(err):
    """The one stderr line of a refusal, after the log lines a build prints."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    return lines[-1]


# 1. A rebuild never deletes (or reads) a file a manifest names outside OUT ------------------------


@pytest.mark.parametrize("where", ["climbing", "absolute"])
@pytest.mark.parametrize("field", ["filename", "index_file"])
def test_an_overwrite_rebuild_never_deletes_a_file_a_flat_manifest_names_outside_out(
        tree, dataset, tmp_path, capsys, caplog, where, field):
    out = _copy(dataset, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    name = "../victim.txt" if where == "climbing" else str(victim)

    def flat_layout_naming_the_victim(m):
        m.pop("version")  # the old flat layout: retention deletes the files the manifest lists
        _shards(m)[0][field] = name

    _edit_manifest(out, flat_layout_naming_the_victim)
    code, _, err = _cli(capsys, "build", "--input", tree, "--output", out, "--num_shards", "2", "--overwrite",
                        "--keep_versions", "1", "--no_progress")
    assert code == 0, err
    assert victim.read_bytes() == VICTIM
    shown = repr(name)
    # --overwrite replaces a dataset whose manifest cannot be trusted, saying so (a line on stderr).
    assert [r.getMessage() for r in caplog.records if "previous manifest" in r.getMessage()] == [
        f"ignoring the unreadable previous manifest: {out / MANIFEST}: "
        f"{'shard file name' if field == 'filename' else 'index file name'} {shown} "
        f"{'climbs out with' if where == 'climbing' else 'is an absolute path'}"
        + (" '..'" if where == "climbing" else "")
        + "; every name in a manifest stays inside the dataset folder (this one was altered, or not written by "
        "imagerecords)"]
    published = json.loads((out / MANIFEST).read_text())
    assert all(s["filename"].startswith(published["version"] + "/") for s in _shards(published))
    assert sorted(os.listdir(tmp_path)) == ["out", "victim.txt"]


# 2. Every reader refuses a manifest whose shard names climb out ------------------------------------


@pytest.fixture
def climbing(dataset, tmp_path):
    """Two datasets side by side; `mine`'s manifest names `other`'s shards through '../other/'."""
    other = shutil.copytree(dataset, tmp_path / "other")
    mine = shutil.copytree(dataset, tmp_path / "mine")

    def through_other(m):
        for s in _shards(m):
            s["filename"] = "../other/" + s["filename"]

    manifest = _edit_manifest(mine, through_other)
    first = sorted(manifest["splits"])[0]
    bad = manifest["splits"][first]["shards"][0]["filename"]
    expected = (f"{mine / MANIFEST}: shard file name {bad!r} climbs out with '..'; every name in a manifest stays "
                "inside the dataset folder (this one was altered, or not written by imagerecords)")
    assert os.path.exists(os.path.join(mine, bad))  # the file it names is there to be read
    return mine, other, expected


def _make_dataset(path):
    from imagerecords import reader

    return reader.make_dataset(str(path), "train", batch_size=2, image_size=16)


def _make_dataset_resumable(path):
    from imagerecords import reader

    return reader.make_dataset(str(path), "train", batch_size=2, image_size=16, training=True, seed=0,
                               start_step=1)


def _as_dataset(path):
    from imagerecords import reader

    return reader.as_dataset(str(path), "train")


def _torch(path):
    from imagerecords import torch as irt

    return irt.RecordDataset(str(path), "train")


@pytest.mark.parametrize("open_reader", [_make_dataset, _make_dataset_resumable, _as_dataset,
                                         pytest.param(_torch, marks=pytest.mark.needs_extra("torch"))],
                         ids=["make_dataset", "make_dataset-start_step", "as_dataset", "torch"])
def test_every_reader_refuses_a_manifest_whose_shards_climb_out(climbing, open_reader):
    mine, _, expected = climbing
    with pytest.raises(ValueError) as raised:
        open_reader(mine)
    assert str(raised.value) == expected


@pytest.mark.parametrize("command", ["verify", "inspect", "report"])
def test_verify_inspect_and_report_refuse_a_manifest_whose_shards_climb_out(climbing, tmp_path, capsys, command):
    mine, _, expected = climbing
    html = ["--html", tmp_path / "report.html"] if command == "report" else []
    code, out, err = _cli(capsys, command, mine, *html)
    assert (code, err) == (3, f"imagerecords {command}: error: {expected}\n")


# 1. ... nor does `finish`, `--resume` or a lock follow a name out of OUT ---------------------------


@pytest.fixture
def staged(tree, tmp_path, monkeypatch):
    """OUT with a complete build staged and not committed (its launcher stopped before the commit),
    and a victim file beside OUT."""
    from imagerecords.pipeline import errors
    from imagerecords.builder import session

    out = tmp_path / "out"

    def stopped(config, results, on_commit):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(session, "_conclude", stopped)
        with pytest.raises(errors.Interrupted):
            build(tree, out, "--num_shards", "2")
    (build_id,) = os.listdir(out / STAGING)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    return out, out / STAGING / build_id, victim


def _climb_in_results(results):
    results["shards"][0]["filename"] = "../../../victim.txt"  # from staging/<id>/: beside OUT


@pytest.mark.parametrize("tampered", ["results.json", "commit.json"])
def test_finish_refuses_staged_files_that_name_paths_outside_out(staged, capsys, tampered):
    from imagerecords.pipeline.publish import commit as publish

    out, staging, victim = staged
    results = json.loads((staging / "results.json").read_text())
    if tampered == "results.json":
        _climb_in_results(results)
        (staging / "results.json").write_text(json.dumps(results))
        what = "shard file name '../../../victim.txt'"
    else:
        manifest = publish.BuildResults.from_json(results).manifest().to_json()
        bad = _shards(manifest)[0]["filename"] = manifest["version"] + "/../../victim.txt"
        (staging / "commit.json").write_text(json.dumps({"manifest": manifest, "build_id": results["build_id"]}))
        what = f"commit.json: shard file name {bad!r}"
    before = sorted(os.listdir(out))
    code, _, err = _cli(capsys, "finish", out)
    assert (code, err) == (4, f"imagerecords finish: error: refusing to publish {out}: {staging / tampered} is "
                              f"unreadable ({what} climbs out with '..'; every name in a manifest stays inside the "
                              "dataset folder (this one was altered, or not written by imagerecords)); nothing was "
                              "published; rerun `imagerecords build ... --overwrite`\n")
    assert victim.read_bytes() == VICTIM
    assert sorted(os.listdir(out)) == before and MANIFEST not in before


@pytest.mark.slow
def test_resume_never_moves_a_file_a_staged_record_names_outside_out(tree, staged, capsys):
    out, staging, victim = staged
    (record_path,) = sorted(staging.glob("*-00000-of-00002.staged.json"))
    record = json.loads(record_path.read_text())
    record["staged"]["result"]["filename"] = "../../../victim.txt"
    record_path.write_text(json.dumps(record))
    code, _, err = _cli(capsys, "build", "--input", tree, "--output", out, "--num_shards", "2", "--resume",
                        "--no_progress")
    assert code == 0, err
    assert "imagerecords build: resumed: 1 of 2 shards reused" in err.splitlines()
    assert victim.read_bytes() == VICTIM
    published = json.loads((out / MANIFEST).read_text())
    assert [os.path.basename(s["filename"]) for s in _shards(published)] == [
        record_path.name[:-len(".staged.json")], record_path.name[:-len(".staged.json")].replace("00000-of", "00001-of")]


def test_a_lock_naming_a_build_outside_out_is_unreadable(dataset, tree, tmp_path, capsys):
    out = _copy(dataset, tmp_path)
    import socket

    (out / LOCK).write_text(json.dumps({"build_id": "../../elsewhere", "host": socket.gethostname(),
                                        "pid": os.getpid(), "started": "2026-01-01T00:00:00+00:00"}))
    code, _, err = _cli(capsys, "build", "--input", tree, "--output", out, "--overwrite", "--no_progress")
    assert (code, _refusal(err)) == (5, f"imagerecords build: error: the lock file {out / LOCK} is unreadable (its "
                                        "build_id '../../elsewhere' climbs out with '..'); if no build is running into "
                                        f"{out}, rerun with --break_lock")


# 5. A declared feature's name is a name, never a path ------------------------------------------------

BAD_FEATURE = "x/../../../PWN"


@pytest.fixture
def tags_rows(tree, tmp_path):
    """A JSONL manifest whose rows carry a class list in a column named like the bad feature."""
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [{"path": str(p), "label": p.parent.name, BAD_FEATURE: ["a", "b"][: 1 + i % 2]}
            for i, p in enumerate(sorted(tree.glob("*/*")))]
    (folder / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "m.jsonl"


@pytest.mark.parametrize("declared", ["flag", "config"])
def test_a_feature_named_with_dot_dot_is_refused_and_nothing_is_written_beside_out(tags_rows, tmp_path, capsys,
                                                                                    declared):
    out = tmp_path / "deep" / "er" / "out"
    if declared == "flag":
        how = ["--feature", f"{BAD_FEATURE}=class_list"]
    else:
        (tmp_path / "f.yaml").write_text(f"features:\n  {BAD_FEATURE}: {{dtype: class_list}}\n")
        how = ["--config", tmp_path / "f.yaml"]
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    code, _, err = _cli(capsys, "build", "--input", tags_rows, "--output", out, "--schema", "tfds",
                        "--max_reject_fraction", "0.5", "--no_progress", *how)
    assert code == 2, err
    line = _refusal(err)
    assert line.startswith("imagerecords build: error: ") and line.endswith(
        f"feature {BAD_FEATURE!r}: a name is '/'-separated parts of letters, digits, '_', '.' and '-', each "
        "starting with a letter, digit or '_' (the first with a letter or '_'): it becomes a file name")
    assert len(err.strip().splitlines()) == 1, err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


# 10. A split name is checked whole: "train\n" is no split name --------------------------------------


@pytest.mark.slow
def test_a_manifest_row_whose_split_is_300_characters_is_a_rejected_row(tree, tmp_path):
    # It once failed the whole build: "File name too long" from the first shard of that split.
    rows = [{"path": str(p), "label": p.parent.name, "split": "train"} for p in sorted(tree.glob("*/*.png"))]
    rows[0]["split"] = "s" * 300
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    manifest = build(tmp_path / "m.jsonl", out, "--max_reject_fraction", "0.5")
    assert manifest.split_names == ("train",) and manifest.num_rejected == 1
    (row,) = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert (row["uri"], row["reason"]) == (rows[0]["path"], "split name 'ssssssssssssssssssss'... is 300 characters, "
                                                            "over 64 (it is part of every shard file name of the split)")


def test_a_manifest_row_whose_split_ends_in_a_newline_is_a_rejected_row(tree, tmp_path):
    rows = [{"path": str(p), "label": p.parent.name, "split": "train"} for p in sorted(tree.glob("*/*.png"))]
    rows[0]["split"] = "train\n"
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    manifest = build(tmp_path / "m.jsonl", out, "--max_reject_fraction", "0.5")
    assert manifest.split_names == ("train",)
    assert manifest.num_rejected == 1
    (row,) = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert (row["uri"], row["split"], row["reason"]) == (
        rows[0]["path"], "train\n", "split name 'train\\n' has characters other than letters, digits, '_'")
    assert all("-train.tfrecord-" in n for n in os.listdir(out / published_version(out))
               if n not in ("index", "keys", "hashes"))


@pytest.mark.parametrize("declared", ["flag", "config"])
def test_a_split_named_with_a_newline_is_refused_at_parsing(tree, tmp_path, capsys, declared):
    out = tmp_path / "out"
    if declared == "flag":
        how = ["--splits", "train\n=0.5,validation=0.5"]
    else:
        (tmp_path / "c.yaml").write_text(json.dumps({"splits": {"train\n": 0.5, "validation": 0.5}}))
        how = ["--config", tmp_path / "c.yaml"]
    code, _, err = _cli(capsys, "build", "--input", tree, "--output", out, "--no_progress", *how)
    what = "--splits" if declared == "flag" else "splits"  # the config file's key is `splits:`
    assert (code, err) == (2, f"imagerecords build: error: {what}: split name 'train\\n' has characters other "
                              "than letters, digits, '_'\n")
    assert not out.exists()


@pytest.mark.parametrize("name", ["images\n", "images/../x", "i" * 300])
def test_a_dataset_name_is_checked_whole(tree, tmp_path, capsys, name):
    out = tmp_path / "out"
    code, _, err = _cli(capsys, "build", "--input", tree, "--output", out, "--name", name, "--no_progress")
    assert (code, err) == (2, f"imagerecords build: error: invalid build configuration: name {name[:80]!r} must match "
                              "[a-z][a-z0-9_]*, at most 64 characters (it begins every shard file name)\n")
    assert not out.exists()
