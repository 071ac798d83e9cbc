"""Test hooks, in one place: each call is a no-op unless a test set its environment variable.

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
