"""Creating a store's schema safely when several processes open it at once.

Serving processes (``workers > 1``) open every store at the same moment. A schema
script run in an ordinary transaction starts as a reader and upgrades to a writer at
its first write; if another process wrote in between, SQLite refuses the upgrade at
once (SQLITE_BUSY, the busy timeout does not apply). ``BEGIN IMMEDIATE`` takes the
write lock first, waiting through the busy handler, so concurrent openers queue.
"""

from __future__ import annotations

import apsw

__all__ = ["apply_schema"]


def apply_schema(conn: apsw.Connection, script: str, *, busy_ms: int = 30_000) -> None:
    """Run ``script`` (CREATE ... IF NOT EXISTS, INSERT OR IGNORE ...) as one write
    transaction, waiting up to ``busy_ms`` for another writer to finish."""
    conn.setbusytimeout(busy_ms)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(script)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
