"""Process helpers shared by the test servers: free ports, stopping a process group, and a lock
that lets one of several pytest runs fetch a tool into the shared cache while the others wait."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator


def free_port(host: str = "127.0.0.1") -> int:
    """Returns a TCP port on `host` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def terminate_group(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """Stops the process group `proc` leads (started with start_new_session=True): SIGTERM, then
    SIGKILL after `grace` seconds, and SIGKILL again for children that outlive the leader."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def cache_dir() -> Path:
    """The per-user cache the tools the tests need are fetched into (``$IMAGERECORDS_CACHE``, the
    same default as the .ci/get_*.sh scripts)."""
    configured = os.environ.get("IMAGERECORDS_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "imagerecords"


@contextlib.contextmanager
def exclusive_lock(path: Path, timeout: float, what: str) -> Iterator[None]:
    """Holds an exclusive flock on `path` (created if missing), waiting at most `timeout` seconds.

    The kernel drops the lock when its holder dies, so a killed run never leaves a stale one.

    Raises:
        TimeoutError: Another process held the lock for `timeout` seconds; the message names
            `what` it was doing and the lock file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process held {path} for {timeout:.0f} s while {what}")
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
