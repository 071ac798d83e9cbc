"""The import rules of the layout (README, "Layout"), read from every module's source with ast: the
build library and the format never import the command; the reader side imports only the format;
no two modules import each other, directly or through others, imports inside functions counted
(the circles left are listed in KNOWN_CIRCLES, which may only shrink); no two packages do either;
and inside each package, imports point down its LAYERS."""

import ast
import os
import textwrap

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


def _base(node, package):
    """The absolute module of a `from ... import` (relative ones resolved against `package`)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    parts = parts[:len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


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
            base = _base(node, package)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if not a.name.startswith("__"))  # a submodule?
    top = module.split(".")[0]
    return {name for name in found if name == top or name.startswith(top + ".")}


def _in(name, package):
    return name == package or name.startswith(package + ".")


MODULES = _modules()


def test_the_walk_sees_the_layout():
    names = {m for m, _ in MODULES}
    for expected in ("imagerecords.builder.session", "imagerecords.builder.checks", "imagerecords.builder.options",
                     "imagerecords.cli.launcher", "imagerecords.reader", "imagerecords.format.records"):
        assert expected in names
    # The walk finds a function-level import (the check would pass vacuously otherwise).
    assert "imagerecords.builder.session" in imported("imagerecords.cli.launcher",
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


class _Imports(ast.NodeVisitor):
    """Each import statement of a module's tree with where it runs: (node, 'top-level', 'in function
    NAME' (Class.method, outer.inner) or 'under TYPE_CHECKING')."""

    def __init__(self):
        self.found, self._scopes, self._type_checking = [], [], 0

    def _scope(self, node):
        self._scopes.append((node.name, not isinstance(node, ast.ClassDef)))
        self.generic_visit(node)
        self._scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_If(self, node):
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            self._type_checking += 1
            for child in node.body:
                self.visit(child)
            self._type_checking -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _import(self, node):
        if any(function for _, function in self._scopes):
            where = "in function " + ".".join(name for name, _ in self._scopes)
        elif self._type_checking:
            where = "under TYPE_CHECKING"
        else:
            where = "top-level"
        self.found.append((node, where))

    visit_Import = visit_ImportFrom = _import


def _parents(module):
    """The packages above a dotted module name, outermost first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_edges(package_dir=PACKAGE_DIR):
    """{module: [(imported module, file, line, where, named)]} for every import of a package module,
    imports inside functions (and under TYPE_CHECKING) included; file is relative to the package's
    folder's parent, named is the module the import names when the edge is a package above it. Each
    edge is a module that the import runs or needs:
      - a name is the module it denotes: `import pkg.mod`, `from pkg import mod` (a submodule) and
        `from pkg.mod import f` (an attribute) are pkg.mod; `from pkg import X` with X defined in
        pkg/__init__.py is pkg, that __init__ alone, not its submodules;
      - importing pkg.mod also runs every package __init__ above it, so those are edges too, except the
        packages above the importer: Python started them before the importer ran, so the import runs
        nothing of theirs. `from pkg import sibling` inside pkg is then no edge to pkg (its __init__
        may import that module without a circle), while `from pkg import X` of an __init__ name is."""
    modules = dict(_modules(package_dir))
    top = os.path.basename(os.path.normpath(package_dir))
    root = os.path.dirname(os.path.normpath(package_dir))

    def module_of(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges = {}
    for m, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        visitor = _Imports()
        visitor.visit(tree)
        out = []
        for node, where in visitor.found:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = _base(node, package)
                names = [base if a.name == "*" else f"{base}.{a.name}" for a in node.names]
            targets = {}
            for name in names:
                if name != top and not name.startswith(top + "."):
                    continue
                target = module_of(name)
                for above in _parents(target):
                    if above not in _parents(m):
                        targets.setdefault(above, target)
                targets[target] = None
            out.extend((t, os.path.relpath(path, root), node.lineno, where, named)
                       for t, named in sorted(targets.items()) if t not in (m, ""))
        edges[m] = out
    return edges


def graph_of(edges):
    """{module: the set of package modules it imports} from import_edges."""
    return {m: {e[0] for e in out} for m, out in edges.items()}


def import_graph(package_dir=PACKAGE_DIR):
    return graph_of(import_edges(package_dir))


def circles(graph):
    """The import circles of `graph`: each set of two or more modules that reach one another (its
    strongly connected components), found by Tarjan's algorithm with an explicit stack."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
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
    return sorted(found, key=sorted)


