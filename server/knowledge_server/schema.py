"""Creating a store's schema safely when several processes open it at once.

Serving processes (``workers > 1``) open every store at the same moment. A schema
script run in an ordinary transaction starts as a reader and upgrades to a writer at
its first write; if another process wrote in between, SQLite refuses the upgrade at
once (SQLITE_BUSY, the busy timeout does not apply). ``BEGIN IMMEDIATE`` takes the
write lock first, waiting through the busy handler, so concurrent openers queue.
"""

from __future__ import annotations

import array
import itertools
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import apsw

__all__ = [
    "apply_schema",
    "immediate",
    "int_array",
    "open_db",
    "set_mmap_mib",
    "store_settings",
    "use_wal",
]

# Stores are read through memory-mapped I/O (``PRAGMA mmap_size``), up to this many bytes
# of each file. A page that is not in the connection's own page cache (2 MB by default,
# far smaller than a code or episodes store) is then a memory access, not a read() system
# call plus a copy. The mapping is the operating system's file cache, shared by every
# connection and serving process: it adds no private memory. Set by the ``sqlite_mmap_mib``
# setting; 0 turns it off.
_mmap_bytes = 256 * 1024 * 1024


def _skip_memory_statistics() -> bool:
    """Turn off SQLite's process-wide memory statistics (``SQLITE_CONFIG_MEMSTATUS``).

    With them on, every allocation SQLite makes takes a global mutex to count bytes; a
    never-seen search makes thousands (about 2% of its instructions, counted under
    callgrind). Nothing here reads those statistics or sets a heap limit. The library can
    only be configured while no connection is open, so this runs when the stores' module
    is imported; if a connection already exists, nothing changes (returns False)."""
    if apsw.connections():
        return False
    apsw.shutdown()
    try:
        apsw.config(apsw.SQLITE_CONFIG_MEMSTATUS, 0)
    finally:
        apsw.initialize()
    return True


_skip_memory_statistics()


def set_mmap_mib(mib: int) -> None:
    """How much of each store file later connections map (``sqlite_mmap_mib``; 0 = none)."""
    global _mmap_bytes
    if mib < 0:
        raise ValueError("sqlite_mmap_mib must not be negative")
    _mmap_bytes = mib * 1024 * 1024


def int_array(values: Iterable[int]) -> apsw.carray:
    """Integers bound as one ``carray(?)`` table (``WHERE id IN (SELECT value FROM
    carray(?))``): no JSON text to build and parse, as ``json_each`` needs. SQLite's
    carray cannot be empty: callers skip the query when there is nothing to look up."""
    ints = array.array("q", values)
    if not ints:
        raise ValueError("int_array needs at least one value")
    return apsw.carray(ints)


def prefix_upper(p: str) -> str | None:
    """The least string above every string that starts with ``p``, in SQLite's binary
    order of UTF-8 (the order of code points): ``p`` with its last character incremented,
    skipping the surrogates (no character). None for "" and a last character U+10FFFF."""
    if not p or ord(p[-1]) >= 0x10FFFF:
        return None
    nxt = ord(p[-1]) + 1
    if 0xD800 <= nxt <= 0xDFFF:
        nxt = 0xE000
    return p[:-1] + chr(nxt)


class QueryValues:
    """Python values a running statement reads through an SQL function, by token.

    SQL functions are registered once per connection, but what they check (a query's rowid
    ranges, its set of allowed ids) belongs to one statement: the statement passes the token
    ``hold`` gave it, and the function looks the value up here. Tokens are unique across
    threads (``itertools.count``; dict access holds the GIL); ``hold`` releases its value
    when the statement is done, also on errors and interrupts."""

    def __init__(self) -> None:
        self._values: dict[int, object] = {}
        self._tokens = itertools.count(1)

    @contextmanager
    def hold(self, value: object) -> Iterator[int]:
        token = next(self._tokens)
        self._values[token] = value
        try:
            yield token
        finally:
            del self._values[token]

    def __getitem__(self, token: int) -> object:
        return self._values[token]

    def __len__(self) -> int:
        return len(self._values)


def store_settings(conn: apsw.Connection) -> None:
    """Settings every store connection gets: the memory-mapping size, and plans that do
    not depend on bound values.

    The second is SQLite's query planner stability guarantee (``SQLITE_DBCONFIG_ENABLE_QPSG``).
    Without it, a statement whose plan might depend on the value bound to one of its
    parameters is compiled again each time that parameter is bound. Among those are
    FTS5's own lookups of a term's segment pages, run for every query term, and several
    of the lanes' statements: a never-seen search re-compiled about 15 statements, 4%
    of its instructions (callgrind). What the planner gives up is what those values could
    offer: STAT4 samples (no store runs ANALYZE), the LIKE prefix optimisation for a
    bound pattern (no store query uses LIKE), and partial indexes matched by a bound
    value (no store has one). ``tests/test_store_sqlite.py`` holds the stores to it."""
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
    conn.execute(f"PRAGMA mmap_size={int(_mmap_bytes)}").fetchall()


def open_db(
    path: str,
    script: str,
    *,
    read_only: bool = False,
    busy_ms: int,
    synchronous_normal: bool = True,
) -> apsw.Connection:
    """A store's connection: read-only, or a writer whose folder, WAL mode and schema
    are ensured first (``synchronous=NORMAL`` unless told otherwise)."""
    if read_only:
        conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        conn = apsw.Connection(path)
        conn.setbusytimeout(busy_ms)
        use_wal(conn)
        if synchronous_normal:
            conn.execute("PRAGMA synchronous=NORMAL")
        apply_schema(conn, script)
    conn.setbusytimeout(busy_ms)
    store_settings(conn)
    return conn


def use_wal(conn: apsw.Connection, *, timeout_s: float = 30.0) -> None:
    """Switch a store to WAL. On a fresh file this needs an exclusive lock, and SQLite
    may answer SQLITE_BUSY without consulting the busy handler while another process
    does the same; retry until the other one has finished (a WAL store answers at once)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
            return
        except apsw.BusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


@contextmanager
def immediate(conn: apsw.Connection) -> Iterator[None]:
    """One write transaction that takes the write lock first (waiting through the busy
    handler), committed on success and rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def apply_schema(conn: apsw.Connection, script: str, *, busy_ms: int = 30_000) -> None:
    """Run ``script`` (CREATE ... IF NOT EXISTS, INSERT OR IGNORE ...) as one write
    transaction, waiting up to ``busy_ms`` for another writer to finish."""
    conn.setbusytimeout(busy_ms)
    with immediate(conn):
        conn.execute(script)
