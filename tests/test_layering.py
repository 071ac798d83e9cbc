"""The import rules of the layout (README, "Layout"), read from every module's source with ast: the
build library and the format never import the command; the reader side imports only the format."""

import ast
import os

import pytest

import imagerecords

PACKAGE_DIR = os.path.dirname(imagerecords.__file__)


def _modules():
    """(dotted module name, path) of every .py file of the package."""
    out = []
    for folder, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE_DIR))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out.append((".".join(rel), path))
    return out


def imported(module, path):
    """Every imagerecords module `path` imports, anywhere in it (functions too, not strings):
    `from imagerecords import reader` counts as imagerecords.reader; relative imports resolved."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if not a.name.startswith("__"))  # a submodule?
    return {name for name in found if name == "imagerecords" or name.startswith("imagerecords.")}


def _in(name, package):
    return name == package or name.startswith(package + ".")


MODULES = _modules()


def test_the_walk_sees_the_layout():
    names = {m for m, _ in MODULES}
    for expected in ("imagerecords.pipeline.session", "imagerecords.pipeline.checks", "imagerecords.pipeline.options",
                     "imagerecords.cli.launcher", "imagerecords.reader", "imagerecords.format.records"):
        assert expected in names
    # The walk finds a function-level import (the check would pass vacuously otherwise).
    assert "imagerecords.pipeline.session" in imported("imagerecords.cli.launcher",
                                                       os.path.join(PACKAGE_DIR, "cli", "launcher.py"))


@pytest.mark.parametrize("layer", ["imagerecords.pipeline", "imagerecords.format", "imagerecords.transforms"])
def test_nothing_below_the_command_imports_it(layer):
    offenders = {m: sorted(n for n in imported(m, p) if _in(n, "imagerecords.cli"))
                 for m, p in MODULES if _in(m, layer)}
    assert {m: names for m, names in offenders.items() if names} == {}


@pytest.mark.parametrize("layer", ["imagerecords.reader", "imagerecords.torch", "imagerecords.grain"])
def test_the_reader_side_imports_only_the_format(layer):
    def allowed(name):
        # `from imagerecords import x` names the package itself; x is checked on its own
        return name == "imagerecords" or _in(name, "imagerecords.format") or _in(name, layer)

    offenders = {m: sorted(n for n in imported(m, p) if not allowed(n)) for m, p in MODULES if _in(m, layer)}
    assert {m: names for m, names in offenders.items() if names} == {}


def test_a_planted_import_is_caught(tmp_path):
    # The rule is only as good as the walk: a function-level, relative import of cli is seen.
    path = tmp_path / "planted.py"
    path.write_text("def f():\n    from ..cli import launcher\n    return launcher\n")
    assert "imagerecords.cli.launcher" in imported("imagerecords.pipeline.planted", str(path))
