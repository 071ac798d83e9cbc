"""A throw-away standalone Apache Flink cluster (a JobManager, TaskManagers, and a Beam worker pool beside
each TaskManager) for FlinkRunner tests."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Set

from tests.support.processes import cache_dir, exclusive_lock, free_port, terminate_group

REPO_ROOT = Path(__file__).resolve().parents[2]
GET_FLINK_SCRIPT = REPO_ROOT / ".ci" / "get_flink.sh"
"""Downloads and caches the Flink distribution and Beam's Flink job server (a launcher jar over
a Maven-resolved classpath)."""

# .ci/get_flink.sh exits with this status when the Flink distribution is ready but Beam's Flink
# job server could not be obtained (the cluster still starts; Beam pipelines cannot run on it).
_EXIT_NO_JOB_SERVER_JAR = 2

_PROBE_JAVA = textwrap.dedent("""\
    import org.apache.flink.api.common.RuntimeExecutionMode;
    import org.apache.flink.api.common.typeinfo.Types;
    import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

    /** Sums 2 * n for n in [0, 99] on the cluster and prints the result. */
    public class ImagerecordsProbe {
      public static void main(String[] args) throws Exception {
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setRuntimeMode(RuntimeExecutionMode.BATCH);
        long total = env.fromSequence(0, 99).map(n -> n * 2).returns(Types.LONG)
            .executeAndCollect(1000).stream().mapToLong(Long::longValue).sum();
        System.out.println("PROBE_SUM=" + total);
      }
    }
    """)


def java_available() -> bool:
    """Tells whether a Java runtime can be started (via ``JAVA_HOME`` or ``PATH``).

    Returns:
        True when ``java -version`` succeeds.
    """
    java = _java_executable()
    if java is None:
        return False
    try:
        return subprocess.run([java, "-version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _java_executable() -> Optional[str]:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    return shutil.which("java")


@dataclasses.dataclass(frozen=True)
class FlinkArtifacts:
    """The cached files a cluster is started from, as reported by ``.ci/get_flink.sh``.

    Attributes:
        flink_home: Unpacked Flink distribution (bin/, conf/, lib/, opt/, plugins/).
        flink_version: Full Flink version, e.g. ``1.19.3``.
        beam_version: Beam version the job server was resolved for (that of the Python SDK
            running the tests).
        job_server_jar: A jar that ``java -jar`` runs as Beam's Flink job server (the
            launcher jar whose manifest lists the resolved classpath, or a jar given with
            ``BEAM_FLINK_JOB_SERVER_JAR``), or None when none could be obtained.
        job_server_classpath: File holding the job server's resolved classpath on one
            ``:``-separated line, or None.
    """

    flink_home: Path
    flink_version: str
    beam_version: str
    job_server_jar: Optional[Path]
    job_server_classpath: Optional[Path] = None

    @property
    def flink_minor(self) -> str:
        """The ``major.minor`` Flink version, as Beam's ``--flink_version`` expects it."""
        return ".".join(self.flink_version.split(".")[:2])


_artifacts_cache: Optional[FlinkArtifacts] = None


def get_artifacts(refresh: bool = False) -> FlinkArtifacts:
    """Runs ``.ci/get_flink.sh`` (fast once cached) and returns what it reported.

    The script resolves the job server for the ``apache-beam`` of the running interpreter
    (``PYTHON=sys.executable``), so SDK and job server versions match. The result is memoised for
    the life of the process.

    Args:
        refresh: Run the script again even if an earlier call succeeded.

    Returns:
        The cached Flink distribution and, where available, Beam's Flink job server.

    Raises:
        RuntimeError: The script failed to provide a Flink distribution.
    """
    global _artifacts_cache
    if _artifacts_cache is not None and not refresh:
        return _artifacts_cache
    env = dict(os.environ)
    env.setdefault("PYTHON", sys.executable)
    # Two runs fetching at once would download into, and replace, the same cache folders.
    with exclusive_lock(cache_dir() / "get_flink.lock", 1800, "fetching Flink"):
        proc = subprocess.run(["bash", str(GET_FLINK_SCRIPT)], capture_output=True, text=True,
                              timeout=1800, env=env, stdin=subprocess.DEVNULL)
    if proc.returncode not in (0, _EXIT_NO_JOB_SERVER_JAR):
        raise RuntimeError(f"{GET_FLINK_SCRIPT} failed with exit status {proc.returncode}:\n"
                           f"{proc.stderr[-4000:]}")
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    jar = values.get("BEAM_FLINK_JOB_SERVER_JAR", "")
    classpath = values.get("BEAM_FLINK_JOB_SERVER_CLASSPATH", "")
    _artifacts_cache = FlinkArtifacts(
        flink_home=Path(values["FLINK_HOME"]),
        flink_version=values["FLINK_VERSION"],
        beam_version=values["BEAM_VERSION"],
        job_server_jar=Path(jar) if jar else None,
        job_server_classpath=Path(classpath) if classpath else None,
    )
    return _artifacts_cache


