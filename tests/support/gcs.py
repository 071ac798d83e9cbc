"""A real Google Cloud Storage emulator for tests.

The storage server is `fake-gcs-server <https://github.com/fsouza/fake-gcs-server>`_,
a Go program speaking the GCS JSON API (resumable uploads, copy/rewrite,
compose, listing, ...).  ``.ci/get_gcs_emulator.sh`` installs it into
``${IMAGERECORDS_CACHE:-~/.cache/imagerecords}/bin``; :func:`ensure_emulator_binary`
runs that script the first time a test needs the emulator.

In front of it runs a small proxy (a child Python process, see
:func:`_run_front_proxy`), because neither client works with the bare server:

* google-cloud-storage (and therefore Apache Beam's ``GcsIO``, used by
  ``FileSystems``, ``ReadFromText``, ``WriteToText``, ``fileio``) honours
  ``STORAGE_EMULATOR_HOST``, which points at the proxy.  Beam renames and
  deletes through *batch* requests; fake-gcs-server ignores batch parts
  without a ``Content-ID`` header, which google-cloud-storage never sends, so
  the proxy runs batches itself, one sub-request at a time.
* TensorFlow's built-in GCS filesystem (``tf.io.gfile``, ``TFRecordDataset``)
  has no endpoint override: it always calls ``https://www.googleapis.com`` and
  ``https://storage.googleapis.com``.  It uses libcurl, which honours
  ``HTTPS_PROXY`` and TensorFlow's ``CURL_CA_BUNDLE``.  The proxy accepts
  ``CONNECT`` for those two hosts, terminates TLS with a certificate from a
  throw-away CA and forwards the requests to the emulator.

Credentials: Beam asks ``google.auth.default()`` for credentials and, when
there are none, retries with back-off for about 30 seconds before it connects
anonymously.  :meth:`GcsEmulator.env` therefore names a fake "authorized user"
credentials file whose access token never expires, so no token refresh (and
no network access) ever happens; the emulator ignores the token.  TensorFlow
gets ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` and ``NO_GCE_CHECK``.

Application code needs no special hook: it must create its storage clients
*after* the environment is set (lazily, not at import time) and must not
hard-code ``client_options={"api_endpoint": ...}``.  See :func:`storage_client`
and :func:`beam_pipeline_options`.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import ipaddress
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

from tests.support.processes import cache_dir, exclusive_lock, free_port, terminate_group

REPO_ROOT = Path(__file__).resolve().parents[2]
GET_EMULATOR_SCRIPT = REPO_ROOT / ".ci" / "get_gcs_emulator.sh"
"""Builds fake-gcs-server with the Go toolchain into the cache (see :func:`ensure_emulator_binary`)."""

FETCH_TIMEOUT_S = 1200
"""Seconds a fetch may take: downloading the Go modules and compiling them on a slow machine."""

FAKE_GCS_SERVER_VERSION = "v1.56.1"
"""The version ``.ci/get_gcs_emulator.sh`` installs by default."""

BINARY_ENV_VAR = "IMAGERECORDS_FAKE_GCS_SERVER"
"""Set to the path of a fake-gcs-server binary to override the lookup."""

DEFAULT_PROJECT = "imagerecords-test"

# Host names TensorFlow's GCS filesystem talks to.  The proxy forwards only
# these (port 443) to the emulator and refuses everything else.
TF_STORAGE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")

_LOOPBACK = "127.0.0.1"


# --------------------------------------------------------------------------
# Locating the emulator binary
# --------------------------------------------------------------------------


def find_emulator_binary() -> Optional[str]:
    """Path of the fake-gcs-server executable, or None when not installed.

    Looks at ``$IMAGERECORDS_FAKE_GCS_SERVER``, then the cache directory that
    ``.ci/get_gcs_emulator.sh`` installs into, then ``$PATH``.
    """
    candidates = [
        os.environ.get(BINARY_ENV_VAR),
        str(cache_dir() / "bin" / "fake-gcs-server"),
        shutil.which("fake-gcs-server"),
    ]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class EmulatorUnavailable(RuntimeError):
    """fake-gcs-server is not installed and could not be fetched; the message is one line."""


def ensure_emulator_binary() -> str:
    """Path of the fake-gcs-server executable, fetched into the cache on first use.

    When :func:`find_emulator_binary` finds none, runs ``.ci/get_gcs_emulator.sh`` under a lock
    file in the cache, so that of two pytest runs starting at once one fetches and the other
    waits and then reuses the result.

    Returns:
        The executable's path.

    Raises:
        EmulatorUnavailable: The fetch failed (no Go toolchain, no network, ...); the one-line
            message says why and names the command that fetches it.
    """
    found = find_emulator_binary()
    if found:
        return found
    lock = cache_dir() / "get_gcs_emulator.lock"
    try:
        with exclusive_lock(lock, FETCH_TIMEOUT_S, "fetching fake-gcs-server"):
            found = find_emulator_binary()  # the run that held the lock may have fetched it
            if found:
                return found
            proc = subprocess.run(["bash", str(GET_EMULATOR_SCRIPT)], capture_output=True,
                                  text=True, timeout=FETCH_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, TimeoutError, subprocess.TimeoutExpired) as error:
        raise EmulatorUnavailable(_unavailable(str(error))) from error
    found = find_emulator_binary()
    if proc.returncode != 0 or not found:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        raise EmulatorUnavailable(_unavailable(
            lines[-1] if lines else f"{GET_EMULATOR_SCRIPT.name} exited with {proc.returncode}"))
    return found


def _unavailable(cause: str) -> str:
    cause = " ".join(cause.split())[:300]  # one line, however the fetch failed
    return (f"fake-gcs-server is not installed and could not be fetched ({cause}); "
            f"run .ci/get_gcs_emulator.sh or set {BINARY_ENV_VAR}")


# --------------------------------------------------------------------------
# How application code should create its clients
# --------------------------------------------------------------------------


def storage_client(project: Optional[str] = None):
    """Create a google-cloud-storage client the way application code should.

    A plain ``storage.Client()`` already does the right thing: in production it
    uses Application Default Credentials; when ``STORAGE_EMULATOR_HOST`` is
    set it talks to the emulator with anonymous credentials.  The only rule is
    to build it lazily (after the environment is final), and never to pass an
    explicit ``api_endpoint``.
    """
    from google.cloud import storage

    return storage.Client(project=project)


def beam_pipeline_options(**options):
    """Pipeline options for a DirectRunner pipeline that uses ``gs://`` paths.

    Nothing emulator-specific is required: Beam's ``GcsIO`` builds its client
    from ``GoogleCloudOptions`` (project, audit headers) plus the environment.
    ``project`` is optional; without it the client uses
    ``$GOOGLE_CLOUD_PROJECT`` (set by :meth:`GcsEmulator.env`).
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    options.setdefault("runner", "DirectRunner")
    return PipelineOptions(**options)


