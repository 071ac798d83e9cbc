"""The commit on gs:// at cloud size, against the GCS emulator: it checks staged shards by their
object metadata (size and crc32c) and downloads none of them, it still refuses a staged object
changed after its writer reported it, and it finds version folders with a delimited listing. A
manifest over the size cap is refused by its object metadata, its bytes never downloaded.

Bytes are counted at the emulator's front proxy (every answer's body length, as sent), not guessed.
Arrays come from a seeded NumPy generator; float32 noise does not compress, so shard bytes are
about the arrays' bytes.
"""

import hashlib
import io
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from conftest import build
from imagerecords.cli import inspection
from imagerecords.format.manifest import MANIFEST, STAGING
from imagerecords.pipeline import staging
from imagerecords.pipeline.publish import commit as publish
from tests.support.gcs import GcsEmulator

pytestmark = pytest.mark.gcs

ROWS = 3000  # float32 16x16: 3 MB of shards, three times the 1 MB the commit may read


@pytest.fixture(scope="module")
def emulator(fake_gcs_server):
    with GcsEmulator(binary=fake_gcs_server) as running:
        yield running


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    r = np.random.default_rng(25)
    path = tmp_path_factory.mktemp("gcs_commit") / "noise.npz"
    np.savez(path, image=r.standard_normal((ROWS, 16, 16)).astype(np.float32),
             label=r.integers(0, 10, ROWS).astype(np.int64))
    return path


def _bucket(emulator):
    name = f"commit-{uuid.uuid4().hex[:8]}"
    emulator.create_bucket(name)
    return name


def _downloaded(requests, bucket, prefix):
    """Body bytes of the media downloads of objects under `prefix`."""
    return sum(r.size for r in requests if r.is_download and r.bucket == bucket and r.name.startswith(prefix))


def test_the_gcs_commit_reads_no_shard_back(emulator, arrays):
    bucket = _bucket(emulator)
    out = f"gs://{bucket}/ds"
    before = len(emulator.requests())
    with emulator.activated():
        manifest = build(arrays, out, "--num_shards", 4)
    requests = emulator.requests()[before:]
    shards = [s for split in manifest.splits for s in split.shards]
    total = sum(s.num_bytes for s in shards)
    read = _downloaded(requests, bucket, "ds/")
    shard_read = sum(r.size for r in requests if r.is_download and r.bucket == bucket and ".tfrecord-" in r.name)
    print(f"gs:// build of {len(shards)} shards, {total} shard bytes: it downloaded {shard_read} shard bytes "
          f"and {read} bytes under OUT in all")
    assert sum(s.count for s in shards) == ROWS and total > 3 * (1 << 20), total
    assert shard_read < (1 << 20), f"the build read {shard_read} of {total} shard bytes back"
    assert shard_read == 0 and read < (1 << 20), (shard_read, read)
    # What the metadata check let through is what the writers wrote.
    for s in shards:
        assert hashlib.sha256(emulator.download(f"{out}/{s.filename}")).hexdigest() == s.sha256

