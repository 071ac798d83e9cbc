"""Test and debug hooks, in one place: each call is a no-op unless its environment variable is set.

IMAGERECORDS_TEST_PAUSE=PHASE makes the process that reaches PHASE write its pid to
IMAGERECORDS_TEST_PAUSE_DIR/PHASE and wait there: until it is killed, or, with
IMAGERECORDS_TEST_RELEASE=PATH, until PATH exists (a writer held past its launcher's death).
"""

from __future__ import annotations

import os
import signal
import time


def pause(phase: str) -> None:
    if os.environ.get("IMAGERECORDS_TEST_PAUSE") != phase:
        return
    marker_dir = os.environ.get("IMAGERECORDS_TEST_PAUSE_DIR", ".")
    with open(os.path.join(marker_dir, phase), "w") as f:
        f.write(str(os.getpid()))
    release = os.environ.get("IMAGERECORDS_TEST_RELEASE")
    while True:
        if release:
            if os.path.exists(release):
                return
            time.sleep(0.05)
        elif hasattr(signal, "pause"):
            signal.pause()
        else:
            time.sleep(3600)


def fail_once(filename: str) -> None:
    """With IMAGERECORDS_TEST_FAIL_ONCE=PATH, the first shard writer to get half-way through a shard
    creates PATH and fails, so a test sees the runner retry a shard mid-write."""
    marker = os.environ.get("IMAGERECORDS_TEST_FAIL_ONCE")
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise RuntimeError(f"test hook: failing once in the middle of {filename}")


def log_writer(filename: str, count: int) -> None:
    """With IMAGERECORDS_WRITER_LOG=DIR, records which process wrote each shard as DIR/<shard>.json
    ({shard, records, host, pid, ppid, cpu_s}), so a test or an operator sees where the work ran (on
    a cluster DIR is a local folder of each worker's host). The last successful attempt wins."""
    log_dir = os.environ.get("IMAGERECORDS_WRITER_LOG")
    if not log_dir:
        return
    import json
    import socket

    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, filename + ".json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"shard": filename, "records": count, "host": socket.gethostname(), "pid": os.getpid(),
                   "ppid": os.getppid(), "cpu_s": time.process_time()}, f)
    os.replace(tmp, path)


def columns_from() -> int:
    """Shards per split from which the manifest holds the split as columns (format.manifest.COLUMNS_FROM);
    IMAGERECORDS_TEST_COLUMNS_FROM=N lowers it, so tests write the columnar form on small real builds."""
    from imagerecords.format.manifest import COLUMNS_FROM

    value = os.environ.get("IMAGERECORDS_TEST_COLUMNS_FROM")
    return int(value) if value else COLUMNS_FROM
