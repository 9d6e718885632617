"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _shared_data_dir() -> Path:
    env = os.environ.get("KNOWLEDGE_SHARED_DATA")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder (session logs, skills, documents); skips when absent."""
    path = _shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"real data folder {path} is absent (set KNOWLEDGE_SHARED_DATA to use another)")
    return path
