"""A throw-away standalone Apache Flink cluster (JobManager + TaskManager) for FlinkRunner tests."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

from tests.support.processes import free_port, terminate_group

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
    proc = subprocess.run(["bash", str(GET_FLINK_SCRIPT)], capture_output=True, text=True,
                          timeout=1800, env=env)
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


def beam_on_flink_unavailable_reason() -> Optional[str]:
    """Says why Beam pipelines cannot run on a local Flink cluster here, for ``pytest.skip``.

    Returns:
        None when Java, the Flink distribution and Beam's Flink job server are all available;
        otherwise a one-line reason.
    """
    if not java_available():
        return "no Java runtime (set JAVA_HOME or put java on PATH)"
    try:
        artifacts = get_artifacts()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        return f"Flink distribution unavailable: {err}"
    if artifacts.job_server_jar is None:
        return (f"org.apache.beam:beam-runners-flink-{artifacts.flink_minor}:"
                f"{artifacts.beam_version} (Beam's Flink job server) could not be resolved with "
                "Maven; set BEAM_FLINK_JOB_SERVER_JAR to a job-server jar")
    return None


class FlinkCluster:
    """A standalone Flink session cluster made of one JobManager and one TaskManager process.

    Both processes run ``start-foreground`` from the cached distribution, each in its own
    process group, with a generated configuration, logs and scratch space in one temporary
    directory that :meth:`stop` removes. Beam reaches the cluster through its REST port.

    Usage::

        with FlinkCluster.start() as cluster:
            with beam.Pipeline(argv=cluster.pipeline_args()) as p:
                ...
            assert len(cluster.finished_jobs()) == 1

    Attributes:
        artifacts: The distribution (and job-server jar) the cluster runs from.
        rest_port: Port of the JobManager's REST API and web UI (Beam's ``--flink_master``).
        rpc_port: Port of the JobManager's RPC endpoint.
        workdir: Temporary directory holding ``conf/``, ``log/`` and ``tmp/``.
    """

    def __init__(self, artifacts: FlinkArtifacts, *, slots: int = 2, parallelism: int = 2,
                 jobmanager_memory: str = "1024m", taskmanager_memory: str = "1536m",
                 keep_workdir: bool = False):
        """Prepares, but does not start, a cluster.

        Args:
            artifacts: Where the Flink distribution (and job-server jar) lies.
            slots: Task slots of the TaskManager; must be at least ``parallelism``.
            parallelism: Default parallelism, also passed to Beam as ``--parallelism``.
            jobmanager_memory: ``jobmanager.memory.process.size``.
            taskmanager_memory: ``taskmanager.memory.process.size``.
            keep_workdir: Leave the configuration and logs behind on :meth:`stop`.

        Raises:
            ValueError: ``parallelism`` is not in ``[1, slots]``.
        """
        if not 1 <= parallelism <= slots:
            raise ValueError(f"parallelism={parallelism} must be between 1 and slots={slots}")
        self.artifacts = artifacts
        self.slots = slots
        self.parallelism = parallelism
        self.jobmanager_memory = jobmanager_memory
        self.taskmanager_memory = taskmanager_memory
        self.keep_workdir = keep_workdir
        self.rest_port = 0
        self.rpc_port = 0
        self.workdir: Optional[Path] = None
        self._processes: Dict[str, subprocess.Popen] = {}

    @classmethod
    def start(cls, timeout: float = 180.0, **kwargs) -> "FlinkCluster":
        """Obtains the artifacts, starts a cluster and waits until a TaskManager registered.

        Args:
            timeout: Seconds to wait for the cluster to come up.
            **kwargs: Passed to the constructor.

        Returns:
            The running cluster; call :meth:`stop` (or use it as a context manager).

        Raises:
            RuntimeError: Java is missing, or the cluster did not come up in time (the
                message carries the tail of the process logs).
        """
        if not java_available():
            raise RuntimeError("no Java runtime (set JAVA_HOME or put java on PATH)")
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

    def pipeline_args(self, *extra: str) -> List[str]:
        """Returns the Beam command-line options that run a pipeline on this cluster.

        Beam's FlinkRunner starts the job server itself (``java -jar`` on
        ``--flink_job_server_jar``, the launcher jar) and stops it when the pipeline ends; the job
        server translates the pipeline and submits it to this cluster's REST endpoint. The SDK
        harness runs inside the calling Python process (``LOOPBACK``), so user code needs no
        Docker image, but the caller must stay alive until the job ends.

        Args:
            *extra: More options appended as given.

        Returns:
            A list for ``PipelineOptions(...)`` or ``beam.Pipeline(argv=...)``.

        Raises:
            RuntimeError: No Beam Flink job-server jar is available.
        """
        if self.artifacts.job_server_jar is None:
            raise RuntimeError(beam_on_flink_unavailable_reason() or "no Flink job server")
        args = [
            "--runner=FlinkRunner",
            f"--flink_master={self.flink_master}",
            f"--flink_version={self.artifacts.flink_minor}",
            f"--flink_job_server_jar={self.artifacts.job_server_jar}",
            "--environment_type=LOOPBACK",
            f"--parallelism={self.parallelism}",
        ]
        java = _java_executable()
        if java is not None:
            args.append(f"--job_server_java_launcher={java}")
        return [*args, *extra]

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
            env=self._env(), capture_output=True, text=True, timeout=timeout)
        match = re.search(r"^PROBE_SUM=(\d+)$", proc.stdout, re.MULTILINE)
        if proc.returncode != 0 or match is None:
            raise RuntimeError(f"probe job failed (exit status {proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return int(match.group(1))

    def stop(self) -> None:
        """Ends every process this cluster started and removes its temporary directory.

        Safe to call more than once.
        """
        for proc in self._processes.values():
            terminate_group(proc)
        self._processes.clear()
        if self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def log_tail(self, chars: int = 4000) -> str:
        """Returns the end of each process's console output, for failure messages."""
        if self.workdir is None:
            return ""
        parts = []
        for name in self._processes or ("jobmanager", "taskmanager"):
            path = self.workdir / "log" / f"{name}.out"
            if path.exists():
                parts.append(f"--- {path} ---\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def _start(self, timeout: float) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="imagerecords-flink-"))
        self.rest_port = free_port()
        self.rpc_port = free_port()
        self._write_config()
        for name in ("jobmanager", "taskmanager"):
            self._spawn(name)
        self._wait_until_ready(timeout)

    def _write_config(self) -> None:
        conf = self.workdir / "conf"
        shutil.copytree(self.artifacts.flink_home / "conf", conf)
        tmp = self.workdir / "tmp"
        tmp.mkdir()
        (self.workdir / "log").mkdir()
        # Flink 1.19+ reads conf/config.yaml (standard YAML). Java 17 needs the distribution's
        # --add-opens/--add-exports flags, so they are carried over from the shipped file.
        java_opts = _shipped_java_opts(self.artifacts.flink_home / "conf" / "config.yaml")
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
            "rest.address": "localhost",
            "rest.bind-address": "localhost",
            "rest.port": self.rest_port,
            "io.tmp.dirs": str(tmp),
            "blob.storage.directory": str(tmp),
            "web.tmpdir": str(tmp),
            "web.upload.dir": str(tmp),
        }
        # Flat dotted keys are valid in config.yaml; JSON strings are valid YAML scalars.
        (conf / "config.yaml").write_text(
            "".join(f"{key}: {json.dumps(value)}\n" for key, value in settings.items()))

    def _env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(FLINK_HOME=str(self.artifacts.flink_home),
                   FLINK_CONF_DIR=str(self.workdir / "conf"),
                   FLINK_LOG_DIR=str(self.workdir / "log"))
        return env

    def _spawn(self, name: str) -> None:
        script = self.artifacts.flink_home / "bin" / f"{name}.sh"
        with open(self.workdir / "log" / f"{name}.out", "wb") as out:
            # A session of its own per process, so stop() can signal the whole group.
            self._processes[name] = subprocess.Popen(
                ["bash", str(script), "start-foreground"], env=self._env(), stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self._processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"Flink {name} exited with status {proc.returncode}:\n"
                                       f"{self.log_tail()}")
            try:
                if self.taskmanagers():
                    return
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass  # The REST endpoint is not up yet.
            time.sleep(0.5)
        raise RuntimeError(f"Flink cluster not ready after {timeout:.0f} s:\n{self.log_tail()}")


def _shipped_java_opts(config_yaml: Path) -> str:
    """Reads ``env.java.opts.all`` from a distribution's nested ``config.yaml``."""
    import yaml

    config = yaml.safe_load(config_yaml.read_text()) or {}
    opts = config.get("env", {}).get("java", {}).get("opts", {})
    return opts.get("all", "") if isinstance(opts, dict) else ""