# The debt being paid down: each import circle of the package still to break, as a frozenset of module
# names. Kept exact: the test fails when a module joins a circle or a new one appears (break it; never
# add to this list), and when a listed circle shrinks or goes (write down the smaller list it prints).
# Empty since 449d0b1 broke the last two (the pipeline/ and transforms/ one, and format.codecs with
# format.features); keep it so.
KNOWN_CIRCLES = []


def _names(modules, most=None):
    names = sorted(modules)
    if most is not None and len(names) > most:
        names = names[:most] + [f"... {len(names) - most} more"]
    return ", ".join(names)


def _import_line(m, t, edges, indent):
    """`m -> t  (where, file:line; ...)`: each import in m that makes the edge."""
    sites = [f"{where}, {path}:{line}" + (f", running it to import {named}" if named else "")
             for to, path, line, where, named in edges.get(m, ()) if to == t]
    return f"{indent}{m} -> {t}  ({'; '.join(sites)})"


def _edges_in(circle, edges, limit=40):
    """A line per importer -> imported pair inside `circle`."""
    graph = graph_of(edges)
    lines = [_import_line(m, t, edges, "      ") for m in sorted(circle) for t in sorted(graph.get(m, ())) if t in circle]
    return lines[:limit] + ([f"      ... and {len(lines) - limit} more"] if len(lines) > limit else [])


def _path(a, b, circle, graph):
    """A shortest import path from a to b (a != b) through the modules of `circle`."""
    prev, queue = {a: None}, [a]
    for v in queue:
        for w in sorted(graph.get(v, ())):
            if w in circle and w not in prev:
                prev[w] = v
                if w == b:
                    path = [b]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1]
                queue.append(w)
    return None


def _cycle_lines(cycle, edges):
    """A line per import of a cycle [a, b, ..., a]."""
    return [_import_line(m, t, edges, "        ") for m, t in zip(cycle, cycle[1:])]


def circle_debt(found, known, edges=None):
    """'' when the circles `found` are exactly the `known` ones; otherwise one block saying which
    differ and what to do: a new circle or a module joining one is to be broken (its imports listed),
    a listed circle that shrank or went is to be written down smaller."""
    found = [frozenset(c) for c in found]
    known = [frozenset(c) for c in known]
    edges = edges or {}
    new = [f for f in found if not any(f & k for k in known)]
    grown = [f for f in found if f not in new and not any(f <= k for k in known)]
    smaller = [k for k in known if k not in found and all(f <= k for f in found if f & k)]
    if not (new or grown or smaller):
        return ""
    lines = ["The import circles (imports inside functions counted) are not the ones KNOWN_CIRCLES lists"
             " (tests/test_layering.py):"]
    for f in new:
        imports = _edges_in(f, edges)
        lines.append(f"  NEW circle of {len(f)}: {_names(f)}" + ("; its imports:" if imports else ""))
        lines.extend(imports)
    for f in grown:
        inside = [k for k in known if k & f]
        joined = f - frozenset().union(*inside)
        what = ([f"{_names(joined)} joined it"] if joined else []) + (
            [f"it merged {len(inside)} listed circles"] if len(inside) > 1 else [])
        lines.append(f"  GROWN circle, now of {len(f)}: " + " and ".join(what))
        graph = graph_of(edges)
        shown, cycles = set(), 0
        for m in sorted(joined):  # a shortest circle through a module that joined and the listed circle
            if m in shown or cycles == 3:
                continue
            ways = [(_path(m, k, f, graph), _path(k, m, f, graph)) for k in sorted(f - joined)]
            cycle = min((there + back[1:] for there, back in ways if there and back), key=len, default=None)
            if cycle:
                shown.update(cycle)
                cycles += 1
                lines.append(f"      a circle through {m} and the listed circle:")
                lines.extend(_cycle_lines(cycle, edges))
        if not joined:  # listed circles merged: a path from one to the next and back
            a, b = sorted(inside[0] & f)[0], sorted(inside[1] & f)[0]
            there, back = _path(a, b, f, graph), _path(b, a, f, graph)
            if there and back:
                lines.append(f"      a circle through {a} and {b}:")
                lines.extend(_cycle_lines(there + back[1:], edges))
    if new or grown:
        lines.append("  -> break these (move what the lower module needs down to it, or the import up to its"
                     " caller); do not add them to KNOWN_CIRCLES, which only shrinks.")
    for k in smaller:
        left = [f for f in found if f <= k]
        now = "; ".join(f"a circle of {len(f)}" for f in left) if left else "no circle"
        lines.append(f"  SMALLER (progress): the listed circle of {len(k)} ({_names(k, 3)}) is now {now}"
                     + (f"; out of it: {_names(k - frozenset().union(*left))}" if left else ""))
    if smaller:
        keep = [f for f in found if any(f <= k for k in known)]
        lines.append("  -> write the list down as it is now, so it stays exact:")
        lines.append("     KNOWN_CIRCLES = [" if keep else "     KNOWN_CIRCLES = []")
        for f in keep:
            lines.extend(textwrap.wrap(", ".join(repr(m) for m in sorted(f)), 100, initial_indent="         frozenset({",
                                       subsequent_indent="                    ", break_long_words=False))
            lines[-1] += "}),"
        if keep:
            lines.append("     ]")
    return "\n".join(lines)


