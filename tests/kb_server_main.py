"""A real serving process with a knowledge base for the kill -9 test of
``tests/test_kb_admin_e2e.py``: the service's own ``serve`` (authentication on, the
token file of DATA_DIR), its knowledge base staging into the file-backed stand-in index
(``tests/kb_fakes.py``, ``DATA_DIR/kb-index.json``) with the hashing embedder, slowed
down per embedding call while ``DATA_DIR/slow`` exists (so a test can kill it during
PROCESS).

    python -m tests.kb_server_main DATA_DIR
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from knowledge_server.app import KnowledgeApp
from knowledge_server.code.embed import HashingEmbedder
from knowledge_server.config import load_config
from knowledge_server.kb.index.sqlite import STORE_FILE, SqliteRetrievalIndex
from knowledge_server.kb.service import KnowledgeBase
from knowledge_server.runtime import build_authenticator, start_background
from knowledge_server.server import serve


class SlowEmbedder(HashingEmbedder):
    def __init__(self, flag: Path) -> None:
        super().__init__()
        self.flag = flag
        self.batch_size = 4

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.flag.exists():
            time.sleep(0.5)
        return super().embed(texts)


def main() -> None:
    data = Path(sys.argv[1])
    config = load_config(
        env={},
        overrides={
            "listen": "127.0.0.1:0",
            "data_dir": str(data),
            "bootstrap": False,
            "auth": "on",
        },
    )
    kb = KnowledgeBase(
        data,
        index=SqliteRetrievalIndex(data / STORE_FILE, dim=SlowEmbedder(data / "slow").dim),
        embedder=SlowEmbedder(data / "slow"),
        poll_seconds=0.2,
    )
    app = KnowledgeApp(config, kb=kb)
    asyncio.run(
        serve(
            config, app=app, authenticate=build_authenticator(config), on_started=start_background
        )
    )


if __name__ == "__main__":
    main()
