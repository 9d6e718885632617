"""The README's Python snippet type-checks with ``mypy --strict`` against the SDK, as a
user's code would (no casts, no ignores)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT


def _python_snippets() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)


def test_readme_python_snippet_passes_mypy_strict(tmp_path: Path) -> None:
    snippets = _python_snippets()
    assert snippets and any("KnowledgeClient" in s for s in snippets)
    for n, code in enumerate(snippets):
        assert "cast(" not in code and "type: ignore" not in code
        (tmp_path / f"readme_snippet_{n}.py").write_text(code, encoding="utf-8")
    # Only the snippets are checked; the SDK (and its generated code) is read for types.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--no-incremental",
            "--python-executable",
            sys.executable,
            *sorted(str(p) for p in tmp_path.glob("readme_snippet_*.py")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
        env={"MYPYPATH": str(REPO_ROOT / "sdk"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout
