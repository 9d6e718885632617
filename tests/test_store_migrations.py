"""Named schema migrations (``knowledge_server.schema.Migrations``): each step runs once,
in order, recorded; stores written before steps were recorded are adopted and upgraded;
a store a newer version wrote is refused with a clear message."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import apsw
import pytest
from knowledge_server import schema
from knowledge_server.code import CodeIndex
from knowledge_server.code import store as code_store
from knowledge_server.derived import store as derived_store
from knowledge_server.derived.store import DerivedStore
from knowledge_server.docgraph import store as docgraph_store
from knowledge_server.docgraph.store import DocGraphStore
from knowledge_server.episodes import store as episodes_store
from knowledge_server.episodes.store import EpisodeStore

from tests.conftest import REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "stores"


def _recorded(path: Path) -> list[str]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM migrations ORDER BY rowid")]
    finally:
        conn.close()


def _from_fixture(path: Path, name: str) -> Path:
    """A store file as the previous version left it, from its saved schema and rows."""
    conn = apsw.Connection(str(path))
    try:
        conn.execute((FIXTURES / name).read_text())
    finally:
        conn.close()
    return path


# --------------------------------------------------------------------------- the helper


def _log_steps(log: list[str]) -> tuple[schema.Step, ...]:
    def second(cur: apsw.Cursor) -> None:
        log.append("002")
        cur.execute("INSERT INTO t(v) VALUES ('from step 2')")

    return (
        schema.Step("001_initial", "CREATE TABLE t(v TEXT);"),
        schema.Step("002_row", second),
    )


def test_steps_run_once_in_order_and_are_recorded(tmp_path: Path) -> None:
    log: list[str] = []
    m = schema.Migrations("t.sqlite", _log_steps(log))
    path = tmp_path / "t.sqlite"
    conn = schema.open_db(str(path), m, busy_ms=1000)
    try:
        assert m.recorded(conn) == ["001_initial", "002_row"]
        assert conn.execute("SELECT v FROM t").fetchall() == [("from step 2",)]
        applied_at = conn.execute("SELECT applied_at FROM migrations").fetchall()
        changes = conn.total_changes()
        # Opening again (or migrating again) runs nothing and writes nothing.
        assert m.migrate(conn, str(path)) == []
        assert conn.total_changes() == changes
    finally:
        conn.close()
    again = schema.open_db(str(path), m, busy_ms=1000)
    try:
        assert log == ["002"]
        assert again.execute("SELECT applied_at FROM migrations").fetchall() == applied_at
        assert again.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
    finally:
        again.close()
    # A later version adds a step at the end: only that one runs.
    grown = schema.Migrations(
        "t.sqlite", (*_log_steps(log), schema.Step("003_col", "ALTER TABLE t ADD COLUMN w INT;"))
    )
    conn = schema.open_db(str(path), grown, busy_ms=1000)
    try:
        assert grown.recorded(conn) == ["001_initial", "002_row", "003_col"]
        assert log == ["002"]
    finally:
        conn.close()


def test_a_failing_step_leaves_nothing_behind(tmp_path: Path) -> None:
    def broken(cur: apsw.Cursor) -> None:
        cur.execute("INSERT INTO missing_table VALUES (1)")

    m = schema.Migrations(
        "t.sqlite",
        (schema.Step("001_initial", "CREATE TABLE t(v TEXT);"), schema.Step("002_bad", broken)),
    )
    path = tmp_path / "t.sqlite"
    with pytest.raises(schema.MigrationError, match="'002_bad' failed"):
        schema.open_db(str(path), m, busy_ms=1000)
    conn = apsw.Connection(str(path))
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "t" not in tables and "migrations" not in tables
    finally:
        conn.close()


def test_a_store_a_newer_version_wrote_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "episodes.sqlite"
    EpisodeStore(str(path)).close()
    conn = apsw.Connection(str(path))
    conn.execute(
        "INSERT INTO migrations(name, applied_at) VALUES ('003_from_the_future', '2030-01-01')"
    )
    conn.close()
    for read_only in (False, True):
        with pytest.raises(schema.StoreTooNew) as err:
            EpisodeStore(str(path), read_only=read_only)
        text = str(err.value)
        assert "written by a newer version" in text and "'003_from_the_future'" in text
        assert str(path) in text


def test_steps_recorded_out_of_order_are_refused(tmp_path: Path) -> None:
    log: list[str] = []
    m = schema.Migrations("t.sqlite", _log_steps(log))
    path = tmp_path / "t.sqlite"
    schema.open_db(str(path), m, busy_ms=1000).close()
    conn = apsw.Connection(str(path))
    conn.execute("DELETE FROM migrations WHERE name = '001_initial'")
    conn.close()
    with pytest.raises(schema.MigrationError, match="out of order"):
        schema.open_db(str(path), m, busy_ms=1000)


def test_step_names_are_unique() -> None:
    with pytest.raises(ValueError, match="share a name"):
        schema.Migrations("t.sqlite", (schema.Step("a", ""), schema.Step("a", "")))


def test_every_store_declares_its_steps_in_order() -> None:
    for m in (
        episodes_store.MIGRATIONS,
        derived_store.MIGRATIONS,
        code_store.MIGRATIONS,
        docgraph_store.MIGRATIONS,
    ):
        assert m.names[0] == "001_initial" and m.legacy is not None
        assert [n[:4] for n in m.names] == [f"{i:03d}_" for i in range(1, len(m.names) + 1)]


def test_concurrent_openers_of_a_fresh_store_run_each_step_once(tmp_path: Path) -> None:
    """Serving processes open every store at once: the openers queue on the write lock and
    the later ones find the steps recorded."""
    path = tmp_path / "episodes.sqlite"
    start = threading.Barrier(8)

    def open_one() -> None:
        start.wait()
        EpisodeStore(str(path)).close()

    with ThreadPoolExecutor(8) as pool:
        for done in [pool.submit(open_one) for _ in range(8)]:
            done.result()  # re-raises an opener's error
    assert _recorded(path) == list(episodes_store.MIGRATIONS.names)


# --------------------------------------------------------------------------- stores of the previous version


EPISODES_STEPS = (
    "001_initial",
    "002_fold_session_cwds",
    "003_stats_generation",
    "004_codex_context_digests",
    "005_plain_names",
)


def test_episodes_store_of_the_previous_version_is_upgraded(tmp_path: Path) -> None:
    path = _from_fixture(tmp_path / "episodes.sqlite", "episodes_before_migrations.sql")
    # A reader neither upgrades nor refuses it.
    reader = EpisodeStore(str(path), read_only=True)
    try:
        assert {s.session_id: s.cwd for s in reader.sessions()}["s1"] == "/work/app/../secret"
        before = reader.index_rev()
    finally:
        reader.close()
    store = EpisodeStore(str(path))
    try:
        # Adopted: the baseline recorded as it was; the cwd folding (no flag) ran; the
        # scopes' statistics have a generation.
        assert _recorded(path) == [*EPISODES_STEPS]
        gen = store.conn.execute("SELECT value FROM lane_meta WHERE key = 'stats_gen'").fetchone()
        assert gen is not None and len(gen[0]) == 32
        assert {s.session_id: s.cwd for s in store.sessions()} == {
            "s1": "/work/secret",
            "s2": "/work/other",
        }
        folded = store.index_rev()
        assert folded != before
        hits = store.search("cookie", workspaces=["/work/secret"])
        assert {h.session_id for h in hits} == {"s1"}
        assert {h.session_id for h in store.search("cookie", workspaces=["/work/app"])} == set()
    finally:
        store.close()
    again = EpisodeStore(str(path))
    try:
        assert again.index_rev() == folded
        assert _recorded(path) == [*EPISODES_STEPS]
    finally:
        again.close()


def test_episodes_store_already_folded_is_adopted_without_folding_again(tmp_path: Path) -> None:
    path = _from_fixture(tmp_path / "episodes.sqlite", "episodes_before_migrations.sql")
    conn = apsw.Connection(str(path))
    conn.execute("INSERT INTO lane_meta(key, value) VALUES ('cwd_normalised', '1')")
    conn.close()
    store = EpisodeStore(str(path))
    try:
        assert _recorded(path) == [*EPISODES_STEPS]
        # Recorded, not run: the revision did not move (the flag said it had run).
        assert store.index_rev() == "episodes:2023-11-14T22:13:20.000Z:1"
    finally:
        store.close()


def test_derived_store_of_the_previous_version_is_adopted_and_reads(tmp_path: Path) -> None:
    path = _from_fixture(tmp_path / "derived.sqlite", "derived_before_migrations.sql")
    store = DerivedStore(str(path))
    try:
        assert _recorded(path) == ["001_initial", "002_skill_by_path", "003_assignment_task_key"]
        assert store.index_rev() == "derived:2023-11-14T22:13:20Z:1"
        actor = store.actor("actor:claude-code:root_session:s1")
        assert actor is not None and actor.workspace_cwd == "/work/secret"
        assert [a.outbox_path for a in store.assignments()] == ["/outbox/a.json"]
        _, created = store.record_assignment("actor:x", "sha256:new", "/outbox/b.json")
        assert created and len(store.assignments()) == 2
    finally:
        store.close()


def test_derived_store_keyed_by_skill_name_gets_skills_by_path(tmp_path: Path) -> None:
    """ISO-1 across versions: a store whose skills were keyed by name (step 001 only) is
    given the table keyed by path, and forgets its catalog's fingerprint, so the next
    rebuild writes both workspaces' skills of one name (the old table refused the second)."""
    from knowledge_server.derived import rebuild

    path = tmp_path / "derived.sqlite"
    conn = apsw.Connection(str(path))
    schema.Migrations(derived_store.MIGRATIONS.store, derived_store.MIGRATIONS.steps[:1]).migrate(
        conn, str(path)
    )
    conn.execute(
        "INSERT INTO skill VALUES ('deploy', '/a/.claude/skills/deploy/SKILL.md', 'd', NULL, 'h')"
    )
    conn.execute("INSERT INTO meta VALUES ('catalog_fp', 'sha256:old')")
    conn.close()
    roots = []
    for ws in ("a", "b"):
        folder = tmp_path / ws / ".claude" / "skills" / "deploy"
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(f"---\nname: deploy\ndescription: from {ws}\n---\n")
        roots.append(str(tmp_path / ws / ".claude" / "skills"))
    store = DerivedStore(str(path))
    eps = EpisodeStore(str(tmp_path / "episodes.sqlite"))
    try:
        assert _recorded(path) == ["001_initial", "002_skill_by_path", "003_assignment_task_key"]
        assert store.skills() == [] and store.get_meta("catalog_fp") is None
        rebuild(eps, store, roots)
        assert sorted(r[2] for r in store.skills()) == ["from a", "from b"]
    finally:
        eps.close()
        store.close()


