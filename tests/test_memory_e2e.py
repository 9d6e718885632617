"""The project memory and the audit log end to end: a real server on a real port with token
authentication, the SDK, the CLI and the MCP bridge (a subprocess) against it.

MEM-E1 memory is per organisation and per workspace: two organisations on the same root and
       two workspaces of one organisation never see each other's entries.
MEM-E2 a token without ``memory.write`` is refused every write, reads still work.
MEM-E3 secrets and paths outside the workspace are refused with their own reason codes.
MEM-E4 budgets cut after a fixed order and the answer names what was cut.
MEM-E5 timeline, contradiction, dry run, lossless eviction and restore over gRPC.
AUD-1  real calls (memory writes, index, ingest, rebuild, dispatch commit, tokens) append
       audit events; ``knowledge audit verify`` passes, and fails naming the first bad event
       for an edited, a removed and a reordered entry, and for a cut tail with ``--expect``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import apsw
import pytest
from click.testing import CliRunner, Result
from knowledge_sdk import AsyncKnowledgeClient, DeadlineExceeded, InvalidRequest, PermissionDenied
from knowledge_server._gen.knowledge.v1 import memory_pb2
from knowledge_server.app import _AuditedWrite
from knowledge_server.audit import AuditLog
from knowledge_server.auth import TokenStore
from knowledge_server.auth_model import Principal
from knowledge_server.cli import main as cli_main
from knowledge_server.errors import DeadlineExceeded as KnowledgeDeadline
from knowledge_server.runtime import build_app

from tests.conftest import start_server, write_session_log
from tests.test_mcp_bridge import bridge_session


@dataclass
class World:
    address: str
    data: Path
    ws_a: Path
    ws_a2: Path
    ws_b: Path
    tokens: dict[str, str]
    rs: Any

    def client(self, who: str) -> AsyncKnowledgeClient:
        return AsyncKnowledgeClient(self.address, token=self.tokens[who], timeout=20)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    ws_a, ws_a2, ws_b = tmp_path / "x" / "ws-a", tmp_path / "x" / "ws-a2", tmp_path / "x" / "ws-b"
    for ws in (ws_a, ws_a2, ws_b):
        (ws / "src").mkdir(parents=True)
        (ws / "src" / "app.py").write_text("def deploy():\n    return 'staging'\n")
    store = TokenStore(tmp_path / "data" / "tokens.json")
    tokens = {}
    for name, org, roots, role, caps in (
        ("a1", "org-a", [ws_a], "agent", None),
        ("a-both", "org-a", [ws_a, ws_a2], "agent", None),
        ("b-same-root", "org-b", [ws_a], "agent", None),
        ("reader", "org-a", [ws_a], "agent", ("read", "memory.read")),
        ("ops", "org-a", [ws_a], "operator", None),
    ):
        _, tokens[name] = store.create(name, org, [str(r) for r in roots], role, caps)

    def app_factory(cfg):  # type: ignore[no-untyped-def]
        small = replace(cfg.memory, recall_facts_limit=3, max_facts=6, reclaim_headroom_pct=0.5)
        return build_app(replace(cfg, memory=small))

    rs = await start_server(
        tmp_path, app_factory=app_factory, authenticate=store.authenticate, auth="on"
    )
    try:
        yield World(rs.address, tmp_path / "data", ws_a, ws_a2, ws_b, tokens, rs)
    finally:
        await rs.server.stop(0)
        rs.served.app.close()


async def test_mem_e1_organisations_and_workspaces_are_isolated(world: World) -> None:
    """MEM-E1"""
    async with world.client("a1") as kc:
        w = await kc.remember("db", "staging-port", "5433")
        assert w.schema == "knowledge.memory/v1" and w.entry.id.startswith("mem:")
        assert w.entry.workspace == str(world.ws_a)
    async with world.client("b-same-root") as kc:
        assert (await kc.recall("")).entries == []
        assert (await kc.rooms()).rooms == []
        assert (await kc.timeline("db", "staging-port")).versions == []
        assert (await kc.restore(query="5433")).restored == []
        await kc.remember("db", "staging-port", "6000")
    async with world.client("a-both") as kc:
        with pytest.raises(InvalidRequest) as info:
            await kc.recall("")
        assert "workspace" in info.value.message
        assert (await kc.recall("", workspace=str(world.ws_a2))).entries == []
        mine = await kc.recall("staging", workspace=str(world.ws_a))
        assert [e.value for e in mine.entries] == ["5433"]
    async with world.client("a1") as kc:
        for outside in (str(world.ws_b), str(world.ws_a2), f"{world.ws_a}/../ws-b"):
            with pytest.raises(PermissionDenied):
                await kc.recall("", workspace=outside)
        assert [e.value for e in (await kc.recall("")).entries] == ["5433"]


async def test_mem_e1_a_made_up_sub_workspace_is_no_memory_of_its_own(world: World) -> None:
    """MEM-E1 / MEM-4: the capacity bounds a workspace's memory; a path under the
    workspace that is no folder is refused (``workspace`` named), not a new store with a
    capacity of its own; an existing folder is one, named by its real path."""
    async with world.client("a1") as kc:
        for i in range(3):
            made_up = f"{world.ws_a}/made-up-{i}"
            with pytest.raises(InvalidRequest) as info:
                await kc.remember("c", "k", "a value", workspace=made_up)
            assert info.value.metadata.get("field") == "workspace"
        with pytest.raises(InvalidRequest):
            await kc.recall("", workspace=f"{world.ws_a}/src/app.py")
        (world.ws_a / "src-link").symlink_to(world.ws_a / "src")
        w = await kc.remember("c", "k", "in src", workspace=str(world.ws_a / "src-link"))
        assert w.entry.workspace == str(world.ws_a / "src")
        mine = await kc.recall("", workspace=str(world.ws_a / "src"))
        assert [e.value for e in mine.entries] == ["in src"]
        assert (await kc.recall("")).entries == []


async def test_mem_e4_a_timeline_without_its_key_is_refused_naming_the_field(
    world: World,
) -> None:
    """MEM-E4: Timeline's category and key are required: empty, over gRPC, is
    INVALID_ARGUMENT naming the field, not an empty answer."""
    async with world.client("a1") as kc:
        for category, key, missing in (("", "", "category"), ("db", "", "key")):
            with pytest.raises(InvalidRequest) as info:
                await kc.timeline(category, key)
            assert info.value.metadata.get("field") == missing


async def test_mem_e2_token_without_memory_write_is_refused(world: World) -> None:
    """MEM-E2"""
    async with world.client("reader") as kc:
        for call in (
            kc.remember("db", "k", "v"),
            kc.consolidate(),
            kc.restore(),
        ):
            with pytest.raises(PermissionDenied) as info:
                await call
            assert "memory.write" in info.value.message
        assert (await kc.recall("")).truncation.total == 0
        assert (await kc.memory_policy()).policy.recall_facts_limit == 3


async def test_mem_e3_secrets_and_outside_paths_are_refused(world: World) -> None:
    """MEM-E3"""
    async with world.client("a1") as kc:
        for value in (
            "the deploy key is AKIAIOSFODNN7EXAMPLE",
            "use password=hunter2hunter2 for the db",
        ):
            with pytest.raises(InvalidRequest) as info:
                await kc.remember("creds", "deploy", value)
            assert info.value.reason == "KNOWLEDGE_SECRET_REFUSED"
            assert "AKIA" not in info.value.message and "hunter2" not in info.value.message
        with pytest.raises(InvalidRequest) as info:
            await kc.remember("paths", "passwd", "users are in /etc/passwd")
        assert info.value.reason == "KNOWLEDGE_PATH_OUTSIDE_SCOPE"
        with pytest.raises(InvalidRequest) as info:
            await kc.remember("paths", "other", f"see {world.ws_b}/src/app.py")
        assert info.value.reason == "KNOWLEDGE_PATH_OUTSIDE_SCOPE"
        ok = await kc.remember("paths", "entry", f"the app starts in {world.ws_a}/src/app.py")
        assert ok.outcome == "created"
        assert (await kc.recall("")).truncation.total == 1


async def test_mem_e4_budgets_cut_after_ordering_and_say_what(world: World) -> None:
    """MEM-E4"""
    async with world.client("a1") as kc:
        ids = []
        for i in range(5):
            ids.append((await kc.remember("deploy", f"step-{i}", f"deploy step {i}")).entry.id)
        r = await kc.recall("deploy", limit=200)
        t = r.truncation
        assert len(r.entries) == 3 and (t.total, t.returned, t.omitted) == (5, 3, 2)
        assert t.limit_name == "recall_facts_limit" and t.limit == 3
        assert [e.id for e in r.entries] == ids[::-1][:3]
        assert list(t.omitted_ids) == ids[::-1][3:]
        assert (await kc.recall("deploy", limit=2)).truncation.omitted == 3


async def test_mem_e5_timeline_contradiction_eviction_restore(world: World) -> None:
    """MEM-E5"""
    async with world.client("a1") as kc:
        first = await kc.remember("db", "host", "db1.internal", confidence=0.95)
        await kc.remember("db", "host", "DB1.internal")
        w = await kc.remember("db", "host", "db2.internal")
        assert w.outcome == "superseded" and w.contradiction.severity == "high"
        assert w.contradiction.previous.id == first.entry.id
        tl = await kc.timeline("db", "host")
        assert [v.value for v in tl.versions] == ["db1.internal", "db2.internal"]
        # the previous version as the write left it: superseded, as the timeline has it
        assert w.contradiction.previous == tl.versions[0]
        assert not w.contradiction.previous.current
        assert w.contradiction.previous.valid_until == w.entry.valid_from
        assert tl.versions[1].supersedes == first.entry.id
        dry = await kc.consolidate(all=True, dry_run=True)
        assert dry.dry_run and "relations" in dry.stores
        # max_facts=6, headroom 0.5: the 7th entry reclaims down to 3, losslessly
        for i in range(5):
            await kc.remember("misc", f"k{i}", f"value {i}", confidence=0.2)
        archived = await kc.restore(query="value", limit=0)
        assert archived.restored and all(e.value.startswith("value") for e in archived.restored)
        again = await kc.restore(query="value", limit=50)
        everything = {e.value for e in (await kc.recall("value", limit=3)).entries}
        assert everything and not {e.id for e in again.restored} & {e.id for e in archived.restored}
        rel = await kc.remember("depends_on", "api", "db", store="relations")
        assert rel.entry.key == "api -> db"
        edges = await kc.relations("db")
        assert [(e.source, e.kind, e.target) for e in edges.edges] == [("api", "depends_on", "db")]
        # a source is matched exactly, as a target is: "API" is not "api"
        await kc.remember("depends_on", "API", "gateway", store="relations")
        edges = await kc.relations("API")
        assert [(e.source, e.target) for e in edges.edges] == [("API", "gateway")]


async def test_mem_e5_a_symbol_or_a_negated_rule_is_a_new_value(world: World) -> None:
    """MEM-E5 / MEM-11: over gRPC, "❌" after "✅" and a rule with "never" for "always" are
    contradictions: the new value is current, the old one is in the timeline."""
    rule = "deploy to production on friday afternoons without written approval from the lead"
    async with world.client("a1") as kc:
        for key, old, new in (("build", "✅", "❌"), ("friday", f"always {rule}", f"never {rule}")):
            await kc.remember("ci", key, old)
            w = await kc.remember("ci", key, new)
            assert w.outcome == "superseded" and w.entry.value == new
            tl = await kc.timeline("ci", key)
            assert [v.value for v in tl.versions] == [old, new]


async def test_mem_e5_restore_never_makes_an_older_value_current_over_an_archived_newer_one(
    world: World,
) -> None:
    """MEM-E5 / MEM-6: both versions of a key compacted; the older one restored first comes
    back superseded until the newer began, the newer one restored after is current."""
    async with world.client("a1") as kc:
        old = await kc.remember("db", "port", "staging port 5432 oldvalue", confidence=0.1)
        await kc.consolidate()
        new = await kc.remember("db", "port", "staging port 5433 newvalue", confidence=0.1)
        await kc.consolidate()
        [back] = (await kc.restore(query="oldvalue")).restored
        assert back.id == old.entry.id and not back.current
        assert (await kc.recall("staging")).entries == []
        [back] = (await kc.restore(query="newvalue")).restored
        assert back.id == new.entry.id and back.current
        tl = await kc.timeline("db", "port")
        assert [(v.id, v.current) for v in tl.versions] == [
            (old.entry.id, False),
            (new.entry.id, True),
        ]
        assert tl.versions[0].valid_until == tl.versions[1].valid_from
        assert [e.value for e in (await kc.recall("staging")).entries] == [new.entry.value]


async def _cli(world: World, *args: str, who: str = "a1") -> Result:
    """The CLI in a thread: its client blocks, and the server runs on this test's loop."""
    return await asyncio.to_thread(_cli_sync, world, *args, who=who)


