#!/usr/bin/env python3
"""Smoke for OpenCode.

Proves the opencode.json template starts the bridge ({env:VAR} expanded as
OpenCode does) and that knowledge_search answers with path:line and index_rev.
Then, unless npm is missing, installs the pinned OpenCode into a temporary prefix
and runs `opencode mcp list` in a project holding the template, with a throw-away
HOME (no provider login). OpenCode connects to the server for that listing.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smoke_common import npm_client_step, run_smoke

CLIENT_VERSION = "1.18.33"


def _layout(template: Path, tmpdir: Path, home: Path, address: str) -> Path:
    project = tmpdir / "project"
    project.mkdir(exist_ok=True)
    shutil.copyfile(template, project / "opencode.json")
    return project


def main() -> int:
    step = npm_client_step("opencode-ai", CLIENT_VERSION, "opencode", ["mcp", "list"], _layout)
    return run_smoke("opencode", client_step=step)


if __name__ == "__main__":
    sys.exit(main())