def test_code_store_of_the_previous_version_gets_its_later_step(tmp_path: Path) -> None:
    path = _from_fixture(tmp_path / "code.sqlite", "code_before_migrations.sql")
    idx = CodeIndex(str(path))
    try:
        # The baseline was there; the full-text settings step ran (automerge was missing),
        # then the file-level index was added and filled, and the generated-file and
        # command-line columns added (0 for the versions stored before: they had no such
        # checks).
        assert _recorded(path) == [
            "001_initial",
            "002_fts_rank_and_automerge",
            "003_files_fts",
            "004_generated_files",
            "005_cli_options",
        ]
        assert {r[0] for r in idx.conn.execute("SELECT generated FROM file_versions")} <= {0}
        assert {r[0] for r in idx.conn.execute("SELECT cli_options FROM file_versions")} <= {0}
        settings = dict(idx.conn.execute("SELECT k, v FROM chunks_fts_config").fetchall())
        # Every stored file version has its row in the file-level index, from its chunks.
        versions = idx.conn.execute("SELECT id FROM file_versions ORDER BY id").fetchall()
        assert versions == idx.conn.execute("SELECT rowid FROM files_fts ORDER BY rowid").fetchall()
        assert settings["automerge"] == code_store.FTS_AUTOMERGE
        assert settings["rank"] == code_store.FTS_RANK
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "guide.md").write_text("# Guide\nRotate the session cookie.\n")
        idx.index_workspace(str(ws))
        assert [h.path for h in idx.search("cookie", mode="lexical").hits] == ["guide.md"]
    finally:
        idx.close()


