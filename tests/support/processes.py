"""Process helpers shared by the test servers: free ports and stopping a process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


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
