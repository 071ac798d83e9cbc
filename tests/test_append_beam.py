"""--append on Beam: DirectRunner writes the local engine's delta bytes, and gs:// outputs append.

Fixtures: example_images.write_tree makes a small class-folder tree of real images; each delta
copies files into it (new classes, a repeated key, a changed file under an old key).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from conftest import build
from imagerecords.pipeline import example_images

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ("--splits", "train=0.7,validation=0.3", "--num_shards", 2, "--max_reject_fraction", 0.5)


def _manifest(out):
    with open(os.path.join(str(out), "manifest.json")) as f:
        return json.load(f)


def _folders(manifest):
    """The version folders the manifest lists or keeps, oldest first (each named by its build's id)."""
    folders = []
    for split in sorted(manifest["splits"].values(), key=lambda s: len(s["shards"])):
        for shard in split["shards"]:
            folder = shard["filename"].split("/")[0]
            if folder not in folders:
                folders.append(folder)
    # An appended version lists only its own folder; the kept earlier ones are named in previous_versions.
    folders.extend(v for v in manifest.get("previous_versions", ()) if v not in folders)
    return sorted(folders)  # v-<UTC time>-...: sorted names are build order


def _renamed(text, manifest):
    """`text` with each version folder named by its place in the append history instead of its build id."""
    for i, folder in enumerate(_folders(manifest)):
        text = text.replace(folder, f"<folder {i}>")
    return text


def _normalized(manifest):
    """The manifest without the build's time and ids: what two engines must agree on."""
    kept = {k: v for k, v in manifest.items() if k not in ("created", "previous_versions", "listed_folders")}
    # Which build wrote each run of shards: the runs must agree, the ids are each build's own.
    kept["shard_builds"] = {split: [first for first, _ in runs] for split, runs in kept.get("shard_builds", {}).items()}
    return json.loads(_renamed(json.dumps(kept, sort_keys=True), manifest))


def _delta_files(out):
    """{path: bytes} of every file (shards, index and keys files) in the version folder the manifest publishes."""
    version = _manifest(out)["version"]
    folder = os.path.join(str(out), version)
    found = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return dict(sorted(found.items()))


def _reports(out):
    """duplicates.jsonl, errors.jsonl and the label files, version folders renamed as in _normalized."""
    manifest = _manifest(out)
    found = {}
    for name in ("duplicates.jsonl", "errors.jsonl", "label.labels.txt", "features.json"):
        path = os.path.join(str(out), name)
        found[name] = _renamed(open(path).read(), manifest) if os.path.exists(path) else None
    return found


@pytest.mark.slow
def test_direct_runner_and_local_engine_write_byte_identical_deltas(tmp_path):
    root = tmp_path / "in"
    local, direct = tmp_path / "local", tmp_path / "direct"
    files = example_images.write_tree(str(root), per_class=4, broken=False)
    classes = sorted(files)

    def both(*extra):
        build(root, local, *ARGS, *extra)
        build(root, direct, *ARGS, *extra, workers=2)
        assert _delta_files(local) == _delta_files(direct)  # every shard and index file, byte for byte
        assert _normalized(_manifest(local)) == _normalized(_manifest(direct))
        assert _reports(local) == _reports(direct)
        return _manifest(local)

    first = both()
    # Delta 1: two new classes, one new image in an old class; every old key repeats.
    for cls in ("aardvark", "zebra"):
        os.makedirs(root / cls)
        shutil.copy(root / classes[0] / files[classes[0]][0], root / cls / f"{cls}1.jpg")
    shutil.copy(root / classes[1] / files[classes[1]][0], root / classes[1] / "new1.jpg")
    m1 = both("--append")
    assert m1["label_names"] == first["label_names"] + ["aardvark", "zebra"]
    assert sum(s["num_examples"] for s in m1["splits"].values()) == 4 * len(classes) + 3
    # Delta 2: one new key only.
    shutil.copy(root / classes[2] / files[classes[2]][1], root / classes[2] / "new2.png")
    both("--append")
    # Delta 3: a changed file under an old key (an errors.jsonl row on both engines) and a new image.
    changed = f"{classes[0]}/{files[classes[0]][0]}"
    shutil.copy(root / classes[3] / files[classes[3]][0], root / changed)
    shutil.copy(root / classes[3] / files[classes[3]][2], root / classes[3] / "new3.jpg")
    m3 = both("--append")
    assert sum(s["num_examples"] for s in m3["splits"].values()) == 4 * len(classes) + 5
    rows = [json.loads(line) for line in open(local / "errors.jsonl")]
    assert [r["key"] for r in rows] == [changed] and "rebuild with --overwrite" in rows[0]["reason"]
    # One whole version folder, its shard runs written by four builds: the first and three deltas.
    listed = {s["filename"].split("/")[0] for split in m3["splits"].values() for s in split["shards"]}
    assert listed == {m3["version"]}
    assert len({build for runs in m3["shard_builds"].values() for _, build in runs}) == 4


@pytest.mark.slow
def test_a_manifest_dataset_with_class_lists_appends_alike_on_both_engines(tmp_path):
    """A JSONL manifest with a split column, keys and a class_list feature: the grown class and tag
    vocabularies and the delta's bytes agree between the engines."""
    root = tmp_path / "in"
    files = example_images.write_tree(str(root), per_class=3, broken=False)
    paths = [f"{c}/{n}" for c in sorted(files) for n in files[c]]
    rows = [{"path": f"in/{p}", "label": p.split("/")[0], "key": f"k{i}", "split": "train" if i % 3 else "test",
             "tags": ["sky", "tree"][: 1 + i % 2]} for i, p in enumerate(paths)]
    jsonl = tmp_path / "list.jsonl"
    args = ("--num_shards", 1, "--feature", "tags=class_list", "--max_reject_fraction", 0.5)

    def both(rows):
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for out, workers in ((tmp_path / "local", None), (tmp_path / "direct", 1)):
            build(jsonl, out, *args, *(("--append",) if (out / "manifest.json").exists() else ()), workers=workers)
        assert _delta_files(tmp_path / "local") == _delta_files(tmp_path / "direct")
        assert _normalized(_manifest(tmp_path / "local")) == _normalized(_manifest(tmp_path / "direct"))
        assert _reports(tmp_path / "local") == _reports(tmp_path / "direct")
        return _manifest(tmp_path / "local")

    first = both(rows)
    grown = both(rows + [{"path": f"in/{paths[0]}", "label": "newclass", "key": "k-new", "split": "test",
                          "tags": ["cloud", "sky"]}])
    assert grown["label_names"] == first["label_names"] + ["newclass"]
    assert grown["features"]["tags"]["names"] == first["features"]["tags"]["names"] + ["cloud"]
    assert (tmp_path / "direct" / "tags.labels.txt").read_text().splitlines() == ["sky", "tree", "cloud"]
    assert grown["splits"]["test"]["num_examples"] == first["splits"]["test"]["num_examples"] + 1


@pytest.mark.slow
def test_append_refuses_a_detached_or_template_job_in_one_line(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    example_images.write_tree(str(root), per_class=2, broken=False)
    build(root, out, *ARGS)
    before = open(out / "manifest.json", "rb").read()
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", str(out),
                           *map(str, ARGS), "--append", "--runner=DataflowRunner",
                           f"--template_location={tmp_path / 'template'}", "--no_progress"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--append needs the build to end in this process" in proc.stderr
    assert open(out / "manifest.json", "rb").read() == before


def test_write_dataset_refuses_append_in_one_line(tmp_path):
    from imagerecords.transforms import WriteDataset

    out = tmp_path / "out"
    with pytest.raises(ValueError) as caught:
        WriteDataset(str(out), append=True)
    assert str(caught.value).count("\n") == 0 and "append is not supported here" in str(caught.value)
    assert not out.exists()


def _objects(emulator, prefix):
    """{uri: (generation, md5)} of every object under `prefix`."""
    from tests.support.gcs import parse_gs_uri

    bucket, name = parse_gs_uri(prefix)
    return {f"gs://{bucket}/{b.name}": (b.generation, b.md5_hash)
            for b in emulator.client.list_blobs(bucket, prefix=name)}


@pytest.mark.slow
@pytest.mark.gcs
def test_append_to_a_gcs_dataset(fake_gcs_server, tmp_path):
    from tests.support.gcs import GcsEmulator

    root = tmp_path / "in"
    files = example_images.write_tree(str(root), per_class=3, broken=False)
    classes = sorted(files)
    with GcsEmulator(binary=fake_gcs_server) as emulator:
        bucket = f"append-{uuid.uuid4().hex[:8]}"
        emulator.create_bucket(bucket)
        emulator.upload_tree(root, f"gs://{bucket}/images")
        images, out = f"gs://{bucket}/images", f"gs://{bucket}/ds"
        with emulator.activated():
            first = build(images, out, *ARGS, workers=1)
        old = _objects(emulator, out + "/" + first.version + "/")
        assert old, "the first build published no objects"
        new = {f"{classes[0]}/more.jpg": root / classes[1] / files[classes[1]][0],
               "okapi/o1.png": root / classes[2] / files[classes[2]][0]}
        for key, source in new.items():
            emulator.upload(str(source), f"{images}/{key}")
        with emulator.activated():
            grown = build(images, out, *ARGS, "--append", workers=1)
        assert grown.version != first.version
        assert _objects(emulator, out + "/" + first.version + "/") == old  # same generation and md5: untouched
        assert list(grown.label_names) == list(first.label_names) + ["okapi"]
        code = textwrap.dedent(f"""
            import json
            from imagerecords.reader.typed import as_dataset
            keys = {{}}
            for split in ("train", "validation"):
                for ex in as_dataset({out!r}, split):
                    keys.setdefault(ex["image/filename"].numpy().decode(), []).append(int(ex["label"].numpy()))
            print(json.dumps(keys))
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                              env={**os.environ, **emulator.env(), "PYTHONPATH": ROOT})
        assert proc.returncode == 0, proc.stderr[-2000:]
        keys = json.loads(proc.stdout.splitlines()[-1])
    want = {f"{c}/{n}" for c in classes for n in files[c]} | set(new)
    assert set(keys) == want and all(len(v) == 1 for v in keys.values())  # old + new, every key once
    assert keys["okapi/o1.png"] == [len(first.label_names)]
    assert sum(s.num_examples for s in grown.splits) == len(want)
