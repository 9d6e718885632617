"""Every automatic integration smoke against the real service and the real MCP bridge.

Each smoke starts `knowledge serve`, indexes a small corpus, launches the bridge exactly as
the product's template says, calls knowledge_search over MCP and fails unless the answer
carries path:line and an index_rev. The client installs (npm/pip) are skipped here
(KNOWLEDGE_SMOKE_SKIP_CLIENT); `python integrations/check.py --run-smokes` runs them too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

INTEGRATIONS = REPO_ROOT / "integrations"
PATH_LINE = re.compile(r"[\w./-]+:\d+")


def _automatic() -> list[str]:
    index = json.loads((INTEGRATIONS / "index.json").read_text())
    products = index["products"] if isinstance(index, dict) else index
    return [p["slug"] for p in products if p.get("smoke") == "automatic"]


@pytest.mark.parametrize("slug", _automatic())
def test_smoke_gets_an_addressed_fact(slug: str) -> None:
    env = dict(os.environ, KNOWLEDGE_SMOKE_SKIP_CLIENT="1")
    env.pop("KNOWLEDGE_ADDRESS", None)
    env.pop("KNOWLEDGE_DATA_DIR", None)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    done = subprocess.run(
        [sys.executable, str(INTEGRATIONS / slug / "smoke.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert PATH_LINE.search(done.stdout), done.stdout[-2000:]
