"""Failures a user cannot fix by changing the input: the log an unexpected failure points at holds its
traceback, and the suite sets up the signal state its signal tests rely on."""

import os
import re
import signal
import subprocess
import sys

import pytest


def _env(**extra):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_full_log_of_an_unexpected_failure_holds_its_traceback(image_tree, tmp_path, workers):
    """A shard writer that raises (the test hook fails the first shard half-way) ends the build in one
    line naming a log file, and that file holds the traceback, from the worker process too."""
    root, _ = image_tree
    logs = tmp_path / "tmp"
    logs.mkdir()
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output",
                           str(tmp_path / "ds"), "--no_progress", "--local_workers", workers],
                          capture_output=True, text=True, timeout=300,
                          env=_env(IMAGERECORDS_TEST_FAIL_ONCE=tmp_path / "failed", TMPDIR=logs))
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    found = re.search(r"full log: (\S+\.log)", proc.stderr)
    assert found, proc.stderr
    log = found.group(1)
    assert log.startswith(str(logs)), log
    text = open(log).read()
    assert "Traceback (most recent call last)" in text, text[-2000:]
    assert "RuntimeError: test hook: failing once in the middle of" in text, text[-2000:]


@pytest.mark.slow
def test_the_signal_tests_pass_when_the_suite_starts_with_sigint_ignored(tmp_path):
    """As a background job of a non-interactive shell starts it: SIGINT ignored. The signal test still
    sees its build stop on SIGINT (conftest restores the default before any build starts)."""
    test = ("tests/test_local_engine.py::"
            "test_a_signal_to_the_launcher_stops_the_build_and_leaves_no_process[0-2]")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "inner"), test], cwd=repo, capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
