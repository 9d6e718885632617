"""The document graph end to end over gRPC: index EIP documents with the code lane, build the
layer (fake LLM server, no LLM, unreachable LLM) and call the five operations through the SDK."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from knowledge_sdk import AsyncKnowledgeClient, InvalidRequest
from knowledge_sdk import types as v1
from knowledge_server.testing.fake_llm import FakeLLMServer

from tests.conftest import dev_keys, make_vendor, start_server

EIPS = ("eip-1559.md", "eip-2718.md", "eip-2930.md", "eip-2929.md", "eip-4844.md")


def eips_workspace(shared_data: Path, tmp_path: Path) -> Path:
    ws = tmp_path / "eips"
    ws.mkdir()
    for name in EIPS:
        shutil.copy(shared_data / "docs" / "eips" / name, ws / name)
    return ws


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def _summary(stream: Any) -> v1.OperationSummary:
    events = [ev async for ev in stream]
    summaries = [ev.summary for ev in events if ev.summary is not None]
    assert len(summaries) == 1
    return summaries[0]


async def _index_and_build(kc: AsyncKnowledgeClient, ws: Path, **build: Any) -> v1.OperationSummary:
    await _summary(kc.index_workspace(str(ws)))
    return await _summary(kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws), **build)))


def _addressed(addr: Any) -> None:
    assert (
        addr is not None and addr.path and addr.start_line >= 1 and addr.end_line >= addr.start_line
    ), addr


def _entity(e: Any) -> None:
    assert e.addresses, e
    for a in e.addresses:
        _addressed(a)


def _theme(t: Any) -> None:
    _addressed(t.address)
    assert t.citations
    for c in t.citations:
        _addressed(c)
    for e in t.top_entities:
        _entity(e)


def _envelope(resp: Any, op: str) -> None:
    assert resp.op == op and resp.provenance == "stated"
    assert resp.index_rev.startswith("docgraph:")


async def _server(tmp_path: Path, ws: Path, **llm: str):  # type: ignore[no-untyped-def]
    make_vendor(tmp_path / "vendor").install(tmp_path / "data")  # Enterprise: doc-graph
    return await start_server(tmp_path, workspaces=[str(ws)], **dev_keys(tmp_path / "data"), **llm)


async def test_five_operations_with_fake_llm(shared_data: Path, tmp_path: Path) -> None:
    ws = eips_workspace(shared_data, tmp_path)
    with FakeLLMServer() as fake:
        rs = await _server(tmp_path, ws, llm_url=fake.url, llm_model="fake")
        try:
            async with AsyncKnowledgeClient(rs.address) as kc:
                await _summary(kc.index_workspace(str(ws)))
                est = await _summary(
                    kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws), estimate=True))
                )
                assert est.counters["chunks_to_process"] > 0 and est.counters["expected_calls"] > 0
                assert fake.calls == 0  # an estimate spends nothing

                first = await _summary(kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws))))
                assert first.changed and not first.stopped_by
                for key in ("documents", "chunks", "entities", "relations", "themes", "llm_calls"):
                    assert first.counters[key] > 0, key
                assert first.counters["documents"] == len(EIPS)
                assert first.index_rev.startswith("docgraph:")

                th = await kc.themes(limit=5)
                _envelope(th, "themes")
                assert th.collected and th.found and th.capability == "full" and th.themes
                # Provenance reaches the client: which model, prompts and build answered.
                (prov,) = th.layer_provenance
                assert prov.workspace == str(ws) and prov.model == "openai:fake:"
                assert {"docgraph-extract/1", "docgraph-summary/2", "docgraph-keywords/1"} <= set(
                    prov.prompt_versions
                )
                assert len(prov.fingerprint) == 64 and prov.built_at and prov.source_index_rev
                for t in th.themes:
                    _theme(t)
                    assert t.address.workspace == str(ws)

                nb = await kc.entity_neighbors("EIP-1559", depth=2)
                _envelope(nb, "entity_neighbors")
                assert nb.found and nb.neighbors
                _entity(nb.entity)
                for n in nb.neighbors:
                    _addressed(n.address)
                    assert n.relation and n.via_id
                tn = await kc.entity_neighbors("EIP-1559", kind="theme")
                for n in tn.neighbors:
                    assert n.kind == "theme"
                    _addressed(n.address)

                rel = await kc.doc_relations(doc="eip-1559.md")
                _envelope(rel, "doc_relations")
                assert rel.found and rel.relations
                for r in rel.relations:
                    assert r.from_ == "eip-1559.md" and r.to and r.via_entities
                    for c in r.citations:
                        _addressed(c)
                    for e in r.via_entities:
                        _entity(e)
                rel2 = await kc.doc_relations(entity="EIP-2718")
                assert rel2.found and all(c.path for r in rel2.relations for c in r.citations)

                ov = await kc.global_overview(limit=3)
                _envelope(ov, "global_overview")
                assert ov.found and ov.documents == len(EIPS) and ov.entities > 0 and ov.chunks > 0
                assert not ov.degraded and ov.top_themes and ov.top_entities
                for t in ov.top_themes:
                    _theme(t)
                for e in ov.top_entities:
                    _entity(e)

                sl = await kc.search_levels("How does EIP-1559 change the base fee?")
                _envelope(sl, "search_levels")
                assert sl.collected and not sl.degraded and sl.found and sl.items
                for h in sl.items:
                    _addressed(h.address)
                    for e in h.matched_entities:
                        _entity(e)
                for t in sl.themes:
                    _theme(t)

                with pytest.raises(InvalidRequest) as err:
                    await kc.entity_neighbors("EIP-1559", depth=4)
                assert "depth" in str(err.value)
                with pytest.raises(InvalidRequest) as err:
                    await kc.themes(limit=1000)
                assert "limit" in str(err.value)

                status = await kc.get_status()
                dg = [lane for lane in status.lanes if lane.lane == "docgraph"]
                assert dg and dg[0].index_rev == first.index_rev and dg[0].counts["entities"] > 0

                # A second build: same fingerprint, no LLM call, same revision.
                calls = fake.calls
                second = await _summary(kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws))))
                assert fake.calls == calls
                assert second.counters["llm_calls"] == 0 and not second.changed
                assert second.index_rev == first.index_rev
        finally:
            await rs.server.stop(0)


async def test_no_llm_structural_build_and_degraded_search(
    shared_data: Path, tmp_path: Path
) -> None:
    ws = eips_workspace(shared_data, tmp_path)
    rs = await _server(tmp_path, ws)
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            before = await kc.themes()
            assert (
                not before.collected and "DOCGRAPH_NOT_BUILT" in before.reason and not before.themes
            )

            summary = await _index_and_build(kc, ws, structural_only=True)
            assert summary.counters["entities"] > 0 and summary.counters["llm_calls"] == 0

            sl = await kc.search_levels("EIP-2718 typed transaction envelope")
            assert (
                sl.collected
                and sl.degraded
                and sl.degradation_reason
                and "LLM not configured" in sl.reason
            )
            assert sl.found and sl.items
            for h in sl.items:
                assert h.match_kind == "lexical"
                _addressed(h.address)

            nb = await kc.entity_neighbors("EIP-1559")
            assert nb.collected and nb.capability == "degraded" and nb.reason
            for n in nb.neighbors:
                _addressed(n.address)
            ov = await kc.global_overview()
            assert ov.degraded and ov.degradation_reason
    finally:
        await rs.server.stop(0)


async def test_unreachable_llm_is_not_collected_with_driver_code(
    shared_data: Path, tmp_path: Path
) -> None:
    ws = eips_workspace(shared_data, tmp_path)
    rs = await _server(tmp_path, ws, llm_url=closed_port_url(), llm_model="fake")
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            summary = await _index_and_build(kc, ws)
            assert summary.stopped_by == "llm_unavailable"
            assert any("LLM_UNAVAILABLE" in p.message for p in summary.problems)
            assert summary.counters["pending_chunks"] > 0

            sl = await kc.search_levels("EIP-1559 base fee")
            assert (
                not sl.collected
                and "LLM_UNAVAILABLE" in sl.reason
                and not sl.items
                and not sl.found
            )
            for call in (kc.themes(), kc.entity_neighbors("EIP-1559"), kc.global_overview()):
                resp = await call
                # Structural facts may answer, but never as "full" and never without the cause.
                assert "LLM_UNAVAILABLE" in resp.reason and resp.capability == "degraded"
                if not resp.collected:
                    assert not resp.found
    finally:
        await rs.server.stop(0)


def test_operations_answer_only_from_workspaces_in_scope(shared_data: Path, tmp_path: Path) -> None:
    """Two workspaces, one layer each: a caller scoped to one never sees the other's facts."""
    from knowledge_server._gen.knowledge.v1 import docgraph_pb2
    from knowledge_server.lanes.code import CodeLane
    from knowledge_server.lanes.docgraph import DocGraphLane

    data = tmp_path / "data"
    data.mkdir()
    roots = []
    for name, files in (("a", EIPS[:2]), ("b", EIPS[2:])):
        ws = tmp_path / name
        ws.mkdir()
        for f in files:
            shutil.copy(shared_data / "docs" / "eips" / f, ws / f)
        roots.append(str(ws))
    code = CodeLane(data)
    dg = DocGraphLane(data, code=code)
    try:
        for root in roots:
            code.index_sync(root, False, lambda *a: None)
        summary = dg.build_sync(None, False, 0, 0, True, lambda *a: None, scope=None)
        assert summary.counters["workspaces"] == 2 and ";" in summary.index_rev
        req = docgraph_pb2.GlobalOverviewRequest(limit=5)
        for root, files in zip(roots, (EIPS[:2], EIPS[2:]), strict=True):
            resp = dg.op_sync("global_overview", req, (root,))
            assert resp.collected and resp.documents == len(files)
            paths = {a.path for e in resp.top_entities for a in e.addresses}
            assert paths <= set(files)
            assert {a.workspace for e in resp.top_entities for a in e.addresses} == {root}
        hidden = dg.op_sync("themes", docgraph_pb2.ThemesRequest(), ())
        assert not hidden.collected and not hidden.themes and "DOCGRAPH_NOT_BUILT" in hidden.reason
        assert dg.status((roots[0],)).counts["workspaces"] == 1
    finally:
        dg.close()
        code.close()


