"""Search: literal queries, multilingual matching, filters in SQL, determinism."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server.episodes import EpisodeStore, InvalidQuery, ingest

from tests.conftest import episodes_alone

EVENTS = [
    # session, seq, time, cwd, role, text, outcome-signal
    (
        "ru1",
        1,
        "2026-02-01T10:00:00Z",
        "/srv/shop",
        "user",
        "База MySQL недоступна с утра, посмотри пожалуйста",
        None,
    ),
    (
        "ru1",
        2,
        "2026-02-01T10:05:00Z",
        "/srv/shop",
        "assistant",
        "Я чинил доступ к базе: пользователь app потерял GRANT, вернул права и перезапустил пул",
        "success",
    ),
    (
        "zh1",
        1,
        "2026-02-02T09:00:00Z",
        "/srv/crm",
        "user",
        "会员退款多久到账？客户在问退款进度",
        None,
    ),
    (
        "zh1",
        2,
        "2026-02-02T09:01:00Z",
        "/srv/crm",
        "assistant",
        "退款多久到账取决于支付渠道：原路退回一般三到五个工作日",
        "failure",
    ),
    (
        "en1",
        1,
        "2026-02-03T08:00:00Z",
        "/srv/shop_v2",
        "user",
        "The checkout test fails with a timeout",
        None,
    ),
    (
        "en1",
        2,
        "2026-02-03T08:10:00Z",
        "/srv/shop_v2",
        "assistant",
        "Fixed the flaky checkout test by mocking the clock",
        "success",
    ),
    (
        "en2",
        1,
        "2026-02-04T08:00:00Z",
        "/srv/shopXv2/sub",
        "user",
        "checkout pipeline rewritten for speed",
        None,
    ),
    (
        "sp1",
        1,
        "2026-02-05T08:00:00Z",
        "/srv/other",
        "user",
        'weird "quoted" NEAR(a b) col:thing -minus ^caret *star',
        None,
    ),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("search")
    p = d / "fixture.jsonl"
    with open(p, "w", encoding="utf-8") as fh:
        for sid, seq, t, cwd, role, text, outcome in EVENTS:
            obj = {"session_id": sid, "seq": seq, "time": t, "cwd": cwd, "role": role, "text": text}
            if outcome:
                obj["outcome"] = outcome
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
    s = EpisodeStore(str(d / "db"))
    ingest(s, [str(p)])
    yield s
    s.close()


def test_russian_question_finds_inflected_word(store: EpisodeStore) -> None:
    hits = store.search("кто чинил доступ к MySQL")
    assert hits and hits[0].id in ("ep:ru1:2", "ep:ru1:1")
    assert "ep:ru1:2" in [h.id for h in hits]
    assert any("чинил" in h.snippet for h in hits)
    # Inflection: "чинили" and "доступа" still reach the same event.
    assert "ep:ru1:2" in [h.id for h in store.search("чинили доступа")]


def test_store_stemmed_by_another_stemmer_is_restemmed_on_open(tmp_path: Path) -> None:
    p = tmp_path / "ru.jsonl"
    rows = [e for e in EVENTS if e[0] == "ru1"]
    with open(p, "w", encoding="utf-8") as fh:
        for sid, seq, t, cwd, role, text, _ in rows:
            obj = {"session_id": sid, "seq": seq, "time": t, "cwd": cwd, "role": role, "text": text}
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
    db = str(tmp_path / "db")
    with EpisodeStore(db) as s:
        ingest(s, [str(p)])
        # What another stemmer left behind: whole words as terms, and no stemmer recorded.
        cur = s.conn.cursor()
        for rowid, text, aux in cur.execute("SELECT id, text, aux FROM events").fetchall():
            old = " ".join(w.lower() for w in text.split() if w.isalpha() and not w.isascii())
            cur.execute(
                "INSERT INTO events_fts(events_fts, rowid, text, aux) VALUES ('delete', ?, ?, ?)",
                (rowid, text, aux),
            )
            cur.execute("UPDATE events SET aux = ? WHERE id = ?", (old, rowid))
            cur.execute(
                "INSERT INTO events_fts(rowid, text, aux) VALUES (?, ?, ?)", (rowid, text, old)
            )
        cur.execute("DELETE FROM lane_meta WHERE key = 'aux_stemmer'")
        rev = s.index_rev()
    with EpisodeStore(db, read_only=True) as r:  # a reader never rewrites the store
        assert "ep:ru1:2" not in [h.id for h in r.search("чинили")]
    with EpisodeStore(db) as s:
        assert [h.id for h in s.search("чинили")] == ["ep:ru1:2"]
        assert s.index_rev() != rev
        stemmer = s.conn.execute("SELECT value FROM lane_meta WHERE key = 'aux_stemmer'")
        assert stemmer.fetchone()[0].startswith("snowball-russian-")
        # Raises when the index no longer agrees with the rows it was built from.
        s.conn.execute("INSERT INTO events_fts(events_fts, rank) VALUES ('integrity-check', 1)")


def test_chinese_question_matches_bigrams(store: EpisodeStore) -> None:
    hits = store.search("会员退款多久到账？")
    assert {h.id for h in hits[:2]} == {"ep:zh1:1", "ep:zh1:2"}
    assert any("退款多久到账" in h.snippet for h in hits)
    assert store.search("退款")[0].session_id == "zh1"


def test_english_or_semantics_and_stop_words(store: EpisodeStore) -> None:
    hits = store.search("who fixed the checkout test?")
    assert hits[0].id == "ep:en1:2"  # matches fixed + checkout + test
    assert hits[0].why == ["fts: match in assistant/message"]
    assert hits[0].score > hits[-1].score or len(hits) == 1
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    # A query of only stop-words still searches them rather than failing.
    assert {h.session_id for h in store.search("the")} == {"en1"}


def test_syntax_characters_are_literal(store: EpisodeStore) -> None:
    for q in [
        '"quoted"',
        "NEAR(a b)",
        "col:thing",
        "-minus",
        "^caret",
        "*star",
        'a" OR "b',
        "(((",
        "\x00weird",
    ]:
        try:
            store.search(q)  # never an FTS error
        except InvalidQuery:
            pass
    assert store.search('"quoted" NEAR')[0].session_id == "sp1"
    with pytest.raises(InvalidQuery):
        store.search("?!:()")
    with pytest.raises(InvalidQuery):
        store.search("")


def test_workspace_filter_in_sql_with_like_escaping(store: EpisodeStore) -> None:
    assert {h.session_id for h in store.search("checkout", workspaces=["/srv/shop_v2"])} == {"en1"}
    # "_" must not act as a LIKE wildcard: /srv/shopXv2/sub is not under /srv/shop_v2.
    assert {h.session_id for h in store.search("checkout", workspaces=["/srv/shopXv2"])} == {"en2"}
    assert store.search("checkout", workspaces=[]) == []
    assert {h.session_id for h in store.search("checkout", workspaces=None)} == {"en1", "en2"}
    assert (
        store.search("checkout", workspaces=["/srv/shop"]) == []
    )  # prefix of a name is not a parent


def test_other_filters(store: EpisodeStore) -> None:
    assert {h.session_id for h in store.search("checkout", session_ids=["en2"])} == {"en2"}
    assert store.search("checkout", session_ids=[]) == []
    since = datetime(2026, 2, 3, 8, 5, tzinfo=UTC)
    assert [
        h.id
        for h in store.search("checkout", since=since, until=datetime(2026, 2, 3, 9, tzinfo=UTC))
    ] == ["ep:en1:2"]
    assert {h.session_id for h in store.search("checkout", outcome="success")} == {"en1"}
    assert {h.session_id for h in store.search("退款", outcome="failure")} == {"zh1"}
    with pytest.raises(InvalidQuery):
        store.search("checkout", outcome="maybe")


def test_hit_shape_snippet_and_determinism(store: EpisodeStore) -> None:
    a = store.search("checkout", k=5, snippet_chars=20)
    b = store.search("checkout", k=5, snippet_chars=20)
    assert [(h.id, h.score) for h in a] == [(h.id, h.score) for h in b]
    for h in a:
        assert h.id == f"ep:{h.session_id}:{h.seq}"
        assert len(h.snippet) <= 20 and "checkout" in h.snippet.lower()
        assert h.session.cwd and h.session.harness == "generic"
        assert h.time is not None and h.time.tzinfo is not None
    assert len(store.search("checkout", k=1)) == 1


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=60))
def test_arbitrary_queries_only_raise_invalid_query(store: EpisodeStore, q: str) -> None:
    try:
        hits = store.search(q, k=3)
    except InvalidQuery:
        return
    assert len(hits) <= 3 and [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.sampled_from(
            [
                '"',
                "*",
                "NEAR",
                "-",
                ":",
                "(",
                ")",
                "^",
                "\x00",
                "AND",
                "OR",
                "NOT",
                "text",
                "aux",
                "{",
                "}",
                "+",
                "чинил",
                "退款",
                "checkout",
                " ",
            ]
        ),
        max_size=12,
    )
)
def test_operator_soup_queries(store: EpisodeStore, parts: list[str]) -> None:
    """Operators are literal: the query answers exactly what its words alone answer."""
    query = "".join(parts)
    words = " ".join(re.findall(r"\w+", query))
    try:
        hits = store.search(query, k=3)
    except InvalidQuery:
        with pytest.raises(InvalidQuery):
            store.search(words, k=3)
        return
    assert [h.id for h in hits] == [h.id for h in store.search(words, k=3)]


def _dated_store(tmp_path: Path) -> EpisodeStore:
    """60 sessions, one per day, 20 events each (1,200 events), texts from a small
    vocabulary: a query matches hundreds of events spread over every day."""
    import random

    rng = random.Random(11)
    vocab = ["cookie", "rotate", "deploy", "schema", "timeout", "retry"]
    lines = []
    for day in range(60):
        for seq in range(20):
            words = rng.choices(vocab, k=rng.randint(1, 5)) + ["filler"] * rng.randint(0, 6)
            lines.append(
                json.dumps(
                    {
                        "session_id": f"d{day:02d}",
                        "seq": seq,
                        "time": f"2026-03-{1 + day % 30:02d}T{10 + day // 30:02d}:{seq:02d}:00Z",
                        "role": "user",
                        "text": " ".join(words),
                        "cwd": f"/ws/{'a' if day % 3 else 'b'}/d{day}",
                    }
                )
            )
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "all.jsonl").write_text("\n".join(lines) + "\n")
    store = EpisodeStore(str(tmp_path / "db"))
    assert not ingest(store, [str(logs)]).errors
    return store


@pytest.mark.parametrize("few_candidates", [False, True])
def test_time_windows_rank_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, few_candidates: bool
) -> None:
    """Filters are exact: with ``since``/``until`` (alone or with a workspace), the scores
    returned are the best ``k`` of all matching events in the window, whichever path the
    search takes (the best candidates overall, or every match checked against the
    window's events when the window holds few of them). An empty window answers at once.
    With few candidates, the window's own best candidates are cut too, as a store of
    millions of events would cut them. With a workspace, the scores are bm25() over a copy
    of the store holding that workspace's events alone (the scope's statistics)."""
    from datetime import timedelta

    import knowledge_server.episodes.store as episodes_store

    if few_candidates:
        monkeypatch.setattr(episodes_store, "CAND_FACTOR", 1)
        monkeypatch.setattr(episodes_store, "CAND_MIN", 5)
    store = _dated_store(tmp_path)
    alone = episodes_alone(store, tmp_path / "alone", ["/ws/a"])
    try:
        day = datetime(2026, 3, 1, tzinfo=UTC)
        windows = [
            (day + timedelta(days=4), day + timedelta(days=4, hours=23)),  # one session
            (day + timedelta(days=10), day + timedelta(days=13)),
            (day + timedelta(days=10), day + timedelta(days=18, hours=23)),  # 30%
            (day, day + timedelta(days=40)),  # most of them
            (day + timedelta(days=20), None),
            (None, day + timedelta(days=2)),
        ]
        for since, until in windows:
            for ws in (None, ["/ws/a"]):
                for query in ["cookie", "rotate deploy", "schema timeout retry"]:
                    match = store._plan_query(query)[0]
                    conds, args = ["1"], [match]
                    if since is not None:
                        conds.append("e.time >= ?")
                        args.append(since.timestamp())
                    if until is not None:
                        conds.append("e.time <= ?")
                        args.append(until.timestamp())
                    if ws is not None:
                        conds.append("s.cwd >= '/ws/a/' AND s.cwd < '/ws/a0'")
                    rows = (
                        (store if ws is None else alone)
                        .conn.execute(
                            "SELECT -m.score FROM (SELECT rowid AS rid, bm25(events_fts) AS score"
                            " FROM events_fts WHERE events_fts MATCH ?) m JOIN events e"
                            " ON e.id = m.rid JOIN sessions s ON s.session_id = e.session_id"
                            f" WHERE {' AND '.join(conds)}",
                            args,
                        )
                        .fetchall()
                    )
                    best = sorted((round(r[0], 6) for r in rows), reverse=True)
                    for k in (3, 10, 50, 150):
                        hits = store.search(query, k=k, since=since, until=until, workspaces=ws)
                        assert [h.score for h in hits] == best[:k], (since, until, ws, query, k)
                        assert all(
                            (since is None or h.time >= since)
                            and (until is None or h.time <= until)
                            for h in hits
                        )
        steps = [0]

        def count() -> bool:
            steps[0] += 1
            return False

        store.conn.setprogresshandler(count, 10)
        assert store.search("cookie", since=day + timedelta(days=365)) == []
        assert steps[0] <= 3, steps[0]  # one seek in the time index, no full-text query
    finally:
        alone.close()
        store.close()


def _workspace_log(path: Path, prefix: str, cwd: str, texts: list[str], *, sessions: int) -> None:
    """A generic log of ``sessions`` sessions in ``cwd`` (each under its own folder), the
    ``texts`` dealt round-robin over them."""
    lines = []
    for i, text in enumerate(texts):
        sid = f"{prefix}{i % sessions}"
        lines.append(
            json.dumps(
                {
                    "session_id": sid,
                    "seq": i // sessions,
                    "time": f"2026-04-{1 + i % 28:02d}T10:{i % 60:02d}:00Z",
                    "role": "user" if i % 2 else "assistant",
                    "text": text,
                    "cwd": f"{cwd}/{sid}",
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("small", [True, False])
def test_another_workspace_moves_no_scoped_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    """KS-ISO: a search scoped to workspace A is ranked with A's statistics (its events'
    count, row lengths and each word's frequency): the events and scores it returns are
    the same before and after workspace B's sessions are ingested, B's words made frequent
    enough to be dropped from the store-wide plan; they are the scores bm25() gives over a
    copy of the store holding A's events alone (a word the tokenizer splits, `snake_case`,
    frequent in A, is kept as the copy's plan keeps it); and they stay so as B grows (the
    scope's counts extended), when B's log is removed, and when A's own first log shrinks
    (its events deleted: counted again). ``small``: A is a small share of the store (its
    sessions' rowid ranges are searched); otherwise A is most of it (its id range)."""
    import knowledge_server.episodes.store as episodes_store

    monkeypatch.setattr(episodes_store, "FREQUENT_MIN_DOCS", 20)
    rng_words = ["cookie", "rotate", "deploy", "schema", "timeout", "retry", "quota", "shard"]
    a_texts = [
        " ".join(rng_words[(i * 7 + j * 3) % len(rng_words)] for j in range(1 + i % 5))
        + " filler" * (i % 4)
        + (" snake_case" if i % 3 == 0 else "")
        for i in range(60 if small else 400)
    ]
    b_texts = [
        f"cookie quota shard deploy {'zentrik ' * (1 + i % 3)}" for i in range(400 if small else 60)
    ]
    logs = tmp_path / "logs"
    logs.mkdir()
    _workspace_log(logs / "a.jsonl", "a", "/ws/a", a_texts, sessions=6)
    _workspace_log(logs / "a2.jsonl", "d", "/ws/a", a_texts[:12], sessions=2)
    store = EpisodeStore(str(tmp_path / "db"))
    questions = [
        "cookie",
        "cookie quota",
        "zentrik cookie",
        "rotate schema timeout",
        "deploy the shard",
        "quota",
        "snake_case cookie",
    ]

    def asked() -> list[list[tuple[str, float]]]:
        out = []
        for q in questions:
            for extra in ({}, {"outcome": "any", "session_ids": ["a1", "a2", "a3"]}):
                hits = store.search(q, k=15, workspaces=["/ws/a"], **extra)  # type: ignore[arg-type]
                out.append([(h.id, h.score) for h in hits])
        return out

    try:
        assert not ingest(store, [str(logs)]).errors
        before = asked()
        assert sum(map(len, before)) > 50, "A found too little: the case cannot fail"
        unscoped = [[(h.id, h.score) for h in store.search(q, k=15)] for q in questions]
        _workspace_log(logs / "b.jsonl", "b", "/ws/b", b_texts, sessions=5)
        assert not ingest(store, [str(logs)]).errors
        assert asked() == before
        # The store-wide ranking did move: the case tells the two apart.
        assert [[(h.id, h.score) for h in store.search(q, k=15)] for q in questions] != unscoped
        _scores_as_alone(store, tmp_path / "alone", questions)
        # B grows (the scope's statistics extended), then its log goes (counted again).
        _workspace_log(logs / "b2.jsonl", "c", "/ws/b", b_texts, sessions=3)
        assert not ingest(store, [str(logs)]).errors
        assert asked() == before
        (logs / "b.jsonl").unlink()
        (logs / "b2.jsonl").unlink()
        assert not ingest(store, [str(logs)]).errors
        assert store.counts()["indexed_docs"] == len(a_texts) + 12
        assert asked() == before
        # A's first log shrinks (its events deleted and read again, after a2's): counted again.
        _workspace_log(logs / "a.jsonl", "a", "/ws/a", a_texts[: len(a_texts) // 3], sessions=6)
        assert not ingest(store, [str(logs)]).errors
        assert store.counts()["indexed_docs"] == len(a_texts) // 3 + 12
        _scores_as_alone(store, tmp_path / "alone-2", questions)
    finally:
        store.close()


def _scores_as_alone(store: EpisodeStore, path: Path, questions: list[str]) -> None:
    """Asserts that each question scoped to /ws/a gets the scores bm25() gives over a copy
    holding /ws/a alone (the statistics; among equal scores at the last places an unscoped
    search keeps others, docs/episodes.md)."""
    alone = episodes_alone(store, path, ["/ws/a"])
    try:
        for q in questions:
            got = [h.score for h in store.search(q, k=15, workspaces=["/ws/a"])]
            assert got == [h.score for h in alone.search(q, k=15)], q
    finally:
        alone.close()


def test_a_session_filling_its_cwd_enters_the_scope_statistics(tmp_path: Path) -> None:
    """KS-ISO: a session first stored without a cwd whose later record names one moves its
    events into that workspace's scope: the scope's statistics are counted again (not only
    extended by the new events), so its scores equal bm25() over the workspace alone."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _workspace_log(
        logs / "a.jsonl", "a", "/ws/a", [f"cookie quota {i}" for i in range(30)], sessions=3
    )
    lines = [
        json.dumps(
            {
                "session_id": "late",
                "seq": i,
                "time": "2026-04-02T10:00:00Z",
                "role": "user",
                "text": "cookie cookie shard",
            }
        )
        for i in range(10)
    ]
    (logs / "late.jsonl").write_text("\n".join(lines) + "\n")
    store = EpisodeStore(str(tmp_path / "db"))
    try:
        assert not ingest(store, [str(logs)]).errors
        store.search("cookie", workspaces=["/ws/a"])  # the scope's statistics remembered
        with (logs / "late.jsonl").open("a") as fh:
            fh.write(
                json.dumps(
                    {
                        "session_id": "late",
                        "seq": 10,
                        "time": "2026-04-02T11:00:00Z",
                        "role": "user",
                        "text": "shard",
                        "cwd": "/ws/a/late",
                    }
                )
                + "\n"
            )
        assert not ingest(store, [str(logs)]).errors
        assert store.session_cwds(["late"]) == {"late": "/ws/a/late"}
        alone = episodes_alone(store, tmp_path / "alone", ["/ws/a"])
        try:
            for q in ("cookie", "shard", "cookie shard"):
                got = {h.id: h.score for h in store.search(q, k=50, workspaces=["/ws/a"])}
                assert got == {h.id: h.score for h in alone.search(q, k=50)}, q
                assert sum(i.startswith("ep:late:") for i in got) >= 10, got
        finally:
            alone.close()
    finally:
        store.close()


def test_a_store_made_again_at_the_same_path_is_counted_afresh(tmp_path: Path) -> None:
    """KS-ISO: the scope statistics a process remembers belong to one store: a store made
    again at the same path (its ids now other events') is counted afresh, so a scoped
    search finds every event of its own, not those the old store's mask named."""
    logs = tmp_path / "logs"
    logs.mkdir()
    db = tmp_path / "db"
    db.mkdir()

    def made(first: str, second: str) -> EpisodeStore:
        for name in ("a.jsonl", "b.jsonl"):
            (logs / name).unlink(missing_ok=True)
        _workspace_log(logs / "a.jsonl", first, f"/ws/{first}", ["cookie step"] * 4, sessions=1)
        _workspace_log(logs / "b.jsonl", second, f"/ws/{second}", ["cookie jar"] * 4, sessions=1)
        store = EpisodeStore(str(db))
        assert not ingest(store, [str(logs / "a.jsonl")]).errors
        assert not ingest(store, [str(logs / "b.jsonl")]).errors
        return store

    store = made("a", "b")
    try:
        assert len(store.search("cookie", k=50, workspaces=["/ws/a"])) == 4
    finally:
        store.close()
    for f in db.iterdir():
        f.unlink()
    store = made("b", "a")  # A's events now take the ids B's had
    try:
        assert {h.id for h in store.search("cookie", k=50, workspaces=["/ws/a"])} == {
            f"ep:a0:{i}" for i in range(4)
        }
    finally:
        store.close()


def _events_by_place(hits: list[Any]) -> list[tuple[str, int, float]]:
    return [(h.session_id, h.seq, h.score) for h in hits]


def test_interleaved_workspaces_answer_as_the_scope_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KS-ISO: workspace A's events interleaved with workspace B's (one log, their ids
    alternating) answer every scoped search as a store of A's log alone does: the same
    events and scores, with frequent terms and a small cap of recent matches (so the
    frequent-term step takes the scope's most recent matches that pass the session and
    outcome filters, not the store's), with session ids, outcome and a time window; and a
    frequent-term search of one session answers from that session's recent matches."""
    import knowledge_server.episodes.store as episodes_store

    monkeypatch.setattr(episodes_store, "FREQUENT_MIN_DOCS", 5)
    monkeypatch.setattr(episodes_store, "RECENT_CAP", 5)
    words = ["cookie", "rotate", "deploy", "schema", "quota"]
    lines_a, lines_b = [], []
    for i in range(120):
        for who, lines in (("a", lines_a), ("b", lines_b)):
            sid = f"{who}{i % 4}"
            text = " ".join(words[(i + j) % len(words)] for j in range(1 + i % 3))
            lines.append(
                json.dumps(
                    {
                        "session_id": sid,
                        "seq": i // 4,
                        "time": f"2026-05-{1 + i % 20:02d}T10:{i % 60:02d}:00Z",
                        "role": "user" if (i + (who == "b")) % 2 else "assistant",
                        "text": text + (" failed with an error" if sid.endswith("1") else ""),
                        "cwd": f"/ws/{who}/{sid}",
                    }
                )
            )
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "log.jsonl").write_text(
        "\n".join(x for pair in zip(lines_a, lines_b, strict=True) for x in pair) + "\n"
    )
    only = tmp_path / "only"
    only.mkdir()
    (only / "log.jsonl").write_text("\n".join(lines_a) + "\n")
    both, alone = EpisodeStore(str(tmp_path / "both")), EpisodeStore(str(tmp_path / "alone"))
    try:
        assert not ingest(both, [str(mixed)]).errors
        assert not ingest(alone, [str(only)]).errors
        ids = [r[0] for r in both.conn.execute("SELECT e.session_id FROM events e ORDER BY e.id")]
        assert ids[:4] == ["a0", "b0", "a1", "b1"]  # interleaved
        since = datetime(2026, 5, 8, tzinfo=UTC)
        filters: list[dict[str, Any]] = [
            {},
            {"session_ids": ["a1", "a2", "b1"]},
            {"outcome": "success"},
            {"outcome": "failure"},
            {"since": since},
            {"session_ids": ["a0", "a3"], "since": since},
        ]
        asked = 0
        for q in ["cookie", "cookie rotate", "quota schema deploy", "error", "deploy"]:
            for extra in filters:
                for k in (1, 3, 10):
                    got = both.search(q, k=k, workspaces=["/ws/a"], **extra)
                    ref = alone.search(q, k=k, workspaces=["/ws/a"], **extra)
                    assert _events_by_place(got) == _events_by_place(ref), (q, extra, k)
                    asked += len(got)
        assert asked > 150, "too few answers: the case cannot fail"
        # The recent matches are those passing the filters: one session's own, not the
        # scope's most recent, which hold few of its events.
        hits = both.search("cookie", k=3, workspaces=["/ws/a"], session_ids=["a1"])
        assert [h.session_id for h in hits] == ["a1"] * 3
    finally:
        both.close()
        alone.close()


def test_a_copy_restored_into_the_store_is_counted_afresh(tmp_path: Path) -> None:
    """KS-ISO: an earlier copy of the store restored into it (SQLite's backup, the store's
    generation unchanged), then new events past the ones counted before: the scope is
    counted afresh, so its answers equal bm25() over a copy holding its events alone. So
    too after a delete by a writer that does not mark the generation (a version before
    it)."""
    import apsw

    logs = tmp_path / "logs"
    logs.mkdir()
    _workspace_log(logs / "a.jsonl", "a", "/ws/a", ["cookie one"] * 10, sessions=2)
    _workspace_log(logs / "b.jsonl", "b", "/ws/b", ["cookie two"] * 10, sessions=2)
    store = EpisodeStore(str(tmp_path / "db"))
    try:
        assert not ingest(store, [str(logs)]).errors
        saved = tmp_path / "saved.sqlite"
        store.conn.execute("VACUUM INTO ?", (str(saved),))
        _workspace_log(logs / "c.jsonl", "c", "/ws/b", ["cookie three"] * 10, sessions=1)
        assert not ingest(store, [str(logs)]).errors
        assert len(store.search("cookie", k=100, workspaces=["/ws/a"])) == 10  # remembered
        with store.conn.backup("main", apsw.Connection(str(saved)), "main") as restore:
            restore.step()
        (logs / "c.jsonl").unlink()
        _workspace_log(logs / "d.jsonl", "d", "/ws/a", ["cookie four"] * 15, sessions=1)
        assert not ingest(store, [str(logs / "d.jsonl")]).errors
        assert _answers_as_alone(store, tmp_path / "alone") == 25
        with store.conn:  # as a writer before generations deletes: no mark
            store.conn.execute("DELETE FROM events WHERE session_id = 'a0'")
        assert _answers_as_alone(store, tmp_path / "alone-2") == 20
    finally:
        store.close()


def _answers_as_alone(store: EpisodeStore, path: Path) -> int:
    """Asserts that "cookie" scoped to /ws/a answers as a copy holding /ws/a alone does
    (the same events and scores); returns how many events it found."""
    alone = episodes_alone(store, path, ["/ws/a"])
    try:
        got = {
            (h.session_id, h.seq, h.score)
            for h in store.search("cookie", k=100, workspaces=["/ws/a"])
        }
        assert got == {(h.session_id, h.seq, h.score) for h in alone.search("cookie", k=100)}
        return len(got)
    finally:
        alone.close()
