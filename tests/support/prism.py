"""Beam's Prism runner for the tests: the binary .ci/get_prism.sh builds for the installed apache-beam.

Prism is Beam's portable local runner (a Go program); since apache-beam 2.68 `--runner
DirectRunner` runs on it when it can. CI's main stage pins apache-beam 2.62, where Prism tests
skip; the newest-Beam stage runs them and must not skip them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "get_prism.sh"
# The first apache-beam whose DirectRunner runs on Prism; older releases are not tested on it.
MIN_BEAM = (2, 68)


def beam_version() -> Tuple[int, ...]:
    import apache_beam

    return tuple(int(p) for p in apache_beam.__version__.split(".")[:2] if p.isdigit())


def ensure_binary() -> Tuple[Optional[str], str]:
    """(path of the Prism binary for this apache-beam, '') or (None, why there is none)."""
    import apache_beam

    if beam_version() < MIN_BEAM:
        return None, (f"apache-beam {apache_beam.__version__} predates Prism as the DirectRunner "
                      f"({'.'.join(map(str, MIN_BEAM))}); the newest-Beam CI stage runs the Prism tests")
    done = subprocess.run([str(SCRIPT)], env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
        return None, f"could not build Prism: {last}"
    path = done.stdout.strip().splitlines()[-1]
    return path, ""

