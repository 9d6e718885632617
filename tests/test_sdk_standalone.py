"""The SDK installs on its own (no server dependencies) and talks to a real server."""

from __future__ import annotations

import shutil
import signal
import subprocess
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, serve_process


def _source_copy(tmp_path: Path, folder: str) -> Path:
    """A copy of one of the repository's packages to install from: pip builds a local folder
    in place, and its build/ and *.egg-info must not land in the source tree (the root
    project's package discovery would find them)."""
    dst = tmp_path / "src" / folder
    if not dst.exists():
        shutil.copytree(
            REPO_ROOT / folder,
            dst,
            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
        )
    return dst


@pytest.mark.slow
def test_sdk_installs_alone_and_searches(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    done = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(_source_copy(tmp_path, "sdk"))],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0 and "No matching distribution" in done.stderr:
        pytest.skip("package registry unreachable: " + done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr
    installed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.lower()
    for server_dep in (
        "apsw",
        "sqlite-vec",
        "structlog",
        "tree-sitter",
        "cryptography",
        "grpcio-health-checking",
    ):
        assert server_dep not in installed, server_dep

    server = serve_process(tmp_path / "data", stderr=subprocess.DEVNULL)
    try:
        assert server.stdout is not None
        address = server.stdout.readline().split()[-1]
        script = (
            "import sys, knowledge_sdk\n"
            "assert not [m for m in sys.modules if m.startswith('knowledge_server')]\n"
            f"with knowledge_sdk.KnowledgeClient({address!r}) as kc:\n"
            "    r = kc.search('where is the config loaded')\n"
            "    print(r.schema, r.lanes.code.source)\n"
            "    try:\n"
            "        kc.themes()\n"
            "    except knowledge_sdk.EditionRefused as e:\n"
            "        print('refused', e.required_edition)\n"
        )
        out = subprocess.run(
            [str(py), "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
        assert out.returncode == 0, out.stderr
        assert (
            "knowledge.search/v1 knowledge.code" in out.stdout
            and "refused enterprise" in out.stdout
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)


@pytest.mark.slow
def test_mcp_bridge_installs_with_the_sdk_and_mcp_only(tmp_path: Path) -> None:
    """The bridge is a client: installed from bridge/ beside the SDK, it brings the SDK,
    `mcp`, protobuf and platformdirs and nothing of the server, and lists its tools."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    done = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "-c",
            str(REPO_ROOT / "requirements.lock"),
            str(_source_copy(tmp_path, "sdk")),
            str(_source_copy(tmp_path, "bridge")),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0 and "No matching distribution" in done.stderr:
        pytest.skip("package registry unreachable: " + done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr
    installed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.lower()
    assert "knowledge-mcp==" in installed and "knowledge-sdk==" in installed
    # (cryptography arrives with mcp's own dependencies, so it is not a sign of the server.)
    for server_dep in (
        "knowledge-service",
        "apsw",
        "sqlite-vec",
        "structlog",
        "tree-sitter",
        "numpy",
    ):
        assert server_dep not in installed, server_dep
    script = (
        "import sys\n"
        "from knowledge_mcp.tools import TOOLS\n"
        "assert not [m for m in sys.modules if m.startswith('knowledge_server')]\n"
        "print(sorted(t.name for t in TOOLS))\n"
    )
    out = subprocess.run(
        [str(py), "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "knowledge_search" in out.stdout
    helped = subprocess.run(
        [str(env_dir / "bin" / "knowledge-mcp"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert helped.returncode == 0 and "--address" in helped.stdout, helped.stderr
