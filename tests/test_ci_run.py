""".ci/run runs the README's set-up commands as written, and a test that needs an optional piece
(the needs_extra mark) skips with its reason on a user's machine and fails in CI."""

import os
import subprocess
import sys

import pytest

from support import doc_blocks

ROOT = doc_blocks.ROOT


def test_ci_runs_the_readmes_two_set_up_commands_as_written():
    (block,) = doc_blocks.blocks("README.md", after="## Set-up: two commands")[:1]
    proc = subprocess.run(["bash", os.path.join(ROOT, ".ci", "run"), "--readme-commands"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == block.code and len(block.code.splitlines()) == 2, proc.stdout
    assert block.lang == "bash"


def test_the_readmes_test_command_runs_the_suite_in_parallel_as_ci_does():
    """What a newcomer runs is what CI runs: the README's second command, with the workers CI uses."""
    (block,) = doc_blocks.blocks("README.md", after="## Set-up: two commands")[:1]
    second = block.code.splitlines()[1]
    assert second.endswith("python -m pytest -q -n auto --dist loadfile tests"), second
    assert "[test]" in second and "-c constraints.txt" in second


_MARKED = '''
import pytest

@pytest.mark.needs_extra("chromium")
def test_marked():
    pass

def test_plain():
    pass
'''


@pytest.mark.parametrize("ci", ["", "1"])
def test_a_needs_extra_test_skips_with_its_reason_here_and_fails_in_ci(tmp_path, ci):
    (tmp_path / "test_marked.py").write_text(_MARKED)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable),  # no chromium on it
           "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "tests"), ROOT]), "IMAGERECORDS_CI": ci}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "conftest", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-p", "no:warnings", "test_marked.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    if ci:
        assert proc.returncode == 1 and "1 passed, 1 error" in proc.stdout, proc.stdout[-2000:]
        assert "CI must run this test, but: chromium is not on PATH" in proc.stdout, proc.stdout[-2000:]
    else:
        assert proc.returncode == 0 and "1 passed, 1 skipped" in proc.stdout, proc.stdout[-2000:]
        assert "SKIPPED [1] test_marked.py:4: chromium is not on PATH" in proc.stdout, proc.stdout[-2000:]
