"""The code lane through the server: streaming IndexWorkspace, GetChunk, freshness warnings."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest
from knowledge_sdk import AsyncKnowledgeClient, InvalidRequest, NotFound

from tests.conftest import start_server


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(
        Path(sysconfig.get_paths()["stdlib"]) / "json",
        ws / "json",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (ws / "notes.md").write_text(
        "# Decoder notes\n\nThe scanner turns text into tokens.\n\n## Errors\n\nJSONDecodeError carries lineno.\n"
    )
    return ws


async def test_index_stream_search_chunk_and_stale_warning(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    rs = await start_server(tmp_path, workspaces=[str(ws)])
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            events = [ev async for ev in kc.index_workspace(str(ws))]
            progress = [e.progress for e in events if e.progress is not None]
            summary = events[-1].summary
            assert progress and progress[-1].total >= 6
            assert summary is not None and summary.index_rev and summary.counters["chunks"] > 20
            resp = await kc.search("where is JSONDecodeError raised", include=["code"])
            code = resp.lanes.code
            assert (
                code.index_rev == summary.index_rev
                and code.capability == "full"
                and not code.freshness.stale
            )
            top = code.items[0]
            assert top.path.startswith("json/") or top.path == "notes.md"
            assert any(w.startswith("lex:") for w in top.why)
            chunk = (await kc.get_chunk(top.id)).chunk
            assert (
                chunk.path == top.path
                and chunk.start_line == top.start_line
                and len(chunk.text) >= len(top.snippet.strip("…"))
            )
            md = await kc.search("scanner turns text into tokens", include=["code"])
            assert any(
                i.path == "notes.md" and i.source_kind == "section" for i in md.lanes.code.items
            )
            # A question that reads as a change: in mode=auto (the router's find_knowledge) the
            # code lane weighs its files as find_code, source first; a caller's stated
            # mode=find_knowledge keeps documents weighed like code (rank.about_code).
            change = "Fix how the scanner turns text into tokens"
            auto = await kc.search(change, include=["code"])
            stated = await kc.search(change, mode="find_knowledge", include=["code"])
            assert auto.routing.intent == stated.routing.intent == "find_knowledge"
            assert auto.lanes.code.items[0].path == "json/scanner.py"
            assert stated.lanes.code.items[0].path == "notes.md"
            # mode=docs: document chunks only, and the lane says it is plain retrieval (seed 003 §3.4).
            docs = await kc.search("scanner tokens decoder errors", mode="docs", include=["code"])
            assert docs.lanes.code.items and all(
                i.language == "markdown" for i in docs.lanes.code.items
            )
            assert (
                docs.lanes.code.degraded
                and "no document graph answered" in docs.lanes.code.degradation_reason
                and docs.found
            )
            # The workspace changes after the revision: data still returned, with a warning.
            (ws / "json" / "decoder.py").write_text(
                (ws / "json" / "decoder.py").read_text() + "\n# touched\n"
            )
            rs.app.lanes.code.refresh_freshness()  # type: ignore[union-attr]
            stale = await kc.search("where is JSONDecodeError raised", include=["code"])
            assert stale.lanes.code.freshness.stale and stale.lanes.code.items
            assert any(w.code == "KNOWLEDGE_STALE_INDEX" for w in stale.warnings)
            st = await kc.get_status()
            code_status = next(lane for lane in st.lanes if lane.lane == "code")
            assert str(ws) in code_status.stale_workspaces
            # Re-index: unchanged files reused, a new revision, fresh again.
            events = [ev async for ev in kc.index_workspace(str(ws))]
            again = events[-1].summary
            assert again.index_rev != summary.index_rev and again.counters["files_reused"] >= 5
            fresh = await kc.search("where is JSONDecodeError raised", include=["code"], trace=True)
            assert (
                not fresh.lanes.code.freshness.stale
                and fresh.lanes.code.index_rev == again.index_rev
            )
            # Lane results are cached per revision: a repeat hits, a new revision missed above.
            assert not next(t for t in fresh.trace.lanes if t.lane == "code").cache_hit
            repeat = await kc.search(
                "where is JSONDecodeError raised", include=["code"], trace=True
            )
            assert next(t for t in repeat.trace.lanes if t.lane == "code").cache_hit
            assert [i.id for i in repeat.lanes.code.items] == [i.id for i in fresh.lanes.code.items]
            with pytest.raises(NotFound):
                await kc.get_chunk("chunk:doesnotexist")
            with pytest.raises(InvalidRequest):
                async for _ in kc.index_workspace(str(tmp_path / "missing")):
                    pass
    finally:
        await rs.server.stop(0)
        rs.app.close()


def test_mode_docs_weighs_documents_like_code_however_the_question_reads(tmp_path: Path) -> None:
    """mode=docs asks the code lane for documents, and mode=find_knowledge for knowledge, with
    the intent "knowledge": documents weigh as in a knowledge question even when the question
    reads as being about code. code.rank.about_code weighs only the router's find_knowledge
    (mode=auto) as find_code. Catches: source files taking the places the lane looks through
    (top_k x 4) and leaving no document to return; a caller's stated mode overridden."""
    import asyncio

    from knowledge_server.lanes.code import CodeLane
    from knowledge_server.search.lanes import LaneQuery

    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "urls.md").write_text(
        "# URLs\n\nHow a URL is joined: join_url joins a base URL.\n"
    )
    for i in range(6):
        (ws / f"url_join_{i}.py").write_text(
            f"def join_url_{i}(base, path):\n    return base + path\n"
        )
    code = CodeLane(tmp_path / "data")
    try:
        code.index_sync(str(ws), False, lambda *a: None)
        for query in ("how a URL is joined", "Fix how a URL is joined"):
            q = LaneQuery(query=query, workspaces=None, docs_only=True, docs_mode="docs", top_k=1)
            items = asyncio.run(code.search(q)).lane.items
            assert [i.path for i in items] == ["docs/urls.md"], query

        def first(query: str, stated: bool) -> str:
            q = LaneQuery(
                query=query, workspaces=None, intent="find_knowledge", intent_stated=stated
            )
            return asyncio.run(code.search(q)).lane.items[0].path

        assert first("how a URL is joined", stated=False) == "docs/urls.md"
        assert first("Fix how a URL is joined", stated=False).startswith("url_join_")
        assert first("Fix how a URL is joined", stated=True) == "docs/urls.md"
    finally:
        code.close()