async def test_search_docs_and_themes_go_through_the_graph(
    shared_data: Path, tmp_path: Path
) -> None:
    """Seed 003 §3.4: with a built graph, Search mode=docs matches entities and themes (each
    item says how, with addressed entities) and is not degraded; mode=themes leads with
    theme-level evidence; before the build, mode=docs says it is plain retrieval."""
    ws = eips_workspace(shared_data, tmp_path)
    rs = await _server(tmp_path, ws)
    query = "how is the base fee per gas computed for a typed transaction"
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            await _summary(kc.index_workspace(str(ws)))
            plain = await kc.search(query, mode="docs", include=["code"])
            assert plain.lanes.code.degraded
            assert "no document graph answered" in plain.lanes.code.degradation_reason
            assert all(not i.match_kind for i in plain.lanes.code.items)

            await _summary(
                kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws), structural_only=True))
            )
            docs = await kc.search(query, mode="docs", include=["code"])
            lane = docs.lanes.code
            assert lane.items and not lane.degraded, lane.degradation_reason
            assert {i.match_kind for i in lane.items} <= {"entity", "theme", "lexical"}
            graph = [i for i in lane.items if i.match_kind in ("entity", "theme")]
            assert graph
            for item in graph:
                assert item.matched_entities and item.language == "markdown"
                for e in item.matched_entities:
                    assert e.name and e.addresses
                    for a in e.addresses:
                        _addressed(a)
                        assert a.workspace == str(ws) and a.path == item.path
                        assert item.start_line <= a.start_line <= item.end_line

            themes = await kc.search(query, mode="themes", include=["code"])
            tl = themes.lanes.code
            assert tl.items and tl.items[0].match_kind == "theme" and tl.items[0].theme_id
            assert not tl.degraded
            assert [i.id for i in tl.items] != [i.id for i in lane.items]
    finally:
        await rs.server.stop(0)


