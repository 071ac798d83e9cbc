"""The build on a real Flink cluster of two TaskManagers, each with a Beam worker pool beside it (the
EXTERNAL environment, as on Kubernetes): the shards are byte-identical to DirectRunner's, written by
both pools' SDK workers and not by the launcher; a shard writer that fails once is retried by Flink's
restart strategy; a detached submit's job publishes itself; a TaskManager lost
mid-build leaves a published dataset untouched (or the job recovers, byte-identical).

One cluster serves the module (starting it is the slow part); tests that need hooks in the SDK workers
restart the worker pools with them (tests/support/flink.py)."""

import filecmp
import hashlib
import json
import os
import resource
import subprocess
import sys
import time

import pytest

from conftest import build, manifest_without_time, shard_files, skip_unless_flink_cluster_runs
from tests.support import flink

pytestmark = [pytest.mark.flink, pytest.mark.slow]

ARGS = ["--splits", "train=0.7,validation=0.3", "--num_shards", "2", "--max_reject_fraction", "0.05"]
JOB_TIMEOUT = 900  # seconds: a job takes 1-4 min on 2 busy cores


@pytest.fixture(scope="module")
def cluster():
    skip_unless_flink_cluster_runs()
    started = time.monotonic()
    # 1 slot per TaskManager: a job of parallelism 2 must use both, so both pools get work.
    with flink.FlinkCluster.start(taskmanagers=2, slots=1, parallelism=2, worker_pools=True,
                                  restart_attempts=3) as running:
        print(f"\ncluster of 2 TaskManagers + 2 worker pools up in {time.monotonic() - started:.0f} s")
        yield running


@pytest.fixture(scope="module")
def direct(image_tree, tmp_path_factory):
    """The reference: the same build on DirectRunner."""
    out = tmp_path_factory.mktemp("direct") / "out"
    build(image_tree[0], out, *ARGS)
    return out


@pytest.fixture(scope="module")
def kept_up(cluster):
    """The pipeline arguments of the byte-identity builds after the first: through one job server
    kept up for the module (--job_endpoint, what docs/flink.md advises for many builds), so each
    saves the ~20 s of a job server's start. The first build (flink_build), the detached submit and
    the TaskManager loss keep the default path, FlinkRunner starting a job server of its own."""
    with cluster.job_server() as server:
        yield cluster.pipeline_args(job_endpoint=server.endpoint)


def assert_same_dataset(out, reference):
    names = [os.path.basename(p) for p in shard_files(out)]
    assert names == [os.path.basename(p) for p in shard_files(reference)] and len(names) == 4
    for a, b in zip(shard_files(out), shard_files(reference)):
        assert filecmp.cmp(a, b, shallow=False), a
    assert manifest_without_time(out) == manifest_without_time(reference)


def new_job(cluster, known):
    jobs = [job for job in cluster.jobs() if job["jid"] not in known]
    assert len(jobs) == 1, jobs
    return jobs[0]


@pytest.fixture(scope="module")
def flink_build(cluster, image_tree, tmp_path_factory):
    """One build on the cluster whose SDK workers log each shard's writer and fail once mid-shard
    (IMAGERECORDS_TEST_FAIL_ONCE), so that a single job (minutes on CI's 2 cores) shows both where the
    work ran and that Flink's restart strategy retries a failed shard writer."""
    from imagerecords.cli.launcher import run

    work = tmp_path_factory.mktemp("flink-build")
    writer_log, marker = work / "writers", work / "failed-once"
    cluster.restart_worker_pools({"IMAGERECORDS_WRITER_LOG": str(writer_log),
                                  "IMAGERECORDS_TEST_FAIL_ONCE": str(marker)})
    pools = {pool.pid: pool for pool in cluster.pools}
    pool_cpu = sum(flink.children_cpu_seconds(pid) for pid in pools)
    known = {job["jid"] for job in cluster.jobs()}
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    out = work / "out"
    manifest = run(["--input", str(image_tree[0]), "--output", str(out), *ARGS, *cluster.pipeline_args()])
    after, seconds = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - started
    launcher_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # The pools reap their SDK workers when a job ends, so the workers' CPU is in the pools' cutime.
    workers_cpu = sum(flink.children_cpu_seconds(pid) for pid in pools) - pool_cpu
    print(f"\nbuild on Flink: {seconds:.0f} s; launcher CPU {launcher_cpu:.1f} s, SDK workers' CPU "
          f"{workers_cpu:.1f} s")
    writers = [json.loads(p.read_text()) for p in sorted(writer_log.glob("*.json"))]
    return dict(out=out, manifest=manifest, job=new_job(cluster, known), pools=pools, writers=writers,
                marker=marker, launcher_cpu=launcher_cpu, workers_cpu=workers_cpu)


