#!/usr/bin/env python3
"""Smoke for OpenAI Codex CLI.

Proves the config.toml template starts the bridge (env_vars forwarded from this
process) and that knowledge_search answers with path:line and index_rev. Then,
unless npm is missing, installs the pinned Codex CLI into a temporary prefix and
runs `codex mcp list` with the template as ~/.codex/config.toml in a throw-away
HOME. `codex mcp list` reads and validates the entry; it does not start servers.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smoke_common import npm_client_step, run_smoke

CLIENT_VERSION = "0.171.0"


def _layout(template: Path, tmpdir: Path, home: Path, address: str) -> Path:
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, codex_home / "config.toml")
    return tmpdir


def main() -> int:
    step = npm_client_step("@openai/codex", CLIENT_VERSION, "codex", ["mcp", "list"], _layout)
    return run_smoke("codex-cli", client_step=step)


if __name__ == "__main__":
    sys.exit(main())