def parse_gs_uri(uri: str) -> Tuple[str, str]:
    """Split ``gs://bucket/name`` into ``("bucket", "name")``."""
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    bucket, _, name = uri[len("gs://"):].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return bucket, name


# --------------------------------------------------------------------------
# The emulator
# --------------------------------------------------------------------------


class GcsEmulatorError(RuntimeError):
    pass


class Request:
    """One request as the proxy logged it (see :meth:`GcsEmulator.requests`).

    Attributes:
      method: the HTTP method.
      path: the URL path (quoted, as sent).
      bucket: the bucket named in the path ('' when none).
      name: the object name (unquoted), '' for bucket-level calls such as listings.
      query: the query parameters ({name: value}).
      status: the HTTP status sent back.
      size: bytes in the answer's body (0 for HEAD).
    """

    _LINE = None

    def __init__(self, method: str, path: str, bucket: str, name: str, query: Dict[str, str], status: int,
                 size: int):
        self.method, self.path, self.bucket, self.name, self.query, self.status, self.size = (
            method, path, bucket, name, query, status, size)

    @property
    def is_download(self) -> bool:
        """Whether this request read an object's bytes (a media GET)."""
        return self.method == "GET" and self.query.get("alt") == "media" and bool(self.name)

    @property
    def is_listing(self) -> bool:
        """Whether this request listed a bucket's objects."""
        return self.method == "GET" and bool(self.bucket) and not self.name and self.path.endswith("/o")

    @classmethod
    def parse(cls, line: str) -> Optional["Request"]:
        import re
        import urllib.parse

        if cls._LINE is None:
            cls._LINE = re.compile(r'^\S+ "(\S+) (\S+) [^"]*" (\d+) (\d+)$')
        match = cls._LINE.match(line.strip())
        if match is None:
            return None  # an error line, or a request logged without a size
        method, target, status, size = match.groups()
        url = urllib.parse.urlsplit(target)
        path = url.path
        bucket = name = ""
        if "/b/" in path:
            after = path.split("/b/", 1)[1]
            bucket, _, rest = after.partition("/")
            if rest.startswith("o/"):
                name = urllib.parse.unquote(rest[2:])
        return cls(method, path, urllib.parse.unquote(bucket), name, dict(urllib.parse.parse_qsl(url.query)),
                   int(status), int(size))


