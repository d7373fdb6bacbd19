"""The import graph of the project's own modules: no circle, layers one way, imports at the top.

Read from the source (``ast``), not by importing: every ``import`` and ``from ... import`` of a
module of ``mhaspec``, at module level or inside a function, is an edge. The layers, innermost
first: ``mhaspec.spec`` <- ``mhaspec.backends`` <- ``mhaspec.conformance`` <- ``mhaspec`` (the
commands); an inner layer never imports an outer one.
"""

from __future__ import annotations

import ast
import pathlib
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: package -> its folder (pyproject.toml's package-dir)
PACKAGES = {"mhaspec": "src/mhaspec", "mhaspec.spec": "spec", "mhaspec.backends": "backends",
            "mhaspec.conformance": "conformance"}
#: the layers, innermost first (a module not in the first three is a command: layer 3)
LAYERS = ("mhaspec.spec", "mhaspec.backends", "mhaspec.conformance")

#: circles allowed for now, each with the reason; the test fails once one is gone, so that its
#: entry is removed with the fix
KNOWN_CIRCLES: dict[frozenset[str], str] = {}

#: (module, function) -> why that function imports a project module when it runs
IMPORTS_IN_FUNCTIONS = {
    ("mhaspec.cli", "cmd_certify"): "a command's module is imported when it runs: `mhaspec verify` "
                                    "starts neither pytest nor Hypothesis",
    ("mhaspec.cli", "cmd_replay"): "as cmd_certify: replay imports the suite",
    ("mhaspec.cli", "parser"): "as cmd_certify: the failure-file reader imports the suite",
}


class Edge(NamedTuple):
    importer: str
    imported: str
    line: int
    function: str | None  # the enclosing function, None at module level


def modules() -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module of the four packages."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _targets(node, name: str, is_package: bool, known) -> list[str]:
    """The project modules ``node`` (an import in module ``name``) imports."""
    if isinstance(node, ast.Import):
        candidates = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = name.split(".")[:len(name.split(".")) - (not is_package) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                      for a in node.names]
    out = []
    for target in candidates:
        while target and target not in known:  # mhaspec.backends.load_backend -> mhaspec.backends
            target = target.rpartition(".")[0]
        if target and target != name:
            out.append(target)
    return out


def edges() -> list[Edge]:
    known = modules()
    out = []
    for name, path in known.items():
        tree = ast.parse(path.read_text("utf-8"))
        functions = [f for f in ast.walk(tree)
                     if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inside = {id(n): f.name for f in functions for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, name, path.name == "__init__.py", known):
                    out.append(Edge(name, target, node.lineno, inside.get(id(node))))
    return out


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    return next((i for i, p in enumerate(LAYERS) if module == p or module.startswith(p + ".")),
                len(LAYERS))


def test_the_graph_is_read():
    """The reader sees the imports it must: a module-level one and one inside a function."""
    found = {(e.importer, e.imported) for e in edges()}
    assert ("mhaspec.conformance.plugin", "mhaspec.backends") in found
    assert ("mhaspec.certify", "mhaspec.runner") in found
    assert any(e.function for e in edges())
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_import_circle():
    graph: dict[str, set[str]] = {}
    for e in edges():
        graph.setdefault(e.importer, set()).add(e.imported)
    found = circles(graph)
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert not new, f"import circles: {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not gone, f"no longer circles, remove them from KNOWN_CIRCLES: {gone}"


def test_an_inner_layer_never_imports_an_outer_one():
    wrong = [f"{e.importer} (line {e.line}) imports {e.imported}" for e in edges()
             if layer(e.imported) > layer(e.importer)]
    assert not wrong, "\n".join(wrong)


def test_project_modules_are_imported_at_the_top():
    """Inside a function only where :data:`IMPORTS_IN_FUNCTIONS` says why, backends/ included."""
    wrong = sorted({f"{e.importer}.{e.function} (line {e.line}) imports {e.imported}"
                    for e in edges() if e.function
                    and (e.importer, e.function) not in IMPORTS_IN_FUNCTIONS})
    assert not wrong, "\n".join(wrong)
    stale = sorted(set(IMPORTS_IN_FUNCTIONS) - {(e.importer, e.function) for e in edges()})
    assert not stale, f"no longer import inside the function, remove them: {stale}"
