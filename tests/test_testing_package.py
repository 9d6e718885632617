"""The runtime package never depends on its test doubles (``knowledge_server.testing``)."""

from __future__ import annotations

import ast
from pathlib import Path

import knowledge_server
import pytest

PACKAGE = Path(knowledge_server.__file__).parent
TESTING = "knowledge_server.testing"


def _imported(path: Path, root: Path) -> set[str]:
    """Every module ``path`` (a file under the package directory ``root``) imports, made
    absolute, at any depth of the file (function-level imports included); for
    ``from m import x`` both ``m`` and ``m.x`` are listed, since ``x`` may be a module."""
    package = path.relative_to(root.parent).parts[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def _offenders(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "testing":
            continue
        hits = [m for m in _imported(path, root) if m == TESTING or m.startswith(TESTING + ".")]
        found += [f"{rel.as_posix()}: {m}" for m in sorted(hits)]
    return found


def test_no_runtime_module_imports_the_testing_package() -> None:
    assert (PACKAGE / "testing" / "fake_llm.py").is_file()
    assert _offenders(PACKAGE) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from knowledge_server.testing.fake_llm import FakeLLMServer\n", "testing.fake_llm"),
        ("import knowledge_server.testing\n", "testing"),
        ("def f():\n    from ..testing import fake_llm\n", "testing"),
        ("from .. import testing\n", "testing"),
        ("from ..docgraph import prompts\n", None),
    ],
)
def test_the_scan_sees_absolute_relative_and_nested_imports(
    tmp_path: Path, source: str, found: str | None
) -> None:
    root = tmp_path / "knowledge_server"
    (root / "docgraph").mkdir(parents=True)
    (root / "testing").mkdir()
    (root / "testing" / "fake_llm.py").write_text("from ..docgraph import x\n", encoding="utf-8")
    (root / "docgraph" / "ops.py").write_text(source, encoding="utf-8")
    offenders = _offenders(root)
    if found is None:
        assert offenders == []
    else:
        assert f"docgraph/ops.py: knowledge_server.{found}" in offenders
