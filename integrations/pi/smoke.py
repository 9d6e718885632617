#!/usr/bin/env python3
"""Smoke for Pi (pi-mcp-adapter).

Proves the mcp.json template starts the bridge the way Pi (pi-mcp-adapter) would spawn it and
that knowledge_search answers with path:line and index_rev. The client itself is
not installed or run here (see the README's Boundaries), so this smoke does not
support an L2 claim.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smoke_common import run_smoke


def main() -> int:
    return run_smoke("pi")


if __name__ == "__main__":
    sys.exit(main())
