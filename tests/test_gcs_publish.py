"""The publish protocol on gs:// (rename is copy + delete there), against a real GCS emulator:
the lock's create-if-absent, a failed rebuild over a published dataset, and kills before and inside
the commit."""

import json
import os
import subprocess
import sys
import uuid

import pytest

from conftest import build
from imagerecords.format.manifest import LOCK, MANIFEST, STAGING
from imagerecords.pipeline import errors
from imagerecords.pipeline import lock as output_lock
from tests.support.gcs import GcsEmulator
from test_failures import ARGS, kill_at, without_created  # ARGS[:-1]: without --no_progress, which build() adds

pytestmark = pytest.mark.gcs


@pytest.fixture(scope="module")
def emulator(fake_gcs_server):
    with GcsEmulator(binary=fake_gcs_server) as running:
        yield running


@pytest.fixture(scope="module")
def published(emulator, image_tree, tmp_path_factory):
    """A local clean build (the expected bytes), and a bucket holding the images."""
    root, _ = image_tree
    local = tmp_path_factory.mktemp("gcs_publish") / "clean"
    build(root, local, *ARGS[:-1])
    bucket = f"pub-{uuid.uuid4().hex[:8]}"
    emulator.create_bucket(bucket)
    emulator.upload_tree(root, f"gs://{bucket}/images")
    return root, local, bucket


def visible(emulator, folder):
    """{path: bytes} of the objects under `folder` that a reader or a glob sees (version folders
    included; staging and the lock are hidden)."""
    out = {}
    for uri in emulator.list(folder.rstrip("/") + "/"):
        name = uri[len(folder.rstrip("/")) + 1:]
        if not name.startswith("."):
            out[name] = emulator.download(uri)
    return out


def _current(files):
    """The published version's files and the metadata, with the version folder's name masked."""
    version = json.loads(files[MANIFEST]).get("version", "") if MANIFEST in files else ""
    out = {}
    for name, data in files.items():
        if name.startswith("v-") and not name.startswith(version + "/"):
            continue  # an older version kept for readers
        out[name.replace(version, "v-<build>")] = data.replace(version.encode(), b"v-<build>") if version else data
    return out


def same_as_local(emulator, folder, local):
    got = _current(visible(emulator, folder))
    want = {}
    for dirpath, _, names in os.walk(local):
        for n in names:
            path = os.path.join(dirpath, n)
            want[os.path.relpath(path, local)] = open(path, "rb").read()
    want = _current(want)
    assert sorted(got) == sorted(want)
    for name in got:
        if name == MANIFEST:
            assert without_created(got[name]) == without_created(want[name])
        elif name == "errors.jsonl":  # the same rows; only the uri's root differs
            strip = lambda data: [{k: v for k, v in json.loads(line).items() if k != "uri"} for line in data.splitlines()]
            assert strip(got[name]) == strip(want[name]) != []
        elif name == "duplicates.jsonl":  # near-duplicate members name their input's uri: only its root differs
            def rows(data):
                out = []
                for line in data.splitlines():
                    row = json.loads(line)
                    for m in row.get("members", []) if row.get("kind") == "near" else []:
                        m.pop("uri", None)
                    out.append(row)
                return out
            assert rows(got[name]) == rows(want[name])
        else:
            assert got[name] == want[name], name


def test_lock_on_gcs_is_create_if_absent(emulator, published):
    _, _, bucket = published
    folder = f"gs://{bucket}/locked"
    with emulator.activated():
        first = output_lock.OutputLock(folder, "one").acquire()
        with pytest.raises(errors.LockHeld, match="locked by build one"):
            output_lock.OutputLock(folder, "two").acquire()
        first.release()
        output_lock.OutputLock(folder, "three").acquire().release()
    assert emulator.list(f"{folder}/") == []


def test_failed_rebuild_and_kills_leave_the_gcs_dataset_whole(emulator, published, tmp_path):
    root, local, bucket = published
    images, out = f"gs://{bucket}/images", f"gs://{bucket}/ds"
    with emulator.activated():
        build(images, out, *ARGS[:-1], "--seed", "5")
        before = visible(emulator, out)
        assert MANIFEST in before
        # Over budget: the published dataset stays byte-identical.
        with pytest.raises(errors.BudgetExceeded):
            build(images, out, *ARGS[:-1], "--overwrite", "--max_reject_fraction", "0")
        assert visible(emulator, out) == before
        assert not emulator.list(f"{out}/{LOCK}")
    env = {**os.environ, **emulator.env()}
    # Killed with shards staged: nothing visible changed.
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        kill_at("mid_shards", images, out, str(tmp_path), "--overwrite")
        assert visible(emulator, out) == before
        staged = [u for u in emulator.list(f"{out}/{STAGING}/") if u.endswith(".staged.json")]
        assert staged
        # --resume takes the killed build's complete shards over (moved within the bucket).
        resumed = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", images, "--output", out,
                                  *ARGS, "--overwrite", "--resume"], capture_output=True, text=True, env=env,
                                 timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        assert f"resumed: {len(staged)} of " in resumed.stderr, resumed.stderr
        same_as_local(emulator, out, local)
        published_now = visible(emulator, out)
        # Killed inside the commit: the previous dataset stays published, every object of it the
        # same; `finish` completes the commit, identical to a local build.
        kill_at("in_commit", images, out, str(tmp_path), "--overwrite", "--seed", "9")
        now = visible(emulator, out)
        assert {k: now.get(k) for k in published_now} == published_now
        done = subprocess.run([sys.executable, "-m", "imagerecords", "finish", out], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        assert json.loads(visible(emulator, out)[MANIFEST])["seed"] == 9
        # The third build in: the oldest version (seed 5) is gone, two remain (--keep_versions 2).
        folders = {n.split("/", 1)[0] for n in visible(emulator, out) if n.startswith("v-")}
        assert len(folders) == 2, folders
        done = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", images, "--output", out,
                               *ARGS, "--overwrite"], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
    finally:
        os.environ.clear()
        os.environ.update(saved)
    same_as_local(emulator, out, local)
    assert not emulator.list(f"{out}/{STAGING}/") and not emulator.list(f"{out}/{LOCK}")


def test_a_columnar_build_on_gcs_publishes_what_a_local_one_does(emulator, published, tmp_path, monkeypatch):
    from imagerecords.cli import inspection

    root, _, bucket = published
    monkeypatch.setenv("IMAGERECORDS_COLUMNS_FROM", "1")  # every split as columns, with a side file
    local = tmp_path / "columns"
    build(root, local, *ARGS[:-1])
    images, out = f"gs://{bucket}/images", f"gs://{bucket}/columns"
    with emulator.activated():
        build(images, out, *ARGS[:-1])
        same_as_local(emulator, out, local)
        files = visible(emulator, out)
        assert json.loads(files[MANIFEST])["format_version"] == 3
        assert sum(name.endswith(".shards.jsonl") for name in files) == 2
        assert inspection.verify(out, records=True)[0] == []