def test_every_workspace_in_scope_answers_merged(shared_data: Path, tmp_path: Path) -> None:
    """Two workspaces with a layer each: an unscoped caller gets both merged deterministically,
    each fact naming its workspace; Search mode=docs reaches both; without the licence feature
    Search stays plain retrieval."""
    import asyncio

    from knowledge_server._gen.knowledge.v1 import docgraph_pb2
    from knowledge_server.lanes.code import CodeLane
    from knowledge_server.lanes.docgraph import DocGraphLane, GraphDocsLane
    from knowledge_server.search.lanes import LaneQuery

    data = tmp_path / "data"
    data.mkdir()
    roots = []
    for name, files in (("a", EIPS[:2]), ("b", EIPS[2:])):
        ws = tmp_path / name
        ws.mkdir()
        for f in files:
            shutil.copy(shared_data / "docs" / "eips" / f, ws / f)
        roots.append(str(ws))
    code = CodeLane(data)
    dg = DocGraphLane(data, code=code)
    try:
        for root in roots:
            code.index_sync(root, False, lambda *a: None)
        dg.build_sync(None, False, 0, 0, True, lambda *a: None, scope=None)
        one = [
            dg.op_sync("global_overview", docgraph_pb2.GlobalOverviewRequest(limit=5), (r,))
            for r in roots
        ]
        both = dg.op_sync("global_overview", docgraph_pb2.GlobalOverviewRequest(limit=50), None)
        assert both.documents == sum(o.documents for o in one) == len(EIPS)
        assert both.entities == sum(o.entities for o in one)
        assert all(f"{r}=docgraph:" in both.index_rev for r in roots)

        req = docgraph_pb2.ThemesRequest(limit=100)
        themes = dg.op_sync("themes", req, None)
        assert themes.found and {t.address.workspace for t in themes.themes} == set(roots)
        for t in themes.themes:
            files = EIPS[:2] if t.address.workspace == roots[0] else EIPS[2:]
            assert t.address.path in files
            assert {c.workspace for c in t.citations} == {t.address.workspace}
        assert dg.op_sync("themes", req, None) == themes  # deterministic
        sizes = [(-t.size, t.address.workspace, t.theme_id) for t in themes.themes]
        assert sizes == sorted(sizes)

        sl = dg.op_sync(
            "search_levels", docgraph_pb2.SearchLevelsRequest(query="base fee gas", limit=50), None
        )
        assert {h.address.workspace for h in sl.items} == set(roots)

        q = LaneQuery(
            query="base fee per gas", workspaces=None, docs_only=True, docs_mode="docs", top_k=60
        )
        merged = asyncio.run(GraphDocsLane(code, dg, lambda: True).search(q))
        graph = [i for i in merged.lane.items if i.match_kind in ("entity", "theme")]
        assert {i.workspace for i in graph} == set(roots)
        for i in graph:
            assert all(a.workspace == i.workspace for e in i.matched_entities for a in e.addresses)
        plain = asyncio.run(GraphDocsLane(code, dg, lambda: False).search(q))
        assert plain.lane.degraded and all(not i.match_kind for i in plain.lane.items)
    finally:
        dg.close()
        code.close()


