"""imagerecords build --append: deltas add shards to a new version that shares the old shards.

Fixtures: example_images.write_tree makes a class-folder tree of small real images; the tests copy
files into it to make each delta (a new class, a repeated key, a changed file).
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from imagerecords.pipeline import example_images

ARGS = ["--splits", "train=0.7,validation=0.3", "--num_shards", "2", "--max_reject_fraction", "0.5"]


def _run(*args):
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "build", *map(str, args), "--no_progress"],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr


def _manifest(out):
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def _files(out, manifest):
    return [s["filename"] for split in manifest["splits"].values() for s in split["shards"]]


def _keys(out):
    """{key: (split, label id, label text)} of every record the manifest lists, read with the typed reader."""
    from imagerecords.reader.typed import as_dataset

    manifest = _manifest(out)
    found = {}
    for split in manifest["splits"]:
        for ex in as_dataset(out, split):
            key = ex["image/filename"].numpy().decode()
            assert key not in found, f"{key} read twice"
            found[key] = (split, int(ex["label"].numpy()))
    return found


def _glob_counts(out, version):
    """{split: records} that a plain glob over one version folder reads (what TFDS, Model Garden or DALI see)."""
    import glob


    from imagerecords.format import records

    counts = {}
    for path in sorted(glob.glob(os.path.join(out, version, "images-*.tfrecord-*"))):
        split = os.path.basename(path).split("-", 1)[1].split(".tfrecord", 1)[0]
        with open(path, "rb") as f:
            counts[split] = counts.get(split, 0) + sum(1 for _ in records.read_records(f, path))
    return counts


def _rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _deltas(root, out, extra=()):
    """Builds `root`, then appends three deltas; returns what each step published."""
    files = example_images.write_tree(str(root), per_class=5, broken=False)
    classes = sorted(files)
    assert _run("--input", root, "--output", out, *ARGS, *extra)[0] == 0
    steps = [(_manifest(out), _keys(out))]
    inodes = {f: (os.stat(os.path.join(out, f)).st_ino, open(os.path.join(out, f), "rb").read())
              for f in _files(out, steps[0][0])}
    # Delta 1: two new classes (names sorting before and after the old ones) and one new image.
    for cls in ("aardvark", "zebra"):
        os.makedirs(root / cls)
        shutil.copy(root / classes[0] / files[classes[0]][0], root / cls / f"{cls}1.jpg")
    shutil.copy(root / classes[1] / files[classes[1]][0], root / classes[1] / "new1.jpg")
    # Delta 2: a repeated key only (nothing new but one image).
    # Delta 3: a changed file under an old key, and one new image.
    return files, classes, steps, inodes


def _append(root, out, extra=()):
    rc, err = _run("--input", root, "--output", out, *ARGS, "--append", *extra)
    assert rc == 0, err
    return _manifest(out), _keys(out)


@pytest.mark.slow
def test_three_deltas_add_up(tmp_path):
    root, out = tmp_path / "in", str(tmp_path / "out")
    files, classes, steps, inodes = _deltas(root, out)
    first, keys0 = steps[0]
    old_names = first["label_names"]

    m1, keys1 = _append(root, out)
    assert m1["label_names"] == old_names + ["aardvark", "zebra"]  # new names at the end, sorted
    for key, value in keys0.items():
        assert keys1[key] == value  # old ids unchanged
    added = set(keys1) - set(keys0)
    assert added == {"aardvark/aardvark1.jpg", "zebra/zebra1.jpg", f"{classes[1]}/new1.jpg"}
    assert keys1["zebra/zebra1.jpg"][1] == old_names.__len__() + 1
    assert sum(s["num_examples"] for s in m1["splits"].values()) == len(keys0) + 3
    # Rows of keys already in the dataset (both members one key); the copies under new keys are
    # the ordinary identical-files rows.
    dups = [d for d in _rows(os.path.join(out, "duplicates.jsonl")) if len({m["key"] for m in d["members"]}) == 1]
    assert sorted(d["members"][0]["key"] for d in dups) == sorted(keys0)

    # Delta 2: one more image under a new key; the rest repeats.
    shutil.copy(root / classes[2] / files[classes[2]][1], root / classes[2] / "new2.png")
    m2, keys2 = _append(root, out)
    assert set(keys2) - set(keys1) == {f"{classes[2]}/new2.png"}
    assert m2["label_names"] == m1["label_names"]

    # Delta 3: a changed file under an old key (other bytes) and one new image.
    changed = f"{classes[0]}/{files[classes[0]][0]}"
    shutil.copy(root / classes[3] / files[classes[3]][0], root / changed)
    shutil.copy(root / classes[3] / files[classes[3]][2], root / classes[3] / "new3.jpg")
    m3, keys3 = _append(root, out)
    assert set(keys3) - set(keys2) == {f"{classes[3]}/new3.jpg"}
    assert keys3[changed] == keys0[changed]  # the record stays as it was
    errors = _rows(os.path.join(out, "errors.jsonl"))
    assert [e["key"] for e in errors] == [changed] and "rebuild with --overwrite" in errors[0]["reason"]
    assert sum(s["num_examples"] for s in m3["splits"].values()) == len(keys0) + 5 == len(keys3)

    # The first build's shards: never copied or rewritten; the newest folder holds them as second
    # names (same inode, same bytes) under the one numbering, before the deltas' shards.
    listed = {os.stat(os.path.join(out, f)).st_ino: f for f in _files(out, m3)}
    for name, (inode, data) in inodes.items():
        assert inode in listed, f"{name} is not in the newest version folder"
        assert listed[inode].startswith(m3["version"] + "/")
        assert open(os.path.join(out, listed[inode]), "rb").read() == data
    # Every kept version folder is whole: its shards are exactly its manifest's, numbered 0..N-1.
    assert "listed_folders" not in m3
    for split, entry in m3["splits"].items():
        names = [s["filename"] for s in entry["shards"]]
        n = len(names)
        assert names == [f"{m3['version']}/images-{split}.tfrecord-{i:05d}-of-{n:05d}" for i in range(n)]
    kept = [m3["version"], *m3["previous_versions"]]
    assert len(kept) == 2 and all(os.path.isdir(os.path.join(out, v)) for v in kept)
    assert m2["version"] in kept and m1["version"] not in kept and not os.path.exists(os.path.join(out, m1["version"]))
    assert _glob_counts(out, m2["version"]) == {k: v["num_examples"] for k, v in m2["splits"].items()}
    assert _glob_counts(out, m3["version"]) == {k: v["num_examples"] for k, v in m3["splits"].items()}
    with open(os.path.join(out, "label.labels.txt")) as f:
        assert f.read().splitlines() == m3["label_names"]


@pytest.mark.slow
def test_append_to_a_manifest_dataset(tmp_path):
    root = tmp_path / "in"
    files = example_images.write_tree(str(root), per_class=4, broken=False)
    rows = [(f"{c}/{n}", c, f"k-{c}-{n}") for c in sorted(files) for n in files[c]]
    csv = tmp_path / "list.csv"

    def write(rows):
        csv.write_text("path,label,key,split\n" + "".join(f"in/{p},{l},{k},{'train' if i % 3 else 'test'}\n"
                                                         for i, (p, l, k) in enumerate(rows)))

    write(rows)
    out = str(tmp_path / "out")
    args = ["--num_shards", "1", "--max_reject_fraction", "0.5"]
    assert _run("--input", csv, "--output", out, *args)[0] == 0
    keys0 = _keys(out)
    assert {s for s, _ in keys0.values()} == {"train", "test"}
    new = (f"{sorted(files)[0]}/{files[sorted(files)[0]][1]}", "newclass", "k-new")
    rc, err = _run("--input", csv, "--output", out, *args, "--append")
    assert rc == 6 and "nothing to append" in err, err  # nothing new: refused, the dataset unchanged
    assert _keys(out) == keys0
    # and nothing left behind that verify would call a leftover and finish an unfinished build
    assert not os.path.exists(os.path.join(out, ".imagerecords-staging"))
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "verify", out], capture_output=True, text=True,
                          timeout=300)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "ok", ""), proc.stdout + proc.stderr
    write(rows + [new])
    rc, err = _run("--input", csv, "--output", out, *args, "--append", "--overwrite")
    assert rc == 2, err  # the two exclude each other
    rc, err = _run("--input", csv, "--output", out, *args, "--append")
    assert rc == 0, err
    keys = _keys(out)
    assert set(keys) - set(keys0) == {"k-new"}
    m = _manifest(out)
    assert m["label_names"][-1] == "newclass" and keys["k-new"][1] == len(m["label_names"]) - 1
    assert keys["k-new"][0] == ("train" if len(rows) % 3 else "test")  # the split column, as before


@pytest.mark.slow
def test_a_differing_spec_is_refused_in_one_line(tmp_path):
    root, out = tmp_path / "in", str(tmp_path / "out")
    example_images.write_tree(str(root), per_class=3, broken=False)
    assert _run("--input", root, "--output", out, *ARGS)[0] == 0
    before = open(os.path.join(out, "manifest.json"), "rb").read()
    rc, err = _run("--input", root, "--output", out, *ARGS, "--append", "--image_encoding", "png")
    assert rc == 2
    assert err.strip().count("\n") == 0 and "image" in err and "--append refused" in err, err
    rc, err = _run("--input", root, "--output", out, "--splits", "train=0.5,validation=0.5", "--append")
    assert rc == 2 and "splits" in err and err.strip().count("\n") == 0, err
    assert open(os.path.join(out, "manifest.json"), "rb").read() == before
    rc, err = _run("--input", root, "--output", str(tmp_path / "empty"), *ARGS, "--append")
    assert rc == 2 and "no published dataset" in err, err


def _delta_tree(tmp_path, per_class=4):
    """A built dataset and a delta of three new images in a new class: (root, out, zebra keys)."""
    root, out = tmp_path / "in", str(tmp_path / "out")
    files = example_images.write_tree(str(root), per_class=per_class, broken=False)
    assert _run("--input", root, "--output", out, *ARGS)[0] == 0
    os.makedirs(root / "zebra")
    first = sorted(files)[0]
    for i in range(3):
        shutil.copy(root / first / files[first][i], root / "zebra" / f"z{i}.jpg")
    return root, out, {f"zebra/z{i}.jpg" for i in range(3)}


def _shards(manifest):
    """{split: [(count, bytes, sha256) of each shard, in order]}: the records and their order, not the folder."""
    return {name: [(s["count"], s["num_bytes"], s["sha256"]) for s in split["shards"]]
            for name, split in manifest["splits"].items()}


def _wait_for(path, proc, what, timeout=180):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(f"the append ended (exit {proc.returncode}) before {what}: "
                                 f"{proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["mid_shards", "before_commit"])
def test_sigkill_during_an_append_leaves_the_previous_version_and_resume_finishes_it(tmp_path, phase):
    from test_failures import kill_at, snapshot

    root, out, zebras = _delta_tree(tmp_path)
    before = snapshot(out)
    keys0 = _keys(out)
    # The same append, never interrupted, on a copy of the dataset: what the resumed one must equal.
    reference = str(tmp_path / "reference")
    shutil.copytree(out, reference)
    m_ref, keys_ref = _append(root, reference)
    assert set(keys_ref) - set(keys0) == zebras

    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    kill_at(phase, root, out, str(marker_dir), "--num_shards", "2", "--max_reject_fraction", "0.5", "--append")
    # Nothing a reader or a glob sees changed: every visible file (manifest, reports, versions) as it was.
    assert snapshot(out) == before
    assert _keys(out) == keys0

    rc, err = _run("--input", root, "--output", out, *ARGS, "--append", "--resume")
    assert rc == 0, err
    m = _manifest(out)
    assert _keys(out) == keys_ref  # every key once, same split, same class id
    assert m["label_names"] == m_ref["label_names"]
    assert _shards(m) == _shards(m_ref)  # the same records in the same order, old shards and delta
    # Each shard's keys file came along with it (the reused ones too): the next append reads no shard.
    for split in m["splits"].values():
        for shard in split["shards"]:
            folder, _, name = shard["filename"].rpartition("/")
            with open(os.path.join(out, folder, "keys", name + ".jsonl")) as f:
                assert len(f.read().splitlines()) == shard["count"], shard["filename"]


@pytest.mark.slow
def test_a_reader_opened_before_an_append_reads_the_old_version_while_it_commits(tmp_path):
    from imagerecords.reader.typed import as_dataset

    root, out, zebras = _delta_tree(tmp_path, per_class=6)
    keys0 = _keys(out)
    old_train = sorted(k for k, (split, _) in keys0.items() if split == "train")
    reader = iter(as_dataset(out, "train"))  # opened on the published version
    seen = [next(reader)["image/filename"].numpy().decode()]

    marker_dir, release = tmp_path / "markers", tmp_path / "release"
    marker_dir.mkdir()
    env = dict(os.environ, IMAGERECORDS_TEST_PAUSE="in_commit", IMAGERECORDS_TEST_PAUSE_DIR=str(marker_dir),
               IMAGERECORDS_TEST_RELEASE=str(release))
    manifest_before = open(os.path.join(out, "manifest.json"), "rb").read()
    proc = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", out,
                             *ARGS, "--append", "--no_progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        # The append is half-way through its commit: the new version's first file is in place.
        _wait_for(marker_dir / "in_commit", proc, "the commit started")
        assert open(os.path.join(out, "manifest.json"), "rb").read() == manifest_before
        seen.append(next(reader)["image/filename"].numpy().decode())
        release.touch()
        assert proc.wait(timeout=180) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert open(os.path.join(out, "manifest.json"), "rb").read() != manifest_before  # the switch happened
    seen.extend(ex["image/filename"].numpy().decode() for ex in reader)
    assert sorted(seen) == old_train  # exactly the old version: nothing new, nothing twice, nothing missing

    after = _keys(out)  # a reader opened after the append: old + new
    assert set(after) == set(keys0) | zebras
    assert {k: v for k, v in after.items() if k in keys0} == keys0


@pytest.mark.slow
def test_changed_files_are_found_from_the_keys_files_without_reading_the_old_shards(tmp_path):
    root, out, zebras = _delta_tree(tmp_path)
    first = _manifest(out)
    keys0 = _keys(out)
    longer, same_size = sorted(k for k in keys0 if not k.startswith("zebra"))[:2]
    with open(root / longer, "ab") as f:
        f.write(b"\0" * 7)  # another size: changed, known without reading it
    data = bytearray((root / same_size).read_bytes())
    data[-3] ^= 0xFF  # the same size, other bytes, a new modification time: read and compared
    (root / same_size).write_bytes(bytes(data))
    # The old shards are out of reach until the delta is written (the commit checks that they are
    # there): the append learns the stored keys from the keys files alone.
    hidden = {}
    for name in _files(out, first):
        hidden[name] = os.path.join(str(tmp_path), name.replace("/", "_"))
        os.rename(os.path.join(out, name), hidden[name])
    marker_dir, release = tmp_path / "markers", tmp_path / "release"
    marker_dir.mkdir()
    env = dict(os.environ, IMAGERECORDS_TEST_PAUSE="before_commit", IMAGERECORDS_TEST_PAUSE_DIR=str(marker_dir),
               IMAGERECORDS_TEST_RELEASE=str(release))
    proc = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", out,
                             *ARGS, "--append", "--no_progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        _wait_for(marker_dir / "before_commit", proc, "the delta was written")
    finally:
        for name, path in hidden.items():
            os.rename(path, os.path.join(out, name))
        release.touch()
        rc = proc.wait(timeout=180)
    assert rc == 0, proc.stderr.read().decode()[-2000:]
    errors = {e["key"]: e["reason"] for e in _rows(os.path.join(out, "errors.jsonl"))}
    assert sorted(errors) == sorted([longer, same_size])
    assert f"its size is {os.path.getsize(root / longer)} bytes, {os.path.getsize(root / longer) - 7}" in errors[longer]
    assert "its bytes differ from the stored record" in errors[same_size]
    keys = _keys(out)
    assert set(keys) == set(keys0) | zebras and keys[longer] == keys0[longer]
    # Every other old key is a duplicates.jsonl row of its own key, none of them read from a shard.
    dups = [d for d in _rows(os.path.join(out, "duplicates.jsonl")) if len({m["key"] for m in d["members"]}) == 1]
    assert sorted(d["members"][0]["key"] for d in dups) == sorted(set(keys0) - {longer, same_size})


@pytest.mark.slow
def test_a_missing_or_damaged_keys_file_is_replaced_by_reading_its_shard(tmp_path):
    root, out, zebras = _delta_tree(tmp_path)
    intact = str(tmp_path / "intact")
    shutil.copytree(out, intact)
    first = _manifest(out)
    names = _files(out, first)
    keys_files = [os.path.join(out, n.rpartition("/")[0], "keys", n.rpartition("/")[2] + ".jsonl") for n in names]
    assert len(keys_files) == 4 and all(os.path.exists(k) for k in keys_files)
    os.remove(keys_files[0])
    with open(keys_files[1], "rb") as f:
        lines = f.read().splitlines(keepends=True)
    with open(keys_files[1], "wb") as f:
        f.write(b"".join(lines[:-1]))  # a row short: the shard's count says the file is incomplete
    with open(keys_files[2], "wb") as f:
        f.write(b"\xff\x00 not a keys file\n" * len(lines))
    with open(keys_files[3], "rb") as f:
        kept = f.read()
    for target in (intact, out):
        rc, err = _run("--input", root, "--output", target, *ARGS, "--append")
        assert rc == 0, err[-2000:]
    damaged, healthy = _manifest(out), _manifest(intact)
    # The same delta, the same reports: the damaged keys files cost a read of their shards, nothing else.
    assert _shards(damaged) == _shards(healthy)
    assert _rows(os.path.join(out, "duplicates.jsonl")) == _rows(os.path.join(intact, "duplicates.jsonl"))
    assert _rows(os.path.join(out, "errors.jsonl")) == _rows(os.path.join(intact, "errors.jsonl")) == []
    keys = _keys(out)
    assert set(keys) == set(_keys(intact)) and zebras <= set(keys)
    # The old keys files are the old version's: an append reads them, never rewrites them.
    with open(keys_files[3], "rb") as f:
        assert f.read() == kept


@pytest.mark.slow
def test_a_keys_file_rewritten_with_its_row_count_kept_is_not_trusted(tmp_path):
    """A keys row naming a new image (count kept) would make the append skip that image and write the
    row's real key twice; the manifest's digest of each keys file refuses it, and the shard is read."""
    root, out, zebras = _delta_tree(tmp_path)
    first = _manifest(out)
    keys0 = _keys(out)
    name = _files(out, first)[0]
    keys_file = os.path.join(out, name.rpartition("/")[0], "keys", name.rpartition("/")[2] + ".jsonl")
    with open(keys_file, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    row = json.loads(lines[0])
    row["key"] = "zebra/z0.jpg"
    lines[0] = (json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    with open(keys_file, "wb") as f:
        f.write(b"".join(lines))
    from imagerecords.cli import inspection

    problems, notes = inspection.verify(out)
    assert problems == [] and [n for n in notes if n.startswith(keys_file)] == [
        f"{keys_file}: sha256 differs from the manifest (the next --append reads {name} instead)"]
    rc, err = _run("--input", root, "--output", out, *ARGS, "--append")
    assert rc == 0, err[-2000:]
    assert "keys file its build wrote" in err and keys_file in err, err
    m = _manifest(out)
    keys = _keys(out)
    assert set(keys) == set(keys0) | zebras
    assert sum(s["num_examples"] for s in m["splits"].values()) == len(keys0) + 3  # no key twice
    assert all(len(s["keys_sha256"]) == 64 for split in m["splits"].values() for s in split["shards"])


def test_keys_and_labels_with_unicode_line_separators_survive_the_keys_file():
    from imagerecords.format import side_files

    rows = [("a\u2028b.jpg", "c\x85d", 12, b"\x01" * 16), ("e\u2029\x1cf.jpg", "g\rh", -1, b"\x02" * 16)]
    data = side_files.format_keys(rows)
    assert data.count(b"\n") == 2  # one line per row, whatever the names hold
    assert side_files.parse_keys(data) == rows
