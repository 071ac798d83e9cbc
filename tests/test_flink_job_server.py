"""Many small builds on one Flink cluster through a job server kept up between them (Beam's
--job_endpoint): no build starts a job server of its own, and each writes the local engine's bytes."""

import filecmp
import os
import subprocess
import sys
import time

import pytest

from conftest import build, manifest_without_time, skip_unless_flink_cluster_runs
from imagerecords.format.manifest import Manifest
from test_flink_build import ARGS, JOB_TIMEOUT  # the same builds and limits as the cluster tests
from tests.support import flink

pytestmark = [pytest.mark.flink, pytest.mark.slow]



@pytest.fixture(scope="module")
def cluster():
    skip_unless_flink_cluster_runs()
    with flink.FlinkCluster.start(taskmanagers=2, slots=1, parallelism=2, worker_pools=True) as running:
        yield running


def _java_in(pid):
    """The JVMs among `pid`'s descendants (a job server FlinkRunner would start), as {pid: argv}."""
    found = {}
    for child in flink.process_tree(pid) - {pid}:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue  # ended between the listing and the read
        if os.path.basename(argv[0]) == b"java":
            found[child] = argv
    return found


def _workers_started(cluster):
    """SDK workers the cluster's pools have started so far (Beam's pool logs one line per worker)."""
    return sum(pool.log_tail(10 ** 9).count("Starting worker with command") for pool in cluster.pools)


def _build_watched(args, work):
    """Runs `imagerecords build` in a process of its own and samples its process tree until it ends.

    Returns:
        The JVMs seen below the launcher, {pid: argv}.
    """
    seen = {}
    with open(work / "launcher.err", "w") as err:
        launcher = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", *map(str, args)],
                                    stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + JOB_TIMEOUT
        try:
            while launcher.poll() is None:
                seen.update(_java_in(launcher.pid))
                assert time.monotonic() < deadline, f"the build did not end within {JOB_TIMEOUT} s"
                time.sleep(0.2)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    assert launcher.returncode == 0, (work / "launcher.err").read_text()[-3000:]
    return seen


def test_two_builds_through_one_kept_up_job_server_match_the_local_engine(cluster, image_tree, tmp_path):
    # The second build writes ArrayRecord (issue 40): the format's bytes on Flink, at no extra job's cost.
    formats = ([], ["--record_format", "array_record"])
    references = [tmp_path / f"local-{i}" for i in range(2)]
    for reference, extra in zip(references, formats):
        build(image_tree[0], reference, *ARGS, *extra)
    known = {job["jid"] for job in cluster.jobs()}
    with cluster.job_server() as server:
        args = cluster.pipeline_args(job_endpoint=server.endpoint)
        assert not any(a.startswith("--flink_job_server_jar") for a in args)
        # Both through warm pools (imagerecords' worker_pool --warm, what docs/flink.md ships for the
        # sidecar): SDK workers are threads of the pools, no interpreter starts, the same bytes. Cold
        # process pools are the cluster tests' first build (tests/test_flink_build.py); a build with
        # --environment_cache_millis started as many workers and wrote the same bytes (docs/flink.md).
        cluster.restart_worker_pools(warm=True)
        outs = []
        try:
            for i in range(2):
                out = tmp_path / f"flink-{i}"
                before = _workers_started(cluster)
                seen = _build_watched(["--input", image_tree[0], "--output", out, "--no_progress", *ARGS, *formats[i],
                                       *args], tmp_path)
                # The launcher submitted to the server that was up: it started no JVM (no job server) of its own.
                assert seen == {}, seen
                assert server.proc.poll() is None, server.log_tail()
                assert _workers_started(cluster) == before, "a warm pool started an SDK worker process"
                outs.append(out)
            assert all("SDK workers run as threads" in pool.log_tail(10 ** 9) for pool in cluster.pools)
        finally:
            cluster.restart_worker_pools()
        server_pid = server.pid
    jobs = [job for job in cluster.jobs() if job["jid"] not in known]
    assert sorted(job["state"] for job in jobs) == ["FINISHED"] * 2, jobs
    assert not os.path.exists(f"/proc/{server_pid}"), "the job server outlived its context"
    for out, reference, suffix in zip(outs, references, (".tfrecord-", ".array_record-")):
        names = [os.path.basename(p) for p in _shards(reference)]
        assert len(names) == 4 and all(suffix in n for n in names), names
        assert [os.path.basename(p) for p in _shards(out)] == names
        for a, b in zip(_shards(out), _shards(reference)):
            assert filecmp.cmp(a, b, shallow=False), b
        assert manifest_without_time(out) == manifest_without_time(reference)


def _shards(output):
    """A published dataset's shard files, of either record format, from its manifest."""
    manifest = Manifest.loads((output / "manifest.json").read_bytes())
    return [str(output / f) for f in manifest.shard_files()]