def test_no_import_circle_but_the_known_ones():
    edges = import_edges()
    message = circle_debt(circles(graph_of(edges)), KNOWN_CIRCLES, edges)
    if message:
        pytest.fail(message, pytrace=False)


def _package(root, files):
    pkg = root / "pkg"
    pkg.mkdir()
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return str(pkg)


def test_a_planted_function_level_circle_is_caught(tmp_path):
    # low -> mid at the top, mid -> high at the top, high -> low only when high.f runs; alone is outside
    pkg = _package(tmp_path, {"low.py": "from pkg import mid\n",
                              "mid.py": "import pkg.high\n",
                              "high.py": "def f():\n    from .low import thing\n    return thing\n",
                              "alone.py": "import pkg.low\n"})
    assert circles(import_graph(pkg)) == [{"pkg.low", "pkg.mid", "pkg.high"}]
    assert ("pkg.low", os.path.join("pkg", "high.py"), 2, "in function f", None) in import_edges(pkg)["pkg.high"]


def test_a_package_without_a_circle_has_none(tmp_path):
    # function-level and top-level imports, downwards only; a sibling imported through the package whose
    # __init__ imports the importer runs nothing of that __init__ (Python started it first): no circle
    pkg = _package(tmp_path, {"__init__.py": "from pkg.sub import Y\n",
                              "low.py": "X = 1\n", "high.py": "def f():\n    from pkg.low import X\n    return X\n",
                              "sub.py": "from pkg import high, low\nY = 2\n"})
    assert circles(import_graph(pkg)) == []


def test_circles_through_a_package_init_are_caught(tmp_path):
    # A name of pkg/__init__.py imported by a module that __init__ imports: a circle through __init__.
    pkg = _package(tmp_path, {"__init__.py": "from pkg.sub import Y\nZ = 1\n",
                              "sub.py": "def f():\n    from pkg import Z\n    return Z\nY = 2\n"})
    assert circles(import_graph(pkg)) == [{"pkg", "pkg.sub"}]


def test_the_packages_an_import_runs_are_edges(tmp_path):
    # Importing pkg.inner.leaf runs pkg/inner/__init__.py, which imports what imports the importer back.
    pkg = _package(tmp_path, {"a.py": "from pkg.inner.leaf import f\n",
                              "inner/__init__.py": "from pkg.inner.other import g\n",
                              "inner/leaf.py": "def f():\n    pass\n",
                              "inner/other.py": "def g():\n    from pkg.a import f\n"})
    assert circles(import_graph(pkg)) == [{"pkg.a", "pkg.inner", "pkg.inner.other"}]


def package_graph(graph, package):
    """The imports among `package`'s direct children (its modules and sub-packages, each sub-package
    standing for everything inside it), from a module graph: {child name: the children it imports}."""
    def child(name):
        return name[len(package) + 1:].split(".")[0] if name.startswith(package + ".") else None

    out = {}
    for m, targets in graph.items():
        a = child(m)
        if a is None:
            continue
        out.setdefault(a, set()).update(b for b in map(child, targets) if b not in (None, a))
    return out


def _packages(graph):
    return sorted({m for m in graph for other in graph if other.startswith(m + ".")})


