"""The gs:// tests fetch fake-gcs-server themselves: a fetch that cannot happen is one line naming
the command that mends it, a fetched binary is reused, and two runs share one fetch through a lock."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from tests.support import gcs
from tests.support.processes import exclusive_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Holds the lock until told on stdin, then "fetches" (writes an executable) and lets go.
_HOLDER = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from tests.support.processes import exclusive_lock

    lock, binary = Path(sys.argv[1]), Path(sys.argv[2])
    with exclusive_lock(lock, 30, "holding it for the test"):
        print("held", flush=True)
        sys.stdin.readline()
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\\n")
        binary.chmod(0o755)
    """)


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty cache and a PATH holding only `bash`: no Go toolchain, no fake-gcs-server."""
    tools = tmp_path / "tools"
    tools.mkdir()
    os.symlink("/bin/bash" if os.path.exists("/bin/bash") else "/usr/bin/bash", tools / "bash")
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setenv("IMAGERECORDS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(gcs.BINARY_ENV_VAR, raising=False)
    return tmp_path / "cache"


def test_fetch_without_go_is_one_line_naming_the_command(empty_cache):
    with pytest.raises(gcs.EmulatorUnavailable) as error:
        gcs.ensure_emulator_binary()
    assert str(error.value) == (
        "fake-gcs-server is not installed and could not be fetched (error: the Go toolchain is "
        "required to install fake-gcs-server); run .ci/get_gcs_emulator.sh or set "
        "IMAGERECORDS_FAKE_GCS_SERVER")
    assert not (empty_cache / "bin").exists()


def test_a_fetched_binary_is_reused_without_fetching(empty_cache, monkeypatch):
    binary = empty_cache / "bin" / "fake-gcs-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", str(empty_cache / "nothing"))  # running the script would fail
    assert gcs.ensure_emulator_binary() == str(binary)


@pytest.mark.slow
def test_a_second_run_waits_for_the_first_fetch_and_reuses_it(empty_cache, monkeypatch):
    lock, binary = empty_cache / "get_gcs_emulator.lock", empty_cache / "bin" / "fake-gcs-server"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock), str(binary)], cwd=ROOT,
                              env={**os.environ, "PATH": os.defpath, "PYTHONPATH": ROOT},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n", "the holder process never took the lock"
        with pytest.raises(TimeoutError, match=f"another process held {lock} for 1 s while probing"):
            with exclusive_lock(lock, 1, "probing"):
                pass

        first_look = threading.Event()
        find = gcs.find_emulator_binary

        def find_and_tell():
            found = find()
            first_look.set()
            return found

        monkeypatch.setattr(gcs, "find_emulator_binary", find_and_tell)
        monkeypatch.setenv("PATH", str(empty_cache / "nothing"))  # a fetch of its own would fail
        result = {}
        waiter = threading.Thread(target=lambda: result.update(path=gcs.ensure_emulator_binary()))
        waiter.start()
        assert first_look.wait(30), "ensure_emulator_binary never looked for the binary"
        holder.stdin.write("go\n")
        holder.stdin.close()
        waiter.join(60)
        assert not waiter.is_alive(), "ensure_emulator_binary still waiting after the holder let go"
        assert result == {"path": str(binary)}
        assert holder.wait(30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


PRISM = os.path.join(ROOT, ".ci", "get_prism.sh")


def test_get_prism_without_go_is_one_line_and_a_built_binary_is_kept(empty_cache, tmp_path):
    env = dict(os.environ, PRISM_VERSION="2.77.0")
    done = subprocess.run(["bash", PRISM], env=env, capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "get_prism: the Go toolchain is required to build Prism 2.77.0\n"
    binary = tmp_path / "cache" / "bin" / "prism-2.77.0"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    done = subprocess.run(["bash", PRISM], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == f"{binary}\n"


def test_get_prism_refuses_a_version_that_is_not_a_beam_release(empty_cache):
    done = subprocess.run(["bash", PRISM], env=dict(os.environ, PRISM_VERSION="2.77; rm -rf /"), capture_output=True,
                          text=True)
    assert done.returncode == 1 and done.stderr == "get_prism: not a Beam release version: '2.77; rm -rf /'\n"
