"""The tests' observer of a build's phases (imagerecords.pipeline.phases), set for every test by
conftest.py; each behaviour is off unless its variable is set, so a build that sets none runs as a
user's does.

IMAGERECORDS_TEST_PAUSE=PHASE makes the process that reaches PHASE write its pid to
IMAGERECORDS_TEST_PAUSE_DIR/PHASE and wait there: until it is killed, or, with
IMAGERECORDS_TEST_RELEASE=PATH, until PATH exists (a writer held past its launcher's death).
IMAGERECORDS_TEST_FAIL_ONCE=PATH: the first shard writer half-way through a shard creates PATH and
fails, so a test sees the runner retry a shard mid-write.
IMAGERECORDS_WRITER_LOG=DIR: each staged shard's writer (host, pid, ppid, cpu_s) as DIR/<shard>.json,
so a test sees where the work ran (on a cluster DIR is a folder of each worker's host).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

OBSERVER = "tests.support.phases:observe"


def observe(phase: str, **facts) -> None:
    if phase == "mid_shard":
        _fail_once(facts["filename"])
    elif phase == "shard_staged":
        _log_writer(facts["filename"], facts["records"])
    if os.environ.get("IMAGERECORDS_TEST_PAUSE") == phase:
        _pause(phase)


def _pause(phase: str) -> None:
    marker_dir = os.environ.get("IMAGERECORDS_TEST_PAUSE_DIR", ".")
    with open(os.path.join(marker_dir, phase), "w") as f:
        f.write(str(os.getpid()))
    release = os.environ.get("IMAGERECORDS_TEST_RELEASE")
    while True:
        if release:
            if os.path.exists(release):
                return
            time.sleep(0.05)  # polls a file the test creates; the condition, not the time, ends it
        elif hasattr(signal, "pause"):
            signal.pause()
        else:
            time.sleep(3600)


def _fail_once(filename: str) -> None:
    marker = os.environ.get("IMAGERECORDS_TEST_FAIL_ONCE")
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise RuntimeError(f"test hook: failing once in the middle of {filename}")


def _log_writer(filename: str, count: int) -> None:
    log_dir = os.environ.get("IMAGERECORDS_WRITER_LOG")
    if not log_dir:
        return
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, filename + ".json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"shard": filename, "records": count, "host": socket.gethostname(), "pid": os.getpid(),
                   "ppid": os.getppid(), "cpu_s": time.process_time()}, f)
    os.replace(tmp, path)