# The layers of each package, lowest first: a child imports only children of its own layer or below
# (README, "Layout"). A module added to a package must be placed here; a layer's children import one
# another without a circle (test_no_circle_among_packages).
LAYERS = {
    "imagerecords": [{"format"}, {"reader", "torch", "grain", "pipeline"}, {"transforms"}, {"builder"}, {"cli"},
                     {"__main__"}],
    # the ground floor (the builder's vocabulary, OUT's files, how a message names a setting), then the
    # data flow's stages in the order a record meets them, the settings after the stages they configure
    "imagerecords.pipeline": [{"errors", "naming", "storage", "processes", "phases", "urls", "refs", "lock",
                               "staging", "example_images"},
                              {"read"}, {"encode"}, {"config"}, {"plan"}, {"sources", "write"}, {"publish"}],
    "imagerecords.builder": [{"checks", "engines"}, {"options"}, {"session"}, {"memory_arrays"}],
}


def back_arrows(graph, layers):
    """`importer -> imported` for each import of a child from a layer above its own, and the children
    no layer names."""
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    unplaced = sorted(set(graph) - set(rank))
    arrows = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                    if a in rank and b in rank and rank[b] > rank[a])
    return arrows, unplaced


def test_no_circle_among_packages():
    # Stricter than no circle among modules: a -> b.x and b.y -> a is a circle of the packages a and b.
    graph = import_graph()
    found = {package: circles(package_graph(graph, package)) for package in _packages(graph)}
    assert {p: c for p, c in found.items() if c} == {}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_point_down_the_layers(package):
    arrows, unplaced = back_arrows(package_graph(import_graph(), package), LAYERS[package])
    assert unplaced == [], f"place these children of {package} in a layer of LAYERS"
    assert arrows == [], f"imports up the layers of {package}"


def test_a_planted_package_circle_is_caught(tmp_path):
    # No module circle (a.x -> b.y -> a.z), yet the packages a and b import each other; and the layers
    # [{b}, {a}] call b.y's import of a.z an import up.
    pkg = _package(tmp_path, {"a/__init__.py": "", "a/x.py": "import pkg.b.y\n", "a/z.py": "Z = 1\n",
                              "b/__init__.py": "", "b/y.py": "from pkg.a.z import Z\n"})
    graph = import_graph(pkg)
    assert circles(graph) == []
    assert package_graph(graph, "pkg") == {"a": {"b"}, "b": {"a"}}
    assert circles(package_graph(graph, "pkg")) == [{"a", "b"}]
    assert back_arrows(package_graph(graph, "pkg"), [{"b"}, {"a"}]) == (["b -> a"], [])
    assert back_arrows(package_graph(graph, "pkg"), [{"b"}]) == ([], ["a"])


def test_the_known_circles_are_kept_exact(tmp_path):
    # Two circles, a <-> b (b's import inside a function) and c <-> d, and d -> a between them.
    pkg = _package(tmp_path, {"a.py": "import pkg.b\n", "b.py": "def f():\n    import pkg.a\n",
                              "c.py": "import pkg.d\n", "d.py": "import pkg.c\nimport pkg.a\n"})
    edges = import_edges(pkg)
    found = circles(graph_of(edges))
    assert found == [{"pkg.a", "pkg.b"}, {"pkg.c", "pkg.d"}]
    ab, cd = frozenset({"pkg.a", "pkg.b"}), frozenset({"pkg.c", "pkg.d"})
    assert circle_debt(found, [cd, ab], edges) == ""
    d_py = os.path.join("pkg", "d.py")

    message = circle_debt(found, [ab], edges)  # a circle that is not listed
    assert "NEW circle of 2: pkg.c, pkg.d; its imports:" in message
    assert f"      pkg.d -> pkg.c  (top-level, {d_py}:1)" in message
    assert "do not add them to KNOWN_CIRCLES" in message and "SMALLER" not in message

    (tmp_path / "pkg" / "b.py").write_text("import pkg.c\ndef f():\n    import pkg.a\n")  # b -> c closes one circle
    edges = import_edges(pkg)
    grown = circles(graph_of(edges))
    assert grown == [ab | cd]
    message = circle_debt(grown, [ab], edges)  # modules join a listed circle
    assert "GROWN circle, now of 4: pkg.c, pkg.d joined it\n      a circle through pkg.c and the listed circle:" in message
    assert f"        pkg.b -> pkg.c  (top-level, {os.path.join('pkg', 'b.py')}:1)" in message
    message = circle_debt(grown, [ab, cd], edges)  # two listed circles merge
    assert "GROWN circle, now of 4: it merged 2 listed circles\n      a circle through pkg.a and pkg.c:" in message
    assert f"        pkg.d -> pkg.a  (top-level, {d_py}:2)" in message

    # A listed circle shrank and another went: the message says the list to write down.
    message = circle_debt(found, [ab | {"pkg.x"}, cd, frozenset({"pkg.y", "pkg.z"})], edges)
    assert "SMALLER (progress): the listed circle of 3 (pkg.a, pkg.b, pkg.x) is now a circle of 2; out of it: pkg.x" in message
    assert "SMALLER (progress): the listed circle of 2 (pkg.y, pkg.z) is now no circle" in message
    assert message.endswith("  -> write the list down as it is now, so it stays exact:\n     KNOWN_CIRCLES = [\n"
                            "         frozenset({'pkg.a', 'pkg.b'}),\n         frozenset({'pkg.c', 'pkg.d'}),\n     ]")
    assert "NEW" not in message and "GROWN" not in message
    assert circle_debt([], [ab], edges).endswith("is now no circle\n  -> write the list down as it is now, so it stays"
                                                 " exact:\n     KNOWN_CIRCLES = []")