def test_docgraph_store_of_the_previous_version_is_adopted_and_reads(tmp_path: Path) -> None:
    path = _from_fixture(tmp_path / "docgraph.sqlite", "docgraph_before_migrations.sql")
    store = DocGraphStore(path)
    try:
        assert _recorded(path) == ["001_initial", "002_mention_entity"]
        rev = store.current_rev("/work/docs")
        assert rev is not None and rev["rev_id"] == 1 and rev["stats"] == {"entities": 0}
    finally:
        store.close()


def test_a_fresh_store_runs_every_step_and_has_the_previous_schema(tmp_path: Path) -> None:
    """Stores created now hold the same tables, indexes and triggers, with the same
    definitions, as a store the previous version created once its later steps ran: the
    steps are the only way the schema changes."""
    stores = (
        ("episodes", lambda p: EpisodeStore(str(p)).close()),
        ("derived", lambda p: DerivedStore(str(p)).close()),
        ("code", lambda p: CodeIndex(str(p)).close()),
        ("docgraph", lambda p: DocGraphStore(p).close()),
    )
    for name, create in stores:
        fresh = tmp_path / f"{name}.sqlite"
        create(fresh)
        old = _from_fixture(tmp_path / f"{name}-old.sqlite", f"{name}_before_migrations.sql")
        create(old)

        def layout(path: Path) -> set[tuple[str, str, str]]:
            conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
            try:
                return set(
                    conn.execute(
                        "SELECT type, name, sql FROM sqlite_master WHERE tbl_name != 'migrations'"
                    )
                )
            finally:
                conn.close()

        assert layout(fresh) == layout(old), name
        module = {
            "episodes": episodes_store,
            "derived": derived_store,
            "code": code_store,
            "docgraph": docgraph_store,
        }[name]
        assert _recorded(fresh) == list(module.MIGRATIONS.names)
