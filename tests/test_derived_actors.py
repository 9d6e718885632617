"""Actors derived from the real session logs; incremental rebuild; no raw text stored."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from knowledge_server.derived import DerivedStore, rebuild
from knowledge_server.episodes import EpisodeStore, ingest


@pytest.fixture(scope="module")
def real(shared_data: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("real")
    logs = d / "logs"
    shutil.copytree(shared_data / "sessions", logs)
    eps = EpisodeStore(str(d))
    ingest(eps, [str(logs)])
    ds = DerivedStore(str(d))
    rep = rebuild(eps, ds, [str(shared_data / "skills")])
    yield eps, ds, rep, logs
    ds.close()
    eps.close()


def test_actor_counts_by_kind(real) -> None:  # type: ignore[no-untyped-def]
    eps, ds, rep, _ = real
    sessions = eps.sessions()
    top = [s for s in sessions if not s.parent_session_id]
    c = ds.counts()
    assert c["actors_root_session"] == len(top)
    assert c["actors_team_member"] == 0 and c["actors_autoclaw_agent"] == 0
    assert c["actors_subagent"] >= 2
    assert rep.skills == 19 and rep.actors == c["actors"]
    assert rep.sessions_processed == len(sessions)


def test_2x_subagent_and_1x_sidechain_become_subagents(real) -> None:  # type: ignore[no-untyped-def]
    eps, ds, _, _ = real
    subs = {a.actor_id: a for a in ds.actors(kind="subagent")}
    children = [s for s in eps.sessions() if s.parent_session_id and s.harness == "claude-code"]
    assert children
    for s in children:
        aid = ds.session_actors([s.session_id])[s.session_id]
        assert aid in subs
        assert subs[aid].root_session_id == s.parent_session_id
        if s.subagent_type:
            assert subs[aid].name == s.subagent_type
    # 1.x inline sidechain events stay in the parent session but map to a subagent actor
    side = [e for e in eps.iter_events_meta() if e.meta.get("is_sidechain")]
    inline = [e for e in side if not any(e.session_id == c.session_id for c in children)]
    assert inline
    for e in inline[:20]:
        aid = ds.episode_actor(e.session_id, e.meta)
        assert aid in subs and ":subagent:" + e.session_id + ":" in aid
        assert ds.episode_actors([e.id]) == {e.id: aid}  # same answer from the id alone
    # ordinary events map to the root session actor
    plain = next(e for e in eps.iter_events_meta() if not e.meta.get("is_sidechain"))
    assert (
        ds.episode_actor(plain.session_id, plain.meta)
        == ds.session_actors([plain.session_id])[plain.session_id]
    )


def test_every_episode_maps_to_an_actor(real) -> None:  # type: ignore[no-untyped-def]
    eps, ds, _, _ = real
    ids = [e.id for e in eps.iter_events_meta()]
    mapping = ds.episode_actors(ids)
    assert set(mapping) == set(ids)
    assert set(mapping.values()) <= {a.actor_id for a in ds.actors()}


def test_outcomes_and_failures(real) -> None:  # type: ignore[no-untyped-def]
    eps, ds, _, _ = real
    for a in ds.actors():
        o = ds.actor_outcomes(a.actor_id)
        assert o["success"] + o["failure"] + o["unknown"] == a.session_count
    errors = {e.id for e in eps.iter_events_meta() if e.is_error}
    assert set(ds.failures(limit=10_000)) == errors
    some = next(iter(errors))
    sid = some[3:].rsplit(":", 1)[0]
    assert some in ds.failures(session_ids=[sid])
    assert ds.failures(session_ids=[]) == []
    assert ds.actors_for_sessions([sid])


def test_real_logs_have_no_catalog_skill_uses(real) -> None:  # type: ignore[no-untyped-def]
    # The shipped logs contain no Skill tool use and no slash command naming a catalog skill.
    rep = real[2]
    assert rep.skill_uses == 0


def test_incremental_noop_and_change(real, tmp_path: Path, shared_data: Path) -> None:  # type: ignore[no-untyped-def]
    eps, ds, rep, logs = real
    again = rebuild(eps, ds, [str(shared_data / "skills")])
    assert not again.changed and again.index_rev == rep.index_rev and again.sessions_processed == 0
    # append one line to one Claude log -> only that session is re-derived
    sid = "1af7fc5e-8455-4414-9ccd-011d40f70b2a"
    target = next(p for p in sorted(logs.rglob("*.jsonl")) if sid in p.read_text(errors="ignore"))
    line = next(x for x in target.read_text().splitlines() if '"sessionId"' in x)
    with target.open("a") as fh:
        fh.write(line + "\n")
    ingest(eps, [str(logs)])
    inc = rebuild(eps, ds, [str(shared_data / "skills")])
    assert inc.changed and inc.index_rev != rep.index_rev
    assert inc.sessions_processed == 1
    full = rebuild(eps, ds, [str(shared_data / "skills")], full=True)
    assert full.actors == inc.actors and full.sessions_processed == len(eps.sessions())


def test_no_raw_text_in_db(real) -> None:  # type: ignore[no-untyped-def]
    eps, ds, _, _ = real
    phrases = []
    for h in eps.search("package configuration", k=3) + eps.search("todo app", k=3):
        detail = eps.get_event(h.id)
        assert detail is not None
        words = detail.text.split()
        if len(words) >= 6:
            phrases.append(" ".join(words[:6]))
    assert phrases
    ds.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    blob = Path(ds.path).read_bytes()
    for p in phrases:
        assert p.encode() not in blob


def test_child_sessions_by_parent_id(tmp_path: Path) -> None:
    # Generic JSONL child sessions (as Codex thread_spawn / OpenCode parentID children are
    # stored): a grandchild still belongs to the top-level root.
    import json

    logs = tmp_path / "logs"
    logs.mkdir()
    rows = [
        {
            "session_id": "top",
            "seq": 1,
            "role": "user",
            "text": "go",
            "cwd": "/w/a",
            "harness": "h",
        },
        {
            "session_id": "kid",
            "seq": 1,
            "role": "assistant",
            "text": "k",
            "parent_session_id": "top",
            "agent_id": "worker-1",
            "cwd": "/w/a",
            "harness": "h",
            "meta": {"skill": "pdf"},
        },
        {
            "session_id": "grandkid",
            "seq": 1,
            "role": "assistant",
            "text": "g",
            "parent_session_id": "kid",
            "agent_id": "worker-2",
            "cwd": "/w/a",
            "harness": "h",
        },
    ]
    for r in rows:
        (logs / f"{r['session_id']}.jsonl").write_text(json.dumps(r) + "\n")
    eps = EpisodeStore(str(tmp_path))
    ingest(eps, [str(logs)])
    ds = DerivedStore(str(tmp_path))
    rebuild(eps, ds, [])
    m = ds.session_actors(["top", "kid", "grandkid"])
    assert m == {
        "top": "actor:h:root_session:top",
        "kid": "actor:h:subagent:top:worker-1",
        "grandkid": "actor:h:subagent:top:worker-2",
    }
    assert ds.skills_of_actor("actor:h:subagent:top:worker-1") == [("pdf", 1)]


def test_an_actors_recent_failures_are_its_newest_sessions_last(tmp_path: Path) -> None:
    """A hand-off package's "the chosen actor failed in ..." risks are its most recent
    failures: the newest by when their session was last active, the newest last. Ordered
    by session id, as before, a session named "a-..." from today lost to "z-..." of 2020."""
    ds = DerivedStore(str(tmp_path))
    try:
        rows = [("z-2020", "2020-01-01T00:00:00Z"), ("a-today", "2026-12-05T10:00:00Z")]
        rows += [(f"m-{i}", f"2024-0{i}-01T00:00:00Z") for i in range(1, 7)]
        for sid, seen in rows:
            ds.conn.execute(
                "INSERT INTO actor_session (actor_id, session_id, last_seen) VALUES ('x', ?, ?)",
                (sid, seen),
            )
            ds.conn.execute("INSERT INTO failed_event VALUES (?, 1, 'x')", (sid,))
        assert ds.failures(actor_id="x", limit=500)[-3:] == [
            "ep:m-5:1",
            "ep:m-6:1",
            "ep:a-today:1",
        ]
        assert ds.failures(actor_id="x", limit=2) == ["ep:m-6:1", "ep:a-today:1"]
    finally:
        ds.close()


def test_a_store_derived_before_the_names_were_made_plain_is_derived_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inline sidechain's actor is named by the agent type in its session's events. The
    episodes schema step 005 makes a stored one plain (redacted) without changing its
    session's fields, so the derivation's version is part of each session's signature:
    a layer derived before (version 1) is derived again, and the actor's name loses the
    token. Before, the session's signature was unchanged and the old name stayed."""
    import json

    import apsw
    from knowledge_server.derived import build as derived_build

    token = "ghp_abcdefghijklmnopqrstuvwxyz0123456789AB"
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = [
        {"session_id": "r", "seq": 1, "role": "user", "text": "ship it"},
        {
            "session_id": "r",
            "seq": 2,
            "role": "tool_use",
            "tool_name": "Task",
            "meta": {"subagent_type": "deployer"},
            "text": "Task",
        },
        {
            "session_id": "r",
            "seq": 3,
            "role": "assistant",
            "text": "shipped",
            "meta": {"is_sidechain": True, "agent_id": "a1"},
        },
    ]
    (logs / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = tmp_path / "data"
    data.mkdir()
    eps = EpisodeStore(str(data))
    ingest(eps, [str(logs)])
    eps.close()
    # A store ingested before names were made plain: the agent type as the log wrote it.
    conn = apsw.Connection(str(data / "episodes.sqlite"))
    conn.execute(
        "UPDATE events SET meta = ? WHERE instr(meta, 'subagent_type') > 0",
        (json.dumps({"subagent_type": f"deployer {token}"}),),
    )
    conn.execute("DELETE FROM migrations WHERE name = '005_plain_names'")
    conn.close()
    ds = DerivedStore(str(data))
    try:
        monkeypatch.setattr(derived_build, "DERIVATION", 1)  # the layer as derived before
        eps = EpisodeStore(str(data), read_only=True)
        rebuild(eps, ds, [])
        eps.close()
        names = {a.name for a in ds.actors(kind="subagent")}
        assert any(token in n for n in names), "the case cannot fail"
        monkeypatch.undo()
        eps = EpisodeStore(str(data))  # the writer runs step 005
        rebuild(eps, ds, [])
        eps.close()
        names = {a.name for a in ds.actors(kind="subagent")}
        assert names and not any(token in n for n in names), names
    finally:
        ds.close()


def test_status_counts_an_actor_made_of_sessions_in_the_callers_workspaces(
    tmp_path: Path,
) -> None:
    """ISO-1, the counts GetStatus gives: a caller of ws_a and ws_b sees an actor whose
    sessions lie in both (search and dispatch show it: each session's folder is in scope),
    though its common folder is their parent; a caller of ws_a alone does not. Before, the
    counts read the common folder only and left it out for both."""
    ds = DerivedStore(str(tmp_path))
    try:
        ws_a, ws_b = "/work/ws_a", "/work/ws_b"
        ds.conn.execute(
            "INSERT INTO actor (actor_id, kind, name, source, harness, session_count,"
            " event_count, success, failure, unknown, workspace_cwd) VALUES"
            " ('x', 'subagent', 'x', 'generic', 'generic', 2, 2, 0, 0, 2, '/work')"
        )
        for sid, cwd in (("s1", ws_a), ("s2", ws_b)):
            ds.conn.execute(
                "INSERT INTO actor_session (actor_id, session_id) VALUES ('x', ?)", (sid,)
            )
            ds.conn.execute("INSERT INTO session_actor VALUES (?, 'x', 'generic', ?)", (sid, cwd))
        both = ds.counts([ws_a, ws_b])
        assert (both["actors"], both["actors_subagent"]) == (1, 1)
        assert ds.counts([ws_a])["actors"] == 0
        assert ds.counts(None)["actors"] == 1
        assert ds.counts(["/work"])["actors"] == 1
        assert ds.counts([])["actors"] == 0
    finally:
        ds.close()


def test_kd3_the_top_actors_of_a_skill_are_those_the_caller_sees(tmp_path: Path) -> None:
    """KD-3 within a scope: the most frequent users of a skill, as a caller of ws_a asks
    for them, are actors it sees. Five actors with more uses in ws_a but sessions in ws_b
    too (not visible to it) filled the first five before, and dispatch, which then passed
    over them, never reached the visible sixth."""
    ds = DerivedStore(str(tmp_path))
    try:
        ws_a, ws_b = "/work/ws_a", "/work/ws_b"
        actors = {f"mixed{i}": [ws_a, ws_b] for i in range(5)} | {"own": [ws_a]}
        for actor, folders in actors.items():
            ds.conn.execute(
                "INSERT INTO actor (actor_id, kind, name, source, harness, session_count,"
                " event_count, success, failure, unknown, workspace_cwd) VALUES"
                " (?, 'subagent', ?, 'generic', 'generic', 1, 1, 0, 0, 1, ?)",
                (actor, actor, folders[0] if len(folders) == 1 else "/work"),
            )
            for j, cwd in enumerate(folders):
                sid = f"{actor}-{j}"
                ds.conn.execute(
                    "INSERT INTO actor_session (actor_id, session_id) VALUES (?, ?)", (actor, sid)
                )
                ds.conn.execute(
                    "INSERT INTO session_actor VALUES (?, ?, 'generic', ?)", (sid, actor, cwd)
                )
                uses = 1 if actor == "own" else 3
                for seq in range(uses):
                    ds.conn.execute(
                        "INSERT INTO skill_use VALUES (?, 'deploy', ?, ?, ?, NULL, 'unknown', 'meta')",
                        (actor, f"ep:{sid}:{seq}", sid, seq),
                    )
        assert ds.top_actors_for_skill("deploy", limit=5, workspaces=[ws_a]) == [("own", 1)]
        assert len(ds.top_actors_for_skill("deploy", limit=10, workspaces=None)) == 6
    finally:
        ds.close()