def flink_unavailable_reason() -> Optional[str]:
    """Says in one line why the Flink distribution cannot be had here (None when it can), naming
    the command that fetches it; fetches it into the cache on first use (about 230 MB)."""
    try:
        get_artifacts()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        cause = " ".join((lines[-1] if lines else type(err).__name__).split())[:300]
        return f"the Flink distribution could not be fetched ({cause}); run .ci/get_flink.sh"
    return None


def beam_on_flink_unavailable_reason() -> Optional[str]:
    """Says why Beam pipelines cannot run on a local Flink cluster here, for ``pytest.skip``.

    Returns:
        None when Java, the Flink distribution and Beam's Flink job server are all available;
        otherwise a one-line reason.
    """
    if not java_available():
        return "no Java runtime (set JAVA_HOME or put java on PATH)"
    reason = flink_unavailable_reason()
    if reason:
        return reason
    artifacts = get_artifacts()
    if artifacts.job_server_jar is None:
        return (f"org.apache.beam:beam-runners-flink-{artifacts.flink_minor}:"
                f"{artifacts.beam_version} (Beam's Flink job server) could not be resolved with "
                "Maven; set BEAM_FLINK_JOB_SERVER_JAR to a job-server jar")
    return None


WORKER_POOL_HOST = "imagerecords-workers"
"""The host name in ``--environment_config`` on a cluster with worker pools. On Kubernetes the pool
is a sidecar in the TaskManager's pod and the config is ``localhost:PORT``; here every "pod" shares
one network namespace, so each TaskManager runs in a mount namespace of its own whose /etc/hosts
maps this name to the loopback address of *its* worker pool (127.0.0.11, 127.0.0.12, ...)."""



def can_isolate_hosts() -> Optional[str]:
    """Says why TaskManagers cannot get a private /etc/hosts here (None when they can).

    A cluster with worker pools needs ``unshare --mount`` and ``mount --bind`` (root, or a user
    namespace that allows them).
    """
    if shutil.which("unshare") is None:
        return "no `unshare` on PATH (util-linux)"
    with tempfile.NamedTemporaryFile("w", suffix=".hosts") as hosts:
        hosts.write(f"127.0.0.11 {WORKER_POOL_HOST}\n")
        hosts.flush()
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f'mount --bind "$1" /etc/hosts && getent hosts {WORKER_POOL_HOST}', "sh", hosts.name],
            capture_output=True, text=True, timeout=30)
    if proc.returncode != 0 or "127.0.0.11" not in proc.stdout:
        return f"cannot bind-mount a private /etc/hosts for a TaskManager: {proc.stderr.strip()[:200]}"
    return None


