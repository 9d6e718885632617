"""The server's layering holds in the code, not by convention (docs/architecture.md).

- no import cycle between the server's modules (module-level imports);
- no module imports a server module inside a function to get round that, except the
  CLI's ``serve``, which loads the runtime only when serving (client commands stay light);
- the application layer (``app.py``, ``search/``, ``dispatch/``, ``lanes/``) imports nothing
  from ``transport/``;
- ``licensing/`` and ``sdk/`` import nothing from the server.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO_ROOT

SERVER = REPO_ROOT / "server" / "knowledge_server"
# (module, function) pairs allowed to import server modules inside a function, with why.
LAZY_ALLOWED = {
    # `knowledge serve` alone loads the stores, tree-sitter and numpy.
    ("knowledge_server.cli", "serve"),
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in (root / package).rglob("*.py"):
        if "_gen" in path.parts:
            continue
        out[_module_name(path, root)] = path
    return out


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[str, str | None]]:
    """(imported module, enclosing function or None) for each import of a known module."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = func
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and func is None:
                inner = child.name
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                # `from pkg import submodule` depends on the submodule; `from mod import
                # name` on the module.
                target = _resolve(module, path, child)
                subs = [f"{target}.{a.name}" for a in child.names]
                names = [s for s in subs if s in known] or [target]
            for name in names:
                if name in known:
                    found.append((name, func))
            visit(child, inner)

    visit(tree, None)
    return found


def _graph(root: Path, package: str) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    mods = _modules(root, package)
    known = set(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    lazy = []
    for module, path in mods.items():
        for target, func in _imports(module, path, known):
            if target == module:
                continue
            if func is None:
                edges[module].add(target)
            else:
                lazy.append((module, func, target))
    return edges, lazy


def _cycle(edges: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (found := dfs(node)):
            return found
    return []


def test_server_modules_import_no_cycle() -> None:
    edges, _ = _graph(REPO_ROOT / "server", "knowledge_server")
    assert _cycle(edges) == []


def test_no_function_level_import_dodges_the_layering() -> None:
    _, lazy = _graph(REPO_ROOT / "server", "knowledge_server")
    assert sorted({(m, f, t) for m, f, t in lazy if (m, f) not in LAZY_ALLOWED}) == []


def test_the_application_layer_imports_nothing_from_the_transport() -> None:
    edges, _ = _graph(REPO_ROOT / "server", "knowledge_server")
    app_layer = [
        m
        for m in edges
        if m == "knowledge_server.app"
        or m.startswith(("knowledge_server.search", "knowledge_server.dispatch"))
        or m.startswith("knowledge_server.lanes")
    ]
    assert app_layer
    leaks = {
        m: t for m in app_layer for t in edges[m] if t.startswith("knowledge_server.transport")
    }
    assert leaks == {}


def test_licensing_and_sdk_import_nothing_from_the_server() -> None:
    for folder, package in (
        (REPO_ROOT / "licensing", "knowledge_licensing"),
        (REPO_ROOT / "sdk", "knowledge_sdk"),
    ):
        for path in (folder / package).rglob("*.py"):
            text = path.read_text()
            assert "knowledge_server" not in text, path


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The checks above can fail: a two-module loop is reported."""
    assert _cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
