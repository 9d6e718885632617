"""Skill-use detection on small Claude Code fixture logs, and the coordinator queries."""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path

import pytest
from knowledge_server.derived import DerivedStore, detect_skill_uses, load_catalog, rebuild
from knowledge_server.episodes import EpisodeStore, ingest
from knowledge_server.episodes.model import EventMeta

FIX = Path(__file__).parent / "fixtures" / "derived"
ROOT1 = "actor:claude-code:root_session:sess-skill-1"
ROOT2 = "actor:claude-code:root_session:sess-skill-2"
SIDE = "actor:claude-code:subagent:sess-skill-1:ag1"


@pytest.fixture
def built(tmp_path: Path):  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    shutil.copytree(FIX / "logs", logs)
    eps = EpisodeStore(str(tmp_path))
    ingest(eps, [str(logs)])
    ds = DerivedStore(str(tmp_path))
    rep = rebuild(eps, ds, [str(FIX / "skills")])
    yield eps, ds, rep, logs
    ds.close()
    eps.close()


def test_detects_skill_tool_slash_command_and_skill_file_read(built) -> None:  # type: ignore[no-untyped-def]
    _, ds, rep, _ = built
    uses = {(u.actor_id, u.skill, u.episode_id, u.via) for u in ds.skill_uses()}
    assert uses == {
        (ROOT1, "brainstorming", "ep:sess-skill-1:2001", "skill_tool"),
        (ROOT1, "pdf-tools", "ep:sess-skill-1:4001", "slash_command"),  # /clear is no skill
        (ROOT1, "review-helper", "ep:sess-skill-1:6000", "read_skill_file"),
        (SIDE, "brainstorming", "ep:sess-skill-1:10000", "skill_tool"),  # plugin prefix dropped
        (ROOT2, "brainstorming", "ep:sess-skill-2:2000", "skill_tool"),
        (ROOT2, "brainstorming", "ep:sess-skill-2:3000", "skill_tool"),  # input.command spelling
    }
    assert rep.skill_uses == 6 and rep.skills == 3
    assert any("broken/SKILL.md" in p for p in rep.problems)


def test_queries(built) -> None:  # type: ignore[no-untyped-def]
    _, ds, _, _ = built
    assert ds.top_actors_for_skill("brainstorming", 5) == [(ROOT2, 2), (ROOT1, 1), (SIDE, 1)]
    assert ds.top_actors_for_skill("brainstorming", 1) == [(ROOT2, 2)]
    assert ds.top_actors_for_skill("brainstorming", 5, workspaces=["/home/dev/proj-alpha"]) == [
        (ROOT1, 1),
        (SIDE, 1),
    ]
    assert ds.top_actors_for_skill("brainstorming", 5, workspaces=[]) == []
    assert ds.skills_of_actor(ROOT1) == [
        ("brainstorming", 1),
        ("pdf-tools", 1),
        ("review-helper", 1),
    ]
    assert [u.episode_id for u in ds.skill_uses_by_actor(SIDE)] == ["ep:sess-skill-1:10000"]
    side = ds.actor(SIDE)
    assert side is not None and side.kind == "subagent" and side.name == "code-reviewer"
    assert side.root_session_id == "sess-skill-1" and side.event_count == 4
    assert ds.failures(actor_id=SIDE) == ["ep:sess-skill-1:11000"]
    assert ds.failures(actor_id=ROOT1) == []
    assert ds.actor("actor:nope") is None
    assert {a.actor_id for a in ds.actors_for_sessions(["sess-skill-1"])} == {ROOT1, SIDE}
    assert ds.episode_actors(
        ["ep:sess-skill-1:9001", "ep:sess-skill-1:1001", "ep:x:1", "junk"]
    ) == {
        "ep:sess-skill-1:9001": SIDE,
        "ep:sess-skill-1:1001": ROOT1,
    }


def test_incremental_append_adds_use(built) -> None:  # type: ignore[no-untyped-def]
    eps, ds, rep, logs = built
    same = rebuild(eps, ds, [str(FIX / "skills")])
    assert not same.changed and same.index_rev == rep.index_rev
    f = logs / "proj" / "sess-skill-2.jsonl"
    line = f.read_text().splitlines()[1]  # the Skill tool use record
    with f.open("a") as fh:
        fh.write(line + "\n")
    ingest(eps, [str(logs)])
    progress: list[tuple[int, int]] = []
    inc = rebuild(
        eps, ds, [str(FIX / "skills")], progress_callback=lambda d, t: progress.append((d, t))
    )
    assert inc.changed and inc.sessions_processed == 1 and inc.skill_uses == 7
    assert progress == [(1, 1)]
    assert inc.index_rev.startswith("derived:") and inc.index_rev.endswith(":2")
    assert ds.top_actors_for_skill("brainstorming", 1) == [(ROOT2, 3)]


