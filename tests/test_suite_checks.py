"""Every test in the suite checks something that can fail."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
# Calls that fail a test by themselves (pytest.raises, pytest.fail, pytest.warns, ...).
_FAILING_CALLS = frozenset({"raises", "fail", "warns", "deprecated_call"})


def _name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _asserts(node: ast.AST) -> bool:
    """An ``assert`` whose condition is not a constant, or a failing pytest call."""
    for n in ast.walk(node):
        if isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant):
            return True
        if isinstance(n, ast.Call) and _name(n) in _FAILING_CALLS:
            return True
    return False


def _unchecked_tests(source: str) -> list[str]:
    tree = ast.parse(source)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    # Helpers that check on a test's behalf (``_assert_rejected(data)``), one call deep.
    checking = {f.name for f in functions if _asserts(f)}
    out = []
    for f in functions:
        if not f.name.startswith("test") or _asserts(f):
            continue
        calls = {_name(c) for c in ast.walk(f) if isinstance(c, ast.Call)}
        if not calls & checking:
            out.append(f.name)
    return out


def test_every_test_function_asserts_something() -> None:
    unchecked = [
        f"{path.relative_to(TESTS)}::{name}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for name in _unchecked_tests(path.read_text(encoding="utf-8"))
    ]
    assert unchecked == []


def test_the_check_tells_real_assertions_from_none() -> None:
    source = """
def _check(x):
    assert x == 1

def test_calls_only(store):
    store.search("q")

def test_constant():
    assert True

def test_real(store):
    assert store.search("q") == []

def test_raises():
    with pytest.raises(ValueError):
        int("x")

def test_helper():
    _check(1)
"""
    assert _unchecked_tests(source) == ["test_calls_only", "test_constant"]
