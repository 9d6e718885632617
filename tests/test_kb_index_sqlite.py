"""The embedded knowledge-base index's storage (``kb.index.sqlite``)."""

from __future__ import annotations

from pathlib import Path

import apsw
from knowledge_server.kb.index.port import IndexChunk
from knowledge_server.kb.index.sqlite import STORE_FILE, SqliteRetrievalIndex


def test_many_small_organisations_keep_the_store_small(tmp_path: Path) -> None:
    """sqlite-vec allocates its vector chunks per partition (organisation): with its
    default of 1,024 vectors a chunk, 60 organisations of one row each took 60 MiB at 256
    dimensions. The index's smaller chunks keep that to a few MiB."""
    path = tmp_path / STORE_FILE
    index = SqliteRetrievalIndex(path, dim=256)
    try:
        for n in range(60):
            org = f"org-{n}"
            row = IndexChunk("r1:0", org, "t", "r1", "s", 0, "text", "T", (), None, "text", ())
            index.stage(org, "r1", [row], [[1.0] + [0.0] * 255])
        assert len(index.revision_counts()) == 60
    finally:
        index.close()
    conn = apsw.Connection(str(path))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        pages, page_size = (
            conn.execute("PRAGMA page_count").fetchall()[0][0],
            conn.execute("PRAGMA page_size").fetchall()[0][0],
        )
    finally:
        conn.close()
    assert pages * page_size < 12 * 1024 * 1024
