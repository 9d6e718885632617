"""The workspace rule in SQL (``under_sql``) and the episodes lane's scoped reads.

Isolation: a principal scoped to a root sees sessions at or under that root, in the
same way ``is_under`` decides it in Python, character for character (paths are case
sensitive). Cost: the rule is a range an index answers, and a scope's sessions are
searched through their rowid ranges, on every path exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from knowledge_server.derived.build import rebuild
from knowledge_server.derived.store import DerivedStore
from knowledge_server.episodes import EpisodeStore, ingest
from knowledge_server.workspaces import is_under, under_sql

from tests.conftest import episodes_alone

# Path pieces that stress LIKE-style matching: wildcards, escapes, case, the characters
# next to "/" in byte order, non-ASCII.
_PIECES = st.sampled_from(["a", "A", "b", "%", "_", "\\", ".", "-", "0", "é", "É", "x y", "🙂"])
_NAMES = st.lists(_PIECES, min_size=1, max_size=3).map("".join)
_PATHS = st.lists(_NAMES, max_size=4).map(lambda parts: "/" + "/".join(parts))


@settings(max_examples=400, deadline=None)
@given(roots=st.lists(_PATHS, min_size=1, max_size=3), paths=st.lists(_PATHS, max_size=8))
def test_under_sql_is_is_under(roots: list[str], paths: list[str]) -> None:
    """Isolation invariant: the SQL filter admits exactly the paths ``is_under`` admits."""
    roots = [os.path.normpath(r) for r in roots]
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE s(cwd TEXT)")
    conn.execute("CREATE INDEX s_cwd ON s(cwd)")
    for p in paths:
        conn.execute("INSERT INTO s VALUES(?)", (p,))
    cond, args = under_sql("cwd", roots)
    got = sorted(r[0] for r in conn.execute(f"SELECT cwd FROM s WHERE {cond}", args))
    want = sorted(p for p in paths if any(is_under(p, r) for r in roots))
    assert got == want


def test_under_sql_is_case_sensitive_and_literal() -> None:
    """LIKE ignored ASCII case and needed escaping: "/srv/A" is not under "/srv/a", and
    "_" or "%" in a root match only themselves."""
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE s(cwd TEXT)")
    paths = ["/srv/a", "/srv/a/x", "/srv/A/x", "/SRV/a", "/srv/ab", "/srv/a_b/x", "/srv/axb/x", "/"]
    for p in paths:
        conn.execute("INSERT INTO s VALUES(?)", (p,))

    def under(*roots: str) -> list[str]:
        cond, args = under_sql("cwd", roots)
        return sorted(r[0] for r in conn.execute(f"SELECT cwd FROM s WHERE {cond}", args))

    assert under("/srv/a") == ["/srv/a", "/srv/a/x"]
    assert under("/srv/a_b") == ["/srv/a_b/x"]
    assert under("/") == sorted(paths)


def test_scoped_episode_search_reads_only_its_sessions(tmp_path: Path) -> None:
    """A scope of two sessions among 301 others: the search reads them through the cwd
    index (SQLite virtual-machine steps, counted: deterministic), not by scanning every
    session's cwd, and finds only theirs, not those of a path that differs in case."""
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = []
    for s in range(303):
        # s302 differs from the scope only in case: not under it (LIKE said it was).
        cwd = "/work/mine" if s < 2 else ("/WORK/mine/x" if s == 302 else f"/work/other{s:03d}")
        for i in range(3):
            lines.append(
                json.dumps(
                    {
                        "session_id": f"s{s:03d}",
                        "seq": i,
                        "time": f"2026-01-01T00:00:{i:02d}Z",
                        "role": "user",
                        "text": f"rotate the session cookie step {i}",
                        "cwd": cwd,
                    }
                )
            )
    (logs / "all.jsonl").write_text("\n".join(lines) + "\n")
    store = EpisodeStore(str(tmp_path / "db"))
    try:
        assert not ingest(store, [str(logs)]).errors
        steps = [0]

        def count() -> bool:
            steps[0] += 1
            return False

        store.conn.setprogresshandler(count, 100)
        hits = store.search("cookie", k=10, workspaces=["/work/mine"])
        assert {h.session_id for h in hits} == {"s000", "s001"}
        # 4 here; scanning every cwd with LIKE took 40 (and grows with the sessions).
        assert steps[0] <= 12, steps[0]
    finally:
        store.close()