def test_a_staged_object_changed_after_its_writer_reported_it_is_refused(emulator, arrays, tmp_path):
    bucket = _bucket(emulator)
    out = f"gs://{bucket}/ds"
    release = tmp_path / "release"
    env = {**os.environ, **emulator.env(), "IMAGERECORDS_TEST_PAUSE": "before_commit",
           "IMAGERECORDS_TEST_PAUSE_DIR": str(tmp_path), "IMAGERECORDS_TEST_RELEASE": str(release)}
    proc = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", "--input", str(arrays), "--output", out,
                             "--num_shards", "2", "--no_progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "before_commit").exists():
            assert proc.poll() is None, f"the build ended (exit {proc.returncode}) before its commit: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "the build never reached its commit within 240 s"
            time.sleep(0.05)
        staged = [u for u in emulator.list(f"{out}/{STAGING}/") if ".tfrecord-00001-of-00002" in u
                  and not u.endswith(staging.STAGED_RECORD) and "/index/" not in u and "/keys/" not in u]
        assert len(staged) == 1, staged
        data = bytearray(emulator.download(staged[0]))
        data[len(data) // 2] ^= 0xFF  # the same size, one byte changed: only a checksum can tell
        emulator.upload(bytes(data), staged[0])
        release.touch()
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    lines = err.strip().splitlines()
    assert proc.returncode != 0
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "refusing to publish" in lines[0] and staged[0] in lines[0] and "crc32c" in lines[0], lines[0]
    assert f"{out}/{MANIFEST}" not in emulator.list(f"{out}/")


def _fake_version(emulator, out, shards):
    """A version folder of `shards` small objects and a manifest beside it, uploaded directly."""
    for i in range(shards):
        emulator.upload(b"x" * 100, f"{out}/v-20261201T000000Z-aaaaaa/ds-train.tfrecord-{i:05d}-of-{shards:05d}")
    emulator.upload(b"{}", f"{out}/{MANIFEST}")


def test_version_folders_are_found_without_listing_the_shards(emulator):
    bucket = _bucket(emulator)
    listed = {}
    for shards in (4, 60):
        out = f"gs://{bucket}/out{shards:03d}"
        _fake_version(emulator, out, shards)
        with emulator.activated():
            before = len(emulator.requests())
            versions = publish._versions_in(out)
            names = inspection._names(out)
            requests = emulator.requests()[before:]
        assert versions == ["v-20261201T000000Z-aaaaaa"]
        assert names == [MANIFEST, "v-20261201T000000Z-aaaaaa"]
        listings = [r for r in requests if r.is_listing]
        assert [r.query.get("delimiter") for r in listings] == ["/", "/"], [r.query for r in listings]
        listed[shards] = sum(r.size for r in listings)
    print(f"version listing bytes: {listed[4]} with 4 shards, {listed[60]} with 60 shards")
    # The same answer but for the objects' timestamps (whose text length varies by a few bytes);
    # listing the 56 more shards would add about 500 bytes each.
    assert abs(listed[60] - listed[4]) < 64, listed


def test_a_manifest_over_the_cap_is_refused_by_its_metadata_without_a_download(emulator, monkeypatch, capsys):
    from imagerecords.cli.main import main
    from imagerecords.format import access
    from imagerecords.format import manifest as manifest_lib
    from imagerecords.pipeline import storage

    bucket = _bucket(emulator)
    out = f"gs://{bucket}/out"
    emulator.upload(b"{" + b" " * 99, f"{out}/{MANIFEST}")
    monkeypatch.setattr(manifest_lib, "MAX_MANIFEST_BYTES", 10)  # 3 GiB objects are not uploaded in a test
    said = f"{out}/{MANIFEST}: 100 bytes, larger than any manifest.json can be (at most 10)"
    with emulator.activated():
        before = len(emulator.requests())
        code = main(["verify", out])  # the builder's storage (Beam's GCS file system)
        err = capsys.readouterr().err
        with pytest.raises(manifest_lib.ManifestError) as refused:  # the torch and Grain readers' files
            access.load_manifest(out)
        with pytest.raises(FileNotFoundError):
            storage.size(f"{out}/absent.json")
        requests = emulator.requests()[before:]
    assert code == 3 and err.count("\n") == 1 and said in err, err
    assert str(refused.value).startswith(said)
    assert _downloaded(requests, bucket, "out/") == 0


def test_a_gcs_append_makes_its_folder_whole_without_moving_bytes_through_the_launcher(emulator, tmp_path):
    import shutil

    from imagerecords.format import records
    from imagerecords.pipeline import example_images

    bucket = _bucket(emulator)
    out = f"gs://{bucket}/ds"
    root = tmp_path / "images"
    files = example_images.write_tree(str(root), per_class=6, broken=False)
    args = ("--splits", "train=0.7,validation=0.3", "--num_shards", 2)
    with emulator.activated():
        first = build(root, out, *args)
        os.makedirs(root / "zebra")
        some = sorted(files)[0]
        for i in range(3):
            shutil.copy(root / some / files[some][i], root / "zebra" / f"z{i}.jpg")
        before = len(emulator.requests())
        manifest = build(root, out, *args, "--append", "--version_name", "week2")
    requests = emulator.requests()[before:]
    shard_read = sum(r.size for r in requests if r.is_download and r.bucket == bucket and ".tfrecord-" in r.name
                     and "/keys/" not in r.name and "/hashes/" not in r.name)  # side files, read by design
    old_bytes = sum(s.num_bytes for split in first.splits for s in split.shards)
    print(f"gs:// append onto {old_bytes} shard bytes: {shard_read} shard bytes downloaded")
    assert shard_read == 0, f"the append read {shard_read} shard bytes through the launcher"
    listed = {u[len(f"{out}/"):] for u in emulator.list(f"{out}/week2/")}
    assert sum(split.num_examples for split in manifest.splits) == \
        sum(split.num_examples for split in first.splits) + 3
    for split in manifest.splits:
        assert all(s.filename.startswith("week2/") and s.filename in listed for s in split.shards)
        count = 0
        for s in split.shards:
            data = emulator.download(f"{out}/{s.filename}")
            assert hashlib.sha256(data).hexdigest() == s.sha256
            count += sum(1 for _ in records.read_records(io.BytesIO(data), s.filename))
        assert count == split.num_examples, split.name
