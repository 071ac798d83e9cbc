"""The flink group: a build's fixed cost on a running Flink cluster, per part, against DirectRunner and the local engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

FLINK_SIZES = (1000, 4000)
ENVIRONMENT_CACHE_MS = 60000
TAGS = ("local", "direct", "flink_job_server_per_job", "flink_kept_job_server", "flink_kept_job_server_env_cache",
        "flink_kept_job_server_env_cache_warm_pools")


def unavailable_reason() -> Optional[str]:
    """Why the project's Flink harness cannot start a cluster here (None when it can)."""
    try:
        from tests.support import flink
    except ImportError as err:
        return f"the Flink harness (tests/support/flink.py) cannot be imported: {err}"
    if not flink.java_available():
        return "no Java runtime (set JAVA_HOME or put java on PATH)"
    # Fetching takes minutes and ~230 MB: the benchmark only uses a distribution already cached.
    if not (flink.cache_dir() / "flink").is_dir():
        return f"no cached Flink distribution under {flink.cache_dir() / 'flink'} (run .ci/get_flink.sh)"
    return flink.beam_on_flink_unavailable_reason() or flink.can_isolate_hosts()


def _pool_workers_started(cluster) -> int:
    """SDK workers the cluster's pools have started so far (one log line each)."""
    return sum(pool.log_tail(10 ** 9).count("Starting worker with command") for pool in cluster.pools)