# Function-level imports (issue 40, point 6): an import inside a function must delay something heavy and
# say why on its line or the line above. Heavy: a package of HEAVY_PACKAGES, or a package module whose
# import pulls one in at its top level (through its top-level imports, computed below).
# `python -X importtime -c "import X"` in the CI environment (Python 3.11), best of 9, cumulative:
HEAVY_PACKAGES = frozenset({
    "numpy",            # 42 ms
    "apache_beam",      # 1.2 s
    "tensorflow",       # 3.4 s
    "PIL",              # 9.8 ms (PIL.Image); the reader-only install has no Pillow
    "torch",            # seconds (not in the CI environment: its own extra)
    "google.cloud",     # 268 ms (google.cloud.storage)
    "google.api_core",  # 284 ms (google.api_core.exceptions)
    "grpc",             # 40 ms
    "urllib3",          # 47 ms
    "protego",          # 10.5 ms
    "yaml",             # 14 ms; only a --config or preset build reads YAML
    "http.client",      # 17.6 ms (stdlib, with ssl and email's parser): only URL builds, whose urllib3 loads it
    "email",            # 8.6 ms (stdlib, email.utils): the same
})  # not heavy, so imported at their module's top: deflate 0.3 ms, array_record 1.9 ms

# `imagerecords --help` imports this module and nothing more (11 ms): each command imports its own
# modules in its branch, so --help and the other commands pay for none of them.
COMMAND_ENTRY = "imagerecords.cli.main"


def _is_heavy_package(name):
    return any(name == p or name.startswith(p + ".") for p in HEAVY_PACKAGES)


def _imports_of(path):
    """(node, where, under TYPE_CHECKING) of every import statement of the file at `path`."""
    class Visitor(_Imports):
        def _import(self, node):
            super()._import(node)
            self.found[-1] = (node, self.found[-1][1], bool(self._type_checking))

        visit_Import = visit_ImportFrom = _import

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    visitor = Visitor()
    visitor.visit(tree)
    return visitor.found


def _outside_names(node, top):
    """The modules outside the package `top` that an import statement names."""
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [] if node.level else [node.module]
    return [n for n in names if n != top and not n.startswith(top + ".")]


def _package_imports(package_dir):
    """{module: (path, _imports_of(path))} of every module of the package."""
    return {m: (path, _imports_of(path)) for m, path in _modules(package_dir)}


def heavy_modules(package_dir=PACKAGE_DIR, edges=None, imports=None):
    """{module: [module, ..., heavy package]} for each package module whose import pulls in a package of
    HEAVY_PACKAGES, through its top-level imports and those of the modules they import (a shortest chain)."""
    top = os.path.basename(os.path.normpath(package_dir))
    own = {}
    for m, (path, found) in (imports or _package_imports(package_dir)).items():
        heavy = sorted(n for node, where, _ in found if where == "top-level"
                       for n in _outside_names(node, top) if _is_heavy_package(n))
        own[m] = heavy[0] if heavy else None
    runs = {m: {e[0] for e in out if e[3] == "top-level"} for m, out in (edges or import_edges(package_dir)).items()}
    chains = {}
    for start in runs:
        prev, queue = {start: None}, [start]
        for v in queue:
            if own[v]:
                chain = [own[v]]
                while v is not None:
                    chain.insert(0, v)
                    v = prev[v]
                chains[start] = chain
                break
            for w in sorted(runs[v]):
                if w not in prev:
                    prev[w] = v
                    queue.append(w)
    return chains


