#!/usr/bin/env python3
"""Smoke for Hermes Agent.

Proves the config.yaml template starts the bridge the way Hermes spawns it and
that knowledge_search answers with path:line and index_rev. Then, unless
KNOWLEDGE_SMOKE_SKIP_CLIENT is set, installs the pinned Hermes Agent (with its
MCP extra) into a temporary virtual environment and runs `hermes mcp test
knowledge` with the template as ~/.hermes/config.yaml in a throw-away HOME: Hermes
itself starts the bridge, connects and lists its tools. No model is needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smoke_common import pip_client_step, run_smoke

CLIENT_REQUIREMENT = "hermes-agent[mcp]==0.19.0"


def _layout(template: Path, tmpdir: Path, home: Path, address: str) -> Path:
    config = yaml.safe_load(template.read_text(encoding="utf-8"))
    # The template names no address (the bridge finds the one `knowledge serve` recorded
    # in the user's data directory); the test service records it in its own, so the copy
    # names it, as the README says for a service elsewhere.
    config["mcp_servers"]["knowledge"].setdefault("env", {})["KNOWLEDGE_ADDRESS"] = address
    (home / ".hermes").mkdir(parents=True, exist_ok=True)
    (home / ".hermes" / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return tmpdir


def main() -> int:
    step = pip_client_step(CLIENT_REQUIREMENT, "hermes", ["mcp", "test", "knowledge"], _layout)
    return run_smoke("hermes-agent", client_step=step)


if __name__ == "__main__":
    sys.exit(main())