def process_tree(pid: int) -> Set[int]:
    """Returns ``pid`` and every live descendant of it, from /proc."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in tree:
            tree.add(current)
            todo.extend(children.get(current, ()))
    return tree


def children_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of the children ``pid`` has waited for (/proc's cutime+cstime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command name: state is field 3 of stat(5); cutime and cstime are 16 and 17.
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


class WorkerPool:
    """Beam's SDK worker pool beside one TaskManager: a process of its own, in its own session and
    temporary folder, that starts one SDK worker process per environment the TaskManager asks for.

    Attributes:
        index: The TaskManager it serves.
        host: Loopback address it listens on (127.0.0.11 for TaskManager 0, ...).
        port: Its port (the same for every pool, as in ``--environment_config``).
        workdir: Its temporary folder (the cwd of its SDK workers), with ``pool.out``.
        env: Extra environment variables its SDK workers inherit (test hooks).
    """

    def __init__(self, index: int, port: int, workdir: Path, env: Optional[Mapping[str, str]] = None,
                 warm: bool = False):
        self.index = index
        self.warm = warm
        self.host = f"127.0.0.{11 + index}"
        self.port = port
        self.workdir = workdir
        self.env = dict(env or {})
        self.proc: Optional[subprocess.Popen] = None

    @property
    def pid(self) -> int:
        """Process id of the pool (the parent of its SDK workers)."""
        if self.proc is None:
            raise RuntimeError(f"worker pool {self.index} is not running")
        return self.proc.pid

    def start(self) -> None:
        """Starts the pool; returns at once (see :meth:`accepting`)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # The pool runs `python -c ...` for each SDK worker: this interpreter and this checkout.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        env.update(self.env)
        with open(self.workdir / "pool.out", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "imagerecords.builder.engines.beam.worker_pool", "--host", self.host,
                 "--port", str(self.port), *(["--warm"] if self.warm else [])],
                cwd=self.workdir, env=env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def accepting(self) -> bool:
        """True when the pool accepts TCP connections on its address."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """Stops the pool and every SDK worker it started (its process group)."""
        if self.proc is not None:
            terminate_group(self.proc, grace=5.0)
            self.proc = None

    def log_tail(self, chars: int = 3000) -> str:
        path = self.workdir / "pool.out"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


class FlinkCluster:
    """A standalone Flink session cluster: one JobManager and ``taskmanagers`` TaskManager processes,
    optionally each with a Beam worker pool beside it.

    Every process runs from the cached distribution in its own process group, with a generated
    configuration, logs and scratch space in a temporary directory of its own (``jobmanager/``,
    ``taskmanager-0/``, ``workerpool-0/``, ... under :attr:`workdir`), which :meth:`stop` removes.
    Beam reaches the cluster through the JobManager's REST port.

    With ``worker_pools=True`` each TaskManager runs in a mount namespace of its own whose /etc/hosts
    maps :data:`WORKER_POOL_HOST` to its own pool, so ``--environment_type=EXTERNAL
    --environment_config=imagerecords-workers:PORT`` means "the pool beside this TaskManager", as
    ``localhost:PORT`` does for a sidecar in a Kubernetes pod.

    Usage::

        with FlinkCluster.start(taskmanagers=2, slots=1, worker_pools=True) as cluster:
            with beam.Pipeline(argv=cluster.pipeline_args()) as p:
                ...
            assert len(cluster.finished_jobs()) == 1

    Attributes:
        artifacts: The distribution (and job-server jar) the cluster runs from.
        rest_port: Port of the JobManager's REST API and web UI (Beam's ``--flink_master``).
        rpc_port: Port of the JobManager's RPC endpoint.
        workdir: Temporary directory holding one folder per process.
        pools: The worker pools, one per TaskManager (empty without ``worker_pools``).
    """

    def __init__(self, artifacts: FlinkArtifacts, *, taskmanagers: int = 1, slots: int = 2, parallelism: int = 2,
                 worker_pools: bool = False, pool_env: Optional[Mapping[str, str]] = None,
                 restart_attempts: int = 0, jobmanager_memory: str = "1024m", taskmanager_memory: str = "1536m",
                 keep_workdir: bool = False):
        """Prepares, but does not start, a cluster.

        Args:
            artifacts: Where the Flink distribution (and job-server jar) lies.
            taskmanagers: Number of TaskManager processes.
            slots: Task slots of each TaskManager.
            parallelism: Default parallelism, also passed to Beam as ``--parallelism``; at most
                ``taskmanagers * slots``.
            worker_pools: Start a Beam worker pool beside each TaskManager, for the EXTERNAL
                environment (:meth:`pipeline_args` then uses it).
            pool_env: Extra environment variables of the worker pools (and so of the SDK workers).
            restart_attempts: With more than 0, ``restart-strategy.type: fixed-delay`` with this many
                attempts 1 s apart; 0 means no restart (``none``).
            jobmanager_memory: ``jobmanager.memory.process.size``.
            taskmanager_memory: ``taskmanager.memory.process.size`` of each TaskManager.
            keep_workdir: Leave the configuration and logs behind on :meth:`stop`.

        Raises:
            ValueError: ``parallelism`` is not in ``[1, taskmanagers * slots]``, or a count is < 1.
        """
        if taskmanagers < 1 or slots < 1:
            raise ValueError(f"taskmanagers={taskmanagers} and slots={slots} must be at least 1")
        if not 1 <= parallelism <= taskmanagers * slots:
            raise ValueError(f"parallelism={parallelism} must be between 1 and taskmanagers * slots = "
                             f"{taskmanagers * slots}")
        if restart_attempts < 0:
            raise ValueError(f"restart_attempts={restart_attempts} must be >= 0")
        self.artifacts = artifacts
        self.num_taskmanagers = taskmanagers
        self.slots = slots
        self.parallelism = parallelism
        self.worker_pools = worker_pools
        self.restart_attempts = restart_attempts
        self.jobmanager_memory = jobmanager_memory
        self.taskmanager_memory = taskmanager_memory
        self.keep_workdir = keep_workdir
        self.rest_port = 0
        self.rpc_port = 0
        self.pool_port = 0
        self.workdir: Optional[Path] = None
        self.pools: List[WorkerPool] = []
        self._pool_env = dict(pool_env or {})
        self._processes: Dict[str, subprocess.Popen] = {}
        self._stopped: Set[str] = set()  # processes ended on purpose (kill_taskmanager)

    @classmethod
    def start(cls, timeout: float = 180.0, **kwargs) -> "FlinkCluster":
        """Obtains the artifacts, starts a cluster and waits until it is ready: every TaskManager
        registered with all its slots free, and every worker pool accepting connections.

        Args:
            timeout: Seconds to wait for the cluster to come up.
            **kwargs: Passed to the constructor.

        Returns:
            The running cluster; call :meth:`stop` (or use it as a context manager).

        Raises:
            RuntimeError: Java (or, with worker pools, a private /etc/hosts) is unavailable, or the
                cluster did not come up in time (the message names what never came and carries
                the tail of the process logs).
        """
        if not java_available():
            raise RuntimeError("no Java runtime (set JAVA_HOME or put java on PATH)")
        if kwargs.get("worker_pools"):
            reason = can_isolate_hosts()
            if reason:
                raise RuntimeError(reason)
        cluster = cls(get_artifacts(), **kwargs)
        try:
            cluster._start(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def __enter__(self) -> "FlinkCluster":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def rest_url(self) -> str:
        """Base URL of the JobManager's REST API."""
        return f"http://localhost:{self.rest_port}"

    @property
    def flink_master(self) -> str:
        """The ``host:port`` Beam's ``--flink_master`` points at."""
        return f"localhost:{self.rest_port}"

    @property
    def environment_config(self) -> str:
        """``--environment_config`` for the EXTERNAL environment: the pool beside each TaskManager."""
        return f"{WORKER_POOL_HOST}:{self.pool_port}"

    def pipeline_args(self, *extra: str, environment: Optional[str] = None,
                      job_endpoint: Optional[str] = None) -> List[str]:
        """Returns the Beam command-line options that run a pipeline on this cluster.

        Without ``job_endpoint``, Beam's FlinkRunner starts the job server itself (``java -jar`` on
        ``--flink_job_server_jar``, the launcher jar) and stops it when the pipeline ends; the job
        server translates the pipeline and submits it to this cluster's REST endpoint.

        Args:
            *extra: More options appended as given.
            environment: ``EXTERNAL`` (the default on a cluster with worker pools): the SDK
                workers run in the pool beside each TaskManager; ``LOOPBACK`` (the default
                otherwise): they run inside the calling Python process, which must stay alive until
                the job ends (a quick local try).
            job_endpoint: ``host:port`` of a job server that is already up (:class:`JobServer`):
                the pipeline is submitted there and no job server is started for it.

        Returns:
            A list for ``PipelineOptions(...)`` or ``beam.Pipeline(argv=...)``.

        Raises:
            RuntimeError: No Beam Flink job-server jar is available, or EXTERNAL was asked of a
                cluster without worker pools.
        """
        if self.artifacts.job_server_jar is None:
            raise RuntimeError(beam_on_flink_unavailable_reason() or "no Flink job server")
        environment = (environment or ("EXTERNAL" if self.worker_pools else "LOOPBACK")).upper()
        if environment == "EXTERNAL" and not self.worker_pools:
            raise RuntimeError("EXTERNAL needs a cluster started with worker_pools=True")
        args = [
            "--runner=FlinkRunner",
            f"--flink_master={self.flink_master}",
            f"--flink_version={self.artifacts.flink_minor}",
            f"--environment_type={environment}",
            f"--parallelism={self.parallelism}",
        ]
        if environment == "EXTERNAL":
            args.append(f"--environment_config={self.environment_config}")
        if job_endpoint:
            args.append(f"--job_endpoint={job_endpoint}")
        else:
            args.append(f"--flink_job_server_jar={self.artifacts.job_server_jar}")
            java = _java_executable()
            if java is not None:
                args.append(f"--job_server_java_launcher={java}")
        return [*args, *extra]

    def job_server(self, timeout: float = 180.0) -> "JobServer":
        """Starts Beam's Flink job server for this cluster and waits until it accepts jobs.

        Args:
            timeout: Seconds to wait for its job port.

        Returns:
            The running job server; pass ``job_endpoint=server.endpoint`` to :meth:`pipeline_args`,
            and call :meth:`JobServer.stop` (or use it as a context manager).
        """
        server = JobServer(self)
        try:
            server.start(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def rest_get(self, path: str) -> dict:
        """GETs ``path`` from the REST API and decodes the JSON answer.

        Args:
            path: Path below the API root, e.g. ``/jobs/overview``.

        Returns:
            The decoded JSON object.
        """
        with urllib.request.urlopen(self.rest_url + path, timeout=10) as response:
            return json.load(response)

    def taskmanagers(self) -> List[dict]:
        """Returns the registered TaskManagers as the REST API describes them."""
        return self.rest_get("/taskmanagers")["taskmanagers"]

    def jobs(self) -> List[dict]:
        """Returns every job the cluster knows, from ``/jobs/overview``."""
        return self.rest_get("/jobs/overview")["jobs"]

    def finished_jobs(self) -> List[dict]:
        """Returns the jobs in state ``FINISHED``, from ``/jobs/overview``."""
        return [job for job in self.jobs() if job["state"] == "FINISHED"]

    def wait_for(self, what: str, condition: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
        """Polls ``condition`` until it returns something true, and returns that.

        Args:
            what: What is awaited, for the error message ("job X finished").
            condition: A function returning a true value once the condition holds; REST
                connection errors count as "not yet".
            timeout: Seconds to wait.
            interval: Seconds between polls.

        Raises:
            RuntimeError: ``what`` did not happen in time, or a cluster process exited (with
                the logs' tails).
        """
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self._processes.items():
                if proc.poll() is not None and name not in self._stopped:
                    raise RuntimeError(f"while waiting for {what}: Flink {name} exited with status "
                                       f"{proc.returncode}:\n{self.log_tail()}")
            try:
                value = condition()
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                value = None  # the REST endpoint is not up (or not answering) yet
            if value:
                return value
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not after {timeout:.0f} s\n{self.log_tail()}")
            time.sleep(interval)

    def run_probe_job(self, timeout: float = 180.0) -> int:
        """Compiles and submits a tiny Java DataStream job with ``bin/flink run``.

        This checks that the cluster executes work without involving Beam: the job sums
        ``2 * n`` for ``n`` in ``[0, 99]``, so a working cluster returns 9900.

        Args:
            timeout: Seconds allowed for compiling and for running the job.

        Returns:
            The sum the job computed.

        Raises:
            RuntimeError: ``javac`` is missing, or the job failed.
        """
        javac, jar = shutil.which("javac"), shutil.which("jar")
        if javac is None or jar is None:
            raise RuntimeError("the probe job needs a JDK (javac and jar on PATH)")
        probe = self.workdir / "probe"
        (probe / "classes").mkdir(parents=True, exist_ok=True)
        source = probe / "ImagerecordsProbe.java"
        source.write_text(_PROBE_JAVA)
        classpath = str(self.artifacts.flink_home / "lib" / "*")
        subprocess.run([javac, "-d", str(probe / "classes"), "-cp", classpath, str(source)],
                       check=True, capture_output=True, timeout=timeout)
        jar_path = probe / "probe.jar"
        subprocess.run([jar, "cf", str(jar_path), "-C", str(probe / "classes"), "."],
                       check=True, capture_output=True, timeout=timeout)
        proc = subprocess.run(
            [str(self.artifacts.flink_home / "bin" / "flink"), "run", "-m", self.flink_master,
             "-c", "ImagerecordsProbe", str(jar_path)],
            env=self._env("jobmanager"), capture_output=True, text=True, timeout=timeout)
        match = re.search(r"^PROBE_SUM=(\d+)$", proc.stdout, re.MULTILINE)
        if proc.returncode != 0 or match is None:
            raise RuntimeError(f"probe job failed (exit status {proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return int(match.group(1))

    def restart_worker_pools(self, env: Optional[Mapping[str, str]] = None, timeout: float = 60.0,
                             per_pool: Optional[Mapping[int, Mapping[str, str]]] = None, warm: bool = False) -> None:
        """Stops every worker pool and starts it again with ``env`` as its extra environment (for
        test hooks that the SDK workers read); call it between jobs.

        Args:
            env: The pools' new extra environment (replaces the previous one); None for none.
            timeout: Seconds to wait for the pools to accept connections.
            per_pool: More variables for single pools, by TaskManager index.
            warm: Run SDK workers as threads of a pool that has Beam and the project imported,
                instead of one fresh interpreter per worker.
        """
        self._pool_env = dict(env or {})
        for pool in self.pools:
            pool.stop()
            pool.env = {**self._pool_env, **dict((per_pool or {}).get(pool.index, {}))}
            pool.warm = warm
            pool.start()
        self.wait_for("worker pools accepting connections",
                      lambda: all(pool.accepting() for pool in self.pools), timeout)

    def kill_taskmanager(self, index: int) -> None:
        """SIGKILLs TaskManager ``index`` and its worker pool (with the SDK workers), as when the
        machine or pod under them is lost."""
        name = f"taskmanager-{index}"
        self._stopped.add(name)
        for proc in (self._processes[name], self.pools[index].proc if self.pools else None):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def stop(self) -> None:
        """Ends every process this cluster started and removes its temporary directory.

        Safe to call more than once.
        """
        for proc in self._processes.values():
            terminate_group(proc)
        self._processes.clear()
        for pool in self.pools:
            pool.stop()
        if self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def log_tail(self, chars: int = 3000) -> str:
        """Returns the end of each process's console output, for failure messages."""
        if self.workdir is None:
            return ""
        parts = []
        for name in self._processes:
            path = self.workdir / name / "log" / f"{name}.out"
            if path.exists():
                parts.append(f"--- {path} ---\n{path.read_text(errors='replace')[-chars:]}")
        for pool in self.pools:
            parts.append(f"--- worker pool {pool.index} ({pool.workdir}) ---\n{pool.log_tail(chars)}")
        return "\n".join(parts)

    def _ready(self) -> bool:
        """Every TaskManager registered with all its slots, and all of them free in /overview: a
        TaskManager is listed before its slots are reported, so the count alone is not enough."""
        taskmanagers = self.taskmanagers()
        if len(taskmanagers) != self.num_taskmanagers:
            return False
        if any(tm.get("slotsNumber") != self.slots or tm.get("freeSlots") != self.slots for tm in taskmanagers):
            return False
        overview = self.rest_get("/overview")
        total = self.num_taskmanagers * self.slots
        return overview.get("slots-total") == total and overview.get("slots-available") == total

    def _start(self, timeout: float) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="imagerecords-flink-"))
        self.rest_port = free_port()
        self.rpc_port = free_port()
        if self.worker_pools:
            # The same port on every pool's address, as the same config reaches every TaskManager.
            self.pool_port = free_port("127.0.0.11")
            for i in range(self.num_taskmanagers):
                pool = WorkerPool(i, self.pool_port, self.workdir / f"workerpool-{i}", self._pool_env)
                pool.start()
                self.pools.append(pool)
        self._spawn("jobmanager")
        for i in range(self.num_taskmanagers):
            self._spawn(f"taskmanager-{i}")
        deadline = time.monotonic() + timeout
        self.wait_for(f"{self.num_taskmanagers} TaskManager(s) registered with {self.slots} free slot(s) each",
                      self._ready, timeout)
        self.wait_for("worker pools accepting connections", lambda: all(p.accepting() for p in self.pools),
                      max(deadline - time.monotonic(), 5.0))

    def _write_config(self, name: str) -> Path:
        home = self.workdir / name
        conf = home / "conf"
        shutil.copytree(self.artifacts.flink_home / "conf", conf)
        tmp = home / "tmp"
        tmp.mkdir()
        (home / "log").mkdir()
        # Flink 1.19+ reads conf/config.yaml (standard YAML). Java 17 needs the distribution's
        # --add-opens/--add-exports flags, so they are carried over from the shipped file.
        # The JVM's own temporary files (lz4's native library, job graphs) go to this process's tmp
        # folder, removed with the cluster, not to the machine's /tmp, which java.io.tmpdir defaults to.
        java_opts = f"{_shipped_java_opts(self.artifacts.flink_home / 'conf' / 'config.yaml')} -Djava.io.tmpdir={tmp}"
        settings = {
            "env.java.opts.all": java_opts,
            "jobmanager.bind-host": "localhost",
            "jobmanager.rpc.address": "localhost",
            "jobmanager.rpc.port": self.rpc_port,
            "jobmanager.memory.process.size": self.jobmanager_memory,
            "taskmanager.bind-host": "localhost",
            "taskmanager.host": "localhost",
            "taskmanager.numberOfTaskSlots": self.slots,
            "taskmanager.memory.process.size": self.taskmanager_memory,
            # Beam's portable runner keeps little in managed memory; give the heap the room.
            "taskmanager.memory.managed.fraction": 0.1,
            # Each blocking (batch) result partition reserves sort-shuffle.min-buffers network
            # buffers (default 512 x 32 KiB); Beam jobs have many such exchanges, which a small
            # TaskManager cannot serve ("Insufficient number of network buffers").
            "taskmanager.network.sort-shuffle.min-buffers": 64,
            "taskmanager.memory.network.min": "128m",
            "taskmanager.memory.network.max": "128m",
            "parallelism.default": self.parallelism,
            # Spread a job's slots over the TaskManagers (the work over the worker pools).
            "cluster.evenly-spread-out-slots": True,
            # A lost TaskManager is noticed in seconds, not after the 50 s default.
            "heartbeat.interval": 2000,
            "heartbeat.timeout": 10000,
            # A job that lost a TaskManager asks for slots again; fail such a request in seconds.
            "slot.request.timeout": 15000,
            "rest.address": "localhost",
            "rest.bind-address": "localhost",
            "rest.port": self.rest_port,
            "io.tmp.dirs": str(tmp),
            "blob.storage.directory": str(tmp),
            "web.tmpdir": str(tmp),
            "web.upload.dir": str(tmp),
        }
        if name.startswith("taskmanager-"):
            settings["taskmanager.resource-id"] = name
        if self.restart_attempts:
            settings.update({"restart-strategy.type": "fixed-delay",
                             "restart-strategy.fixed-delay.attempts": self.restart_attempts,
                             "restart-strategy.fixed-delay.delay": "1 s"})
        else:
            settings["restart-strategy.type"] = "none"
        # Flat dotted keys are valid in config.yaml; JSON strings are valid YAML scalars.
        (conf / "config.yaml").write_text(
            "".join(f"{key}: {json.dumps(value)}\n" for key, value in settings.items()))
        return home

    def _env(self, name: str) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(FLINK_HOME=str(self.artifacts.flink_home),
                   FLINK_CONF_DIR=str(self.workdir / name / "conf"),
                   FLINK_LOG_DIR=str(self.workdir / name / "log"),
                   FLINK_PID_DIR=str(self.workdir / name))  # its pid file, else left in /tmp
        return env

    def _spawn(self, name: str) -> None:
        home = self._write_config(name)
        role = "taskmanager" if name.startswith("taskmanager-") else name
        command = ["bash", str(self.artifacts.flink_home / "bin" / f"{role}.sh"), "start-foreground"]
        if role == "taskmanager" and self.worker_pools:
            # A "pod": this TaskManager resolves WORKER_POOL_HOST to its own pool's address.
            pool = self.pools[int(name.rsplit("-", 1)[1])]
            hosts = home / "hosts"
            hosts.write_text(Path("/etc/hosts").read_text() + f"\n{pool.host} {WORKER_POOL_HOST}\n")
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       'mount --bind "$1" /etc/hosts && shift && exec "$@"', "sh", str(hosts), *command]
        with open(home / "log" / f"{name}.out", "wb") as out:
            # A session of its own per process, so stop() can signal the whole group.
            self._processes[name] = subprocess.Popen(
                command, env=self._env(name), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=home)


