"""The import rules of the layout (README, "Layout"), read from every module's source with ast: the
build library and the format never import the command; the reader side imports only the format;
no two modules import each other, directly or through others, imports inside functions counted."""

import ast
import os

import pytest

import imagerecords

PACKAGE_DIR = os.path.dirname(imagerecords.__file__)


def _modules(package_dir=PACKAGE_DIR):
    """(dotted module name, path) of every .py file of the package."""
    out = []
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(package_dir))[:-3].split(os.sep)
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
    top = module.split(".")[0]
    return {name for name in found if name == top or name.startswith(top + ".")}


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


def import_graph(package_dir=PACKAGE_DIR):
    """{module: the package's modules it imports}, imports inside functions included. A name is the
    module it denotes (`from pkg.mod import f` is pkg.mod). A package above the importer is no edge:
    Python has run it before the importer, so it cannot close a circle through it."""
    modules = dict(_modules(package_dir))

    def module_of(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for m, path in modules.items():
        targets = {module_of(n) for n in imported(m, path)}
        graph[m] = {t for t in targets if t and t != m and not m.startswith(t + ".")}
    return graph


def circles(graph):
    """The import circles of `graph`: each set of two or more modules that reach one another."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]  # Tarjan's algorithm, with an explicit stack
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                members = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    members.add(w)
                    if w == v:
                        break
                if len(members) > 1:
                    found.append(members)
    return found


def test_no_import_circle_counting_imports_inside_functions():
    found = circles(import_graph())
    assert found == [], "modules that import one another (move what the lower one needs down to it):\n" + "\n".join(
        "  a circle of " + ", ".join(sorted(c)) for c in found)


def _package(root, files):
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).write_text(text)
    return str(pkg)


def test_a_planted_function_level_circle_is_caught(tmp_path):
    pkg = _package(tmp_path, {"low.py": "from pkg import high\n",
                              "high.py": "def f():\n    from .low import thing\n    return thing\n",
                              "alone.py": "import pkg.low\n"})
    assert circles(import_graph(pkg)) == [{"pkg.low", "pkg.high"}]


def test_a_package_without_a_circle_has_none(tmp_path):
    pkg = _package(tmp_path, {"low.py": "X = 1\n", "high.py": "def f():\n    from pkg.low import X\n    return X\n",
                              "sub.py": "from pkg import high, low\n"})
    assert circles(import_graph(pkg)) == []