def _scoped_store(tmp_path: Path) -> EpisodeStore:
    """150 sessions written one after another (disjoint rowid ranges), odd and even ones
    in different workspaces, plus 20 sessions whose events interleave (overlapping ranges);
    texts from a small vocabulary, so queries match many events with varied scores."""
    import random

    rng = random.Random(7)
    vocab = ["cookie", "rotate", "deploy", "schema", "timeout", "retry", "parser", "cache"]

    def event(sid: str, seq: int, cwd: str) -> str:
        words = rng.choices(vocab, k=rng.randint(1, 6)) + ["filler"] * rng.randint(0, 8)
        rng.shuffle(words)
        return json.dumps(
            {
                "session_id": sid,
                "seq": seq,
                "time": f"2026-01-01T00:{seq // 60:02d}:{seq % 60:02d}Z",
                "role": "user",
                "text": " ".join(words),
                "cwd": cwd,
            }
        )

    logs = tmp_path / "logs"
    logs.mkdir()
    lines = []
    for i in range(150):
        lines += [event(f"s{i:03d}", j, f"/ws/g{i % 2}/n{i // 10}/s{i}") for j in range(4)]
    (logs / "a.jsonl").write_text("\n".join(lines) + "\n")
    lines = [event(f"t{i:02d}", j, f"/ws/g{i % 2}/mix") for j in range(3) for i in range(20)]
    (logs / "b.jsonl").write_text("\n".join(lines) + "\n")
    store = EpisodeStore(str(tmp_path / "db"))
    assert not ingest(store, [str(logs)]).errors
    return store


def test_scoped_search_ranks_exactly_on_every_path(tmp_path: Path) -> None:
    """KC-2/KC-5 groundwork: whatever path a scope takes (rowid ranges pushed into FTS5,
    many ranges checked per match, a wide scope filtered after ranking), the scores
    returned are the best ``k`` of all matching events in scope, and nothing outside it;
    ranked with the scope's statistics, they are the scores bm25() gives over a copy of the
    store holding the scope's events alone."""
    store = _scoped_store(tmp_path)
    try:
        scopes = [
            ["/ws/g1/n0/s1"],  # one session: one range
            ["/ws/g0/n1"],  # five sessions: five ranges, checked per match
            ["/ws/g0"],  # 85 sessions, half the events: 76 ranges
            ["/ws/g0", "/ws/g1/n3"],
            ["/ws/g1/mix"],  # interleaved sessions: overlapping ranges
            ["/ws"],  # everything: ranked, then filtered
        ]
        for n, scope in enumerate(scopes):
            cond, args = under_sql("s.cwd", scope)
            alone = episodes_alone(store, tmp_path / f"alone{n}", scope)
            for query in ["cookie", "rotate deploy", "schema timeout retry", "parser cache"]:
                match = store._plan_query(query)[0]
                rows = alone.conn.execute(
                    "SELECT -m.score, s.cwd FROM (SELECT rowid AS rid, bm25(events_fts) AS score"
                    " FROM events_fts WHERE events_fts MATCH ?) m JOIN events e ON e.id = m.rid"
                    f" JOIN sessions s ON s.session_id = e.session_id WHERE {cond}",
                    [match, *args],
                ).fetchall()
                best = sorted((round(r[0], 6) for r in rows), reverse=True)
                for k in (3, 10, 50):
                    hits = store.search(query, k=k, workspaces=scope)
                    assert [h.score for h in hits] == best[:k], (scope, query, k)
                    # outcome is session-level too: it takes the same paths
                    with_outcome = store.search(query, k=k, workspaces=scope, outcome="unknown")
                    assert [h.score for h in with_outcome] == best[:k], (scope, query, k)
                    assert all(
                        any(is_under(h.session.cwd, r) for r in scope) for h in hits if h.session
                    )
            alone.close()
        from knowledge_server.episodes.store import RANGES, SCOPES

        assert len(RANGES) == 0  # every query's ranges were released
        assert len(SCOPES) == 0  # and its scope
    finally:
        store.close()


def test_scope_memo_follows_new_sessions(tmp_path: Path) -> None:
    """A scope's ranges are remembered per index revision: sessions ingested later are
    found by the next scoped search."""
    store = _scoped_store(tmp_path)
    try:
        before = {h.session_id for h in store.search("cookie", k=500, workspaces=["/ws/new"])}
        assert before == set()
        log = tmp_path / "logs" / "c.jsonl"
        log.write_text(
            json.dumps(
                {
                    "session_id": "fresh",
                    "seq": 0,
                    "time": "2026-01-02T00:00:00Z",
                    "role": "user",
                    "text": "rotate the cookie",
                    "cwd": "/ws/new/app",
                }
            )
            + "\n"
        )
        assert ingest(store, [str(log)]).events_added == 1
        after = {h.session_id for h in store.search("cookie", k=500, workspaces=["/ws/new"])}
        assert after == {"fresh"}
    finally:
        store.close()