def test_catalog_change_rederives(built, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    eps, ds, _, _ = built
    skills = tmp_path / "skills2"
    shutil.copytree(FIX / "skills", skills)
    shutil.rmtree(skills / "pdf-tools")
    rep = rebuild(eps, ds, [str(skills)])
    assert rep.changed and rep.skills == 2 and rep.sessions_processed == 2
    assert "pdf-tools" not in {u.skill for u in ds.skill_uses()}


def test_removed_session_is_dropped(built) -> None:  # type: ignore[no-untyped-def]
    eps, ds, _, logs = built
    (logs / "proj" / "sess-skill-2.jsonl").unlink()
    ingest(eps, [str(logs)])
    rebuild(eps, ds, [str(FIX / "skills")])
    assert ds.actor(ROOT2) is None
    assert all(u.session_id != "sess-skill-2" for u in ds.skill_uses())


def test_detect_skill_uses_unit() -> None:
    cat = load_catalog([str(FIX / "skills")]).by_name()

    def ev(event_type: str, meta: dict, tool: str | None = None) -> EventMeta:  # type: ignore[type-arg]
        return EventMeta("ep:s:1", "s", 1, event_type, tool, meta, False, datetime(2026, 1, 1))

    assert detect_skill_uses(ev("tool_use/Skill", {"skill": "unknown-skill"}, "Skill"), cat) == [
        ("unknown-skill", "skill_tool")
    ]
    assert detect_skill_uses(ev("user/message", {"slash_command": "/pdf-tools extra"}), cat) == [
        ("pdf-tools", "slash_command")
    ]
    assert detect_skill_uses(ev("user/message", {"slash_command": "compact"}), cat) == []
    assert detect_skill_uses(ev("tool_use/Read", {"file_path": "/x/README.md"}, "Read"), cat) == []
    assert detect_skill_uses(ev("user/message", {"skill": "pdf-tools"}), cat) == [
        ("pdf-tools", "meta")
    ]
    assert detect_skill_uses(ev("tool_use/Skill", {}, "Skill"), cat) == []


def test_no_session_text_in_db(built) -> None:  # type: ignore[no-untyped-def]
    _, ds, _, _ = built
    ds.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    blob = Path(ds.path).read_bytes()
    for phrase in (b"zebra-quokka", b"review finished", b"report.pdf", b"All planned"):
        assert phrase not in blob


def test_used_by_evidence_is_from_the_callers_workspaces(tmp_path: Path) -> None:
    """Workspace isolation: an actor whose sessions lie in two workspaces (a root session's
    subagents, one run in each) was given, as a scoped caller's ``used_by`` evidence, its
    latest use in the other workspace; the count was scoped, the episode id was not."""
    from knowledge_server.derived import search_skills

    a, b = tmp_path / "A", tmp_path / "B"
    (a / ".claude" / "skills" / "deploy").mkdir(parents=True)
    b.mkdir()
    (a / ".claude" / "skills" / "deploy" / "SKILL.md").write_text(
        "---\nname: deploy\ndescription: deploy things\n---\n"
    )
    data = tmp_path / "d"
    data.mkdir()
    store = DerivedStore(str(data))
    rebuild(EpisodeStore(str(data)), store, [str(a / ".claude" / "skills")])
    actor = "actor:claude-code:subagent:root1:Explore"
    with store.conn:
        for sid, ws, seq, day in (("root1/agent-a", a, 3, 1), ("root1/agent-b", b, 7, 2)):
            store.conn.execute(
                "INSERT INTO session_actor VALUES (?, ?, 'claude-code', ?)", (sid, actor, str(ws))
            )
            store.conn.execute(
                "INSERT INTO skill_use VALUES (?, 'deploy', ?, ?, ?, ?, 'success', 'skill_tool')",
                (actor, f"ep:{sid}:{seq}", sid, seq, f"2026-01-0{day}T00:00:00.000000Z"),
            )
    (hit,) = search_skills(store, "deploy", scope=[str(a)], workspaces=[str(a)])
    assert hit.uses == 1 and hit.used_by == [(actor, "ep:root1/agent-a:3")]


def test_a_session_rewritten_in_place_is_derived_again(tmp_path: Path) -> None:
    """Nothing stale: a session log rewritten in place (same lines and times, the Skill
    call now naming another skill) was imported again, but the incremental rebuild kept
    its old skill use: the session's signature held nothing of its events."""
    fixtures = Path(__file__).parent / "fixtures" / "derived"
    shutil.copytree(fixtures / "logs", tmp_path / "logs")
    data = tmp_path / "d"
    data.mkdir()
    eps = EpisodeStore(str(data))
    ingest(eps, [str(tmp_path / "logs")])
    store = DerivedStore(str(data))
    rebuild(eps, store, [str(fixtures / "skills")])
    log = tmp_path / "logs" / "proj" / "sess-skill-1.jsonl"
    text = log.read_text()
    changed = text.replace('"skill": "brainstorming"', '"skill": "pdf-tools"    ')
    assert len(changed) == len(text) and changed != text
    st = log.stat()
    log.write_text(changed)
    os.utime(log, (st.st_atime, st.st_mtime + 5))
    ingest(eps, [str(tmp_path / "logs")])
    rebuild(eps, store, [str(fixtures / "skills")])
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    fresh_eps = EpisodeStore(str(fresh_dir))
    ingest(fresh_eps, [str(tmp_path / "logs")])
    fresh = DerivedStore(str(fresh_dir))
    rebuild(fresh_eps, fresh, [str(fixtures / "skills")], full=True)

    def uses(s: DerivedStore) -> list[tuple[str, str, str]]:
        return sorted((u.skill, u.episode_id, u.via) for u in s.skill_uses())

    assert uses(store) == uses(fresh)
