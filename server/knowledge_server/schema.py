"""Opening a store: its settings, and its schema as named, recorded migrations.

A store's schema is an ordered list of named steps (``Migrations``). Each step runs once,
in order, inside the transaction that records it in the store's ``migrations`` table
(name, applied_at), as sqlite-utils' migrations do. A later change to a store is a new
step at the end of its list, never an edit of a recorded one. A store whose table names a
step this code does not know was written by a newer version: opening it fails with
``StoreTooNew`` instead of misreading it. Stores written before steps were recorded are
adopted: the steps they already have are recorded without running (``Migrations.legacy``).

Serving processes (``workers > 1``) open every store at the same moment. A schema
script run in an ordinary transaction starts as a reader and upgrades to a writer at
its first write; if another process wrote in between, SQLite refuses the upgrade at
once (SQLITE_BUSY, the busy timeout does not apply). ``BEGIN IMMEDIATE`` takes the
write lock first, waiting through the busy handler, so concurrent openers queue; the
second finds the steps recorded and runs none.
"""

from __future__ import annotations

import array
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import apsw

__all__ = [
    "MigrationError",
    "Migrations",
    "Step",
    "StoreTooNew",
    "has_schema",
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

    With them on, every allocation SQLite makes takes a global mutex to count bytes, and
    a never-seen search makes thousands of allocations (figures in bench/RESULTS.md).
    Nothing here reads those statistics or sets a heap limit. The library can only be
    configured while no connection is open, so this runs when the stores' module is
    imported; if a connection already exists, nothing changes (returns False)."""
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


def int_array(values: Iterable[int]) -> apsw.CArrayBinding:
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
    of the lanes' statements, so every search spent part of its work compiling them again
    (figures in bench/RESULTS.md). What the planner gives up is what those values could
    offer: STAT4 samples (no store runs ANALYZE), the LIKE prefix optimisation for a
    bound pattern (no store query uses LIKE), and partial indexes matched by a bound
    value (no store has one). ``tests/test_store_sqlite.py`` holds the stores to it."""
    conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
    conn.execute(f"PRAGMA mmap_size={int(_mmap_bytes)}").fetchall()


def open_db(
    path: str,
    migrations: Migrations,
    *,
    read_only: bool = False,
    busy_ms: int,
    synchronous_normal: bool = True,
) -> apsw.Connection:
    """A store's connection: read-only, or a writer whose folder, WAL mode and schema
    (``migrations``, brought up to date) are ensured first (``synchronous=NORMAL`` unless
    told otherwise). Either way, a store written by a newer version is refused."""
    if read_only:
        conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        conn = apsw.Connection(path)
    try:
        conn.setbusytimeout(busy_ms)
        if read_only:
            migrations.check(conn, path)
        else:
            use_wal(conn)
            if synchronous_normal:
                conn.execute("PRAGMA synchronous=NORMAL")
            migrations.migrate(conn, path)
    except BaseException:
        conn.close()
        raise
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


@contextmanager
def snapshot(conn: apsw.Connection) -> Iterator[None]:
    """The reads of one lane call (or one store search) in one read transaction: they all
    see the same state of the store (the revision a result is cached under is the one its
    rows come from), and SQLite takes its locks once instead of per statement, which makes
    a short read much cheaper (figures in bench/RESULTS.md). Inside a transaction already,
    nothing changes."""
    if not conn.getautocommit():
        yield
        return
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if not conn.getautocommit():  # an interrupted query may have ended it already
            conn.execute("COMMIT")


# --------------------------------------------------------------------------- migrations

MIGRATIONS_TABLE = "migrations"


class MigrationError(RuntimeError):
    """A store's recorded schema steps do not fit this code's list (out of order, or a
    step failed); the message names the store and the step."""


class StoreTooNew(MigrationError):
    """The store records schema steps this version does not know: a newer version wrote it."""


@dataclass(frozen=True)
class Step:
    """One named schema change: an SQL script, or a function of the open write
    transaction's cursor (for data changes that need Python)."""

    name: str
    apply: str | Callable[[apsw.Cursor], None]


@dataclass(frozen=True)
class Migrations:
    """The ordered schema steps of one kind of store (``store`` names it in messages).

    ``legacy`` serves stores written before steps were recorded (they have no
    ``migrations`` table but do have tables): given the cursor, it returns the names of
    the leading steps such a store already has, which are recorded without running. The
    first step is always its baseline (the schema those versions created); later names
    stand for the one-off upgrades they applied behind ad-hoc flags."""

    store: str
    steps: tuple[Step, ...]
    legacy: Callable[[apsw.Cursor], Sequence[str]] | None = None
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(step.name for step in self.steps)
        if len(set(names)) != len(names):
            raise ValueError(f"{self.store}: two schema steps share a name")
        object.__setattr__(self, "names", names)

    def recorded(self, conn: apsw.Connection) -> list[str]:
        """The steps recorded in the store, in the order they were applied."""
        if not _has_table(conn, MIGRATIONS_TABLE):
            return []
        return [r[0] for r in conn.execute(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY rowid")]  # noqa: S608 - a constant table name

    def pending(self, conn: apsw.Connection, where: str) -> list[Step]:
        """The steps still to apply, in order; raises ``StoreTooNew`` for a store a newer
        version wrote and ``MigrationError`` for steps recorded out of order."""
        done = self.recorded(conn)
        unknown = [name for name in done if name not in self.names]
        if unknown:
            raise StoreTooNew(
                f"{where} was written by a newer version of the Knowledge Service: it records "
                f"schema migration(s) {', '.join(map(repr, unknown))} that this version does not "
                f"know ({self.store} here knows up to {self.names[-1]!r}). Run the newer "
                "version, or move the data directory aside to start afresh."
            )
        if done != list(self.names[: len(done)]):
            raise MigrationError(
                f"{where}: schema migrations recorded out of order ({', '.join(done)}); "
                f"{self.store} expects {', '.join(self.names)}"
            )
        return list(self.steps[len(done) :])

    def check(self, conn: apsw.Connection, where: str) -> None:
        """For a read-only connection: refuse a store a newer version wrote. A store
        behind this code is left as it is (its writer brings it up to date)."""
        self.pending(conn, where)

    def migrate(self, conn: apsw.Connection, where: str) -> list[str]:
        """Bring the store up to date; returns the names of the steps run now. Reads only
        when nothing is pending, so opening an up-to-date store writes nothing."""
        if not self.pending(conn, where):
            return []
        ran: list[str] = []
        with immediate(conn):
            cur = conn.cursor()
            if not _has_table(conn, MIGRATIONS_TABLE):
                cur.execute(
                    f"CREATE TABLE {MIGRATIONS_TABLE}(name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
                )
                self._adopt(cur, where)
            for step in self.pending(conn, where):  # again: another opener may have run them
                try:
                    if isinstance(step.apply, str):
                        cur.execute(step.apply)
                    else:
                        step.apply(cur)
                except apsw.Error as exc:
                    raise MigrationError(
                        f"{where}: schema migration {step.name!r} failed: {exc}"
                    ) from exc
                _record(cur, step.name)
                ran.append(step.name)
        return ran

    def _adopt(self, cur: apsw.Cursor, where: str) -> None:
        """Record the steps a store written before migrations were recorded already has."""
        has_tables = cur.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name NOT IN (?, 'sqlite_sequence')",
            (MIGRATIONS_TABLE,),
        ).fetchone()
        if has_tables is None or self.legacy is None:
            return
        present = list(self.legacy(cur))
        if present != list(self.names[: len(present)]):
            raise MigrationError(
                f"{where}: an unrecorded store was judged to have steps {present}, "
                f"which are not the first steps of {self.store}"
            )
        for name in present:
            _record(cur, name)


def _record(cur: apsw.Cursor, name: str) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    cur.execute(f"INSERT INTO {MIGRATIONS_TABLE}(name, applied_at) VALUES (?, ?)", (name, now))  # noqa: S608 - a constant table name


def one_row(conn: apsw.Connection | apsw.Cursor, sql: str, params: Any = ()) -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate without GROUP BY)."""
    row: tuple[Any, ...] | None = conn.execute(sql, params).fetchone()
    if row is None:
        raise LookupError("the query returned no row")
    return row


def _has_table(conn: apsw.Connection | apsw.Cursor, name: str) -> bool:
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(sql, (name,)).fetchone() is not None


def has_schema(cur: apsw.Cursor, script: str) -> bool:
    """Whether the store already holds every table, index and trigger ``script`` creates
    (for ``Migrations.legacy``: a baseline step is present in an unrecorded store)."""
    scratch = apsw.Connection(":memory:")
    try:
        scratch.execute(script)
        wanted = {
            (kind, name)
            for kind, name in scratch.execute(
                "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            )
        }
    finally:
        scratch.close()
    have = set(cur.execute("SELECT type, name FROM sqlite_master"))
    return wanted <= have