def _sdk_worker_import_s() -> float:
    """What an SDK worker pays before its first bundle: a fresh interpreter importing Beam's worker
    main and the project's transforms (the pool starts one such process per worker)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import apache_beam.runners.worker.sdk_worker_main, imagerecords.transforms"],
                   check=True, capture_output=True)
    return time.perf_counter() - start


def flink_job_parts(cluster, known: set, launched_at: float, ended_at: float) -> Dict[str, object]:
    """Splits one launcher run into parts from the Flink REST API's timestamps (epoch ms).

    Returns:
        submit_s (launcher start -> job INITIALIZING), schedule_s (INITIALIZING -> RUNNING),
        run_s (RUNNING -> FINISHED), after_s (FINISHED -> launcher exit: commit), and vertices:
        [(name, seconds)] longest first.
    """
    jobs = [job for job in cluster.jobs() if job["jid"] not in known]
    if len(jobs) != 1:
        raise RuntimeError(f"expected one new Flink job, found {jobs}")
    detail = cluster.rest_get(f"/jobs/{jobs[0]['jid']}")
    ts = detail["timestamps"]
    init, running, finished = ts["INITIALIZING"] / 1e3, ts["RUNNING"] / 1e3, ts["FINISHED"] / 1e3
    vertices = sorted(((v["name"], v["duration"] / 1e3) for v in detail["vertices"]), key=lambda v: -v[1])
    return {"jid": jobs[0]["jid"], "submit_s": init - launched_at, "schedule_s": running - init,
            "run_s": finished - running, "after_s": ended_at - finished, "vertices": vertices}


def bench_flink(res, corpus_files: Sequence[str], corpus_root: str, work: str,
                run_watched: Callable, build_cmd: Callable, sizes: Sequence[int] = FLINK_SIZES) -> None:
    """Starts the harness's cluster (2 TaskManagers, 1 slot each, a worker pool beside each) and
    times builds of `sizes` images: local engine, DirectRunner, Flink with the job server FlinkRunner
    starts per job, Flink through a job server kept up (--job_endpoint), that with
    --environment_cache_millis (one SDK worker per TaskManager kept across a job's stages), and that
    with warm worker pools (SDK workers as threads of a pool with Beam and the project imported)."""
    reason = unavailable_reason()
    if reason:
        res.notes.append(f"flink group skipped: {reason}")
        print(res.notes[-1], flush=True)
        return
    from tests.support import flink

    started = time.perf_counter()
    with flink.FlinkCluster.start(taskmanagers=2, slots=1, parallelism=2, worker_pools=True) as cluster:
        res.notes.append(f"flink: cluster of 2 TaskManagers + 2 worker pools up in {time.perf_counter() - started:.0f} s "
                         "(not part of any job's figures)")
        res.add("flink", "sdk_worker_import", _sdk_worker_import_s(), "s", higher_is_better=False)
        for n in sizes:
            root = os.path.join(work, f"flink-tree-{n}")
            for path in corpus_files[:n]:
                dst = os.path.join(root, os.path.relpath(path, corpus_root))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(path, dst)
            _one_size(res, cluster, root, n, work, run_watched, build_cmd)
            shutil.rmtree(root, ignore_errors=True)


def _one_size(res, cluster, root: str, n: int, work: str, run_watched: Callable, build_cmd: Callable) -> None:
    def out(tag: str) -> str:
        return os.path.join(work, f"flink-out-{n}-{tag}")

    wall, _ = run_watched(build_cmd(root, out("local")))
    res.add("flink", f"build{n}_local_engine", wall, "s", higher_is_better=False)
    wall, _ = run_watched(build_cmd(root, out("direct"), "--runner=DirectRunner"))
    res.add("flink", f"build{n}_direct_runner", wall, "s", higher_is_better=False)
    direct = f"flink/build{n}_direct_runner"

    def on_flink(tag: str, args: List[str]) -> None:
        known = {job["jid"] for job in cluster.jobs()}
        workers = _pool_workers_started(cluster)
        launched = time.time()
        wall, _ = run_watched(build_cmd(root, out(tag), *args))
        parts = flink_job_parts(cluster, known, launched, launched + wall)
        res.add("flink", f"build{n}_{tag}", wall, "s", higher_is_better=False, baseline=direct)
        for part in ("submit_s", "schedule_s", "run_s", "after_s"):
            res.add("flink", f"build{n}_{tag}.{part[:-2]}", parts[part], "s", higher_is_better=False)
        res.add("flink", f"build{n}_{tag}.sdk_workers_started", _pool_workers_started(cluster) - workers, "")
        res.notes.append(f"flink {tag} {n} images, job {parts['jid']}: vertices " + "; ".join(
            f"{name[:60]} {seconds:.1f} s" for name, seconds in parts["vertices"]))
        _same_bytes(out("local"), out(tag))

    on_flink("flink_job_server_per_job", cluster.pipeline_args())
    with cluster.job_server() as server:
        res.add("flink", f"build{n}_job_server_start", server.started_in, "s", higher_is_better=False)
        on_flink("flink_kept_job_server", cluster.pipeline_args(job_endpoint=server.endpoint))
        # Without it a TaskManager drops the job's SDK worker whenever no stage holds it, and
        # each of the ~50 stages that run one after another starts a fresh one.
        cached = cluster.pipeline_args(f"--environment_cache_millis={ENVIRONMENT_CACHE_MS}", job_endpoint=server.endpoint)
        on_flink("flink_kept_job_server_env_cache", cached)
        cluster.restart_worker_pools(warm=True)
        try:
            on_flink("flink_kept_job_server_env_cache_warm_pools", cached)
        finally:
            cluster.restart_worker_pools()
    for tag in TAGS:
        shutil.rmtree(out(tag), ignore_errors=True)


def _same_bytes(reference: str, out: str) -> None:
    """The Flink build's shards equal the local engine's (the byte-identity every engine keeps)."""
    import glob
    import filecmp

    mine = sorted(glob.glob(os.path.join(out, "*", "*.tfrecord-*")))
    theirs = sorted(glob.glob(os.path.join(reference, "*", "*.tfrecord-*")))
    if [os.path.basename(p) for p in mine] != [os.path.basename(p) for p in theirs] or not mine:
        raise RuntimeError(f"{out}: shard names differ from the local engine's {reference}")
    for a, b in zip(mine, theirs):
        if not filecmp.cmp(a, b, shallow=False):
            raise RuntimeError(f"{a} differs from the local engine's {b}")