class JobServer:
    """Beam's Flink job server kept up across jobs (``--job_endpoint``), as FlinkRunner would start it
    per pipeline: ``java -jar`` on the launcher jar, pointed at one cluster's REST endpoint.

    Attributes:
        job_port: Port of its job service (``--job_endpoint=localhost:PORT``).
        workdir: Its temporary folder (staged artifacts, ``jobserver.out``).
        started_in: Seconds from spawning it to its job port accepting connections.
    """

    def __init__(self, cluster: FlinkCluster):
        if cluster.artifacts.job_server_jar is None:
            raise RuntimeError(beam_on_flink_unavailable_reason() or "no Flink job server")
        self.cluster = cluster
        self.job_port = 0
        self.workdir: Optional[Path] = None
        self.started_in = 0.0
        self.proc: Optional[subprocess.Popen] = None

    @property
    def endpoint(self) -> str:
        """``host:port`` for Beam's ``--job_endpoint``."""
        return f"localhost:{self.job_port}"

    @property
    def pid(self) -> int:
        """Process id of the job server's JVM."""
        if self.proc is None:
            raise RuntimeError("the job server is not running")
        return self.proc.pid

    def start(self, timeout: float = 180.0) -> None:
        """Spawns the job server and waits until its job port accepts connections.

        Raises:
            RuntimeError: It exited, or its port did not open in time (with its log's tail).
        """
        java = _java_executable()
        if java is None:
            raise RuntimeError("no Java runtime (set JAVA_HOME or put java on PATH)")
        self.workdir = Path(tempfile.mkdtemp(prefix="imagerecords-jobserver-"))
        self.job_port = free_port()
        # The same arguments Beam's FlinkJarJobServer passes (flink_runner.py), with ports of our own.
        (self.workdir / "tmp").mkdir()
        command = [java, f"-Djava.io.tmpdir={self.workdir / 'tmp'}", "-jar", str(self.cluster.artifacts.job_server_jar),
                   "--flink-master", f"http://{self.cluster.flink_master}",
                   "--artifacts-dir", str(self.workdir / "artifacts"),
                   "--job-port", str(self.job_port), "--artifact-port", str(free_port()),
                   "--expansion-port", str(free_port())]
        started = time.monotonic()
        with open(self.workdir / "jobserver.out", "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, cwd=self.workdir)
        deadline = started + timeout
        while not self._accepting():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Flink job server exited with status {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Flink job server's port {self.job_port}: not open after {timeout:.0f} s\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)
        self.started_in = time.monotonic() - started

    def _accepting(self) -> bool:
        try:
            with socket.create_connection(("localhost", self.job_port), timeout=1):
                return True
        except OSError:
            return False

    def log_tail(self, chars: int = 3000) -> str:
        path = self.workdir / "jobserver.out" if self.workdir else None
        return path.read_text(errors="replace")[-chars:] if path and path.exists() else ""

    def stop(self) -> None:
        """Ends the job server and removes its folder; safe to call more than once."""
        if self.proc is not None:
            terminate_group(self.proc, grace=5.0)
            self.proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> "JobServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _shipped_java_opts(config_yaml: Path) -> str:
    """Reads ``env.java.opts.all`` from a distribution's nested ``config.yaml``."""
    import yaml

    config = yaml.safe_load(config_yaml.read_text()) or {}
    opts = config.get("env", {}).get("java", {}).get("opts", {})
    return opts.get("all", "") if isinstance(opts, dict) else ""