def _has_reason(lines, node):
    """A `#` comment on the import's lines, or a comment line just above it or above the run of
    import lines it ends (one reason for a group of imports)."""
    if any("#" in line for line in lines[node.lineno - 1:node.end_lineno]):
        return True
    above = node.lineno - 2
    while above >= 0 and lines[above].lstrip().startswith(("import ", "from ")):
        above -= 1
    return above >= 0 and lines[above].lstrip().startswith("#")


def function_import_problems(package_dir=PACKAGE_DIR, entry=COMMAND_ENTRY):
    """`file:line: IMPORT in function F` (and what is wrong) for each import inside a function that does
    not delay something heavy, or does but without its reason."""
    top = os.path.basename(os.path.normpath(package_dir))
    root = os.path.dirname(os.path.normpath(package_dir))
    edges, imports = import_edges(package_dir), _package_imports(package_dir)
    heavy = heavy_modules(package_dir, edges, imports)
    problems = []
    for m, (path, found) in imports.items():
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for node, where, type_checking in found:
            if not where.startswith("in function") or type_checking:
                continue
            ours = {e[0] for e in edges[m] if e[2] == node.lineno and e[3] == where}
            outside = _outside_names(node, top)
            delays = (any(_is_heavy_package(n) for n in outside) or any(t in heavy for t in ours)
                      or (m == entry and not outside))
            site = f"{os.path.relpath(path, root)}:{node.lineno}: {ast.unparse(node)} {where}"
            if not delays:
                problems.append(f"{site}  (nothing heavy: import it at the module's top)")
            elif not _has_reason(lines, node):
                problems.append(f"{site}  (heavy: say why on its line or the line above)")
    return problems


def test_function_level_imports_delay_something_heavy_and_say_why():
    problems = function_import_problems()
    if problems:
        pytest.fail(f"{len(problems)} import(s) inside functions break the rule (tests/test_layering.py,"
                    f" HEAVY_PACKAGES):\n" + "\n".join(problems), pytrace=False)


def test_a_planted_uncommented_stdlib_import_in_a_function_is_caught(tmp_path):
    pkg = _package(tmp_path, {"heavy.py": "import numpy\n",
                              "light.py": "X = 1\n",
                              "user.py": "import pkg.light\n"
                                         "def a():\n    import tempfile\n    return tempfile\n"
                                         "def b():\n    import numpy as np  # numpy: 42 ms\n    return np\n"
                                         "def c():\n    # pkg.heavy imports numpy\n    from pkg import heavy\n"
                                         "def d():\n    from pkg.heavy import numpy\n"
                                         "def e():\n    from . import light  # a reason is not enough\n"
                                         "def t():\n    if TYPE_CHECKING:\n        import typing\n"
                                         "def g():\n    # numpy: 42 ms\n    import numpy\n    from pkg import heavy\n"
                                         "class K:\n    def m(self):\n        import signal\n"})
    assert heavy_modules(pkg) == {"pkg.heavy": ["pkg.heavy", "numpy"]}
    user = os.path.join("pkg", "user.py")
    assert function_import_problems(pkg, entry="pkg.none") == [
        f"{user}:3: import tempfile in function a  (nothing heavy: import it at the module's top)",
        f"{user}:12: from pkg.heavy import numpy in function d  (heavy: say why on its line or the line above)",
        f"{user}:14: from . import light in function e  (nothing heavy: import it at the module's top)",
        f"{user}:24: import signal in function K.m  (nothing heavy: import it at the module's top)"]
    # The command's entry module may delay its commands' modules, with a reason; stdlib is still moved up.
    assert function_import_problems(pkg, entry="pkg.user") == [
        f"{user}:3: import tempfile in function a  (nothing heavy: import it at the module's top)",
        f"{user}:12: from pkg.heavy import numpy in function d  (heavy: say why on its line or the line above)",
        f"{user}:24: import signal in function K.m  (nothing heavy: import it at the module's top)"]
