"""The service address the bridge and the hook dial, found as the `knowledge` CLI finds it:
the address given (``--address``), else ``KNOWLEDGE_ADDRESS``, else the address `knowledge
serve` recorded in ``DATA_DIR/server.json``, else ``127.0.0.1:50151``.

``DATA_DIR`` is ``KNOWLEDGE_DATA_DIR`` or the user's data directory for ``knowledge-service``
(the server's default, ``knowledge_server.config.default_data_dir``; this package does not
import the server).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import platformdirs
from knowledge_sdk.client import DEFAULT_ADDRESS

SERVER_FILE = "server.json"


def data_dir() -> Path:
    env = os.environ.get("KNOWLEDGE_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("knowledge-service", appauthor=False))


def recorded_address() -> str | None:
    """The address in ``DATA_DIR/server.json``; None when there is none to read."""
    try:
        address = json.loads((data_dir() / SERVER_FILE).read_text())["address"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return address if isinstance(address, str) and address else None


def resolve_address(given: str | None = None) -> str:
    return given or os.environ.get("KNOWLEDGE_ADDRESS") or recorded_address() or DEFAULT_ADDRESS
