"""The TypeScript client (clients/typescript) against a real server on a free port.

The server runs here, with authentication on, the Community edition (no licence), one
workspace and one session log; `npm test` there compiles the client and runs its
node:test suite against it: the surface parity of the client, an authentication
failure, a streaming index with progress, a search with code and episode evidence, a
dispatch dry run, the document graph's edition refusal, the knowledge base's NO_EVIDENCE
answers under the caller's trace id, an unknown tag's refusal, and a deadline.

The client's packages come from its lockfile (`npm ci`, which .ci/run does): without
them the test is skipped, except under CI, where it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from knowledge_server.auth import TokenStore

from tests.conftest import REPO_ROOT, ServerThread, write_session_log

CLIENT = REPO_ROOT / "clients" / "typescript"
WORD = "quokkaparser"


def _node_ready() -> None:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if not (CLIENT / "node_modules").is_dir():
        missing.append("clients/typescript/node_modules (run `npm ci` there)")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the TypeScript client's tests need {', '.join(missing)}")
        pytest.skip(f"missing {', '.join(missing)}")


def test_typescript_client_against_a_real_server(tmp_path: Path) -> None:
    _node_ready()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "parser.py").write_text(
        f"def {WORD}_parse(text):\n    '''The {WORD} parser splits text into tokens.'''\n"
        "    return text.split()\n"
    )
    # A few other files: ranking needs more than one document to tell words apart.
    (ws / "util.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "README.md").write_text("# Tools\n\nSmall helpers for text.\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    write_session_log(logs / "s1.jsonl", "s-ts-1", ws, f"the {WORD} parser fails on empty input")
    store = TokenStore(tmp_path / "data" / "tokens.json")
    _, operator = store.create("ops-ts", "org-a", None, "operator")
    server = ServerThread(
        tmp_path,
        authenticate=store.authenticate,
        auth="on",
        workspaces=[str(ws)],
        session_paths=[str(logs)],
    )
    try:
        env = dict(
            os.environ,
            KNOWLEDGE_TS_ADDRESS=server.address,
            KNOWLEDGE_TS_TOKEN=operator,
            KNOWLEDGE_TS_WORKSPACE=str(ws),
            KNOWLEDGE_TS_SESSIONS=str(logs),
            KNOWLEDGE_TS_WORD=WORD,
        )
        result = subprocess.run(
            ["npm", "test"],
            cwd=CLIENT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        server.stop()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # node:test's closing lines: every test ran and passed.
    assert "# fail 0" in output and "# pass 15" in output, output
