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


def _auto_workers(one_cpu=False, **env):
    code = "import conftest; print(conftest.pytest_xdist_auto_num_workers(None))"
    first = min(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests"), **env},
                          preexec_fn=(lambda: os.sched_setaffinity(0, {first})) if one_cpu else None)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.slow  # three interpreters importing pytest, about a second
def test_n_auto_is_two_to_four_workers_and_yields_to_the_users_count():
    assert _auto_workers(one_cpu=True) == "2"  # one CPU: still two, as the tests mostly wait on subprocesses
    assert 2 <= int(_auto_workers()) <= 4
    assert _auto_workers(PYTEST_XDIST_AUTO_NUM_WORKERS="7") == "None"  # pytest-xdist then reads the 7
