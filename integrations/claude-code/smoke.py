#!/usr/bin/env python3
"""Smoke for Claude Code.

Proves the .mcp.json template starts the bridge and that knowledge_search answers
with path:line and index_rev. Then, unless npm is missing, installs the pinned
Claude Code into a temporary prefix and runs `claude mcp list` against the same
template with a throw-away HOME (no account): the project is marked trusted and
the server approved there, so Claude Code itself launches the bridge for its
health check.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smoke_common import npm_client_step, run_smoke

CLIENT_VERSION = "2.1.332"


def _layout(template: Path, tmpdir: Path, home: Path, address: str) -> Path:
    project = tmpdir / "project"
    project.mkdir(exist_ok=True)
    shutil.copyfile(template, project / ".mcp.json")
    # Project-scope servers need workspace trust and approval; record both the way
    # the interactive prompt would, in the throw-away HOME only.
    state = {
        "projects": {
            str(project): {"hasTrustDialogAccepted": True, "enabledMcpjsonServers": ["knowledge"]}
        }
    }
    (home / ".claude.json").write_text(json.dumps(state), encoding="utf-8")
    return project


def main() -> int:
    step = npm_client_step(
        "@anthropic-ai/claude-code", CLIENT_VERSION, "claude", ["mcp", "list"], _layout
    )
    return run_smoke("claude-code", client_step=step)


if __name__ == "__main__":
    sys.exit(main())