def _cli_sync(world: World, *args: str, who: str = "a1") -> Result:
    env = {"KNOWLEDGE_ADDRESS": world.address, "KNOWLEDGE_TOKEN": world.tokens[who]}
    return CliRunner().invoke(
        cli_main, ["--data-dir", str(world.data), *args], env=env, catch_exceptions=False
    )


def _doc(out: Result) -> Any:
    """The JSON document a command printed (the server's own log lines share stdout here)."""
    lines = out.stdout.splitlines()
    return json.loads("\n".join(lines[lines.index("{") :]))


async def test_cli_and_mcp_reach_the_memory(world: World) -> None:
    """MEM-E1 through the CLI and the MCP tool: same scope, same answers."""
    out = await _cli(
        world, "memory", "remember", "ops", "fridays", "never migrate on Fridays", "--json"
    )
    assert out.exit_code == 0, out.output
    entry_id = _doc(out)["entry"]["id"]
    recalled = await _cli(world, "memory", "recall", "fridays", "--json")
    assert [e["id"] for e in _doc(recalled)["entries"]] == [entry_id]
    assert (await _cli(world, "memory", "consolidate", "--all", "--dry-run")).exit_code == 0
    assert (await _cli(world, "memory", "policy", "validate")).exit_code == 0
    refused = await _cli(world, "memory", "remember", "x", "y", "z", who="reader")
    assert refused.exit_code != 0 and "memory.write" in refused.output
    async with bridge_session(world.address, KNOWLEDGE_TOKEN=world.tokens["a1"]) as session:
        result = await session.call_tool(
            "knowledge_memory", {"action": "recall", "query": "fridays"}
        )
        assert not result.is_error, result.content
        data = result.structured_content
        assert data["action"] == "recall" and data["recall"]["entries"][0]["id"] == entry_id
        assert "recall.entries[].value" in data["untrusted_fields"]
        result = await session.call_tool(
            "knowledge_memory", {"action": "remember", "category": "c", "key": "k", "value": "v"}
        )
        assert not result.is_error and result.structured_content["remember"]["outcome"] == "created"
        result = await session.call_tool("knowledge_memory", {"action": "rooms", "query": "x"})
        assert result.is_error and "query" in result.content[0].text
        result = await session.call_tool(
            "knowledge_memory",
            {"action": "remember", "category": "c", "key": "k2", "value": "AKIAIOSFODNN7EXAMPLE"},
        )
        assert result.is_error and result.content[0].text.startswith("KNOWLEDGE_SECRET_REFUSED")


