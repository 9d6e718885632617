"""The code lane's cache key follows its capability, not only its index revision.

Vectors filled in after the lexical commit keep the workspace's revision but turn the lane
from "vectors not ready" to full: a search repeated after that must not be answered from
the cache filled while they were missing (issue #20, item 8)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from knowledge_server._gen.knowledge.v1 import search_pb2
from knowledge_server.code import CodeIndex, HashingEmbedder, IndexOptions
from knowledge_server.lanes.code import CodeLane
from knowledge_server.search.coordinator import Coordinator
from knowledge_server.search.validate import validate_search


def _ask(co: Coordinator) -> search_pb2.SearchResponse:
    v = validate_search(
        search_pb2.SearchRequest(
            schema="knowledge.search/v1", query="user name lookup", include=["code"], trace=True
        )
    )
    return asyncio.run(co.search(v, None))


def test_vectors_filled_under_the_same_revision_are_not_hidden_by_the_cache(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "service.py").write_text(
        "class UserService:\n    def get_user_name(self, uid):\n        return self.db.lookup(uid)\n"
    )
    data = tmp_path / "data"
    data.mkdir()
    embedder = HashingEmbedder()
    with CodeIndex(str(data / "code.sqlite"), embedder=embedder) as ix:
        rep = ix.index_workspace(str(ws), options=IndexOptions(fill_vectors=False))
    assert rep.vectors_missing == rep.chunks > 0
    lane = CodeLane(data, embedder=embedder)
    try:
        # The lane's first freshness check (its background thread's) is part of its
        # revision: done here, so it cannot land between two searches below and turn a
        # repeat into a miss.
        lane.refresh_freshness()
        co = Coordinator({"code": lane}, timeout_ms=5000)
        first = _ask(co)
        assert first.lanes.code.degraded
        assert "vectors not ready" in first.lanes.code.degradation_reason
        assert first.lanes.code.items
        rev_before = lane.revision()
        # Another process fills the vectors: the workspace keeps its revision.
        with CodeIndex(str(data / "code.sqlite"), embedder=embedder) as ix:
            assert ix.fill_vectors(str(ws)) == rep.chunks
            assert ix.current_rev(str(ws)) == rep.index_rev
        second = _ask(co)
        assert second.lanes.code.index_rev == first.lanes.code.index_rev == rep.index_rev
        assert not second.lanes.code.degraded, second.lanes.code.degradation_reason
        assert second.lanes.code.capability == "full"
        assert [t.cache_hit for t in second.trace.lanes if t.lane == "code"] == [False]
        # Nothing changed since: the repeat is a cache hit again.
        third = _ask(co)
        assert [t.cache_hit for t in third.trace.lanes if t.lane == "code"] == [True]
        assert not third.lanes.code.degraded
        assert lane.revision() != rev_before
    finally:
        lane.close()