@pytest.mark.slow
def test_flink_build_is_byte_identical_to_direct_runner(flink_build, direct):
    assert flink_build["job"]["state"] == "FINISHED"
    out = flink_build["out"]
    assert_same_dataset(out, direct)
    for split in flink_build["manifest"].splits:
        for shard in split.shards:
            with open(out / shard.filename, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == shard.sha256
    assert flink_build["manifest"].num_rejected == 1


def test_shards_are_written_by_both_worker_pools_not_the_launcher(flink_build):
    writers, pools = flink_build["writers"], flink_build["pools"]
    assert sorted(w["shard"] for w in writers) == sorted(os.path.basename(p) for p in shard_files(flink_build["out"]))
    launcher_tree = flink.process_tree(os.getpid())
    for w in writers:
        # Each SDK worker is a child process of the pool beside one TaskManager.
        assert w["ppid"] in pools, (w, sorted(pools))
        assert w["pid"] != os.getpid() and w["pid"] not in launcher_tree, w
    assert {w["ppid"] for w in writers} == set(pools), "one worker pool wrote no shard"
    # The launcher only submits and waits; the images are read, checked and encoded on the workers.
    assert flink_build["launcher_cpu"] < 0.25 * flink_build["workers_cpu"], flink_build


def test_a_shard_writer_that_fails_once_is_retried_by_flink(cluster, flink_build, direct):
    """Issue 7: with a restart strategy, a shard writer failing mid-shard is retried and the output
    is byte-identical to a clean build."""
    assert flink_build["marker"].exists(), "the test hook never failed a shard writer"
    job = flink_build["job"]
    assert job["state"] == "FINISHED"
    history = cluster.rest_get(f"/jobs/{job['jid']}/exceptions").get("exceptionHistory", {}).get("entries", [])
    assert any("test hook: failing once" in (e.get("stacktrace") or "") for e in history), history
    assert_same_dataset(flink_build["out"], direct)


def _imagerecords(*args, timeout=JOB_TIMEOUT):
    return subprocess.run([sys.executable, "-m", "imagerecords", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_a_detached_submit_returns_and_its_job_publishes_itself(cluster, image_tree, direct, tmp_path):
    cluster.restart_worker_pools(warm=True)
    out = tmp_path / "out"
    known = {job["jid"] for job in cluster.jobs()}
    started = time.monotonic()
    proc = _imagerecords("build", "--input", image_tree[0], "--output", out, *ARGS, "--detached",
                         *cluster.pipeline_args())
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"\ndetached submit returned after {time.monotonic() - started:.0f} s: {proc.stdout.strip()}")
    job = new_job(cluster, known)
    assert job["state"] in ("CREATED", "INITIALIZING", "RUNNING"), job  # the launcher left a running job
    assert job["jid"] in proc.stdout and "its last step publishes the dataset" in proc.stdout
    assert not (out / "manifest.json").exists() and not shard_files(out)

    state = cluster.wait_for(f"detached job {job['jid']} ended",
                             lambda: next((j["state"] for j in cluster.jobs() if j["jid"] == job["jid"]
                                           and j["state"] in ("FINISHED", "FAILED", "CANCELED")), None), JOB_TIMEOUT, 2)
    assert state == "FINISHED"
    # No `imagerecords finish`: the job's Commit step took its launcher's lock, published, let go.
    assert (out / "manifest.json").exists() and not (out / ".imagerecords.lock").exists()
    assert not os.listdir(out / ".staging") if (out / ".staging").exists() else True
    assert_same_dataset(out, direct)


# Before the TaskManager-loss test: the cluster it leaves behind has lost a TaskManager's slot.
@pytest.mark.slow
def test_a_declared_features_build_on_flink_is_byte_identical(cluster, kept_up, tmp_path):
    """Issue 17: boxes, class lists, a float, a caption and two image features, written by the SDK
    workers on the cluster, give the local engine's bytes."""
    from imagerecords.cli.launcher import run
    from tests.support.detection import CONFIG, write_rows

    cluster.restart_worker_pools(warm=True)
    rows = write_rows(tmp_path)
    with open(tmp_path / "m.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    (tmp_path / "f.yaml").write_text(CONFIG)
    args = ["--input", str(tmp_path / "m.jsonl"), "--config", str(tmp_path / "f.yaml"), "--num_shards", "2",
            "--no_progress"]
    run([*args, "--output", str(tmp_path / "local")])
    run([*args, "--output", str(tmp_path / "flink"), *kept_up])
    local, on_flink = shard_files(tmp_path / "local"), shard_files(tmp_path / "flink")
    assert [os.path.basename(p) for p in local] == [os.path.basename(p) for p in on_flink] and len(local) == 2
    for a, b in zip(local, on_flink):
        assert filecmp.cmp(a, b, shallow=False), b
    assert manifest_without_time(tmp_path / "local") == manifest_without_time(tmp_path / "flink")


@pytest.mark.slow
def test_a_url_manifest_is_downloaded_by_the_flink_workers_into_the_local_bytes(cluster, kept_up, tmp_path):
    """Issue 31: http URLs fetched by the SDK workers on the cluster give the local engine's bytes,
    and the launcher fetches none of them."""
    from imagerecords.cli.launcher import run
    from tests.support.web import Server, jpeg

    cluster.restart_worker_pools(warm=True)
    with Server({f"p{i:02d}.jpg": jpeg(i) for i in range(10)}) as server:
        # Keys of their own: the URLs hold the server's port, which differs per run (and so would the splits).
        rows = [f"{server.url(f'/img/p{i:02d}.jpg')},{'cat' if i % 2 else 'dog'},photo{i:02d}\n" for i in range(10)]
        (tmp_path / "urls.csv").write_text("url,label,key\n" + "".join(rows) + f"{server.url('/missing')},cat,gone\n")
        args = ["--input", str(tmp_path / "urls.csv"), "--path_column", "url", "--num_shards", "2",
                "--splits", "train=0.7,validation=0.3", "--max_reject_fraction", "0.2", "--http_retries", "0",
                "--no_progress"]
        run([*args, "--output", str(tmp_path / "local")])
        assert sum(server.requests.values()) == 11
        run([*args, "--output", str(tmp_path / "flink"), *kept_up])
        assert sum(server.requests.values()) == 22  # each URL once more, by a worker
    assert_same_dataset(tmp_path / "flink", tmp_path / "local")


@pytest.mark.slow
def test_http_per_host_holds_across_the_flink_workers(cluster, kept_up, tmp_path):
    """Issue 41: --http_per_host 3 on a job of --parallelism 2 gives each shard writer 1 request at
    once to the host (of its 4 image threads): the server never sees more than the 2 writers' 2,
    however their shards overlap (one writer alone would reach 3 with the limit per process)."""
    from imagerecords.cli.launcher import run
    from tests.support.web import Server, jpeg

    cluster.restart_worker_pools(warm=True)
    n = 32
    with Server({f"p{i:02d}.jpg": jpeg(i) for i in range(n)}, delay=0.1) as server:
        # Keys of their own: the shards (and the subtasks they go to) do not move with the server's port.
        rows = [f"{server.url(f'/img/p{i:02d}.jpg')},cat,photo{i:02d}\n" for i in range(n)]
        (tmp_path / "urls.csv").write_text("url,label,key\n" + "".join(rows))
        run(["--input", str(tmp_path / "urls.csv"), "--path_column", "url", "--num_shards", "8", "--threads", "4",
             "--http_per_host", "3", "--no_progress", "--output", str(tmp_path / "out"), *kept_up])
        assert sum(server.requests.values()) == n
        assert 1 <= server.max_in_flight <= 2, server.max_in_flight


@pytest.mark.slow
def test_arrays_build_on_flink_is_byte_identical_to_direct_runner(cluster, kept_up, tmp_path):
    """An .npz input (float32 28x28 raw, uint8 labels as classes, a float64 tensor) on the cluster's
    SDK workers writes the bytes DirectRunner writes."""
    import numpy as np

    from imagerecords.cli.launcher import run

    cluster.restart_worker_pools(warm=True)
    r = np.random.default_rng(7)
    npz = tmp_path / "data.npz"
    np.savez(npz, image=r.random((200, 28, 28), dtype=np.float32), label=r.integers(0, 10, 200),
             extra=r.standard_normal((200, 2)))
    args = ["--input", str(npz), "--splits", "train=0.7,validation=0.3", "--num_shards", "2"]
    reference = tmp_path / "direct"
    run([*args, "--output", str(reference), "--no_progress", "--runner=DirectRunner"])
    out = tmp_path / "flink"
    run([*args, "--output", str(out), *kept_up])
    assert_same_dataset(out, reference)
    assert json.loads((out / "manifest.json").read_text())["features"]["extra"]["dtype"] == "float64"


@pytest.mark.slow
def test_taskmanager_lost_mid_build(cluster, image_tree, direct, tmp_path):
    """Kills TaskManager 1 and its worker pool while a shard writer beside it is paused after its first
    shard (IMAGERECORDS_TEST_PAUSE=mid_shards, on that pool only). The other TaskManager has one slot
    and the job's pipelined region needs two, so the job cannot be rescheduled: its slot request
    times out (slot.request.timeout, 15 s here), the restart attempts run out, the job fails, the
    launcher says so in one line (exit 1), and the dataset published before is byte-identical. (Were the lost TaskManager replaced, as Kubernetes does, the restart would succeed
    and the output be byte-identical; the test accepts that outcome too.) Runs last: it breaks the
    cluster."""
    out = tmp_path / "out"
    build(image_tree[0], out, *ARGS)  # the published dataset the failed rebuild must not touch
    before = {p: open(p, "rb").read() for p in shard_files(out)}
    before_manifest = (out / "manifest.json").read_bytes()
    pause_dir = tmp_path / "paused"
    pause_dir.mkdir()
    cluster.restart_worker_pools(per_pool={1: {"IMAGERECORDS_TEST_PAUSE": "mid_shards",
                                               "IMAGERECORDS_TEST_PAUSE_DIR": str(pause_dir)}})
    with open(tmp_path / "launcher.err", "w") as err:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "imagerecords", "build", "--input", str(image_tree[0]), "--output", str(out),
             *ARGS, "--overwrite", *cluster.pipeline_args()], stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            cluster.wait_for("a shard writer beside TaskManager 1 paused mid-shards",
                             lambda: (pause_dir / "mid_shards").exists() or launcher.poll() is not None, JOB_TIMEOUT, 1)
            assert launcher.poll() is None, "the build ended before the TaskManager could be killed"
            cluster.kill_taskmanager(1)
            stdout, _ = launcher.communicate(timeout=JOB_TIMEOUT)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    stderr = (tmp_path / "launcher.err").read_text()
    if launcher.returncode == 0:
        print("\nTaskManager lost: the job recovered")
        assert_same_dataset(out, direct)
        return
    print(f"\nTaskManager lost: the build failed cleanly: {stderr.strip()}")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert launcher.returncode == 1 and lines[0].startswith("imagerecords build: error: the pipeline failed"), stderr
    assert not (out / ".imagerecords.lock").exists()  # the failed build let go of the folder
    assert {p: open(p, "rb").read() for p in shard_files(out)} == before
    assert (out / "manifest.json").read_bytes() == before_manifest