def test_a_root_pointed_elsewhere_after_the_scope_check_is_refused(tmp_path: Path) -> None:
    """Workspace isolation by real paths: IndexWorkspace checked the root's real path, then,
    after waiting for the writer's lock, walked whatever the name pointed to by then; a
    scoped operator whose folder was swapped for a link into another tenant's tree got that
    tree indexed under its own root. The folder the indexer opens is checked again."""
    from functools import partial

    from knowledge_server.errors import PermissionDenied
    from knowledge_server.lanes.code import CodeLane
    from knowledge_server.workspaces import real_path_in_scope, really_in_scope

    a, b = tmp_path / "x" / "ws-a", tmp_path / "x" / "ws-b"
    (a / "sub").mkdir(parents=True)
    (b / "src").mkdir(parents=True)
    (a / "sub" / "mine.py").write_text("def tenant_a_fn():\n    return 1\n")
    (b / "src" / "secret_algo.py").write_text("def zebrafinch_pricing_model():\n    return 42\n")
    scope = [str(a)]
    assert really_in_scope(str(a / "sub"), scope)  # what the service checks on the request
    shutil.rmtree(a / "sub")
    (a / "sub").symlink_to(b / "src")  # then, while the request waits for the lock
    code = CodeLane(tmp_path / "data")
    try:
        with pytest.raises(PermissionDenied):
            code.index_sync(
                str(a / "sub"), False, lambda *a: None, partial(real_path_in_scope, scope=scope)
            )
        assert not code._writer.search("zebrafinch_pricing_model", check_fresh=False).hits
        code.index_sync(str(a), False, lambda *a: None, partial(real_path_in_scope, scope=scope))
    finally:
        code.close()