def test_a_slow_graph_match_keeps_the_text_matches(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: a graph match slower than the lane's time costing the whole code lane (the
    coordinator drops a lane past its timeout): the text matches answer, degraded, saying why."""
    import asyncio
    import time

    from knowledge_server.lanes.code import CodeLane
    from knowledge_server.lanes.docgraph import DocGraphLane, GraphDocsLane
    from knowledge_server.search.lanes import LANE_DEADLINE, LaneQuery

    ws = eips_workspace(shared_data, tmp_path)
    code = CodeLane(tmp_path / "data")
    dg = DocGraphLane(tmp_path / "data", code=code)
    try:
        code.index_sync(str(ws), False, lambda *a: None)
        dg.build_sync(None, False, 0, 0, True, lambda *a: None)
        real = dg.match_sync

        def slow(*args: Any) -> Any:
            time.sleep(1.0)
            return real(*args)

        monkeypatch.setattr(dg, "match_sync", slow)
        q = LaneQuery(query="base fee per gas", workspaces=None, docs_only=True, docs_mode="docs")

        lane = GraphDocsLane(code, dg, lambda: True)
        before = lane.revision()

        async def search() -> Any:
            LANE_DEADLINE.set(time.monotonic() + 0.3)
            return await lane.search(q)

        started = time.monotonic()
        result = asyncio.run(search())
        assert time.monotonic() - started < 0.9
        assert result.lane.items and all(not i.match_kind for i in result.lane.items)
        assert result.lane.degraded and "DOCGRAPH_TIMEOUT" in result.lane.degradation_reason
        # The answer made without the graph is cached under a revision no later search uses.
        assert lane.revision() != before
    finally:
        dg.close()
        code.close()


async def test_search_docs_keeps_to_the_paths_filter(tmp_path: Path) -> None:
    """``filters.paths`` restricts the documents lane to paths under its prefixes: the
    chunks the graph brings (not the text match) came from every folder."""
    ws = tmp_path / "ws"

    def doc(title: str, a: str, b: str) -> str:
        return (
            f"# {title}\n\n## One\n\nThe `{a}` value goes with `{b}`.\n\n"
            f"## Two\n\nAgain `{a}` and `{b}` together.\n\n## Three\n\nFinally `{a}`, `{b}`.\n"
        )

    for rel, text in {
        "docs/guide.md": doc("Alpha Guide", "zorblatt_rate", "zorblatt_cap"),
        "other/notes.md": doc("Alpha Notes", "zorblatt_rate", "frobnic_limit"),
    }.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    rs = await _server(tmp_path, ws)
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            await _index_and_build(kc, ws, structural_only=True)
            query = "zorblatt_rate frobnic_limit"
            for mode in ("docs", "themes"):
                every = await kc.search(query, mode=mode, include=["code"])
                assert any(i.path.startswith("other/") for i in every.lanes.code.items), mode
                kept = await kc.search(query, mode=mode, include=["code"], paths=["docs/"])
                paths = [i.path for i in kept.lanes.code.items]
                assert paths and all(p.startswith("docs/") for p in paths), (mode, paths)
    finally:
        await rs.server.stop(0)


async def test_a_model_that_never_answers_does_not_hold_the_graphs_threads(tmp_path: Path) -> None:
    """A search's graph match asks the model for keywords; one left to finish when the
    lane stopped waiting sat in the call for the endpoint's whole time limit (and its
    retries) on one of the graph pool's two threads, so two searches left every later
    DocGraph call, even one that needs no model, queued past its deadline. The keyword
    call now ends with the search's time."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "guide.md").write_text(
        "# Guide\n\n## A\n\n`alpha_x` with `beta_y`.\n\n## B\n\n`alpha_x`.\n"
    )
    with socket.socket() as hole:  # accepts connections, never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        url = f"http://127.0.0.1:{hole.getsockname()[1]}"
        rs = await _server(tmp_path, ws, llm_url=url, llm_model="m", llm_timeout_seconds=60.0)
        try:
            async with AsyncKnowledgeClient(rs.address) as kc:
                await _index_and_build(kc, ws, structural_only=True)
                for query in ("alpha_x", "beta_y", "alpha_x beta_y"):
                    found = await kc.search(query, mode="docs", include=["code"], timeout=10)
                    assert found.lanes.code.items, query
                themes = await kc.themes(timeout=10)
                assert themes.collected
                overview = await kc.global_overview(timeout=10)
                assert overview.collected
        finally:
            await rs.server.stop(0)
