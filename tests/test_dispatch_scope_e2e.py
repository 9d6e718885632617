"""Dispatch and Search within the caller's workspaces, over a real server: an actor made of
sessions in two workspaces (a log may name a parent session of another workspace) is visible
only to a caller who sees both; never to one of them alone, after a full rebuild and after an
incremental one alike, whether named explicitly, listed among a search's actors or chosen by
one (ISO, KD)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from knowledge_sdk import AsyncKnowledgeClient, NotFound
from knowledge_server.auth import TokenStore

from tests.conftest import ingest_and_derive, start_server

ACTOR = "actor:generic:subagent:rootA:helper"


def _log(path: Path, lines: list[dict[str, Any]], mode: str = "w") -> None:
    with open(path, mode, encoding="utf-8") as fh:
        fh.write("".join(json.dumps(line) + "\n" for line in lines))


async def _check(address: str, token: str, task: str) -> None:
    async with AsyncKnowledgeClient(address, token=token) as kc:
        with pytest.raises(NotFound):
            await kc.dispatch("anything", actor_id=ACTOR)
        found = await kc.search(task)
        assert ACTOR not in [a.actor_id for a in found.actors]
        assert not any("alpha-internal-billing" in w for a in found.actors for w in a.why)
        plan = await kc.dispatch(task)
        assert plan.target is None or plan.target.actor_id != ACTOR
        assert "alpha-internal-billing" not in [s.name for s in plan.context_pack.skills]
        assert all(
            "alpha-internal-billing" not in w for w in (plan.target.why if plan.target else [])
        )


async def test_an_actor_spanning_two_workspaces_is_seen_only_with_both(tmp_path: Path) -> None:
    a, b, logs = tmp_path / "x" / "ws_a", tmp_path / "x" / "ws_b", tmp_path / "logs"
    for d in (a, b, logs):
        d.mkdir(parents=True)
    _log(
        logs / "rootA.jsonl",
        [{"session_id": "rootA", "seq": 1, "cwd": str(a), "role": "user", "text": "hello"}],
    )
    sub_a = {
        "session_id": "subA",
        "seq": 1,
        "time": "2026-10-21T09:00:03Z",
        "cwd": str(a),
        "parent_session_id": "rootA",
        "subagent_type": "helper",
        "role": "assistant",
        "text": "private alpha refactor of the billing module",
        "meta": {"skill": "alpha-internal-billing"},
    }
    _log(logs / "subA.jsonl", [sub_a])
    sub_b = {
        "session_id": "subB",
        "seq": 1,
        "time": "2026-10-21T09:00:04Z",
        "cwd": str(b),
        "parent_session_id": "rootA",
        "subagent_type": "helper",
        "role": "user",
        "text": "deploy the quokka service",
    }
    _log(logs / "subB.jsonl", [sub_b])
    # A session of b's own on the same task: the actor b's dispatch should find.
    _log(
        logs / "rootB2.jsonl",
        [
            {
                "session_id": "rootB2",
                "seq": 1,
                "cwd": str(b),
                "role": "user",
                "text": "deploy the quokka service",
            }
        ],
    )
    tokens = TokenStore(tmp_path / "data" / "tokens.json")
    _, ta = tokens.create("agent-a", "org-a", [str(a)], "agent")
    _, tb = tokens.create("agent-b", "org-b", [str(b)], "agent")
    _, parent = tokens.create("agent-x", "org-x", [str(tmp_path / "x")], "agent")
    _, both = tokens.create("agent-ab", "org-x", [str(a), str(b)], "agent")
    _, ops = tokens.create("ops", "org", None, "operator")
    rs = await start_server(
        tmp_path, authenticate=tokens.authenticate, auth="on", workspaces=[str(a), str(b)]
    )
    try:
        await ingest_and_derive(rs.address, ops, logs)
        await _check(rs.address, ta, "private alpha refactor")
        await _check(rs.address, tb, "deploy the quokka service")
        async with AsyncKnowledgeClient(rs.address, token=tb) as kc:
            plan = await kc.dispatch("deploy the quokka service")
            assert plan.target.actor_id == "actor:generic:root_session:rootB2"
        # One more event in a's subagent session, then an incremental rebuild: the same.
        _log(logs / "subA.jsonl", [{**sub_a, "seq": 2, "text": "done", "meta": {}}], mode="a")
        await ingest_and_derive(rs.address, ops, logs, full=False)
        await _check(rs.address, ta, "private alpha refactor")
        await _check(rs.address, tb, "deploy the quokka service")
        # A caller who sees both workspaces (their parent, or each of them) sees the actor.
        for token in (parent, both):
            async with AsyncKnowledgeClient(rs.address, token=token) as kc:
                plan = await kc.dispatch("anything", actor_id=ACTOR)
                assert plan.target.actor_id == ACTOR
                found = await kc.search("private alpha refactor")
                assert ACTOR in [a.actor_id for a in found.actors]
    finally:
        await rs.server.stop(0)
        rs.app.close()
