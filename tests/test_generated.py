"""Generated code is committed and must match proto/ (run `python scripts/gen_protos.py`)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


def test_generated_code_is_not_stale() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_lint_is_clean() -> None:
    buf = shutil.which("buf") or str(REPO_ROOT / ".venv" / "bin" / "buf")
    if not shutil.which(buf):
        pytest.skip("buf is not installed (pip install buf-bin)")
    result = subprocess.run(
        [buf, "lint"], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
