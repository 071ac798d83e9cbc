"""The output folder's lock: one build (or `finish`, or a job's own commit step) writes into OUT at a time.

    OUT/.imagerecords.lock    {build_id, host, pid, started, command}, created only if absent

A lock whose process is gone on this host is taken over with a note; a live one, or another
host's, blocks until --break_lock. Kept apart from the commit so that what holds OUT and what is
written into it are read separately.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import socket
import time
import uuid
from typing import Callable, Optional

from imagerecords.format.manifest import LOCK
from imagerecords.format.paths import segment_problem
from imagerecords.pipeline import storage
from imagerecords.pipeline.errors import LockHeld, OutputError
from imagerecords.pipeline.naming import setting

log = logging.getLogger(__name__)

DETACHED = "detached"  # LockInfo.command of a build whose job runs on without its launcher
JOB_COMMIT = "job-commit"  # LockInfo.command of a job's own last step, publishing what its launcher locked
# LockInfo.command of a pipeline's commit (WriteDataset): it held no lock while it wrote, touches only
# its own staging, and holds the lock for seconds; other pipelines' writers go on, their commits wait.
COMMIT = "commit"
COMMIT_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class LockInfo:
    """Who holds an output folder.

    Attributes:
      build_id: the holder's build id.
      host: host name of the holder's launcher.
      pid: process id of the holder's launcher.
      started: UTC start time (ISO 8601).
      command: what the holder runs (build, finish, or detached: a build submitted with --detached,
        whose job runs on the cluster after its launcher exited; `finish` takes it over once
        staging/results.json exists).
    """

    build_id: str
    host: str
    pid: int
    started: str
    command: str = "build"

    def describe(self) -> str:
        return f"build {self.build_id} ({self.command}, host {self.host}, pid {self.pid}, started {self.started})"

    def is_dead_here(self) -> bool:
        """True when the holder ran on this host and its process is gone: its lock is stale. A
        detached build's launcher is gone by design (its job runs on), so its lock is never stale."""
        if self.host != socket.gethostname() or self.command == DETACHED:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return is_zombie(self.pid)


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def new_build_id() -> str:
    # Microseconds: two builds of one folder within a second still sort in the order they started.
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ") + "-" + uuid.uuid4().hex[:6]


@dataclasses.dataclass(frozen=True)
class UnreadableLock(LockInfo):
    """A lock file that holds no LockInfo this tool wrote (not JSON, fields unknown or missing, a pid
    that is not an integer).

    Attributes:
      reason: what is wrong with it, for the message.
    """

    reason: str = ""

    def describe(self) -> str:
        return f"unreadable lock file ({self.reason})"

    def is_dead_here(self) -> bool:
        return False  # nothing says whose it is: only --break_lock takes it


def _unreadable(reason: str) -> UnreadableLock:
    return UnreadableLock("unknown", "unknown", -1, "unknown", "unknown", reason)


