"""The build on a real Flink cluster (JobManager + TaskManager processes, Beam's Flink job server,
LOOPBACK SDK harness): byte-identical to the DirectRunner build, sha256 as in the manifest."""

import filecmp
import hashlib
import os

import pytest

from conftest import build, manifest_without_time, shard_files, skip_unless_ci
from tests.support import flink

pytestmark = [pytest.mark.flink, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    if not flink.java_available():
        skip_unless_ci("no Java runtime: the Flink tests need Java 11+ on PATH or JAVA_HOME")
    reason = flink.beam_on_flink_unavailable_reason()
    if reason:
        skip_unless_ci(reason)
    with flink.FlinkCluster.start() as running:
        yield running


def test_flink_build_is_byte_identical_to_direct_runner(cluster, image_tree, tmp_path):
    from imagerecords.pipeline import run

    root, _ = image_tree
    args = ["--splits", "train=0.7,validation=0.3", "--num_shards", "2", "--max_reject_fraction", "0.05"]
    on_flink = tmp_path / "flink"
    manifest = run(["--input", str(root), "--output", str(on_flink), *args, *cluster.pipeline_args()])
    finished = cluster.finished_jobs()
    assert len(finished) == 1 and finished[0]["tasks"]["failed"] == 0, cluster.jobs()

    direct = tmp_path / "direct"
    build(root, direct, *args)
    names = [os.path.basename(p) for p in shard_files(on_flink)]
    assert names == [os.path.basename(p) for p in shard_files(direct)] and len(names) == 4
    for a, b in zip(shard_files(on_flink), shard_files(direct)):
        assert filecmp.cmp(a, b, shallow=False), a
    assert manifest_without_time(on_flink) == manifest_without_time(direct)
    for split in manifest.splits:
        for shard in split.shards:
            with open(on_flink / shard.filename, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == shard.sha256
    assert manifest.num_rejected == 1
