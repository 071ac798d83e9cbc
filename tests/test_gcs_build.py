"""gs:// for real: images read from and the dataset written to a GCS emulator, byte-identical to
a local build of the same images."""

import json
import os
import uuid

import pytest

from conftest import build, manifest_without_time, shard_files, without_version
from tests.support.gcs import GcsEmulator

pytestmark = pytest.mark.gcs


@pytest.fixture(scope="module")
def emulator(fake_gcs_server):
    with GcsEmulator(binary=fake_gcs_server) as running:
        yield running


def test_build_from_gcs_to_gcs_matches_local_build(emulator, image_tree, tmp_path):
    root, files = image_tree
    bucket = f"images-{uuid.uuid4().hex[:8]}"
    emulator.create_bucket(bucket)
    emulator.upload_tree(root, f"gs://{bucket}/images")
    args = ("--splits", "train=0.7,validation=0.3", "--num_shards", 2, "--max_reject_fraction", 0.05)
    local = tmp_path / "local"
    build(root, local, *args)
    with emulator.activated():
        # Two worker processes: they inherit the emulator settings from the environment.
        manifest = build(f"gs://{bucket}/images", f"gs://{bucket}/dataset", *args, workers=2)
    remote = sorted(emulator.list(f"gs://{bucket}/dataset/"))
    names = sorted(u[len(f"gs://{bucket}/dataset/"):] for u in remote)
    want = sorted(f"{manifest.version}/{os.path.basename(p)}" for p in shard_files(local)) + [
        "dataset_info.json", "duplicates.jsonl", "errors.jsonl", "features.json", "label.labels.txt", "manifest.json"]
    local_version = os.path.dirname(shard_files(local)[0])
    # Each shard's keys file and perceptual hashes file (what --append reads).
    sides = [f"{folder}/{name}" for folder in ("keys", "hashes")
             for name in sorted(os.listdir(os.path.join(local_version, folder)))]
    want += [f"{manifest.version}/{name}" for name in sides]
    assert names == sorted(want)
    for name in sides:
        with open(os.path.join(local_version, name), "rb") as f:
            assert emulator.download(f"gs://{bucket}/dataset/{manifest.version}/{name}") == f.read(), name
    for path in shard_files(local):
        with open(path, "rb") as f:
            assert emulator.download(f"gs://{bucket}/dataset/{manifest.version}/{os.path.basename(path)}") == f.read()
    remote_manifest = without_version(json.loads(emulator.download(f"gs://{bucket}/dataset/manifest.json")))
    assert remote_manifest == manifest_without_time(local)
    assert manifest.num_rejected == 1
    errors = [json.loads(line) for line in emulator.download(f"gs://{bucket}/dataset/errors.jsonl").splitlines()]
    assert errors[0]["uri"] == f"gs://{bucket}/images/circle/truncated.jpg"
