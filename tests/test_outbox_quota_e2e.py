"""The per-principal outbox quota over a real server: a committing Dispatch past the
limit is refused with RESOURCE_EXHAUSTED and writes nothing; other principals and
repeated commits of recorded packages are not affected."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from knowledge_sdk import (
    AsyncKnowledgeClient,
    InternalError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from knowledge_server.audit import AuditLog
from knowledge_server.auth import TokenStore
from knowledge_server.config import ConfigError, load_config
from knowledge_server.derived.store import DerivedStore
from knowledge_server.dispatch import Dispatcher

from tests.conftest import ingest_and_derive, start_server, write_session_log


def _rows(data: Path) -> int:
    store = DerivedStore(str(data / "derived.sqlite"), read_only=True)
    try:
        return len(store.assignments())
    finally:
        store.close()


def _outbox(data: Path) -> list[dict]:  # type: ignore[type-arg]
    folder = data / "outbox"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


async def test_commit_over_the_outbox_quota_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    a, b, logs = tmp_path / "ws_a", tmp_path / "ws_b", tmp_path / "logs"
    for d in (a, b, logs):
        d.mkdir()
    write_session_log(logs / "a.jsonl", "sess-a", a, "deploy the quokka service")
    write_session_log(logs / "b.jsonl", "sess-b", b, "deploy the quokka service")
    data = tmp_path / "data"
    tokens = TokenStore(data / "tokens.json")
    _, agent_a = tokens.create("agent-a", "org", [str(a)], "agent")
    _, agent_b = tokens.create("agent-b", "org", [str(b)], "agent")
    _, ops = tokens.create("ops", "org", None, "operator")
    rs = await start_server(
        tmp_path,
        authenticate=tokens.authenticate,
        auth="on",
        workspaces=[str(a), str(b)],
        outbox_quota_per_principal=2,
    )
    actor_a, actor_b = "actor:generic:root_session:sess-a", "actor:generic:root_session:sess-b"
    try:
        await ingest_and_derive(rs.address, ops, logs)
        async with AsyncKnowledgeClient(rs.address, token=agent_a) as kc:
            first = await kc.dispatch("deploy task one", actor_id=actor_a, commit=True)
            await kc.dispatch("deploy task two", actor_id=actor_a, commit=True)
            assert first.assignment.created is True
            assert _rows(data) == 2 and len(_outbox(data)) == 2
            with pytest.raises(ResourceExhausted) as info:
                await kc.dispatch("deploy task three", actor_id=actor_a, commit=True)
            err = info.value
            assert err.reason == "KNOWLEDGE_QUOTA_EXCEEDED"
            assert err.metadata["limit"] == "2"
            assert err.metadata["quota"] == "outbox_quota_per_principal"
            assert "quota" in err.message
            # Nothing was written: no row, no package, no temporary file.
            assert _rows(data) == 2
            assert sorted(p.name for p in (data / "outbox").iterdir()) == sorted(
                f"{x['assignment_id']}.json" for x in _outbox(data)
            )
            assert len(_outbox(data)) == 2
            # A repeat of a recorded commit writes nothing new and is still answered.
            again = await kc.dispatch("deploy task one", actor_id=actor_a, commit=True)
            assert again.assignment.assignment_id == first.assignment.assignment_id
            assert again.assignment.created is False
            # A dry run is never limited.
            dry = await kc.dispatch("deploy task three", actor_id=actor_a)
            assert dry.mode == "dry_run"
        # The quota is per principal: another agent still commits.
        async with AsyncKnowledgeClient(rs.address, token=agent_b) as kc:
            other = await kc.dispatch("deploy task one", actor_id=actor_b, commit=True)
            assert other.assignment.created is True
        owners = sorted(p["committed_by"] for p in _outbox(data))
        assert owners == ["agent-a", "agent-a", "agent-b"]
        # Handled packages leave the outbox, which frees the quota.
        Path(first.assignment.outbox_path).unlink()  # noqa: ASYNC240 - a small local file
        async with AsyncKnowledgeClient(rs.address, token=agent_a) as kc:
            third = await kc.dispatch("deploy task three", actor_id=actor_a, commit=True)
            assert third.assignment.created is True
            # KD-2: a repeat of a handled commit (a retry after a lost reply) is answered
            # with its assignment and writes nothing: the package is not handed over a
            # second time (nor refused for a quota it no longer holds).
            retry = await kc.dispatch("deploy task one", actor_id=actor_a, commit=True)
            assert retry.assignment.assignment_id == first.assignment.assignment_id
            assert retry.assignment.created is False
            assert retry.assignment.outbox_path == first.assignment.outbox_path
            assert not Path(first.assignment.outbox_path).exists()  # noqa: ASYNC240 - a small local file
            assert len(_outbox(data)) == 3 and _rows(data) == 4
    finally:
        await rs.server.stop(0)
        rs.app.close()


@pytest.mark.parametrize("value", ["0", "-1", "1000001"])
def test_outbox_quota_is_validated(value: str) -> None:
    with pytest.raises(ConfigError, match="outbox_quota_per_principal"):
        load_config(env={"KNOWLEDGE_OUTBOX_QUOTA_PER_PRINCIPAL": value})


def test_outbox_quota_default() -> None:
    assert load_config(env={}).outbox_quota_per_principal == 100


async def test_kd_a_commit_never_hands_over_a_package_planned_in_another_scope(
    tmp_path: Path,
) -> None:
    """KD-2 / ISO: token ids are not unique across organisations. Org-a's "ci" (workspaces
    shared + a) commits; org-b's "ci" (shared only) commits the same task to the same actor:
    it records an assignment and a package of its own, planned within its own scope, never
    org-a's with an episode of workspace a (before, it was answered with org-a's assignment,
    its time and its outbox file); and the two do not share one outbox quota."""
    shared, a, logs = tmp_path / "shared", tmp_path / "ws_a", tmp_path / "logs"
    for d in (shared, a, logs):
        d.mkdir()
    write_session_log(logs / "s.jsonl", "sess-s", shared, "deploy the quokka service")
    write_session_log(logs / "a.jsonl", "sess-a", a, "deploy the quokka service: codename BLUEFIN")
    data = tmp_path / "data"
    tokens = TokenStore(data / "tokens.json")
    _, ci_a = tokens.create("ci", "org-a", [str(shared), str(a)], "agent")
    _, ci_b = tokens.create("ci", "org-b", [str(shared)], "agent")
    _, ops = tokens.create("ops", "org", None, "operator")
    rs = await start_server(
        tmp_path,
        authenticate=tokens.authenticate,
        auth="on",
        workspaces=[str(shared), str(a)],
        outbox_quota_per_principal=1,
    )
    actor = "actor:generic:root_session:sess-s"
    try:
        await ingest_and_derive(rs.address, ops, logs)
        async with AsyncKnowledgeClient(rs.address, token=ci_a) as kc:
            first = await kc.dispatch("deploy the quokka service", actor_id=actor, commit=True)
        recorded = first.handoff.context_pack.prior_episodes
        assert any("BLUEFIN" in e.snippet for e in recorded)  # org-a's scope holds it
        async with AsyncKnowledgeClient(rs.address, token=ci_b) as kc:
            again = await kc.dispatch("deploy the quokka service", actor_id=actor, commit=True)
            # Org-a's pending package does not count against org-b's "ci" (quota 1).
            assert again.assignment.created is True
            assert again.assignment.assignment_id != first.assignment.assignment_id
            assert again.assignment.outbox_path != first.assignment.outbox_path
            assert not any(
                "BLUEFIN" in e.snippet for e in again.handoff.context_pack.prior_episodes
            )
            assert not any("BLUEFIN" in str(c.arguments) for c in again.handoff.tool_calls)
            package = Path(again.assignment.outbox_path).read_text()  # noqa: ASYNC240 - a small local file
            assert "BLUEFIN" not in package
            # Its own repeat is idempotent.
            same = await kc.dispatch("deploy the quokka service", actor_id=actor, commit=True)
            assert same.assignment.assignment_id == again.assignment.assignment_id
            assert same.assignment.created is False
        owners = sorted((p["committed_org"], p["committed_by"]) for p in _outbox(data))
        assert owners == [("org-a", "ci"), ("org-b", "ci")]
    finally:
        await rs.server.stop(0)
        rs.app.close()


async def test_a_commit_whose_package_cannot_be_written_records_nothing_and_is_audited(
    tmp_path: Path,
) -> None:
    """The outbox folder cannot be written (here a file stands in its place): the commit
    answers UNAVAILABLE naming the outbox, leaves no assignment row, and its audit event
    says how it ended. Once the folder can be written, the same commit records both."""
    a, logs = tmp_path / "ws_a", tmp_path / "logs"
    for d in (a, logs):
        d.mkdir()
    write_session_log(logs / "a.jsonl", "sess-a", a, "deploy the quokka service")
    data = tmp_path / "data"
    tokens = TokenStore(data / "tokens.json")
    _, agent = tokens.create("agent-a", "org", [str(a)], "agent")
    _, ops = tokens.create("ops", "org", None, "operator")
    rs = await start_server(
        tmp_path, authenticate=tokens.authenticate, auth="on", workspaces=[str(a)]
    )
    actor = "actor:generic:root_session:sess-a"
    try:
        await ingest_and_derive(rs.address, ops, logs)
        (data / "outbox").write_text("not a folder")
        async with AsyncKnowledgeClient(rs.address, token=agent) as kc:
            with pytest.raises(Unavailable) as info:
                await kc.dispatch("deploy task one", actor_id=actor, commit=True)
            assert "outbox" in info.value.message and "nothing was recorded" in info.value.message
            assert _rows(data) == 0
            log = AuditLog(data / "audit.sqlite")
            try:
                last = log.tail(1)[0]
            finally:
                log.close()
            assert (last.operation, last.outcome) == (
                "dispatch.commit",
                "KNOWLEDGE_SOURCE_UNAVAILABLE",
            )
            (data / "outbox").unlink()
            done = await kc.dispatch("deploy task one", actor_id=actor, commit=True)
            assert done.assignment.created is True and _rows(data) == 1
            assert Path(done.assignment.outbox_path).is_file()  # noqa: ASYNC240 - a small local file
    finally:
        await rs.server.stop(0)
        rs.app.close()


@asynccontextmanager
async def _one_agent(tmp_path: Path) -> AsyncIterator[AsyncKnowledgeClient]:
    """A real server with one workspace and a client of an agent held to it."""
    a = tmp_path / "ws_a"
    a.mkdir()
    tokens = TokenStore(tmp_path / "data" / "tokens.json")
    _, agent = tokens.create("agent-a", "org", [str(a)], "agent")
    rs = await start_server(
        tmp_path, authenticate=tokens.authenticate, auth="on", workspaces=[str(a)]
    )
    try:
        async with AsyncKnowledgeClient(rs.address, token=agent) as kc:
            yield kc
    finally:
        await rs.server.stop(0)
        rs.app.close()


def _audited(data: Path) -> list[tuple[str, str]]:
    log = AuditLog(data / "audit.sqlite")
    try:
        return [(e.operation, e.outcome) for e in log.events()]
    finally:
        log.close()


async def test_a_commit_refused_before_its_write_is_audited(tmp_path: Path) -> None:
    """AUD (every write audited, refused ones too): a committing Dispatch refused while it
    is checked or planned (here: an actor that is not there) has its
    ``dispatch.commit`` event with the refusal's reason; a dry run refused the same way is
    no write and has none."""
    async with _one_agent(tmp_path) as kc:
        with pytest.raises(NotFound):
            await kc.dispatch("deploy", actor_id="actor:generic:root_session:nope", commit=True)
        with pytest.raises(NotFound):
            await kc.dispatch("deploy", actor_id="actor:generic:root_session:nope")
    assert _audited(tmp_path / "data") == [("dispatch.commit", "KNOWLEDGE_NOT_FOUND")]


async def test_a_commit_that_fails_unexpectedly_while_planned_is_audited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committing Dispatch whose planning fails for an unexpected reason answers INTERNAL
    and is still audited, as ``KNOWLEDGE_INTERNAL``."""

    async def broken(self: object, v: object, scope: object) -> object:
        raise RuntimeError("the derived store is damaged")

    monkeypatch.setattr(Dispatcher, "plan", broken)
    async with _one_agent(tmp_path) as kc:
        with pytest.raises(InternalError):
            await kc.dispatch("deploy", commit=True)
    assert _audited(tmp_path / "data") == [("dispatch.commit", "KNOWLEDGE_INTERNAL")]