def _events(data: Path) -> list[dict[str, Any]]:
    runner = CliRunner()
    out = runner.invoke(cli_main, ["--data-dir", str(data), "audit", "export"])
    assert out.exit_code == 0, out.output
    return [json.loads(line) for line in out.stdout.splitlines()]


def _tamper(path: Path, *sql: str) -> None:
    conn = apsw.Connection(str(path))
    conn.execute("DROP TRIGGER events_no_update; DROP TRIGGER events_no_delete;")
    for statement in sql:
        conn.execute(statement)
    conn.close()


def _verify(data: Path, *extra: str) -> Result:
    return CliRunner().invoke(cli_main, ["--data-dir", str(data), "audit", "verify", *extra])


async def test_aud1_real_calls_append_events_and_verify_finds_tampering(
    world: World, tmp_path: Path
) -> None:
    """AUD-1"""
    async with world.client("a1") as kc:
        await kc.remember("db", "port", "5433")
        await kc.remember("db", "port", "5434")
        with pytest.raises(InvalidRequest):
            await kc.remember("db", "key", "AKIAIOSFODNN7EXAMPLE")
        await kc.consolidate(dry_run=True)
        assert [e["operation"] for e in _events(world.data)][-1] == "memory.remember"
        await kc.consolidate()
        await kc.dispatch("deploy the staging app", commit=True)
    logs = world.ws_a / "logs"
    logs.mkdir()
    write_session_log(logs / "s.jsonl", "sess-a", world.ws_a, "deploy the staging app")
    async with world.client("ops") as kc:
        async for _ in kc.index_workspace(str(world.ws_a)):
            pass
        async for _ in kc.ingest_sessions([str(logs)]):
            pass
    token = CliRunner().invoke(
        cli_main,
        [
            *("--data-dir", str(world.data), "token", "create", "--id", "late"),
            *("--org", "org-c", "--all-workspaces", "--role", "agent", "--json"),
        ],
    )
    token_id = json.loads(token.stdout)["token_id"]
    assert _verify(world.data).exit_code == 0
    CliRunner().invoke(cli_main, ["--data-dir", str(world.data), "token", "revoke", token_id])

    events = _events(world.data)
    ops = [e["operation"] for e in events]
    for op in (
        "memory.remember",
        "memory.consolidate",
        "dispatch.commit",
        "index",
        "ingest",
        "derived.rebuild",
        "token.create",
        "token.revoke",
    ):
        assert op in ops, (op, ops)
    refused = [e for e in events if e["outcome"] == "KNOWLEDGE_SECRET_REFUSED"]
    assert len(refused) == 1 and refused[0]["principal"] == "a1" and refused[0]["org"] == "org-a"
    create = next(e for e in events if e["operation"] == "token.create")
    assert create["org"] == "org-c" and create["principal"].startswith("cli:")
    assert create["targets"] == [token_id]
    index = next(e for e in events if e["operation"] == "index")
    assert index["principal"] == "ops" and index["targets"][0] == str(world.ws_a)
    # The inputs' words are in no field (the hex digests are left out of the look: "5433"
    # can be part of a SHA-256 by chance).
    digests = {"hash", "prev_hash", "input_hash"}
    text = json.dumps([{k: v for k, v in e.items() if k not in digests} for e in events])
    assert "5433" not in text and "AKIA" not in text and "staging app" not in text

    ok = _verify(world.data)
    assert ok.exit_code == 0, ok.output
    head = ok.output.strip().rsplit(" ", 1)[-1]
    assert head.startswith(f"{len(events)}:")
    await world.rs.server.stop(0)
    world.rs.served.app.close()

    def copy(name: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        shutil.copy(world.data / "audit.sqlite", d / "audit.sqlite")
        return d

    edited, removed, reordered, cut = (copy(n) for n in ("edited", "removed", "reordered", "cut"))
    _tamper(edited / "audit.sqlite", "UPDATE events SET principal = 'someone-else' WHERE seq = 3")
    _tamper(removed / "audit.sqlite", "DELETE FROM events WHERE seq = 4")
    _tamper(
        reordered / "audit.sqlite",
        "UPDATE events SET seq = -5 WHERE seq = 5",
        "UPDATE events SET seq = 5 WHERE seq = 6",
        "UPDATE events SET seq = 6 WHERE seq = -5",
    )
    _tamper(cut / "audit.sqlite", f"DELETE FROM events WHERE seq = {len(events)}")
    for where, seq in ((edited, 3), (removed, 5), (reordered, 5)):
        out = _verify(where)
        assert out.exit_code == 1, (where.name, out.output)
        assert f"broken at seq {seq}" in out.output, (where.name, out.output)
    assert _verify(cut).exit_code == 0  # a cut tail leaves a valid chain ...
    out = _verify(cut, "--expect", head)  # ... found against the recorded head
    assert out.exit_code == 1 and "removed from its end" in out.output
    tail = CliRunner().invoke(cli_main, ["--data-dir", str(edited), "audit", "tail", "-n", "2"])
    assert [json.loads(x)["seq"] for x in tail.stdout.splitlines()] == [
        len(events) - 1,
        len(events),
    ]
    log = AuditLog(world.data / "audit.sqlite")
    try:
        assert log.verify().ok
    finally:
        log.close()


async def test_aud2_a_write_past_its_deadline_is_audited_as_it_ended(world: World) -> None:
    """AUD-2 (every write audited, with its ids): a Remember still waiting for the store when
    the caller's deadline passes goes on and commits; the caller gets DEADLINE_EXCEEDED and
    the audit log records the write as it ended (ok, with the new entry's id), not as a
    failure without ids. A write the deadline stopped before it began is recorded with the
    deadline's reason, and nothing is written."""
    app = world.rs.served.app
    lock = app.memory_ops.store._lock
    release = threading.Event()

    def hold() -> None:
        with lock:
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    await asyncio.sleep(0.1)
    client = world.client("a1")
    try:
        with pytest.raises(DeadlineExceeded):
            await client.remember("deploy", "day", "never deploy on fridays", timeout=0.5)
        release.set()
        holder.join()
        # The write finishes in its thread once the lock is free, then appends its event.
        events: list[dict[str, Any]] = []
        for _ in range(100):
            if (world.data / "audit.sqlite").exists():
                events = [e for e in _events(world.data) if e["operation"] == "memory.remember"]
            if events:
                break
            await asyncio.sleep(0.05)
        [entry] = (await client.recall("fridays")).entries
        last = events[-1]
        assert last["outcome"] == "ok" and last["targets"] == [entry.id]
        # Stopped before it began: the caller's side records it, and it never runs.
        before = len(_events(world.data))
        who = Principal("a1", "org-a", (str(world.ws_a),), "agent")
        req = memory_pb2.RememberRequest(category="c", key="late", value="postponed indefinitely")
        late = _AuditedWrite(
            app,
            who,
            "memory.remember",
            {},
            lambda: (*app.memory_ops.run("remember", req, who), "ok"),
        )
        assert late.abandon() is True
        with pytest.raises(KnowledgeDeadline):
            late.run()
        assert len(_events(world.data)) == before
        assert not (await client.recall("postponed")).entries
    finally:
        release.set()
        holder.join()
        await client.close()
