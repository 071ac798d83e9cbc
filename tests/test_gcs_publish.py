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
from imagerecords import errors, publish
from imagerecords.manifest import LOCK, MANIFEST, STAGING
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
    """{name: bytes} of the objects directly in `folder` that a reader or a glob sees."""
    out = {}
    for uri in emulator.list(folder.rstrip("/") + "/"):
        name = uri[len(folder.rstrip("/")) + 1:]
        if "/" not in name and not name.startswith("."):
            out[name] = emulator.download(uri)
    return out


def same_as_local(emulator, folder, local):
    got = visible(emulator, folder)
    want = {n: open(os.path.join(local, n), "rb").read() for n in os.listdir(local)}
    assert sorted(got) == sorted(want)
    for name in got:
        if name == MANIFEST:
            assert without_created(got[name]) == without_created(want[name])
        elif name == "errors.jsonl":  # the same rows; only the uri's root differs
            strip = lambda data: [{k: v for k, v in json.loads(line).items() if k != "uri"} for line in data.splitlines()]
            assert strip(got[name]) == strip(want[name]) != []
        else:
            assert got[name] == want[name], name


def test_lock_on_gcs_is_create_if_absent(emulator, published):
    _, _, bucket = published
    folder = f"gs://{bucket}/locked"
    with emulator.activated():
        first = publish.OutputLock(folder, "one").acquire()
        with pytest.raises(errors.LockHeld, match="locked by build one"):
            publish.OutputLock(folder, "two").acquire()
        first.release()
        publish.OutputLock(folder, "three").acquire().release()
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
        assert emulator.list(f"{out}/{STAGING}/")
        # Killed inside the commit: no manifest; `finish` completes it, identical to a local build.
        kill_at("in_commit", images, out, str(tmp_path), "--overwrite")
        assert MANIFEST not in visible(emulator, out)
        done = subprocess.run([sys.executable, "-m", "imagerecords", "finish", out], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr
    finally:
        os.environ.clear()
        os.environ.update(saved)
    same_as_local(emulator, out, local)
    assert not emulator.list(f"{out}/{STAGING}/") and not emulator.list(f"{out}/{LOCK}")
