"""The client commands install on a clean machine: wheels of the SDK and the bridge built with
``python -m build``, installed into a fresh environment from those files (their dependencies
from the package registry), give working ``knowledge-mcp`` and ``knowledge-hook`` commands
against a real server, as docs/harness.md ("Install") says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from knowledge_sdk import KnowledgeClient

from tests.conftest import REPO_ROOT, ServerThread


def _source_copy(tmp_path: Path, folder: str) -> Path:
    """A copy to build from, so build/ and *.egg-info never land in the source tree."""
    dst = tmp_path / "src" / folder
    shutil.copytree(
        REPO_ROOT / folder, dst, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    return dst


@pytest.mark.slow
def test_wheels_build_and_install_the_client_commands(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    for folder in ("sdk", "bridge"):
        built = subprocess.run(
            [
                sys.executable,
                "-m",
                "build",
                "--wheel",
                "--no-isolation",
                # setuptools builds wheels itself; the `wheel` package the build-system table
                # names is not needed (and not in the lock)
                "--skip-dependency-check",
                "--outdir",
                str(dist),
                str(_source_copy(tmp_path, folder)),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert built.returncode == 0, built.stderr[-3000:]
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    assert wheels == [
        "knowledge_mcp-0.1.0-py3-none-any.whl",
        "knowledge_sdk-0.1.0-py3-none-any.whl",
    ], wheels

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    done = subprocess.run(
        [
            str(env_dir / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--find-links",
            str(dist),
            str(dist / wheels[0]),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0 and "No matching distribution" in done.stderr:
        pytest.skip("package registry unreachable: " + done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-3000:]
    for command in ("knowledge-mcp", "knowledge-hook"):
        assert (env_dir / "bin" / command).is_file(), command

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "billing.py").write_text("def charge_invoice_total(invoice):\n    return invoice.total\n")
    server = ServerThread(tmp_path, workspaces=[str(ws)])
    try:
        with KnowledgeClient(server.address) as kc:
            for _ in kc.index_workspace(str(ws)):
                pass
        clean = {"PATH": "/usr/bin:/bin", "KNOWLEDGE_ADDRESS": server.address}
        hook = subprocess.run(
            [str(env_dir / "bin" / "knowledge-hook")],
            input=json.dumps(
                {"hook_event_name": "UserPromptSubmit", "prompt": "charge invoice total"}
            ),
            env=clean,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert hook.returncode == 0, hook.stderr
        context = json.loads(hook.stdout)["hookSpecificOutput"]["additionalContext"]
        assert "billing.py:1-2" in context
        helped = subprocess.run(
            [str(env_dir / "bin" / "knowledge-mcp"), "--help"],
            env=clean,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert helped.returncode == 0 and "--http" in helped.stdout
    finally:
        server.stop()
