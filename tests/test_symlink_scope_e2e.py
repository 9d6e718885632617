"""Symlinks and scope over a real server with scoped principals: a link inside a workspace
never widens what its operator may index or ingest, nor what its agent may read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from knowledge_sdk import AsyncKnowledgeClient, InvalidRequest, PermissionDenied
from knowledge_server.auth import TokenStore
from knowledge_server.code.walker import read_text, walk_workspace
from knowledge_server.episodes.discover import discover

from tests.conftest import start_server, write_session_log

CANARY_B = "zebrafinch_tenant_b_canary"


def _world(tmp_path: Path) -> tuple[Path, Path]:
    """Tenant A's workspace full of links into tenant B's (and the host's /etc)."""
    a, b = tmp_path / "ws_a", tmp_path / "ws_b"
    (a / "src" / "deep" / "nested").mkdir(parents=True)
    (b / "logs").mkdir(parents=True)
    (a / "logs").mkdir()
    (a / "src" / "app.py").write_text("def alpha_handler(request):\n    return request\n")
    (b / "shipping.py").write_text(f"def ship_{CANARY_B}(parcel):\n    return parcel\n")
    write_session_log(b / "logs" / "b.jsonl", "sess-b", b, f"tenant b talks about {CANARY_B}")
    write_session_log(a / "logs" / "a.jsonl", "sess-a", a, "tenant a talks about alpha_handler")
    (a / "b-link").symlink_to(b, target_is_directory=True)
    (a / "etc-link").symlink_to("/etc", target_is_directory=True)
    (a / "src" / "deep" / "nested" / "b-dir").symlink_to(b, target_is_directory=True)
    (a / "src" / "deep" / "nested" / "stolen.py").symlink_to(b / "shipping.py")
    (a / "logs" / "stolen.jsonl").symlink_to(b / "logs" / "b.jsonl")
    return a, b


async def test_links_out_of_a_workspace_are_refused_or_not_followed(tmp_path: Path) -> None:
    a, _ = _world(tmp_path)
    tokens = TokenStore(tmp_path / "data" / "tokens.json")
    _, ops_a = tokens.create("ops-a", "org", [str(a)], "operator")
    _, agent_a = tokens.create("agent-a", "org", [str(a)], "agent")
    rs = await start_server(tmp_path, authenticate=tokens.authenticate, auth="on")
    try:
        async with AsyncKnowledgeClient(rs.address, token=ops_a) as kc:
            # A root that is, or passes through, a link leaving the workspace is outside it.
            nested = a / "src" / "deep" / "nested" / "b-dir"
            for root in (a / "b-link", a / "etc-link", a / "b-link" / "logs", nested):
                with pytest.raises(PermissionDenied):
                    async for _ in kc.index_workspace(str(root)):
                        pass
            events = [ev async for ev in kc.index_workspace(str(a))]
            summary = events[-1].summary
            assert summary is not None and summary.counters["chunks"] >= 1
        async with AsyncKnowledgeClient(rs.address, token=agent_a) as kc:
            for query in (CANARY_B, "ship parcel", "alpha_handler request"):
                resp = await kc.search(query, include=["code"])
                for item in resp.lanes.code.items:
                    assert item.workspace == str(a)
                    assert "b-dir" not in item.path and "stolen" not in item.path
                    assert CANARY_B not in item.snippet
            found = await kc.search("alpha_handler request", include=["code"])
            paths = {i.path for i in found.lanes.code.items}
            assert "src/app.py" in paths and paths <= {"src/app.py", "logs/a.jsonl"}
    finally:
        await rs.server.stop(0)


async def test_ingest_out_of_scope_answers_as_missing(tmp_path: Path) -> None:
    a, b = _world(tmp_path)
    tokens = TokenStore(tmp_path / "data" / "tokens.json")
    _, ops_a = tokens.create("ops-a", "org", [str(a)], "operator")
    rs = await start_server(tmp_path, authenticate=tokens.authenticate, auth="on")

    async def refusal(kc: AsyncKnowledgeClient, path: Path) -> tuple[str, str, str]:
        with pytest.raises(InvalidRequest) as info:
            async for _ in kc.ingest_sessions([str(path)]):
                pass
        err = info.value
        return type(err).__name__, err.reason, err.message.replace(str(path), "<path>")

    try:
        async with AsyncKnowledgeClient(rs.address, token=ops_a) as kc:
            missing = await refusal(kc, a / "logs" / "id_rsa_nope.jsonl")
            assert "does not exist" in missing[2]
            # Another tenant's log, a host file, and links to them: the same answer as missing.
            for path in (
                b / "logs" / "b.jsonl",
                Path("/etc/passwd"),
                a / "logs" / "stolen.jsonl",
                a / "b-link" / "logs",
            ):
                assert await refusal(kc, path) == missing
            # A folder in scope: its link into tenant B's logs is not followed.
            events = [ev async for ev in kc.ingest_sessions([str(a / "logs")])]
            summary = events[-1].summary
            assert summary is not None
            assert summary.counters["files_seen"] == 1 and summary.counters["sessions"] == 1
    finally:
        await rs.server.stop(0)


def test_walker_skips_nested_links_and_never_reads_through_a_new_one(tmp_path: Path) -> None:
    a, _ = _world(tmp_path)
    walked = walk_workspace(str(a))
    assert [f.path for f in walked.files] == ["logs/a.jsonl", "src/app.py"]
    assert walked.skipped["symlink"] == 5
    # A walked file replaced by a link before it is read: the link is not followed.
    app = a / "src" / "app.py"
    app.unlink()
    app.symlink_to(tmp_path / "ws_b" / "shipping.py")
    text, _, reason = read_text(walked.files[1].abspath)
    assert text is None and reason == "unreadable"


def test_discover_keeps_links_inside_the_folder_only(tmp_path: Path) -> None:
    a, _ = _world(tmp_path)
    os.symlink(a / "logs" / "a.jsonl", a / "logs" / "alias.jsonl")
    found = [p for p, _ in discover([str(a / "logs")])]
    assert found == [str(a / "logs" / "a.jsonl"), str(a / "logs" / "alias.jsonl")]