@pytest.mark.parametrize("recent_span", [16_000, 100])
def test_frequent_term_query_in_a_scope_whose_range_spans_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recent_span: int
) -> None:
    """A query made only of frequent terms, in the scope of a session whose events span
    the table (it began before 6,000 other events and ended after them): its rowid range
    holds the other sessions' events too, so "the most recent matches in range" are all
    theirs. The search must still find the session's own matches: by ranking every match
    in the range (a range of few events) or through the fallbacks (``RECENT_SPAN`` lowered:
    the most recent matches overall, then in the range, then every match in it)."""
    import knowledge_server.episodes.store as episodes_store

    monkeypatch.setattr(episodes_store, "RECENT_SPAN", recent_span)
    logs = tmp_path / "logs"
    logs.mkdir()

    def event(sid: str, seq: int, text: str, cwd: str) -> str:
        return json.dumps(
            {
                "session_id": sid,
                "seq": seq,
                "time": "2026-01-01T00:00:00Z",
                "role": "user",
                "text": text,
                "cwd": cwd,
            }
        )

    lines = [event("target", i, "rotate the cookie", "/ws/target") for i in range(20)]
    lines += [event(f"o{i % 50}", i, "cookie filler", f"/ws/other{i % 50}") for i in range(6000)]
    lines.append(event("target", 20, "done", "/ws/target"))
    (logs / "a.jsonl").write_text("\n".join(lines) + "\n")
    store = EpisodeStore(str(tmp_path / "db"))
    try:
        assert not ingest(store, [str(logs)]).errors
        assert store._plan_query("cookie")[1]  # frequent terms only
        for scope in ({"workspaces": ["/ws/target"]}, {"session_ids": ["target"]}):
            hits = store.search("cookie", k=10, **scope)  # type: ignore[arg-type]
            assert len(hits) == 10 and {h.session_id for h in hits} == {"target"}
    finally:
        store.close()


def _cookie_log(path: Path, cwds: dict[str, str]) -> None:
    lines = [
        json.dumps(
            {
                "session_id": sid,
                "seq": 0,
                "time": "2026-01-01T00:00:00Z",
                "role": "user",
                "text": "rotate the session cookie",
                "cwd": cwd,
            }
        )
        for sid, cwd in cwds.items()
    ]
    path.write_text("\n".join(lines) + "\n")


def test_session_directories_are_stored_normalised(tmp_path: Path) -> None:
    """Isolation invariant: a log's cwd is untrusted. "/work/app/../secret/x" lies in
    /work/secret, as ``in_scope`` reads it, so a scope of /work/app does not see it in
    SQL either; "/work/secret/../app/y" is /work/app's."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _cookie_log(
        logs / "all.jsonl",
        {
            "escapes": "/work/app/../secret/x",
            "returns": "/work/secret/../app/y",
            "doubled": "/work/app//z/",
            "plain": "/work/app/w",
        },
    )
    store = EpisodeStore(str(tmp_path / "db"))
    try:
        assert not ingest(store, [str(logs)]).errors
        cwds = {s.session_id: s.cwd for s in store.sessions()}
        assert cwds == {
            "escapes": "/work/secret/x",
            "returns": "/work/app/y",
            "doubled": "/work/app/z",
            "plain": "/work/app/w",
        }

        def seen(root: str) -> set[str]:
            return {h.session_id for h in store.search("cookie", k=10, workspaces=[root])}

        assert seen("/work/app") == {"returns", "doubled", "plain"}
        assert seen("/work/secret") == {"escapes"}
    finally:
        store.close()


def _derived_cwd(store: EpisodeStore, tmp_path: Path, session_id: str) -> str:
    """The session's cwd in the derived store, rebuilt from ``store`` first."""
    derived = DerivedStore(str(tmp_path / "derived.sqlite"))
    try:
        rebuild(store, derived, catalog_roots=[])
        sql = "SELECT cwd FROM session_actor WHERE session_id = ?"
        return str(derived.conn.execute(sql, (session_id,)).fetchall()[0][0])
    finally:
        derived.close()


def test_a_store_written_before_normalising_is_folded_once(tmp_path: Path) -> None:
    """A store whose cwds were kept as written: its writer folds them when it opens, in a
    new index revision (caches and the derived store follow), and only once; a reader
    opening it writes nothing."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _cookie_log(logs / "all.jsonl", {"s1": "/work/app/w", "s2": "/work/other"})
    db = str(tmp_path / "db")
    store = EpisodeStore(db)
    try:
        assert not ingest(store, [str(logs)]).errors
        # As an older version left it.
        store.conn.execute(
            "UPDATE sessions SET cwd = '/work/app/../secret' WHERE session_id = 's1'"
        )
        # Written before schema steps were recorded, and before the folding step (its flag
        # in lane_meta is absent): adopted with the baseline, then folded.
        store.conn.execute("DROP TABLE migrations")
        before = store.index_rev()
        assert _derived_cwd(store, tmp_path, "s1") == "/work/app/../secret"
    finally:
        store.close()
    reader = EpisodeStore(db, read_only=True)
    try:
        assert {s.session_id: s.cwd for s in reader.sessions()}["s1"] == "/work/app/../secret"
    finally:
        reader.close()
    store = EpisodeStore(db)
    try:
        assert {s.session_id: s.cwd for s in store.sessions()} == {
            "s1": "/work/secret",
            "s2": "/work/other",
        }
        folded = store.index_rev()
        assert folded != before
        assert {h.session_id for h in store.search("cookie", workspaces=["/work/app"])} == set()
        # The derived store's copy follows at its next rebuild (the cwd is in a session's
        # signature).
        assert _derived_cwd(store, tmp_path, "s1") == "/work/secret"
    finally:
        store.close()
    again = EpisodeStore(db)
    try:
        assert again.index_rev() == folded
    finally:
        again.close()