def read_lock(output: str) -> Optional[LockInfo]:
    path = storage.join(output, LOCK)
    try:
        data = json.loads(storage.read_bytes(path))
    except OSError:
        return None
    except ValueError:
        return _unreadable("not JSON")
    if not isinstance(data, dict):
        return _unreadable("not a JSON object")
    fields = {f.name: f for f in dataclasses.fields(LockInfo)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        return _unreadable(f"unknown field {unknown[0]!r}")
    missing = [n for n, f in fields.items() if n not in data and f.default is dataclasses.MISSING]
    if missing:
        return _unreadable(f"it has no {missing[0]}")
    pid = data["pid"]
    if not isinstance(pid, int) or isinstance(pid, bool):  # a bool is an int to Python
        shown = json.dumps(pid)
        return _unreadable(f"its pid is {shown if len(shown) <= 40 else shown[:37] + '...'}, not an integer")
    problem = segment_problem(data["build_id"])
    if problem:  # a build id names staging and version folders
        return _unreadable(f"its build_id {data['build_id']!r} {problem}")
    return LockInfo(**data)


def _create_exclusive(path: str, data: bytes) -> bool:
    """Creates `path` holding `data` only if it does not exist; returns False when it did."""
    if storage.is_local(path):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    if path.startswith("gs://"):
        # google-api-core: 284 ms to import, the gcp extra; only a gs:// lock needs it
        from google.api_core import exceptions as gexc

        bucket, _, name = path[len("gs://"):].partition("/")
        blob = _gcs_client().bucket(bucket).blob(name)
        try:
            # Generation 0 means "only if no live object has this name": GCS decides, not us.
            blob.upload_from_string(data, content_type="application/json", if_generation_match=0)
        except gexc.PreconditionFailed:
            return False
        return True
    # Other filesystems have no create-if-absent; check then create (a narrow race, documented).
    if storage.exists(path):
        return False
    with storage.create(path) as f:
        f.write(data)
    return True


def _gcs_client():
    return storage.gcs_client()


class OutputLock:
    """The output folder's lock, held by one build (or `finish`) at a time.

    A lock left by a killed launcher on this host (its pid is gone) is taken over with a note; one
    held by a live process, or by another host, blocks until the user passes --break_lock.
    """

    def __init__(self, output: str, build_id: str, command: str = "build", break_lock: bool = False,
                 detached_job_done: Optional[Callable[[], bool]] = None, wait_for_commits_s: float = 0.0):
        """`detached_job_done` (given by `finish`): whether a detached job has staged its results, so
        that its lock may be taken over. `wait_for_commits_s`: how long to wait while another
        pipeline's commit (COMMIT, JOB_COMMIT) holds the lock, before LockHeld."""
        self._output = output
        self._detached_job_done = detached_job_done
        self._wait_for_commits_s = wait_for_commits_s
        self._path = storage.join(output, LOCK)
        self.info = LockInfo(build_id, socket.gethostname(), os.getpid(),
                             datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), command)
        self._break = break_lock
        self._held = False
        self.took_over: Optional[LockInfo] = None
        self._took_over_because = ""

    def acquire(self) -> "OutputLock":
        deadline = time.monotonic() + self._wait_for_commits_s
        while True:
            try:
                return self._acquire_once()
            except LockHeld:
                holder = read_lock(self._output)
                if holder is None:
                    continue  # released meanwhile
                if holder.command not in (COMMIT, JOB_COMMIT) or time.monotonic() >= deadline:
                    raise
                time.sleep(COMMIT_POLL_S)  # another pipeline's commit: seconds, then it releases

    def _acquire_once(self) -> "OutputLock":
        data = json.dumps(dataclasses.asdict(self.info), sort_keys=True).encode()
        for _ in range(3):
            try:
                created = _create_exclusive(self._path, data)
            except OSError as e:
                raise OutputError(f"cannot create the lock {self._path}: {storage.os_reason(e)}") from None
            if created:
                self._held = True
                return self
            holder = read_lock(self._output)
            if holder is None:
                continue  # released between our create and our read: try again
            dead = holder.is_dead_here()
            detached = not dead and self._finishes_detached(holder)
            # A job's commit step takes its own launcher's lock (same build id): that launcher has
            # handed the build over, or is about to, and never commits it itself.
            own = self.info.command == JOB_COMMIT and holder.build_id == self.info.build_id
            if dead or detached or own or self._break:
                log.info("taking over the lock of %s", holder.describe())
                self.took_over = holder
                self._took_over_because = ("gone" if dead else "detached" if detached else "own" if own
                                           else "broken")
                storage.delete_quietly([self._path])
                continue
            if isinstance(holder, UnreadableLock):
                raise LockHeld(f"the lock file {self._path} is unreadable ({holder.reason}); if no build is running "
                               f"into {self._output}, rerun with {setting('break_lock')}")
            raise LockHeld(f"{self._output} is locked by {holder.describe()}; wait for it to end, or, if no build "
                           f"is running there any more, rerun with {setting('break_lock')}")
        if storage.is_local(self._path) and os.path.isdir(self._path):
            raise OutputError(f"{self._path} is a folder, not a lock file; remove it (rm -r {self._path}) and rerun")
        raise LockHeld(f"could not take the lock {self._path} after 3 tries (another build keeps taking it)")

    def take_over_note(self) -> Optional[str]:
        """What to tell the user about a lock this one replaced; None when there was none."""
        if self.took_over is None:
            return None
        holder = self.took_over.describe()
        if isinstance(self.took_over, UnreadableLock):
            return f"broke the {holder} at your request ({setting('break_lock')})"
        return {"gone": f"took over the lock of {holder}, whose process is no longer running",
                "detached": f"took over the lock of {holder}, whose detached job has staged its results",
                "own": f"took over the lock of {holder}, this job's own launcher",
                "broken": f"broke the lock of {holder} at your request ({setting('break_lock')})"}[self._took_over_because]

    def _finishes_detached(self, holder: LockInfo) -> bool:
        """`finish` takes over a detached build's lock once its job has staged its results."""
        return (self._detached_job_done is not None and holder.command == DETACHED
                and self._detached_job_done())

    def hand_over_to_detached_job(self) -> None:
        """Marks the lock as held by this build's detached job (command "detached") and lets go of
        it here: leaving the `with` block no longer removes it; `finish` takes it over later."""
        self.info = dataclasses.replace(self.info, command=DETACHED)
        holder = read_lock(self._output)
        if holder is not None and holder.build_id == self.info.build_id:  # else the job has published already
            storage.write_bytes(self._path, json.dumps(dataclasses.asdict(self.info), sort_keys=True).encode())
        self._held = False

    def release(self) -> None:
        if not self._held:
            return
        holder = read_lock(self._output)
        if holder is not None and holder.build_id == self.info.build_id:
            storage.delete_quietly([self._path])
        self._held = False

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
