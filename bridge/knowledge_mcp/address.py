"""The service address the bridge and the hook dial, found as the `knowledge` CLI finds it:
the address given (``--address``), else ``KNOWLEDGE_ADDRESS``, else the address `knowledge
serve` recorded in ``DATA_DIR/server.json``, else ``127.0.0.1:50151``.

``DATA_DIR`` is ``KNOWLEDGE_DATA_DIR`` or the user's data directory for ``knowledge-service``
(the server's default, ``knowledge_server.config.default_data_dir``; this package does not
import the server).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
from knowledge_sdk.client import DEFAULT_ADDRESS
from knowledge_sdk.recorded import recorded_address as read_recorded


def data_dir() -> Path:
    env = os.environ.get("KNOWLEDGE_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("knowledge-service", appauthor=False))


def recorded_address() -> str | None:
    """The address `knowledge serve` recorded in ``DATA_DIR/server.json``, when this user
    wrote the file and it names this machine (``knowledge_sdk.recorded``); else None."""
    return read_recorded(data_dir())


def resolve_address(given: str | None = None) -> str:
    return given or os.environ.get("KNOWLEDGE_ADDRESS") or recorded_address() or DEFAULT_ADDRESS
