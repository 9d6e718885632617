"""FTS5 index upkeep (knowledge_server.fts): segment counting and merging after write runs.

Invariant: merging changes how fast a query runs, never what it returns (the same hits in
the same order, KE-determinism of the lanes); a write run merges only when it changed a
sizeable share of the rows or the segments piled up.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import apsw
import pytest
from knowledge_server import fts
from knowledge_server.code import CodeIndex
from knowledge_server.derived import DerivedStore, rebuild, search_skills
from knowledge_server.episodes import EpisodeStore, ingest

FIX = Path(__file__).parent / "fixtures" / "derived"


def _table(automerge: int = 0) -> apsw.Connection:
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(body)")
    # automerge 0: every transaction's segment stays, so the count is exactly known.
    conn.execute("INSERT INTO t(t, rank) VALUES('automerge', ?)", (automerge,))
    conn.execute("INSERT INTO t(t, rank) VALUES('crisismerge', 64)")
    return conn


def _write_runs(conn: apsw.Connection, runs: int, start: int = 0) -> None:
    for i in range(start, start + runs):
        with conn:
            conn.execute("INSERT INTO t(rowid, body) VALUES(?, ?)", (i + 1, f"alpha word{i} beta"))


def test_segment_count_follows_transactions() -> None:
    conn = _table()
    assert fts.segment_count(conn, "t") == 0
    _write_runs(conn, 5)
    assert fts.segment_count(conn, "t") == 5
    conn.execute("INSERT INTO t(t) VALUES('optimize')")
    assert fts.segment_count(conn, "t") == 1


def test_segment_count_reads_the_second_structure_format() -> None:
    """A contentless table with deletes (as the code store's chunks_fts) writes the newer
    structure record, with a 4-byte marker after the cookie; the count must not read the
    marker as levels and segments."""
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(body, content='', contentless_delete=1)")
    conn.execute("INSERT INTO t(t, rank) VALUES('automerge', 0)")
    _write_runs(conn, 3)
    with conn:
        conn.execute("DELETE FROM t WHERE rowid = 2")
    block = conn.execute("SELECT block FROM t_data WHERE id = 10").fetchone()[0]
    assert block[4:8] == b"\xff\x00\x00\x01"
    assert fts.segment_count(conn, "t") == 3


def test_compact_merges_only_after_a_large_share_or_too_many_segments() -> None:
    conn = _table()
    _write_runs(conn, 4)
    # A small run on a large index: left to automerge.
    assert not fts.compact(conn, "t", changed_rows=1, total_rows=1000)
    assert fts.segment_count(conn, "t") == 4
    # A run that changed 1/20 of the rows: merged into one segment.
    assert fts.compact(conn, "t", changed_rows=50, total_rows=1000)
    assert fts.segment_count(conn, "t") == 1
    assert not fts.compact(conn, "t", changed_rows=1000, total_rows=1000)  # nothing to merge
    # Small runs that piled up beyond MAX_SEGMENTS: merged regardless.
    _write_runs(conn, fts.MAX_SEGMENTS - 1, start=10)
    assert fts.segment_count(conn, "t") == fts.MAX_SEGMENTS
    assert not fts.compact(conn, "t", changed_rows=1, total_rows=10**6)
    _write_runs(conn, 1, start=100)
    assert fts.segment_count(conn, "t") == fts.MAX_SEGMENTS + 1
    assert fts.compact(conn, "t", changed_rows=1, total_rows=10**6)
    assert fts.segment_count(conn, "t") == 1


def test_merge_keeps_bm25_results_identical() -> None:
    conn = _table()
    for i in range(40):
        with conn:
            words = " ".join(["alpha"] * (i % 5 + 1) + ["beta"] * (i % 3) + [f"w{i}"])
            conn.execute("INSERT INTO t(rowid, body) VALUES(?, ?)", (i + 1, words))
    with conn:
        conn.execute("DELETE FROM t WHERE rowid IN (3, 17, 29)")
    sql = "SELECT rowid, bm25(t) FROM t WHERE t MATCH ? ORDER BY bm25(t), rowid"
    before = {
        q: conn.execute(sql, (q,)).fetchall() for q in ("alpha", "beta OR w7", "alpha AND beta")
    }
    assert fts.segment_count(conn, "t") > 1
    assert fts.compact(conn, "t", changed_rows=40, total_rows=40)
    after = {q: conn.execute(sql, (q,)).fetchall() for q in before}
    assert after == before


def _log(path: Path, sid: str, n: int) -> None:
    lines = [
        json.dumps(
            {
                "session_id": sid,
                "seq": i,
                "time": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
                "role": "user",
                "text": f"step {i} of {sid}: fixed the failing parser test {i % 7}",
                "cwd": "/work/proj",
            }
        )
        for i in range(1, n + 1)
    ]
    path.write_text("\n".join(lines) + "\n")


def test_ingest_run_leaves_one_segment_and_same_hits(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for k in range(6):  # one transaction (and one segment) per file
        _log(logs / f"s{k}.jsonl", f"sess-{k}", 30)
    store = EpisodeStore(str(tmp_path / "db"))
    try:
        rep = ingest(store, [str(logs)])
        assert rep.events_added == 180
        assert fts.segment_count(store.conn, "events_fts") == 1
        # A later small run (one new file of 2 events against 180) is left to automerge.
        _log(logs / "s9.jsonl", "sess-9", 2)
        assert ingest(store, [str(logs)]).events_added == 2
        assert fts.segment_count(store.conn, "events_fts") > 1
        hits = [(h.id, h.score) for h in store.search("failing parser test 3", k=20)]
        assert fts.compact(store.conn, "events_fts", changed_rows=182, total_rows=182)
        assert fts.segment_count(store.conn, "events_fts") == 1
        assert [(h.id, h.score) for h in store.search("failing parser test 3", k=20)] == hits
    finally:
        store.close()


def test_code_index_run_merges_after_a_full_index_not_after_a_one_file_edit(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(60):
        (ws / f"mod{i}.py").write_text(f"def handler_{i}(request):\n    return parse_config({i})\n")
    index = CodeIndex(str(tmp_path / "data" / "code.sqlite"))
    try:
        rep = index.index_workspace(str(ws))
        assert "fts_merge" in rep.timings_ms or fts.segment_count(index.conn, "chunks_fts") == 1
        assert fts.segment_count(index.conn, "chunks_fts") == 1
        (ws / "mod7.py").write_text("def handler_7(request):\n    return parse_config(700)\n")
        rep = index.index_workspace(str(ws))
        assert rep.chunks_new == 1 and "fts_merge" not in rep.timings_ms
        assert fts.segment_count(index.conn, "chunks_fts") > 1
    finally:
        index.close()


def test_catalog_rewrite_leaves_one_segment(tmp_path: Path) -> None:
    """Every catalog rewrite deletes and re-inserts the skills; without the merge each
    left its segments and deleted entries behind for every later query to skip. The
    answers equal those of a store that only ever saw the final catalog."""
    skills = tmp_path / "skills"
    shutil.copytree(FIX / "skills", skills)
    eps = EpisodeStore(str(tmp_path))
    store = DerivedStore(str(tmp_path))
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    fresh = DerivedStore(str(fresh_dir))
    try:
        rebuild(eps, store, [str(skills)])
        for round_ in range(3):
            extra = skills / f"extra-{round_}" / "SKILL.md"
            extra.parent.mkdir()
            extra.write_text(
                f"---\nname: extra-{round_}\ndescription: an unrelated helper {round_}\n---\nbody\n"
            )
            rebuild(eps, store, [str(skills)])
            assert fts.segment_count(store.conn, "skill_fts") == 1
        rebuild(eps, fresh, [str(skills)])
        for q in ("brainstorming ideas", "unrelated helper", "debugging a test"):
            got = [(h.name, h.score) for h in search_skills(store, q, limit=10)]
            assert got == [(h.name, h.score) for h in search_skills(fresh, q, limit=10)]
    finally:
        store.close()
        fresh.close()
        eps.close()


def test_table_name_is_checked() -> None:
    with pytest.raises(ValueError):
        fts.segment_count(apsw.Connection(":memory:"), "t; DROP TABLE x")
