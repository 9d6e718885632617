"""How stores use SQLite: memory-mapped reads (``sqlite_mmap_mib``), no memory statistics,
plans that do not depend on bound values."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest
from knowledge_server import schema
from knowledge_server.code.store import open_store
from knowledge_server.config import load_config
from knowledge_server.episodes.store import EpisodeStore
from knowledge_server.runtime import build_app


@pytest.fixture(autouse=True)
def _restore_setting() -> Iterator[None]:
    before = schema._mmap_bytes
    yield
    schema._mmap_bytes = before


def _mapped(conn: apsw.Connection) -> int:
    return int(conn.execute("PRAGMA mmap_size").fetchall()[0][0])


def test_every_kind_of_store_connection_is_mapped(tmp_path: Path) -> None:
    schema.set_mmap_mib(64)
    writer = EpisodeStore(str(tmp_path / "episodes.sqlite"))
    reader = EpisodeStore(str(tmp_path / "episodes.sqlite"), read_only=True)
    code = open_store(str(tmp_path / "code.sqlite"))
    try:
        for conn in (writer.conn, reader.conn, code):
            assert _mapped(conn) == 64 * 1024 * 1024
    finally:
        writer.close()
        reader.close()
        code.close()


def test_zero_turns_mapping_off_and_negative_is_refused(tmp_path: Path) -> None:
    schema.set_mmap_mib(0)
    conn = open_store(str(tmp_path / "code.sqlite"))
    try:
        assert _mapped(conn) == 0
    finally:
        conn.close()
    with pytest.raises(ValueError, match="sqlite_mmap_mib"):
        schema.set_mmap_mib(-1)


def test_the_setting_reaches_the_stores_of_a_served_app(tmp_path: Path) -> None:
    cfg = load_config(
        env={}, overrides={"data_dir": tmp_path, "bootstrap": False, "sqlite_mmap_mib": 8}
    )
    app = build_app(cfg)
    try:
        with app.lanes.episodes._readers.get() as store:  # type: ignore[attr-defined]
            assert _mapped(store.conn) == 8 * 1024 * 1024
    finally:
        app.close()


def _steps(script: str) -> schema.Migrations:
    return schema.Migrations("test.sqlite", (schema.Step("001_initial", script),))


def test_a_mapped_reader_sees_a_file_that_grew_and_was_checkpointed(tmp_path: Path) -> None:
    """A mapping covers the file as it was; later pages (after the writer grew the file and
    checkpointed the WAL into it) must still be read, and read right."""
    schema.set_mmap_mib(1)  # smaller than the file will become: part mapped, part read()
    path = str(tmp_path / "grow.sqlite")
    steps = _steps("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);")
    writer = schema.open_db(path, steps, busy_ms=1000)
    reader = schema.open_db(path, steps, read_only=True, busy_ms=1000)
    try:
        blob = bytes(range(256)) * 16
        for round_ in range(3):
            with writer:
                writer.executemany("INSERT INTO t(v) VALUES (?)", [(blob,) for _ in range(400)])
            writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            rows = reader.execute("SELECT count(*), sum(length(v)) FROM t").fetchall()[0]
            assert rows == (400 * (round_ + 1), 400 * (round_ + 1) * len(blob))
            last = reader.execute("SELECT v FROM t ORDER BY id DESC LIMIT 1").fetchall()[0][0]
            assert last == blob
        assert Path(path).stat().st_size > 1024 * 1024
    finally:
        reader.close()
        writer.close()


def test_sqlite_memory_statistics_are_off_and_stores_still_work(tmp_path: Path) -> None:
    """The stores' module turned SQLite's memory statistics off when it was imported (no
    connection was open yet): the counter stays at zero while a store is written and read."""
    store = EpisodeStore(str(tmp_path / "episodes.sqlite"))
    try:
        store.conn.execute("CREATE TABLE probe(v BLOB)")
        store.conn.execute("INSERT INTO probe VALUES (zeroblob(100000))")
        assert store.conn.execute("SELECT length(v) FROM probe").fetchall() == [(100000,)]
        assert apsw.status(apsw.SQLITE_STATUS_MEMORY_USED)[0] == 0
    finally:
        store.close()
    # With a connection open, the library is left as it is.
    held = apsw.Connection(":memory:")
    try:
        assert schema._skip_memory_statistics() is False
    finally:
        held.close()


def _plans_fixed(conn: apsw.Connection) -> bool:
    return bool(conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, -1))


def test_every_kind_of_store_connection_keeps_its_plans(tmp_path: Path) -> None:
    """The query planner stability guarantee is on for every store connection: writers,
    readers, the code store, and any other store opened through ``schema.open_db``."""
    writer = EpisodeStore(str(tmp_path / "episodes.sqlite"))
    reader = EpisodeStore(str(tmp_path / "episodes.sqlite"), read_only=True)
    code = open_store(str(tmp_path / "code.sqlite"))
    plain = schema.open_db(
        str(tmp_path / "other.sqlite"), _steps("CREATE TABLE t(v);"), busy_ms=1000
    )
    try:
        for conn in (writer.conn, reader.conn, code, plain):
            assert _plans_fixed(conn)
    finally:
        for c in (writer.conn, reader.conn, code, plain):
            c.close()


def test_rebinding_a_parameter_does_not_compile_a_statement_again(tmp_path: Path) -> None:
    """A full-text query run with new values: no statement, FTS5's own lookups included,
    reports being prepared again (SQLITE_STMTSTATUS_REPREPARE). Without the guarantee,
    FTS5's segment-page lookup for each term is compiled anew on every query."""
    conn = schema.open_db(
        str(tmp_path / "fts.sqlite"),
        _steps(
            "CREATE VIRTUAL TABLE t USING fts5(x); CREATE TABLE meta(k TEXT PRIMARY KEY, v TEXT);"
        ),
        busy_ms=1000,
    )
    try:
        with conn:
            conn.executemany(
                "INSERT INTO t(x) VALUES (?)", [(f"alpha beta w{i}",) for i in range(50)]
            )
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [(f"k{i}", "v") for i in range(9)])
        seen: list[tuple[str, int]] = []
        conn.trace_v2(
            apsw.SQLITE_TRACE_PROFILE,
            lambda ev: seen.append((ev["sql"], ev["stmt_status"]["SQLITE_STMTSTATUS_REPREPARE"])),
        )
        for i in range(4):
            conn.execute(
                "SELECT rowid, bm25(t) AS s FROM t WHERE t MATCH ? ORDER BY s, rowid LIMIT ?",
                (f'"alpha" OR "w{i}"', 3 + i),
            ).fetchall()
            conn.execute("SELECT v FROM meta WHERE k = ?", (f"k{i}",)).fetchall()
        conn.trace_v2(0, None)
        assert any("_idx" in sql for sql, _ in seen)  # FTS5's own lookups were traced
        assert [sql for sql, n in seen if n] == []
    finally:
        conn.close()


def test_int_array_binds_a_list_of_ids_and_refuses_an_empty_one() -> None:
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"v{i}") for i in range(1, 50)])
    ids = [7, 3, 42, 3, 2**40]  # duplicates and absent ids are harmless in IN (...)
    got = conn.execute(
        "SELECT id FROM t WHERE id IN (SELECT value FROM carray(?)) ORDER BY id",
        (schema.int_array(ids),),
    ).fetchall()
    assert got == [(3,), (7,), (42,)]
    with pytest.raises(ValueError, match="at least one"):
        schema.int_array([])


def test_one_row_reads_an_aggregate_and_refuses_a_query_without_a_row() -> None:
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    # An aggregate over no rows still has its one row.
    assert schema.one_row(conn, "SELECT COUNT(*), MAX(id) FROM t") == (0, None)
    conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    assert schema.one_row(conn.cursor(), "SELECT COUNT(*), MAX(id) FROM t WHERE id > ?", (0,)) == (
        2,
        2,
    )
    with pytest.raises(LookupError, match="no row"):
        schema.one_row(conn, "SELECT v FROM t WHERE id = ?", (3,))
