"""Seed 003 §3.9: the document graph is Enterprise. Under Community every docgraph operation and
BuildDocGraph answers an EditionRefusal naming the edition; under a valid Enterprise licence
they execute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from knowledge_sdk import AsyncKnowledgeClient, EditionRefused
from knowledge_sdk import types as v1

from tests.conftest import LicenceVendor, dev_keys, start_server

DOC = """---
eip: 9001
title: Example standard
status: Final
requires: 1559
---

# Abstract

EIP-9001 extends EIP-1559 with an example parameter.

## Motivation

Example text that refers to [EIP-1559](./eip-1559.md).
"""


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "docs"
    ws.mkdir()
    (ws / "eip-9001.md").write_text(DOC, encoding="utf-8")
    return ws


async def _drain(stream: Any) -> list[Any]:
    return [ev async for ev in stream]


def _ops(kc: AsyncKnowledgeClient) -> dict[str, Any]:
    return {
        "Themes": lambda: kc.themes(),
        "EntityNeighbors": lambda: kc.entity_neighbors("EIP-9001"),
        "DocRelations": lambda: kc.doc_relations(doc="eip-9001.md"),
        "GlobalOverview": lambda: kc.global_overview(),
        "SearchLevels": lambda: kc.search_levels("EIP-9001 example"),
    }


@pytest.mark.parametrize("edition", [None, "community"])
async def test_community_refuses_every_docgraph_rpc(
    tmp_path: Path, licence_vendor: LicenceVendor, edition: str | None
) -> None:
    keys: dict[str, str] = {}
    if edition is not None:  # None: no licence file at all
        licence_vendor.install(tmp_path / "data", licence_vendor.issue(edition=edition))
        keys = dev_keys(tmp_path / "data")
    ws = _workspace(tmp_path)
    rs = await start_server(tmp_path, workspaces=[str(ws)], **keys)
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            await _drain(kc.index_workspace(str(ws)))  # ungated: works on Community
            calls = dict(_ops(kc))
            calls["BuildDocGraph"] = lambda: _drain(
                kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws)))
            )
            for name, call in calls.items():
                with pytest.raises(EditionRefused) as err:
                    await call()
                exc = err.value
                assert exc.required_edition == "enterprise" and exc.feature == "doc-graph", name
                assert exc.current_edition == "community", name
                assert "enterprise" in exc.message.lower(), name
    finally:
        await rs.server.stop(0)


async def test_enterprise_executes_every_docgraph_rpc(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    licence_vendor.install(tmp_path / "data")
    ws = _workspace(tmp_path)
    rs = await start_server(tmp_path, workspaces=[str(ws)], **dev_keys(tmp_path / "data"))
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            assert (await kc.get_status()).edition.edition == "enterprise"
            # Before a build: executed, and "not collected" rather than an empty answer.
            for name, call in _ops(kc).items():
                resp = await call()
                assert not resp.collected and "DOCGRAPH_NOT_BUILT" in resp.reason, name
            await _drain(kc.index_workspace(str(ws)))
            events = await _drain(kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws))))
            summary = events[-1].summary
            assert summary is not None and summary.index_rev.startswith("docgraph:")
            assert summary.counters["entities"] > 0
            for name, call in _ops(kc).items():
                resp = await call()
                assert resp.collected and resp.provenance == "stated", name
                assert resp.index_rev == summary.index_rev, name
    finally:
        await rs.server.stop(0)