class GcsEmulator:
    """A fake-gcs-server process and the proxy in front of it.

    Typical use (one emulator per test session or module)::

        emulator = GcsEmulator()
        emulator.start()
        try:
            emulator.create_bucket("inputs")
            emulator.upload(b"hello", "gs://inputs/a.txt")
            with emulator.activated():
                ...  # Beam / TensorFlow code using gs:// paths
        finally:
            emulator.stop()

    It is also a context manager (``with GcsEmulator() as emulator:``) that
    starts and stops it.  Data lives in memory and vanishes on :meth:`stop`.
    """

    def __init__(
        self,
        binary: Optional[str] = None,
        project: str = DEFAULT_PROJECT,
        tensorflow: bool = True,
        startup_timeout: float = 30.0,
    ) -> None:
        """
        Args:
          binary: fake-gcs-server executable; found with
            :func:`find_emulator_binary` by default.
          project: project id used for buckets and ``GOOGLE_CLOUD_PROJECT``.
          tensorflow: let TensorFlow's GCS filesystem reach the emulator
            (TLS certificates and proxy variables).  Needs the
            ``cryptography`` package (a dependency of google-auth).
          startup_timeout: seconds to wait for the server to answer.
        """
        self.binary = binary
        self.project = project
        self.tensorflow = tensorflow
        self.startup_timeout = startup_timeout
        self.server_port: Optional[int] = None  # fake-gcs-server itself
        self.proxy_port: Optional[int] = None  # the front proxy
        self._workdir: Optional[Path] = None
        self._server: Optional[subprocess.Popen] = None
        self._proxy: Optional[subprocess.Popen] = None
        self._client = None

    # -- lifecycle ---------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """Base URL for GCS clients (the proxy), e.g. ``http://127.0.0.1:4443``."""
        if self.proxy_port is None:
            raise GcsEmulatorError("emulator not started")
        return f"http://{_LOOPBACK}:{self.proxy_port}"

    @property
    def server_url(self) -> str:
        """Base URL of fake-gcs-server itself, bypassing the proxy."""
        if self.server_port is None:
            raise GcsEmulatorError("emulator not started")
        return f"http://{_LOOPBACK}:{self.server_port}"

    @property
    def running(self) -> bool:
        return all(
            process is not None and process.poll() is None
            for process in (self._server, self._proxy)
        )

    def start(self, attempts: int = 3) -> "GcsEmulator":
        """Launch the server (and proxy) and wait until it answers requests."""
        if self.running:
            return self
        binary = self.binary or find_emulator_binary()
        if binary is None:
            raise GcsEmulatorError("fake-gcs-server not installed; run .ci/get_gcs_emulator.sh "
                                   f"(or set {BINARY_ENV_VAR})")
        self._workdir = Path(tempfile.mkdtemp(prefix="gcs-emulator-"))
        atexit.register(self.stop)
        self._write_fake_credentials()
        if self.tensorflow:
            self._write_certificates()
        # Ports are picked before the server binds them, so another process
        # could steal one in between; retry with fresh ports in that case.
        last_error: Optional[Exception] = None
        for _ in range(attempts):
            try:
                self._launch_server(binary)
                break
            except GcsEmulatorError as error:
                last_error = error
                self._stop_server()
        else:
            self._cleanup_workdir()
            raise GcsEmulatorError(f"fake-gcs-server did not start: {last_error}")
        try:
            self._launch_proxy()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server and proxy and delete their temporary files."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self._proxy is not None:
            terminate_group(self._proxy, grace=5.0)
            for pipe in (self._proxy.stdin, self._proxy.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()
            self._proxy = None
        self._stop_server()
        self._cleanup_workdir()
        self.server_port = self.proxy_port = None
        atexit.unregister(self.stop)

    def __enter__(self) -> "GcsEmulator":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _launch_server(self, binary: str) -> None:
        assert self._workdir is not None
        self.server_port = free_port()
        command = [
            binary,
            "-backend", "memory",
            "-host", _LOOPBACK,
            "-location", "US",
            "-log-level", "warn",
            "-scheme", "http",
            "-port", str(self.server_port),
        ]
        log = open(self._workdir / "fake-gcs-server.log", "ab")
        try:
            self._server = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._workdir,
                start_new_session=True,  # own process group, see stop()
            )
        finally:
            log.close()
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        url = f"{self.server_url}/storage/v1/b?project={self.project}"
        while True:
            if self._server.poll() is not None:
                raise GcsEmulatorError(
                    f"exited with {self._server.returncode}: {self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                pass
            if time.monotonic() > deadline:
                raise GcsEmulatorError(
                    f"no answer on {url} after {self.startup_timeout}s: "
                    f"{self._log_tail()}"
                )
            time.sleep(0.05)

    def _launch_proxy(self) -> None:
        assert self._workdir is not None
        command = [
            sys.executable, os.path.abspath(__file__), "--front-proxy",
            str(self.server_port), str(self._workdir), str(self._server.pid),
        ]
        log = open(self._workdir / "proxy.log", "ab")
        try:
            self._proxy = subprocess.Popen(
                command,
                # The proxy stops itself and the server when this pipe closes,
                # i.e. when this process dies without calling stop().
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                # Run as a script, it still imports tests.support.processes from the repo root.
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))},
            )
        finally:
            log.close()
        # The proxy binds port 0 and reports the port it got.
        ready, _, _ = select.select([self._proxy.stdout], [], [], self.startup_timeout)
        line = self._proxy.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            raise GcsEmulatorError("the proxy in front of fake-gcs-server did not start")
        self.proxy_port = int(line)

    def _stop_server(self) -> None:
        if self._server is not None:
            terminate_group(self._server, grace=5.0)
            self._server = None

    def _cleanup_workdir(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _log_tail(self, limit: int = 2000) -> str:
        if self._workdir is None:
            return ""
        try:
            return (self._workdir / "fake-gcs-server.log").read_text(
                errors="replace")[-limit:]
        except OSError:
            return ""

    # -- credentials and certificates --------------------------------------

    def _write_fake_credentials(self) -> None:
        """An ADC file that google.auth accepts without any network access.

        "authorized_user" credentials with an access token that expires in
        the far future are valid as they are, so they are never refreshed.
        """
        assert self._workdir is not None
        info = {
            "type": "authorized_user",
            "client_id": "imagerecords-test.apps.example",
            "client_secret": "not-a-secret",
            "refresh_token": "not-a-refresh-token",
            "token": "fake-access-token",
            "expiry": "2999-01-01T00:00:00Z",
            "quota_project_id": self.project,
        }
        (self._workdir / "credentials.json").write_text(json.dumps(info))

    def _write_certificates(self) -> None:
        """A throw-away CA and a server certificate for the Google host names."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        assert self._workdir is not None
        now = datetime.datetime.now(datetime.timezone.utc)
        validity = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=7))

        def name(common_name: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = name("imagerecords test CA")
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(validity[0])
            .not_valid_after(validity[1])
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False, content_commitment=False,
                    key_encipherment=False, data_encipherment=False,
                    key_agreement=False, key_cert_sign=True, crl_sign=True,
                    encipher_only=False, decipher_only=False),
                critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                critical=False)
            .sign(ca_key, hashes.SHA256())
        )

        server_key = ec.generate_private_key(ec.SECP256R1())
        alt_names: List[x509.GeneralName] = [x509.DNSName(h) for h in TF_STORAGE_HOSTS]
        alt_names += [
            x509.DNSName("*.storage.googleapis.com"),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address(_LOOPBACK)),
        ]
        server_cert = (
            x509.CertificateBuilder()
            .subject_name(name(TF_STORAGE_HOSTS[0]))
            .issuer_name(ca_name)
            .public_key(server_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(validity[0])
            .not_valid_after(validity[1])
            .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False)
            .sign(ca_key, hashes.SHA256())
        )

        pem = serialization.Encoding.PEM
        (self._workdir / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
        (self._workdir / "server.pem").write_bytes(server_cert.public_bytes(pem))
        (self._workdir / "server.key").write_bytes(
            server_key.private_bytes(
                pem,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    # -- environment -------------------------------------------------------

    def env(self) -> Dict[str, str]:
        """Environment variables that point GCS clients at this emulator."""
        if not self.running or self._workdir is None:
            raise GcsEmulatorError("emulator not started")
        variables = {
            # google-cloud-storage (hence Beam's GcsIO): endpoint + project.
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "GOOGLE_CLOUD_PROJECT": self.project,
            # Makes google.auth.default() succeed at once (Beam otherwise
            # spends ~30 s retrying before it falls back to anonymous).
            "GOOGLE_APPLICATION_CREDENTIALS": str(self._workdir / "credentials.json"),
            # Never probe the GCE metadata server (google-auth, TensorFlow).
            "NO_GCE_CHECK": "true",
        }
        if self.tensorflow:
            proxy = self.endpoint  # the same proxy also tunnels HTTPS
            no_proxy = f"{_LOOPBACK},localhost"
            variables.update({
                # TensorFlow's GCS filesystem: skip OAuth entirely.
                "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake-access-token",
                # libcurl reaches the Google host names through the proxy and
                # trusts only the test CA.  `requests` honours these variables
                # too, so real HTTPS hosts are unreachable meanwhile.
                "HTTPS_PROXY": proxy,
                "https_proxy": proxy,
                "NO_PROXY": no_proxy,
                "no_proxy": no_proxy,
                "CURL_CA_BUNDLE": str(self._workdir / "ca.pem"),
                # TensorFlow caches object stats and blocks per process;
                # caching would hide writes made through other clients.
                "GCS_STAT_CACHE_MAX_AGE": "0",
                "GCS_READ_CACHE_MAX_SIZE_MB": "0",
                "GCS_MATCHING_PATHS_CACHE_MAX_AGE": "0",
                # Fail in seconds, not minutes, when a request keeps failing.
                "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "50000",
                "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "1000000",
            })
        return variables

    @contextlib.contextmanager
    def activated(self) -> Iterator["GcsEmulator"]:
        """Set :meth:`env` in ``os.environ``; restore the old values on exit."""
        variables = self.env()
        saved = {key: os.environ.get(key) for key in variables}
        os.environ.update(variables)
        try:
            yield self
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    # -- direct access, independent of os.environ ---------------------------

    @property
    def client(self):
        """A google-cloud-storage client bound to this emulator."""
        if self._client is None:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self._client = storage.Client(
                project=self.project,
                credentials=AnonymousCredentials(),
                client_options={"api_endpoint": self.endpoint},
            )
        return self._client

    def create_bucket(self, name: str) -> None:
        """Create a bucket; creating an existing one is not an error."""
        from google.api_core.exceptions import Conflict

        with contextlib.suppress(Conflict):
            self.client.create_bucket(name, project=self.project)

    def upload(
        self, source: Union[bytes, bytearray, str, "os.PathLike[str]"], gs_uri: str
    ) -> None:
        """Store ``source`` (bytes, or the path of a local file) at ``gs_uri``."""
        bucket, name = parse_gs_uri(gs_uri)
        blob = self.client.bucket(bucket).blob(name)
        if isinstance(source, (bytes, bytearray)):
            blob.upload_from_string(bytes(source), content_type="application/octet-stream")
        else:
            blob.upload_from_filename(os.fspath(source), content_type="application/octet-stream")

    def upload_tree(self, folder: Union[str, "os.PathLike[str]"], gs_prefix: str) -> None:
        """Store every file under the local ``folder`` below ``gs_prefix`` (``gs://b/dir``), keeping
        relative paths."""
        for dirpath, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(dirpath, name)
                self.upload(path, f"{gs_prefix.rstrip('/')}/{os.path.relpath(path, folder)}")

    def download(self, gs_uri: str) -> bytes:
        """The exact bytes stored at ``gs_uri``."""
        bucket, name = parse_gs_uri(gs_uri)
        return self.client.bucket(bucket).blob(name).download_as_bytes(raw_download=True)

    def requests(self) -> List["Request"]:
        """Every request the proxy has answered so far, oldest first, with the bytes of each answer's
        body: what a test counts to say how much a step read (take the length before the step)."""
        if self._workdir is None:
            raise GcsEmulatorError("emulator not started")
        out = []
        with open(self._workdir / "proxy.log", encoding="latin-1") as f:
            for line in f:
                request = Request.parse(line)
                if request is not None:
                    out.append(request)
        return out

    def list(self, prefix: str) -> List[str]:
        """Sorted ``gs://`` URIs of all objects under ``prefix`` (``gs://b/dir/``)."""
        bucket, name_prefix = parse_gs_uri(prefix)
        blobs = self.client.list_blobs(bucket, prefix=name_prefix or None)
        return sorted(f"gs://{bucket}/{blob.name}" for blob in blobs)


# --------------------------------------------------------------------------
# The proxy in front of fake-gcs-server (a child process, see _launch_proxy)
# --------------------------------------------------------------------------

# Headers that describe a single hop; never forwarded as they are.
_HOP_BY_HOP_HEADERS = frozenset({
    "connection", "content-length", "expect", "keep-alive", "proxy-authenticate",
    "proxy-authorization", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade",
})

_BATCH_PATH = "/batch/storage/v1"


def _parse_batch(content_type: str, body: bytes):
    """Split a GCS batch request into ``(method, path, headers, body)`` tuples.

    The body is ``multipart/mixed``; each part holds one HTTP request whose
    target may be an absolute URL.
    """
    import email.parser
    import urllib.parse

    message = email.parser.BytesParser().parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise ValueError("batch body is not multipart")
    requests = []
    for part in message.get_payload():
        raw = part.get_payload(decode=True) or b""
        head, _, sub_body = raw.replace(b"\r\n", b"\n").partition(b"\n\n")
        request_line, *header_lines = head.decode("latin-1").split("\n")
        method, target, _ = request_line.split(" ", 2)
        url = urllib.parse.urlsplit(target)
        path = url.path + (f"?{url.query}" if url.query else "")
        headers = [
            tuple(item.strip() for item in line.split(":", 1))
            for line in header_lines if ":" in line
        ]
        requests.append((method, path, headers, sub_body.strip(b"\n")))
    return requests


def _batch_response(responses) -> Tuple[str, bytes]:
    """Encode ``(status, reason, headers, body)`` tuples as a batch response."""
    import uuid

    boundary = f"batch_{uuid.uuid4().hex}"
    chunks = []
    for index, (status, reason, headers, body) in enumerate(responses, start=1):
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{key}: {value}" for key, value in headers
                  if key.lower() not in _HOP_BY_HOP_HEADERS]
        lines.append(f"Content-Length: {len(body)}")
        chunks.append(
            f"--{boundary}\r\nContent-Type: application/http\r\n"
            f"Content-ID: <response-{index}>\r\n\r\n".encode("latin-1")
            + "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body + b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode("latin-1"))
    return f"multipart/mixed; boundary={boundary}", b"".join(chunks)


def _run_front_proxy(server_port: int, workdir: Path, server_pid: int) -> None:
    """Serve GCS clients on a free loopback port, in front of fake-gcs-server.

    * Plain HTTP requests (google-cloud-storage, Beam) are forwarded to the
      server, except batch requests (``POST /batch/storage/v1``), which are
      split and sent one by one, the answers being packed into one
      ``multipart/mixed`` response.
    * ``CONNECT www.googleapis.com:443`` / ``storage.googleapis.com:443``
      (TensorFlow, via ``HTTPS_PROXY``) is accepted when ``workdir`` holds the
      test certificate: the proxy does the TLS handshake itself and serves the
      requests of the tunnel like plain ones.  Two quirks are repaired there:
      TensorFlow sends ``Transfer-Encoding: identity`` with empty POST/PUT
      bodies, which Go's HTTP server rejects with 501 (requests are re-sent
      with an explicit ``Content-Length``); and the resumable-upload
      ``Location`` says ``http://<Host>/...``, which is turned into
      ``https://<Host>/...`` so the upload goes on through the tunnel.

    The port is printed on stdout once the proxy listens.  When stdin
    reaches end-of-file (the test process is gone), the proxy terminates the
    server's process group (``server_pid``) and exits.
    """
    import http.client
    import http.server
    import ssl

    server_base = f"http://{_LOOPBACK}:{server_port}"
    tls_context = None
    if (workdir / "server.pem").exists():
        tls_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls_context.load_cert_chain(workdir / "server.pem", workdir / "server.key")

    def send_upstream(method, path, headers, body):
        """One request to fake-gcs-server -> (status, reason, headers, body)."""
        upstream = http.client.HTTPConnection(_LOOPBACK, server_port, timeout=120)
        try:
            upstream.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for key, value in headers:
                if key.lower() not in _HOP_BY_HOP_HEADERS:
                    upstream.putheader(key, value)
            if not any(key.lower() == "host" for key, _ in headers):
                upstream.putheader("Host", f"{_LOOPBACK}:{server_port}")
            if body or method in ("POST", "PUT", "PATCH"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            return response.status, response.reason, response.getheaders(), response.read()
        finally:
            upstream.close()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, answers Expect: 100-continue
        scheme = "http"

        def log_message(self, format: str, *args) -> None:
            host = self.headers.get("Host", "-") if self.headers else "-"
            sys.stderr.write(f"{self.scheme}://{host} {format % args}\n")

        # -- tunnels for TensorFlow -------------------------------------

        def do_CONNECT(self) -> None:
            host, _, port = self.path.rpartition(":")
            if tls_context is None or host not in TF_STORAGE_HOSTS or port != "443":
                self.send_error(403, "only Google storage hosts are tunnelled")
                return
            self.send_response(200, "Connection Established")
            self.end_headers()
            self.close_connection = True  # this socket now belongs to the tunnel
            try:
                tunnel = tls_context.wrap_socket(self.connection, server_side=True)
            except (ssl.SSLError, OSError):
                return
            with tunnel, contextlib.suppress(ssl.SSLError, OSError):
                TunnelHandler(tunnel, self.client_address, self.server)

        # -- forwarding -------------------------------------------------

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _forward(self) -> None:
            body = self._read_body()
            try:
                if self.command == "POST" and self.path.split("?")[0] == _BATCH_PATH:
                    status, reason, headers, data = self._run_batch(body)
                else:
                    status, reason, headers, data = send_upstream(
                        self.command, self.path, list(self.headers.items()), body)
            except (OSError, ValueError) as error:
                self.send_error(502, f"proxy error: {error}")
                return
            self.log_request(status, 0 if self.command == "HEAD" else len(data))  # body bytes: tests count reads
            self.send_response_only(status, reason)
            for key, value in headers:
                if key.lower() in _HOP_BY_HOP_HEADERS:
                    continue
                if key.lower() == "location":
                    value = self._client_location(value)
                self.send_header(key, value)
            if self.command == "HEAD":
                length = dict((k.lower(), v) for k, v in headers).get("content-length")
                if length is not None:
                    self.send_header("Content-Length", length)
            else:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _run_batch(self, body: bytes):
            responses = [
                send_upstream(method, path, headers, sub_body)
                for method, path, headers, sub_body in _parse_batch(
                    self.headers.get("Content-Type", ""), body)
            ]
            content_type, data = _batch_response(responses)
            return 200, "OK", [("Content-Type", content_type)], data

        def _client_location(self, location: str) -> str:
            """Make a URL in a Location header lead back through this proxy."""
            host = self.headers.get("Host", f"{_LOOPBACK}:{server_port}")
            for base in (server_base, f"http://{host}"):
                if location.startswith(base + "/"):
                    return f"{self.scheme}://{host}{location[len(base):]}"
            return location

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    class TunnelHandler(Handler):
        """Serves the requests sent inside one TLS tunnel."""

        scheme = "https"

        def do_CONNECT(self) -> None:
            self.send_error(405)

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

    def stop_with_parent() -> None:
        sys.stdin.buffer.read()  # returns at EOF: the parent has gone
        with contextlib.suppress(OSError):
            os.killpg(server_pid, signal.SIGTERM)
        os._exit(0)

    threading.Thread(target=stop_with_parent, daemon=True).start()
    with Server((_LOOPBACK, 0), Handler) as server:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print(server.server_address[1], flush=True)
        server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--front-proxy":
        _run_front_proxy(int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(f"usage: {sys.argv[0]} --front-proxy SERVER_PORT WORKDIR SERVER_PID")
