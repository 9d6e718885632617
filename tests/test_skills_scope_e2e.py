"""The skills lane over a real server with two scoped agents: a workspace's SKILL.md is
its own principals' (items and GetStatus counts), a skill root outside every workspace is
the server owner's, seen only by an unrestricted principal."""

from __future__ import annotations

from pathlib import Path

from knowledge_sdk import AsyncKnowledgeClient
from knowledge_server.auth import TokenStore

from tests.conftest import ingest_and_derive, start_server, write_session_log

CANARY_A = "quokkaskill"
CANARY_B = "wombatskill"
OWNER = "platypusskill"


def _skill(folder: Path, name: str) -> None:
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: the {name} canary deploys the tenant's service\n---\n"
    )


def _skills_status(st) -> dict[str, int]:  # type: ignore[no-untyped-def]
    lane = next(lane for lane in st.lanes if lane.lane == "skills")
    return dict(lane.counts)


async def test_skills_and_their_counts_stay_in_the_callers_scope(tmp_path: Path) -> None:
    a, b, home = tmp_path / "ws_a", tmp_path / "ws_b", tmp_path / "home" / "skills"
    _skill(a / ".claude" / "skills" / CANARY_A, CANARY_A)
    _skill(b / ".claude" / "skills" / CANARY_B, CANARY_B)
    _skill(home / OWNER, OWNER)
    # A link in A's skills to B's skill: a path under A that is B's file.
    (a / ".claude" / "skills" / "borrowed").mkdir()
    (a / ".claude" / "skills" / "borrowed" / "SKILL.md").symlink_to(
        b / ".claude" / "skills" / CANARY_B / "SKILL.md"
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    write_session_log(logs / "a.jsonl", "sess-a", a, "deploy the service")
    write_session_log(logs / "b.jsonl", "sess-b", b, "deploy the service")
    tokens = TokenStore(tmp_path / "data" / "tokens.json")
    _, agent_a = tokens.create("agent-a", "org", [str(a)], "agent")
    _, agent_b = tokens.create("agent-b", "org", [str(b)], "agent")
    _, ops = tokens.create("ops", "org", None, "operator")
    roots = [str(home), str(a / ".claude" / "skills"), str(b / ".claude" / "skills")]
    rs = await start_server(
        tmp_path,
        authenticate=tokens.authenticate,
        auth="on",
        workspaces=[str(a), str(b)],
        skill_roots=roots,
    )
    query = f"{CANARY_A} {CANARY_B} {OWNER} canary deploys"
    try:
        await ingest_and_derive(rs.address, ops, logs)
        async with AsyncKnowledgeClient(rs.address, token=ops) as kc:
            everything = await kc.search(query, include=["skills"], limit=50)
            assert {i.name for i in everything.lanes.skills.items} == {CANARY_A, CANARY_B, OWNER}
            counts = _skills_status(await kc.get_status())
            assert counts["skills"] == 3 and counts["actors"] == 2
        for token, own, other in ((agent_a, CANARY_A, CANARY_B), (agent_b, CANARY_B, CANARY_A)):
            async with AsyncKnowledgeClient(rs.address, token=token) as kc:
                for q in (query, other, OWNER):
                    resp = await kc.search(q, include=["skills"], limit=50)
                    seen = resp.lanes.skills.items
                    assert {i.name for i in seen} <= {own}, (own, [i.path for i in seen])
                    blob = str(resp)
                    assert other not in blob.replace(q, "") and OWNER not in blob.replace(q, "")
                mine = await kc.search(own, include=["skills"], limit=50)
                assert [i.name for i in mine.lanes.skills.items] == [own]
                counts = _skills_status(await kc.get_status())
                assert counts["skills"] == 1 and counts["actors"] == 1, counts
    finally:
        await rs.server.stop(0)
